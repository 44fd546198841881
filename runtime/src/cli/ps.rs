//! `ps`.

use clap::Parser;

use super::GlobalOptions;
use super::output::{age, print_json, print_table};
use crate::ipc::{self, Reply, Request};

/// List the threads running in live worker processes.
#[derive(Debug, Parser)]
pub struct PsCommand {
    /// Print as JSON
    #[arg(long)]
    pub json: bool,
}

impl PsCommand {
    pub async fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let home = global.home()?;
        let mut all = Vec::new();
        for hash in ipc::live_workers(&home)? {
            // A worker that exits between listing and asking simply has no threads.
            let Some(mut connection) = ipc::connect(&home, hash).await? else { continue };
            if connection.send(&Request::Ps).await.is_err() {
                continue;
            }
            if let Ok(Some(Reply::Threads { threads })) = connection.receive::<Reply>().await {
                all.extend(threads);
            }
        }
        all.sort_by(|a, b| a.thread_id.cmp(&b.thread_id));
        if self.json {
            print_json(&all)?;
        } else if all.is_empty() {
            println!("no running threads");
        } else {
            let rows: Vec<Vec<String>> = all
                .iter()
                .map(|t| {
                    vec![
                        t.thread_id.clone(),
                        t.name.clone(),
                        t.role.clone().unwrap_or_else(|| "-".into()),
                        t.steps.to_string(),
                        age(t.since),
                        t.pid.to_string(),
                    ]
                })
                .collect();
            print_table(&["THREAD", "WORKFLOW", "ROLE", "STEPS", "AGE", "PID"], &rows);
        }
        Ok(0)
    }
}
