//! `resume <id>`.

use clap::Parser;

use super::follow::follow;
use super::options::{AgentArgs, FollowArgs, GlobalOptions, parse_budget_raise};
use crate::run::actions;
use crate::store::pauses::DecidedBy;
use crate::store::records::Budget;

/// Continue a paused or interrupted thread after its last recorded step.
///
/// It runs in the bundle's live worker, or in a new one if none is live (for example after a
/// crash). Agent calls the interrupted step already made are answered from the thread's call
/// journal, not made again. Agent flags given here override the thread's recorded ones.
#[derive(Debug, Parser)]
pub struct ResumeCommand {
    /// The thread
    #[arg(add = clap_complete::ArgValueCompleter::new(super::complete::thread_ids))]
    pub id: String,
    #[command(flatten)]
    pub agents: AgentArgs,
    /// Raise the thread's budget first (repeatable): tokens=N, cost=USD, agent-calls=N,
    /// duration=D; in force from then on
    #[arg(long, value_name = "KEY=VALUE", value_parser = parse_budget_raise)]
    pub raise_budget: Vec<Budget>,
    #[command(flatten)]
    pub follow: FollowArgs,
}

impl ResumeCommand {
    pub async fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let store = global.store()?;
        let id = store.threads().resolve(&self.id)?;
        let flags = self.agents.overrides()?;
        let how = self.follow.how();
        if !self.raise_budget.is_empty() {
            let raise = self.raise_budget.iter().fold(Budget::default(), |b, r| b.raised(r));
            actions::raise_budget(&store, id, &raise, &DecidedBy::local("cli"))?;
        }
        let handed = actions::resume(&store, id, &flags, how.hand()).await?;
        Ok(follow(&store, handed, how).await?)
    }
}
