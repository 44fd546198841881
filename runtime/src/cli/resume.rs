//! `resume <id>`.

use clap::Parser;

use super::GlobalOptions;
use super::follow::{AgentArgs, FollowArgs, hand_over};
use crate::error::Error;
use crate::ids::ThreadId;
use crate::store::records::ThreadStatus;

/// Continue a paused or interrupted thread after its last recorded step.
///
/// It runs in the bundle's live worker, or in a new one if none is live (for example after a
/// crash). Agent calls the interrupted step already made are answered from the thread's call
/// journal, not made again. Agent flags given here override the thread's recorded ones.
#[derive(Debug, Parser)]
pub struct ResumeCommand {
    /// The thread
    pub id: String,
    #[command(flatten)]
    pub agents: AgentArgs,
    #[command(flatten)]
    pub follow: FollowArgs,
}

impl ResumeCommand {
    pub async fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let store = global.store()?;
        let id: ThreadId = self.id.parse()?;
        let record = store.threads().read(id)?;
        match record.status() {
            ThreadStatus::Running => return Err(Error::ThreadBusy(id.to_string()).into()),
            status if status.is_ended() => return Err(Error::ended(id, status.as_str()).into()),
            _ => {}
        }
        let flags = self.agents.overrides()?;
        let how = self.follow.how();
        Ok(hand_over(&store, record.start.hash, id, &flags, how).await?)
    }
}
