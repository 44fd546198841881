//! `step <id>`.

use clap::Parser;
use serde_json::json;

use super::GlobalOptions;
use crate::catalog::Catalog;
use crate::engine::Runtime;
use crate::ids::ThreadId;
use crate::runner::{RunContext, RunOutcome, ThreadEvent, Until, run_thread};
use crate::threads;

/// Run exactly one role of a thread, persist it, and exit (stateless single step).
///
/// Prints the new step as JSON — `{"thread", "index", "step"}` — or, when the workflow is
/// over, `{"thread", "end"}`. Runs in this process, not in a worker, so a thread can be driven
/// entirely from scripts or cron: `thread start`, then `step` until it prints `end`.
#[derive(Debug, Parser)]
pub struct StepCommand {
    /// The thread
    pub id: String,
}

impl StepCommand {
    pub async fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let home = global.home()?;
        let id: ThreadId = self.id.parse()?;
        let (mut writer, record) = threads::open(&home, id)?;
        let runtime = Runtime::new(&home)?;
        let bundle = Catalog::new(&home).load(&runtime, &record.start.name, record.start.hash)?;
        let agents = threads::agents_for(&home, &record, &bundle, &Default::default())?;
        let ctx = RunContext {
            runtime: &runtime,
            home: &home,
            agents,
            limits: threads::limits_for(&home, &record)?,
            control: Default::default(),
        };
        let mut taken = None;
        let outcome = run_thread(&ctx, &bundle, &mut writer, &record, Until::Steps(1), |event| {
            let ThreadEvent::Step { index, step, .. } = event;
            taken = Some((index, step));
        })
        .await?;
        match outcome {
            RunOutcome::Waiting { role } => {
                println!("{}", json!({"thread": id.to_string(), "waiting": {"role": role}}));
                eprintln!(
                    "uncaged-workflow: thread {id} waits for a human answer for role `{role}`: `uncaged-workflow answer {id} TEXT`"
                );
                Ok(crate::error::exit::STATE)
            }
            RunOutcome::Ended(end) => {
                println!("{}", json!({"thread": id.to_string(), "end": end.end}));
                Ok(end.end.return_code)
            }
            RunOutcome::Stepped | RunOutcome::Paused => {
                let (index, step) = taken.expect("a step was taken");
                println!("{}", json!({"thread": id.to_string(), "index": index, "step": step}));
                Ok(0)
            }
        }
    }
}
