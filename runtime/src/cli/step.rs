//! `step <id>`.

use clap::Parser;

use super::follow::print_event;
use super::options::GlobalOptions;
use crate::agents::Secrets;
use crate::run::catalog::Catalog;
use crate::run::children::{self, StoreChildren};
use crate::run::events::Event;
use crate::run::lifecycle;
use crate::run::runner::{RunContext, RunOutcome, ThreadEvent, Until, run_thread};
use crate::run_request::RunRequest;
use crate::sandbox::engine::Runtime;
use crate::store::records::{PauseReason, Paused};

/// Run exactly one role of a thread, persist it, and exit (stateless single step).
///
/// Prints the steps it took as JSON lines, the events `run --json` prints (`{"type": "step",
/// …}`: one, or each step of a parallel group), then `{"type": "ended", …}` when the workflow
/// is over or `{"type": "waiting", …}` when it waits for a person. Runs in this process, not
/// in a worker, so a thread can be driven entirely from scripts or cron: `thread start`, then
/// `step` until it prints `ended`. Between steps the thread is `paused`.
#[derive(Debug, Parser)]
pub struct StepCommand {
    /// The thread
    #[arg(add = clap_complete::ArgValueCompleter::new(super::complete::thread_ids))]
    pub id: String,
}

impl StepCommand {
    pub async fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let store = global.store()?;
        let id = store.threads().resolve(&self.id)?;
        let (mut writer, record) = lifecycle::open(&store, id)?;
        let runtime = Runtime::new(store.home())?;
        let bundle = Catalog::new(&store).load(&runtime, &record.start.name, record.version())?;
        // `step` runs the thread in this process, with this command's secrets.
        let secrets = Secrets::from_env(&store.config()?);
        let agents =
            lifecycle::agents_for(&store, &record, &bundle, &RunRequest::default(), &secrets)?;
        let ctx = RunContext {
            runtime: &runtime,
            store: &store,
            agents,
            limits: lifecycle::limits_for(&store, &record)?,
            control: Default::default(),
            children: Some(StoreChildren::shared(&store)),
        };
        // One generator step: one role, or every step of a parallel group.
        let mut taken = Vec::new();
        let outcome = run_thread(&ctx, &bundle, &mut *writer, &record, Until::Steps(1), |event| {
            let ThreadEvent::Step { index, step } = event;
            taken.push(Event::Step { thread: id, index, step });
        })
        .await?;
        for event in &taken {
            print_event(event)?;
        }
        if matches!(outcome, RunOutcome::Waiting { .. } | RunOutcome::Ended(_)) {
            // A child that ended, or a child waited on that ended, is passed on.
            drop(writer);
            children::rested(&store, id).await?;
            return match outcome {
                RunOutcome::Waiting { role } => waiting(&store, id, &role),
                RunOutcome::Ended(end) => {
                    print_event(&Event::Ended { thread: id, end: end.end.clone() })?;
                    Ok(end.end.exit_code())
                }
                _ => unreachable!("matched above"),
            };
        }
        match outcome {
            RunOutcome::Waiting { .. } | RunOutcome::Ended(_) => unreachable!("returned above"),
            RunOutcome::Stepped | RunOutcome::Paused | RunOutcome::HandedBack => {
                // At rest between steps, and said so: `step` or `resume` continues it.
                if outcome == RunOutcome::Stepped {
                    writer.append_pause(Paused::by(PauseReason::Step))?;
                }
                Ok(0)
            }
        }
    }
}

/// Says what thread `id` waits on: a person's answer for `role`, or a child workflow's thread.
fn waiting(
    store: &crate::store::Storage,
    id: crate::ids::ThreadId,
    role: &str,
) -> anyhow::Result<i32> {
    print_event(&Event::Waiting { thread: id, role: role.to_string() })?;
    let role = crate::terminal::line(role);
    match store.threads().read(id)?.waited_child() {
        Some((child, ..)) => eprintln!(
            "uncaged-workflow: thread {id} waits for its child thread {child} (step `{role}`); it continues when the child ends"
        ),
        None => eprintln!(
            "uncaged-workflow: thread {id} waits for a human answer for role `{role}`: `uncaged-workflow answer {id} TEXT`"
        ),
    }
    Ok(crate::error::exit::STATE)
}
