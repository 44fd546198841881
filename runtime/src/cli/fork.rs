//! `fork <id> [--from-role R | --at N]`.

use clap::Parser;

use super::follow::follow;
use super::options::{AgentArgs, FollowArgs, GlobalOptions};
use crate::run::actions::{self, Forked};
use crate::run::lifecycle::ForkAt;

/// Start a new thread from a prefix of another's steps, and run it.
///
/// The new thread (a new id) records `forkedFrom` in its start record and continues after the
/// kept steps; the original is left untouched. Without `--at` or `--from-role`, every step is
/// kept.
#[derive(Debug, Parser)]
pub struct ForkCommand {
    /// The thread to fork
    #[arg(add = clap_complete::ArgValueCompleter::new(super::complete::thread_ids))]
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
        let at = match (self.at, self.from_role) {
            (Some(n), _) => ForkAt::Steps(n),
            (None, Some(role)) => ForkAt::BeforeRole(role),
            (None, None) => ForkAt::All,
        };
        let over = self.agents.overrides()?;
        let how = self.follow.how();
        let Forked { handed, kept } = actions::fork(&store, id, &at, &over, how.hand()).await?;
        if !self.follow.detach && !self.follow.json && !self.follow.quiet {
            outln!("forked {id} at step {kept} into {}", handed.id)?;
        }
        Ok(follow(&store, handed, how).await?)
    }
}
