//! `retry <thread> [--to HASH | --latest]`.

use clap::Parser;

use super::follow::follow;
use super::options::{AgentArgs, FollowArgs, GlobalOptions};
use crate::error::exit;
use crate::ids::BundleHash;
use crate::limits::Limits;
use crate::run::upgrade::{self, Outcome, Target};
use crate::run::{actions, retry};
use crate::sandbox::engine::Runtime;
use crate::terminal;

const AFTER_HELP: &str = "\
Examples:
  uncaged-workflow retry 01M8AYRD
  uncaged-workflow add review review-fixed.yaml && uncaged-workflow retry 01M8AYRD --latest";

/// Continue a failed thread from the step that failed, in place: the steps that succeeded
/// stay, with their journaled calls; the failed step's calls are made again. In a DAG, the
/// failed steps and those skipped because of them run again, and nothing else. With
/// --from-step N it continues after its first N steps.
///
/// With --to or --latest it first moves the thread to that version, as `upgrade` does (refused
/// if the version diverges from what the thread did): fix the bundle, `add` it, `retry
/// --latest`, and no agent call is paid twice.
#[derive(Debug, Parser)]
#[command(after_help = AFTER_HELP)]
pub struct RetryCommand {
    /// The failed thread
    #[arg(add = clap_complete::ArgValueCompleter::new(super::complete::thread_ids))]
    pub id: String,
    /// Move it to this version of its workflow first
    #[arg(long, value_name = "HASH", conflicts_with = "latest")]
    pub to: Option<BundleHash>,
    /// Move it to its workflow's current version first
    #[arg(long)]
    pub latest: bool,
    /// Continue after its first N steps instead (those after stay in its history, not in the
    /// thread; their calls are made again)
    #[arg(long, value_name = "N")]
    pub from_step: Option<usize>,
    #[command(flatten)]
    pub agents: AgentArgs,
    #[command(flatten)]
    pub follow: FollowArgs,
}

impl RetryCommand {
    pub async fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let store = global.store()?;
        let id = store.threads().resolve(&self.id)?;
        let flags = self.agents.overrides()?;
        let how = self.follow.how();
        let target = match (self.to, self.latest) {
            (Some(hash), _) => Some(Target::Version(hash)),
            (None, true) => Some(Target::Latest),
            (None, false) => None,
        };
        if let Some(target) = target {
            let runtime = Runtime::new(store.home())?;
            let limits = Limits::resolve(&store.config()?.limits, &Default::default())?;
            match upgrade::upgrade(&store, &runtime, &limits, id, target, false).await? {
                Outcome::Refused { to, divergence, .. } => {
                    eprintln!(
                        "uncaged-workflow: thread {id} stays as it was: {to} diverges at step {}: {}",
                        divergence.step,
                        terminal::line(&divergence.reason)
                    );
                    return Ok(exit::DIVERGED);
                }
                Outcome::Upgraded { from, to, at_step, .. } if !how.json && !how.quiet => {
                    eprintln!("thread {id}: upgraded from {from} to {to} after step {at_step}");
                }
                _ => {}
            }
        }
        let retried = retry::reopen(&store, id, self.from_step)?;
        if !how.json && !how.quiet {
            eprintln!(
                "thread {id}: retried after step {} ({})",
                retried.from_step,
                terminal::line(&retried.reason)
            );
        }
        let handed = actions::resume(&store, id, &flags, how.hand()).await?;
        Ok(follow(&store, handed, how).await?)
    }
}
