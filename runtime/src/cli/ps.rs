//! `ps`.

use clap::Parser;

use super::GlobalOptions;
use super::output::{age, print_json, print_table};
use crate::run::control;

/// List the threads running in live worker processes, and those waiting for a human answer.
#[derive(Debug, Parser)]
pub struct PsCommand {
    /// Print as JSON
    #[arg(long)]
    pub json: bool,
}

impl PsCommand {
    pub async fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let store = global.store()?;
        let all = control::ps(&store).await?;
        if self.json {
            print_json(&all)?;
        } else if all.is_empty() {
            outln!("no running threads")?;
        } else {
            let rows: Vec<Vec<String>> = all
                .iter()
                .map(|t| {
                    vec![
                        t.thread_id.clone(),
                        t.name.clone(),
                        t.state.clone(),
                        t.role.clone().unwrap_or_else(|| "-".into()),
                        t.steps.to_string(),
                        age(t.since),
                        t.pid.map_or_else(|| "-".into(), |p| p.to_string()),
                    ]
                })
                .collect();
            print_table(&["THREAD", "WORKFLOW", "STATE", "ROLE", "STEPS", "AGE", "PID"], &rows)?;
        }
        Ok(0)
    }
}
