//! `threads [name]`.

use clap::Parser;
use serde_json::json;

use super::GlobalOptions;
use super::output::{age, print_json, print_table, truncate};

/// List threads, oldest first, with status, step count and age.
#[derive(Debug, Parser)]
pub struct ThreadsCommand {
    /// Only threads of this workflow
    pub name: Option<String>,
    /// Print as JSON
    #[arg(long)]
    pub json: bool,
}

impl ThreadsCommand {
    pub fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let store = global.store()?;
        let mut rows = Vec::new();
        let mut list = Vec::new();
        for id in store.threads().list()? {
            // One unreadable thread must not hide the others.
            let thread = match store.threads().read(id) {
                Ok(thread) => thread,
                Err(e) => {
                    tracing::warn!("skipping thread {id}: {e}");
                    continue;
                }
            };
            if self.name.as_ref().is_some_and(|n| *n != thread.start.name) {
                continue;
            }
            if self.json {
                list.push(json!({
                    "threadId": id.to_string(), "name": thread.start.name, "hash": thread.start.hash.to_string(),
                    "status": thread.status(), "steps": thread.steps.len(),
                    "timestamp": thread.start.timestamp, "prompt": thread.start.parameters.prompt,
                    "returnCode": thread.end.as_ref().map(|e| e.end.return_code),
                }));
            } else {
                rows.push(vec![
                    id.to_string(),
                    thread.start.name.clone(),
                    thread.status().as_str().to_string(),
                    thread.steps.len().to_string(),
                    age(thread.start.timestamp),
                    truncate(&thread.start.parameters.prompt, 40),
                ]);
            }
        }
        if self.json {
            print_json(&list)?;
        } else if rows.is_empty() {
            outln!("no threads")?;
        } else {
            print_table(&["THREAD", "WORKFLOW", "STATUS", "STEPS", "AGE", "PROMPT"], &rows)?;
        }
        Ok(0)
    }
}
