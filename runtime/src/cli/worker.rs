//! `worker [HASH]`: on a database store, the process each machine runs to take threads of any
//! bundle from the queue; with a bundle hash (internal), the process `run` starts to host that
//! bundle's threads on this machine.

use clap::Parser;

use super::options::GlobalOptions;
use crate::ids::BundleHash;
use crate::run::dispatch;
use crate::run::worker::WorkerOptions;
use crate::store::queue::Scope;

const AFTER_HELP: &str = "\
On a database store (--store postgres://… or UNCAGED_WORKFLOW_STORE), run one worker per
machine, or several: each claims runnable threads of any workflow, up to --max-threads at
once, renewing a lease on each; a worker that dies loses its leases, and the others take its
threads over where they stopped. On SIGTERM or Ctrl-C it stops claiming, lets each thread
finish the step at hand (for --grace at most), hands its threads back to the queue, and
exits: the other workers continue them, with no command. Secrets for agents come from the
worker's own environment.

Examples:
  UNCAGED_WORKFLOW_STORE=postgres://flows@db/flows uncaged-workflow worker
  uncaged-workflow worker --store postgres://flows@db/flows --max-threads 200";

/// Run threads from a database store's queue (or, with HASH, serve one bundle's threads on
/// this machine: started by `run`, not for direct use)
///
/// Once it is up the worker prints `ready <pid>` on stdout, the one line it ever writes
/// there: the process that started it waits for that line instead of polling.
#[derive(Debug, Parser)]
#[command(after_help = AFTER_HELP)]
pub struct WorkerCommand {
    /// The bundle (a home-directory store's per-bundle worker)
    pub hash: Option<String>,
    /// Most threads this worker runs at once [default: limits.max-threads]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_threads: Option<u32>,
    /// Exit after a few seconds with nothing to run (how `run` starts one when no worker is
    /// alive)
    #[arg(long)]
    pub exit_when_idle: bool,
    /// On SIGTERM, how long threads may take to finish the step at hand before they are
    /// handed back in the middle of it (their agent call is then asked again elsewhere)
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration, default_value = "30s")]
    pub grace: std::time::Duration,
}

impl WorkerCommand {
    pub async fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let store = global.store()?;
        let scope = match &self.hash {
            Some(hash) => Scope::Bundle(hash.parse::<BundleHash>()?),
            None => Scope::Any,
        };
        let limits = crate::limits::Limits::resolve(&store.config()?.limits, &Default::default())?;
        let options = WorkerOptions {
            scope,
            max_threads: self.max_threads.map_or(limits.max_threads, |n| n as usize),
            exit_when_idle: self.exit_when_idle.then_some(dispatch::shared::ON_DEMAND_IDLE),
            grace: self.grace,
            children: Some(crate::run::children::StoreChildren::shared(&store)),
        };
        dispatch::of(&store).work(options).await?;
        Ok(0)
    }
}
