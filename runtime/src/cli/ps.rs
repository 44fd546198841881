//! `ps`.

use clap::Parser;

use super::GlobalOptions;
use super::output::{age, print_json, print_table};
use crate::run::ipc::{self, PsEntry, Reply, Request};
use crate::store::records::ThreadStatus;

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
        let home = store.home();
        let mut all = Vec::new();
        for hash in ipc::live_workers(home)? {
            // A worker that exits between listing and asking simply has no threads.
            let Some(mut connection) = ipc::connect(home, hash).await? else { continue };
            if connection.send(&Request::Ps).await.is_err() {
                continue;
            }
            if let Ok(Some(Reply::Threads { threads })) = connection.receive::<Reply>().await {
                all.extend(threads);
            }
        }
        // Threads waiting for a human answer hold no process, but they are live work.
        for thread in store.threads().summaries()? {
            if thread.status == ThreadStatus::Waiting {
                all.push(PsEntry {
                    thread_id: thread.thread_id.to_string(),
                    name: thread.name.clone(),
                    hash: thread.hash.to_string(),
                    role: thread.waiting_role.clone(),
                    steps: thread.steps,
                    since: thread.paused_at.unwrap_or(thread.timestamp),
                    pid: None,
                    state: "waiting".into(),
                });
            }
        }
        all.sort_by(|a, b| a.thread_id.cmp(&b.thread_id));
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
