//! `kill <id>` and `pause <id>`: reach a running thread through its worker.

use clap::Parser;

use super::GlobalOptions;
use crate::run::control;

/// End a thread that has not ended, and record it `killed`: a running thread now (its guest is
/// interrupted even mid-call, an agent process it waits on is stopped), a paused, waiting or
/// interrupted one where it is.
#[derive(Debug, Parser)]
pub struct KillCommand {
    /// The thread
    #[arg(add = clap_complete::ArgValueCompleter::new(super::completions::thread_ids))]
    pub id: String,
}

/// Stop a running thread after its current step is persisted; `resume` continues it.
#[derive(Debug, Parser)]
pub struct PauseCommand {
    /// The thread
    #[arg(add = clap_complete::ArgValueCompleter::new(super::completions::thread_ids))]
    pub id: String,
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
        let id = store.threads().resolve(&self.id)?;
        control::pause(&store, id).await?;
        outln!("thread {id} pauses after its current step")?;
        Ok(0)
    }
}
