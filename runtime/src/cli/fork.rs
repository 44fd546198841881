//! `fork <id> [--from-role R | --at N]`.

use clap::Parser;

use super::GlobalOptions;
use super::follow::{AgentArgs, FollowArgs, hand_over};
use crate::run::lifecycle::{self, ForkAt};

/// Start a new thread from a prefix of another's steps, and run it.
///
/// The new thread (a new id) records `forkedFrom` in its start record and continues after the
/// kept steps; the original is left untouched. Without `--at` or `--from-role`, every step is
/// kept.
#[derive(Debug, Parser)]
pub struct ForkCommand {
    /// The thread to fork
    #[arg(add = clap_complete::ArgValueCompleter::new(super::completions::thread_ids))]
    pub id: String,
    /// Keep the steps before the last step of this role (it runs again)
    #[arg(long, value_name = "ROLE", conflicts_with = "at")]
    pub from_role: Option<String>,
    /// Keep the first N steps
    #[arg(long, value_name = "N")]
    pub at: Option<usize>,
    #[command(flatten)]
    pub agents: AgentArgs,
    #[command(flatten)]
    pub follow: FollowArgs,
}

impl ForkCommand {
    pub async fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let store = global.store()?;
        let id = store.threads().resolve(&self.id)?;
        let original = store.threads().read(id)?;
        let at = match (self.at, self.from_role) {
            (Some(n), _) => ForkAt::Steps(n),
            (None, Some(role)) => ForkAt::BeforeRole(role),
            (None, None) => ForkAt::All,
        };
        let keep = lifecycle::fork_point(&original, &at)?;
        let flags = self.agents.overrides()?;
        let (writer, fork) = lifecycle::fork(&store, &original, keep, flags)?;
        drop(writer);
        if !self.follow.detach && !self.follow.json {
            outln!("forked {id} at step {keep} into {}", fork.id())?;
        }
        let how = self.follow.how();
        Ok(hand_over(&store, original.start.hash, fork.id(), &Default::default(), how).await?)
    }
}
