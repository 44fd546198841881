//! `show <name>`.

use clap::Parser;
use serde_json::json;

use super::options::GlobalOptions;
use super::output::print_json;
use crate::declarative;
use crate::error::Error;
use crate::run::catalog::Catalog;
use crate::terminal;

/// Show a workflow: description, current hash, the contract version it targets, the JSON
/// Schema of the data it takes, and its roles with their schemas — or, for a declarative (YAML) workflow, the YAML it was built
/// from, read back out of the bundle.
#[derive(Debug, Parser)]
pub struct ShowCommand {
    /// The workflow
    #[arg(add = clap_complete::ArgValueCompleter::new(super::complete::workflow_names))]
    pub name: String,
    /// Print as JSON
    #[arg(long, conflicts_with = "graph")]
    pub json: bool,
    /// Print a declarative workflow's routing as a Mermaid flowchart (its role graph, or its
    /// DAG of steps)
    #[arg(long)]
    pub graph: bool,
}

impl ShowCommand {
    pub fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let catalog = Catalog::new(&global.store()?);
        let entry = catalog.entry(&self.name)?;
        let descriptor = catalog.bundles().descriptor(entry.hash)?;
        let registry = catalog.registry().load()?;
        let bundle = catalog.bundles().load(&registry, &self.name, entry.hash)?;
        let source = declarative::source_of(&bundle.bytes);
        if self.graph {
            let Some(source) = source else {
                return Err(Error::Usage(format!(
                    "workflow `{}` is code, not a declarative workflow: its routing is whatever \
                     its moderator computes, so there is no graph to draw",
                    self.name
                ))
                .into());
            };
            let definition = declarative::source::parse(&bundle.path, &source)?;
            outln!("{}", declarative::mermaid::flowchart(&definition).trim_end())?;
            return Ok(0);
        }
        if self.json {
            print_json(&json!({
                "name": self.name, "hash": entry.hash.to_string(), "timestamp": entry.timestamp,
                "description": descriptor.description, "maxRounds": descriptor.max_rounds,
                "contract": descriptor.contract, "roles": descriptor.roles,
                "inputSchema": descriptor.input_schema, "source": source,
            }))?;
            return Ok(0);
        }
        outln!("{} {}", self.name, entry.hash)?;
        outln!("{}", terminal::block(&descriptor.description))?;
        outln!("max rounds: {}", descriptor.max_rounds)?;
        outln!("contract: uncaged:workflow@{}", terminal::line(&descriptor.contract))?;
        if let Some(schema) = &descriptor.input_schema {
            outln!("input (--data, checked against this JSON Schema):")?;
            for line in serde_json::to_string_pretty(schema)?.lines() {
                outln!("  {}", terminal::line(line))?;
            }
        }
        if let Some(source) = source {
            outln!("declarative: the YAML below, run by the interpreter built into this host")?;
            outln!()?;
            outln!("{}", terminal::block(source.trim_end()))?;
            return Ok(0);
        }
        for role in &descriptor.roles {
            outln!()?;
            outln!("role {}", terminal::line(&format!("{}: {}", role.name, role.description)))?;
            outln!("  system prompt:  {}", super::output::truncate(&role.system_prompt, 200))?;
            outln!("  extract prompt: {}", super::output::truncate(&role.extract_prompt, 200))?;
            let schema = serde_json::to_string_pretty(&role.schema)?;
            outln!("  schema:")?;
            for line in schema.lines() {
                outln!("    {line}")?;
            }
        }
        Ok(0)
    }
}
