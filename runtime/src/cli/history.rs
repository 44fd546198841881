//! `history <name>`.

use clap::Parser;
use serde_json::json;

use super::options::GlobalOptions;
use super::output::{age, print_json, print_table};
use crate::run::catalog::Catalog;

/// Show a workflow's versions, current first.
#[derive(Debug, Parser)]
pub struct HistoryCommand {
    /// The workflow
    #[arg(add = clap_complete::ArgValueCompleter::new(super::complete::workflow_names))]
    pub name: String,
    /// Print as JSON
    #[arg(long)]
    pub json: bool,
}

impl HistoryCommand {
    pub fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let entry = Catalog::new(&global.store()?).entry(&self.name)?;
        let versions = std::iter::once((entry.hash, entry.timestamp, true))
            .chain(entry.history.iter().map(|v| (v.hash, v.timestamp, false)));
        if self.json {
            let list: Vec<_> = versions
                .map(|(hash, timestamp, current)| json!({"hash": hash.to_string(), "timestamp": timestamp, "current": current}))
                .collect();
            print_json(&list)?;
            return Ok(0);
        }
        let rows: Vec<Vec<String>> = versions
            .map(|(hash, timestamp, current)| {
                vec![
                    hash.to_string(),
                    age(timestamp),
                    if current { "current".into() } else { String::new() },
                ]
            })
            .collect();
        print_table(&["HASH", "SINCE", ""], &rows)?;
        Ok(0)
    }
}
