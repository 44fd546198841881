//! `thread <id>` and `thread rm <id>`.

use clap::{Parser, Subcommand};
use serde_json::json;

use super::GlobalOptions;
use super::output::print_json;
use crate::error::Error;
use crate::ids::ThreadId;
use crate::thread_log::{find_thread, read_thread};

/// Show a thread's state and steps, or delete it.
#[derive(Debug, Parser)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct ThreadCommand {
    /// The thread's id (a ULID)
    #[arg(required = true)]
    pub id: Option<String>,
    /// Print as JSON
    #[arg(long)]
    pub json: bool,
    #[command(subcommand)]
    pub action: Option<ThreadAction>,
}

/// What to do with a thread other than show it.
#[derive(Debug, Subcommand)]
pub enum ThreadAction {
    /// Delete a thread's files
    Rm {
        /// The thread's id
        id: String,
    },
}

impl ThreadCommand {
    pub fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let home = global.home()?;
        match self.action {
            Some(ThreadAction::Rm { id }) => {
                let id: ThreadId = id.parse()?;
                let (hash, data) = find_thread(&home, id)?;
                std::fs::remove_file(&data).map_err(Error::io("delete thread", &data))?;
                let info = home.thread_info_file(hash, id);
                if let Err(e) = std::fs::remove_file(&info)
                    && e.kind() != std::io::ErrorKind::NotFound
                {
                    return Err(Error::io("delete thread log", &info)(e).into());
                }
                println!("deleted thread {id}");
                Ok(0)
            }
            None => {
                let id: ThreadId = self.id.as_deref().unwrap_or_default().parse()?;
                let (_, data) = find_thread(&home, id)?;
                let thread = read_thread(&data)?;
                if self.json {
                    print_json(&json!({
                        "start": thread.start, "status": thread.status(), "steps": thread.steps,
                        "end": thread.end,
                    }))?;
                    return Ok(0);
                }
                let start = &thread.start;
                println!(
                    "thread {}  {} {}  {}",
                    start.thread_id,
                    start.name,
                    start.hash,
                    thread.status()
                );
                println!("prompt: {}", start.parameters.prompt);
                println!("max rounds: {}", start.parameters.options.max_rounds);
                if let Some(fork) = &start.forked_from {
                    println!("forked from {} at step {}", fork.thread_id, fork.step);
                }
                for (i, step) in thread.steps.iter().enumerate() {
                    println!();
                    println!("[{}] {}  {}", i + 1, step.role, step.meta);
                    for line in step.content.lines() {
                        println!("    {line}");
                    }
                }
                if let Some(end) = &thread.end {
                    println!();
                    println!(
                        "{} ({}): {}",
                        end.end.status.as_str(),
                        end.end.return_code,
                        end.end.summary
                    );
                }
                Ok(0)
            }
        }
    }
}
