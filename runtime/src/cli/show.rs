//! `show <name>`.

use clap::Parser;
use serde_json::json;

use super::GlobalOptions;
use super::output::print_json;
use super::terminal;
use crate::run::catalog::Catalog;

/// Show a workflow: description, current hash, the contract version it targets, roles and
/// their schemas.
#[derive(Debug, Parser)]
pub struct ShowCommand {
    /// The workflow
    pub name: String,
    /// Print as JSON
    #[arg(long)]
    pub json: bool,
}

impl ShowCommand {
    pub fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let catalog = Catalog::new(&global.store()?);
        let entry = catalog.entry(&self.name)?;
        let descriptor = catalog.bundles().descriptor(entry.hash)?;
        if self.json {
            print_json(&json!({
                "name": self.name, "hash": entry.hash.to_string(), "timestamp": entry.timestamp,
                "description": descriptor.description, "maxRounds": descriptor.max_rounds,
                "contract": descriptor.contract, "roles": descriptor.roles,
            }))?;
            return Ok(0);
        }
        outln!("{} {}", self.name, entry.hash)?;
        outln!("{}", terminal::block(&descriptor.description))?;
        outln!("max rounds: {}", descriptor.max_rounds)?;
        outln!("contract: uncaged:workflow@{}", terminal::line(&descriptor.contract))?;
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
