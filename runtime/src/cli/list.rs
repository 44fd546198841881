//! `list`.

use clap::Parser;
use serde_json::json;

use super::options::GlobalOptions;
use super::output::{age, print_json, print_table};
use crate::run::catalog::Catalog;

/// List registered workflows.
#[derive(Debug, Parser)]
pub struct ListCommand {
    /// Print as JSON
    #[arg(long)]
    pub json: bool,
}

impl ListCommand {
    pub fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let store = global.store()?;
        let catalog = Catalog::new(&store);
        let registry = catalog.registry().load()?;
        let phases = crate::schedule::phase::phases(&store)?;
        let phase = |name: &str| phases.get(name).map_or("-", |p| p.as_str());
        if self.json {
            let list: Vec<_> = registry
                .workflows
                .iter()
                .map(|(name, e)| {
                    json!({"name": name, "hash": e.hash.to_string(), "timestamp": e.timestamp, "versions": e.history.len() + 1, "phase": phase(name)})
                })
                .collect();
            print_json(&list)?;
            return Ok(0);
        }
        if registry.workflows.is_empty() {
            outln!(
                "no workflows registered (add one with `uncaged-workflow add <name> <file.wasm>`)"
            )?;
            return Ok(0);
        }
        let rows: Vec<Vec<String>> = registry
            .workflows
            .iter()
            .map(|(name, e)| {
                // The registry keeps the start of each description: `list` reads no descriptor
                // (older registries lack it, and fall back to the descriptor).
                let summary = registry.bundles.get(&e.hash).and_then(|b| b.summary.clone());
                let description = summary
                    .map(Ok)
                    .unwrap_or_else(|| catalog.bundles().descriptor(e.hash).map(|d| d.description))
                    .map(|d| super::output::truncate(&d, 60))
                    .unwrap_or_else(|err| format!("(descriptor unreadable: {err})"));
                vec![
                    name.clone(),
                    e.hash.to_string(),
                    (e.history.len() + 1).to_string(),
                    phase(name).to_string(),
                    age(e.timestamp),
                    description,
                ]
            })
            .collect();
        print_table(&["NAME", "HASH", "VERSIONS", "PHASE", "UPDATED", "DESCRIPTION"], &rows)?;
        Ok(0)
    }
}
