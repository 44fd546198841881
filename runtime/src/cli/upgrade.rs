//! `upgrade <thread> | --workflow NAME --all [--status S] [--to HASH | --latest] [--dry-run]`.

use clap::Parser;
use serde_json::json;

use super::options::GlobalOptions;
use super::output::print_json;
use crate::error::exit;
use crate::ids::BundleHash;
use crate::limits::Limits;
use crate::run::query::{self, ThreadQuery};
use crate::run::upgrade::{self, Outcome, Target};
use crate::sandbox::engine::Runtime;
use crate::store::records::ThreadStatus;
use crate::terminal;

const AFTER_HELP: &str = "\
Exits 0 when every thread upgraded (or had nothing to do), 79 when one was refused.

Examples:
  uncaged-workflow upgrade 01M8AYRD --latest --dry-run
  uncaged-workflow upgrade 01M8AYRD --to 4PANMSYWZEF6T
  uncaged-workflow upgrade --workflow review --all --status failed";

/// Move a thread to another version of its workflow, if the new version does what the thread
/// did: its recorded steps are replayed through it, its call journal answering every call.
///
/// A paused, interrupted, waiting or failed thread can move; a running one is paused first,
/// after its current step. A thread the new version diverges from is refused, naming the step
/// and the difference, and stays exactly as it was. `resume` (or `answer`, `retry`) continues
/// an upgraded thread on its new version; `thread` shows the move.
#[derive(Debug, Parser)]
#[command(after_help = AFTER_HELP)]
pub struct UpgradeCommand {
    /// The thread
    #[arg(
        required_unless_present = "workflow",
        conflicts_with = "workflow",
        add = clap_complete::ArgValueCompleter::new(super::complete::thread_ids)
    )]
    pub id: Option<String>,
    /// Upgrade threads of this workflow (with --all)
    #[arg(long, value_name = "NAME", requires = "all", add = clap_complete::ArgValueCompleter::new(super::complete::workflow_names))]
    pub workflow: Option<String>,
    /// Every thread of --workflow that has not ended (or those in --status)
    #[arg(long, requires = "workflow")]
    pub all: bool,
    /// Only threads in this status (repeatable): paused, interrupted, waiting, failed, running
    #[arg(long, value_name = "STATUS", requires = "all", value_parser = parse_status)]
    pub status: Vec<ThreadStatus>,
    /// The version to move to: a hash in the workflow's history
    #[arg(long, value_name = "HASH", conflicts_with = "latest")]
    pub to: Option<BundleHash>,
    /// The workflow's current version (the default)
    #[arg(long)]
    pub latest: bool,
    /// Say what would happen, and change nothing
    #[arg(long)]
    pub dry_run: bool,
    /// Print the report as JSON
    #[arg(long)]
    pub json: bool,
}

fn parse_status(text: &str) -> Result<ThreadStatus, String> {
    ThreadStatus::ALL
        .iter()
        .copied()
        .find(|s| s.as_str() == text)
        .ok_or_else(|| format!("`{text}` is not a thread status"))
}

impl UpgradeCommand {
    pub async fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let store = global.store()?;
        let target = self.to.map_or(Target::Latest, Target::Version);
        let ids = match (&self.id, &self.workflow) {
            (Some(id), _) => vec![store.threads().resolve(id)?],
            (None, Some(workflow)) => {
                store.registry().get(workflow)?;
                let query = ThreadQuery { workflow: Some(workflow.clone()), ..Default::default() };
                let mut ids: Vec<_> = query::threads(&store, &query)?
                    .threads
                    .into_iter()
                    .filter(|t| match self.status.is_empty() {
                        true => !t.status.is_ended() || t.status == ThreadStatus::Failed,
                        false => self.status.contains(&t.status),
                    })
                    .map(|t| t.thread_id)
                    .collect();
                ids.reverse();
                ids
            }
            (None, None) => unreachable!("clap requires a thread or --workflow"),
        };
        let runtime = Runtime::new(store.home())?;
        let limits = Limits::resolve(&store.config()?.limits, &Default::default())?;
        let mut report = Vec::new();
        for id in ids {
            let outcome =
                upgrade::upgrade(&store, &runtime, &limits, id, target, self.dry_run).await?;
            report.push((id, outcome));
        }
        let refused = report.iter().filter(|(_, o)| matches!(o, Outcome::Refused { .. })).count();
        if self.json {
            let threads: Vec<_> = report
                .iter()
                .map(|(id, outcome)| json!({"thread": id.to_string(), "result": outcome}))
                .collect();
            print_json(&json!({"dryRun": self.dry_run, "refused": refused, "threads": threads}))?;
        } else {
            for (id, outcome) in &report {
                match outcome {
                    Outcome::Upgraded { from, to, at_step, dry_run } => {
                        let verb = if *dry_run { "would upgrade" } else { "upgraded" };
                        outln!("{id}  {verb} from {from} to {to} after step {at_step}")?;
                    }
                    Outcome::Refused { from, to, divergence } => {
                        outln!(
                            "{id}  refused from {from} to {to}: diverges at step {}: {}",
                            divergence.step,
                            terminal::line(&divergence.reason)
                        )?;
                        super::output::print_divergence(divergence)?;
                    }
                    Outcome::Skipped { reason } => {
                        outln!("{id}  skipped: {}", terminal::line(reason))?;
                    }
                }
            }
            if report.is_empty() {
                outln!("no thread to upgrade")?;
            }
        }
        Ok(if refused > 0 { exit::DIVERGED } else { 0 })
    }
}
