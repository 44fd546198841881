//! `threads [name]` and `threads prune`.

use std::time::Duration;

use clap::{Parser, Subcommand};
use serde_json::json;

use super::GlobalOptions;
use super::output::{age, print_json, print_table, truncate};
use crate::run::lifecycle::{self, PruneFilter};
use crate::store::records::EndStatus;

/// List threads, oldest first, with status, step count and age; or prune ended ones.
#[derive(Debug, Parser)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ThreadsCommand {
    /// Only threads of this workflow
    pub name: Option<String>,
    /// Print as JSON
    #[arg(long)]
    pub json: bool,
    #[command(subcommand)]
    pub action: Option<ThreadsAction>,
}

/// What to do with many threads at once.
#[derive(Debug, Subcommand)]
pub enum ThreadsAction {
    /// Remove ended threads (their records, journals and logs) that ended long enough ago.
    ///
    /// Only threads that have ended are removed: never one that runs, is paused, waits for a
    /// human or was interrupted. A removal a crash interrupts is finished by the next one.
    #[command(after_help = "Examples:\n  uncaged-workflow threads prune --older-than 30d\n  \
        uncaged-workflow threads prune --older-than 12h --status failed --workflow solve-issue --dry-run")]
    Prune {
        /// How long ago a thread must have ended, e.g. 30d, 12h, 90m
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        older_than: Duration,
        /// Only threads that ended so (repeatable) [default: completed, failed and killed]
        #[arg(long, value_name = "STATUS", value_enum)]
        status: Vec<EndedStatus>,
        /// Only threads of this workflow
        #[arg(long, value_name = "NAME")]
        workflow: Option<String>,
        /// Say what would be removed, and remove nothing
        #[arg(long)]
        dry_run: bool,
        /// Print the threads as JSON
        #[arg(long)]
        json: bool,
    },
}

/// How a thread ended, as `--status` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EndedStatus {
    Completed,
    Failed,
    Killed,
}

impl From<EndedStatus> for EndStatus {
    fn from(status: EndedStatus) -> Self {
        match status {
            EndedStatus::Completed => EndStatus::Completed,
            EndedStatus::Failed => EndStatus::Failed,
            EndedStatus::Killed => EndStatus::Killed,
        }
    }
}

impl ThreadsCommand {
    pub fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let store = global.store()?;
        if let Some(ThreadsAction::Prune { older_than, status, workflow, dry_run, json }) =
            self.action
        {
            let statuses = if status.is_empty() {
                vec![EndStatus::Completed, EndStatus::Failed, EndStatus::Killed]
            } else {
                status.into_iter().map(EndStatus::from).collect()
            };
            let filter = PruneFilter { older_than, statuses, workflow };
            let pruned = lifecycle::prune(&store, &filter, dry_run)?;
            if json {
                print_json(&pruned)?;
            } else {
                for thread in &pruned {
                    outln!("{} {} {}", thread.thread_id, thread.status.as_str(), thread.name)?;
                }
                let verb = if dry_run { "would remove" } else { "removed" };
                outln!("{verb} {} thread(s)", pruned.len())?;
            }
            return Ok(0);
        }
        let mut rows = Vec::new();
        let mut list = Vec::new();
        for thread in store.threads().summaries()? {
            if self.name.as_ref().is_some_and(|n| *n != thread.name) {
                continue;
            }
            if self.json {
                list.push(json!({
                    "threadId": thread.thread_id, "name": thread.name, "hash": thread.hash,
                    "status": thread.status, "steps": thread.steps,
                    "timestamp": thread.timestamp, "prompt": thread.prompt,
                    "returnCode": thread.return_code,
                }));
            } else {
                rows.push(vec![
                    thread.thread_id.to_string(),
                    thread.name.clone(),
                    thread.status.as_str().to_string(),
                    thread.steps.to_string(),
                    age(thread.timestamp),
                    truncate(&thread.prompt, 40),
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
