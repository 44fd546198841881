//! `threads [name]`.

use clap::Parser;
use serde_json::json;

use super::GlobalOptions;
use super::output::{age, one_line, print_json, print_table};
use crate::thread_log::{all_threads, read_thread};

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
        let home = global.home()?;
        let mut rows = Vec::new();
        let mut list = Vec::new();
        for (hash, id, path) in all_threads(&home)? {
            // One unreadable thread file must not hide the others.
            let thread = match read_thread(&path) {
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
                    "threadId": id.to_string(), "name": thread.start.name, "hash": hash.to_string(),
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
                    one_line(&thread.start.parameters.prompt, 40),
                ]);
            }
        }
        if self.json {
            print_json(&list)?;
        } else if rows.is_empty() {
            println!("no threads");
        } else {
            print_table(&["THREAD", "WORKFLOW", "STATUS", "STEPS", "AGE", "PROMPT"], &rows);
        }
        Ok(0)
    }
}
