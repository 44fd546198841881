//! `step <id>`.

use clap::Parser;
use serde_json::json;

use super::GlobalOptions;
use super::output::StepLine;
use crate::agents::{AgentFlags, Secrets};
use crate::ids::ThreadId;
use crate::run::catalog::Catalog;
use crate::run::lifecycle;
use crate::run::runner::{RunContext, RunOutcome, ThreadEvent, Until, run_thread};
use crate::sandbox::engine::Runtime;

/// Run exactly one role of a thread, persist it, and exit (stateless single step).
///
/// Prints the new step as one JSON line — `{"thread", "index", "step", "agent", "durationMs"}`,
/// the shape `run --json` prints steps in — or, when the workflow is over, `{"thread", "end"}`. Runs in this process, not in a worker, so a thread can be driven
/// entirely from scripts or cron: `thread start`, then `step` until it prints `end`.
#[derive(Debug, Parser)]
pub struct StepCommand {
    /// The thread
    pub id: String,
}

impl StepCommand {
    pub async fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let store = global.store()?;
        let id: ThreadId = self.id.parse()?;
        let (mut writer, record) = lifecycle::open(&store, id)?;
        let runtime = Runtime::new(store.home())?;
        let bundle = Catalog::new(&store).load(&runtime, &record.start.name, record.start.hash)?;
        // `step` runs the thread in this process, with this command's secrets.
        let flags =
            AgentFlags { secrets: Secrets::from_env(&store.config()?), ..Default::default() };
        let agents = lifecycle::agents_for(&store, &record, &bundle, &flags)?;
        let ctx = RunContext {
            runtime: &runtime,
            store: &store,
            agents,
            limits: lifecycle::limits_for(&store, &record)?,
            control: Default::default(),
        };
        let mut taken = None;
        let outcome = run_thread(&ctx, &bundle, &mut *writer, &record, Until::Steps(1), |event| {
            let ThreadEvent::Step { index, step, agent, elapsed } = event;
            taken = Some((index, step, agent, elapsed));
        })
        .await?;
        match outcome {
            RunOutcome::Waiting { role } => {
                outln!("{}", json!({"thread": id.to_string(), "waiting": {"role": role}}))?;
                let role = crate::terminal::line(&role);
                eprintln!(
                    "uncaged-workflow: thread {id} waits for a human answer for role `{role}`: `uncaged-workflow answer {id} TEXT`"
                );
                Ok(crate::error::exit::STATE)
            }
            RunOutcome::Ended(end) => {
                outln!("{}", json!({"thread": id.to_string(), "end": end.end}))?;
                Ok(end.end.exit_code())
            }
            RunOutcome::Stepped | RunOutcome::Paused => {
                let (index, step, agent, elapsed) = taken.expect("a step was taken");
                let line = StepLine {
                    thread: id,
                    index,
                    step: &step,
                    agent: &agent,
                    duration_ms: elapsed.as_millis() as u64,
                };
                outln!("{}", serde_json::to_string(&line).expect("steps serialize"))?;
                Ok(0)
            }
        }
    }
}
