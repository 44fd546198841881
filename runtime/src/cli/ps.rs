//! `ps`.

use clap::Parser;

use super::options::GlobalOptions;
use super::output::{Table, age, print_json};
use crate::run::control;
use crate::terminal;

/// List the threads running in live worker processes, and those waiting for a human answer
/// (on a database store: in every worker on every machine, and those queued for one).
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
            // Threads of a shared store run on many machines: say which.
            let hosts = all.iter().any(|t| t.host.is_some());
            let rows: Vec<Vec<String>> = all
                .iter()
                .map(|t| {
                    let mut row = vec![
                        t.thread_id.to_string(),
                        terminal::line(&t.name).into_owned(),
                        match &t.waiting_for {
                            Some(limit) => format!("waiting for {}", terminal::line(limit)),
                            None => t.state.as_str().to_string(),
                        },
                        t.role
                            .as_deref()
                            .map_or_else(|| "-".into(), |r| terminal::line(r).into_owned()),
                        t.steps.to_string(),
                        age(t.since),
                        t.pid.map_or_else(|| "-".into(), |p| p.to_string()),
                    ];
                    if hosts {
                        row.push(
                            t.host
                                .as_deref()
                                .map_or_else(|| "-".into(), |h| terminal::line(h).into_owned()),
                        );
                    }
                    row
                })
                .collect();
            let mut header = vec!["THREAD", "WORKFLOW", "STATE", "ROLE", "STEPS", "AGE", "PID"];
            if hosts {
                header.push("HOST");
            }
            let mut table = Table::new(&header);
            table.status_column(2);
            for cell in rows.iter().flatten() {
                table.cell(cell);
            }
            table.print()?;
        }
        Ok(0)
    }
}
