//! Moving a thread to another version of its workflow, with its call journal as the judge: the
//! thread's recorded steps are replayed through the new version (see [`super::replay`]), and it
//! moves only if the new version does what the thread did. The move is one record appended
//! under the thread's run lock — a crash leaves the thread on its old version, or on the new
//! one whole — and `resume`, `answer` or `retry` continue it on the new version.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::catalog::Catalog;
use super::replay::{self, Divergence, Verdict};
use crate::clock::now_ms;
use crate::error::{Error, Result};
use crate::ids::{BundleHash, ThreadId};
use crate::limits::Limits;
use crate::sandbox::engine::Runtime;
use crate::store::Storage;
use crate::store::records::{ThreadStatus, Upgrade, UpgradeRecord};

/// How long an upgrade waits for a running thread to pause after its current step.
const PAUSE_WAIT: Duration = Duration::from_secs(60);

/// The version to move to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The workflow's current version.
    Latest,
    /// A version in the workflow's history.
    Version(BundleHash),
}

/// What an upgrade did to one thread.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "camelCase")]
pub enum Outcome {
    /// It moved (or, in a dry run, would move) after `at_step` steps.
    Upgraded { from: BundleHash, to: BundleHash, at_step: usize, dry_run: bool },
    /// The new version does not do what the thread did: it stays as it was.
    Refused { from: BundleHash, to: BundleHash, divergence: Divergence },
    /// Nothing to do, or nothing that may be done: why.
    Skipped { reason: String },
}

/// Moves thread `id` to `target` (see the module), or says why not. A running thread is
/// paused first, after its current step (not in a dry run, which changes nothing).
pub async fn upgrade(
    store: &Storage,
    runtime: &Runtime,
    limits: &Limits,
    id: ThreadId,
    target: Target,
    dry_run: bool,
) -> Result<Outcome> {
    let mut record = store.threads().read(id)?;
    let status = record.status();
    if matches!(status, ThreadStatus::Completed | ThreadStatus::Killed) {
        return Ok(skipped(format!("it has ended ({})", status.as_str())));
    }
    let entry = Catalog::new(store).entry(&record.start.name)?;
    let to = match target {
        Target::Latest => entry.hash,
        Target::Version(hash) if hash == entry.hash => hash,
        Target::Version(hash) if entry.history.iter().any(|v| v.hash == hash) => hash,
        Target::Version(hash) => {
            return Err(Error::UnknownVersion {
                name: record.start.name.clone(),
                hash: hash.to_string(),
            });
        }
    };
    if record.version() == to {
        return Ok(skipped(format!("it runs {to} already")));
    }
    if record.is_live() {
        if dry_run {
            return Ok(skipped("it is running (a dry run does not pause it)".into()));
        }
        record = paused(store, id).await?;
    }
    let bundle = Catalog::new(store).load(runtime, &record.start.name, to)?;
    // Held while it is judged and moved: no worker takes it meanwhile, and one that holds it
    // (under a lease, on a database) keeps it.
    let (mut writer, record) = match store.threads().open(id) {
        Ok(open) => open,
        Err(e) if e.is_busy() => {
            return Ok(skipped("another process holds it (a worker, under a lease)".into()));
        }
        Err(e) => return Err(e),
    };
    // Read again under the lock: another upgrade may have moved it meanwhile.
    let from = record.version();
    if from == to {
        return Ok(skipped(format!("it runs {to} already")));
    }
    let mut calls = replay::recorded_calls(store, &record)?;
    let at_step = record.steps.len();
    // A failed thread moves for a retry: the new version must do what it did before it
    // failed; the failed step is run again, as the new version asks it.
    let mut judged = record.clone();
    if record.status_at_rest() == ThreadStatus::Failed {
        let point = super::retry::failure_point(&record);
        judged.steps.truncate(point);
        calls.retain(|line| match line {
            crate::store::journal::JournalLine::Call(c) => c.step < point,
            crate::store::journal::JournalLine::Loop(l) => l.step < point,
        });
    }
    match replay::replay(runtime, limits, &bundle, &judged, calls).await? {
        Verdict::Diverges(divergence) => Ok(Outcome::Refused { from, to, divergence }),
        Verdict::Compatible { .. } if dry_run => {
            Ok(Outcome::Upgraded { from, to, at_step, dry_run })
        }
        Verdict::Compatible { .. } => {
            let upgrade = Upgrade { from, to, at_step };
            crate::faults::crash_point("upgrade-judged");
            writer.append_upgrade(&UpgradeRecord { upgrade, timestamp: now_ms() })?;
            crate::faults::crash_point("upgrade-recorded");
            Ok(Outcome::Upgraded { from, to, at_step, dry_run })
        }
    }
}

fn skipped(reason: String) -> Outcome {
    Outcome::Skipped { reason }
}

/// Pauses running thread `id` and waits until it is at rest.
async fn paused(store: &Storage, id: ThreadId) -> Result<crate::store::records::ThreadRecord> {
    match super::control::pause(store, id).await {
        // Came to rest meanwhile.
        Ok(()) | Err(Error::ThreadState { .. }) => {}
        Err(e) => return Err(e),
    }
    let deadline = Instant::now() + PAUSE_WAIT;
    loop {
        let record = store.threads().read(id)?;
        if !record.is_live() {
            return Ok(record);
        }
        if Instant::now() > deadline {
            return Err(Error::ThreadBusy(id.to_string()));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
