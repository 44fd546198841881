//! `resume <id>`.

use clap::Parser;

use super::GlobalOptions;
use super::follow::{AgentArgs, FollowArgs, follow};
use crate::run::actions;

/// Continue a paused or interrupted thread after its last recorded step.
///
/// It runs in the bundle's live worker, or in a new one if none is live (for example after a
/// crash). Agent calls the interrupted step already made are answered from the thread's call
/// journal, not made again. Agent flags given here override the thread's recorded ones.
#[derive(Debug, Parser)]
pub struct ResumeCommand {
    /// The thread
    #[arg(add = clap_complete::ArgValueCompleter::new(super::completions::thread_ids))]
    pub id: String,
    #[command(flatten)]
    pub agents: AgentArgs,
    #[command(flatten)]
    pub follow: FollowArgs,
}

impl ResumeCommand {
    pub async fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let store = global.store()?;
        let id = store.threads().resolve(&self.id)?;
        let flags = self.agents.overrides()?;
        let how = self.follow.how();
        let handed = actions::resume(&store, id, &flags, how.hand()).await?;
        Ok(follow(&store, handed, how).await?)
    }
}
