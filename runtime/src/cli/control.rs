//! `kill <id>` and `pause <id> | --workflow NAME`: reach a running thread through its worker.

use clap::Parser;

use super::options::GlobalOptions;
use crate::run::control;

/// End a thread that has not ended, and record it `killed`: a running thread now (its guest is
/// interrupted even mid-call, an agent process it waits on is stopped), a paused, waiting or
/// interrupted one where it is.
#[derive(Debug, Parser)]
pub struct KillCommand {
    /// The thread
    #[arg(add = clap_complete::ArgValueCompleter::new(super::complete::thread_ids))]
    pub id: String,
}

/// Stop a running thread after its current step is persisted (and its running child
/// workflows' threads after theirs); `resume` continues it. With --workflow, pause a workflow
/// as a whole: its triggers, and every thread of it that runs.
#[derive(Debug, Parser)]
pub struct PauseCommand {
    /// The thread
    #[arg(
        required_unless_present = "workflow",
        conflicts_with = "workflow",
        add = clap_complete::ArgValueCompleter::new(super::complete::thread_ids)
    )]
    pub id: Option<String>,
    /// Pause this workflow: its triggers stop (`schedule resume --workflow` fires them again)
    /// and its running threads pause after their current step (`resume THREAD` each)
    #[arg(long, value_name = "NAME", add = clap_complete::ArgValueCompleter::new(super::complete::workflow_names))]
    pub workflow: Option<String>,
}

impl KillCommand {
    pub async fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let store = global.store()?;
        let id = store.threads().resolve(&self.id)?;
        control::kill(&store, id).await?;
        outln!("killed thread {id}")?;
        Ok(0)
    }
}

impl PauseCommand {
    pub async fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let store = global.store()?;
        if let Some(workflow) = &self.workflow {
            let paused = crate::schedule::phase::pause_workflow(&store, workflow).await?;
            for schedule in &paused.schedules {
                outln!("paused schedule {}", schedule.name)?;
            }
            for id in &paused.threads {
                outln!("thread {id} pauses after its current step")?;
            }
            if paused.schedules.is_empty() && paused.threads.is_empty() {
                outln!(
                    "workflow {workflow} has no trigger and no running thread: nothing to pause"
                )?;
            }
            return Ok(0);
        }
        let id = store.threads().resolve(self.id.as_deref().unwrap_or_default())?;
        control::pause(&store, id).await?;
        outln!("thread {id} pauses after its current step")?;
        Ok(0)
    }
}
