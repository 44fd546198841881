//! A thread's moves to other versions of its workflow, and its retries: each recorded as a line
//! of its own, kept wherever it falls among the steps. The thread runs the version of its last
//! move (or the one it started on); its records stay where they were first stored.

use serde::{Deserialize, Serialize};

use crate::ids::BundleHash;

/// A line of a thread: it moved from one version to another.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpgradeRecord {
    pub upgrade: Upgrade,
    pub timestamp: u64,
}

/// A move of a thread to another version, checked by replaying its steps through it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Upgrade {
    pub from: BundleHash,
    pub to: BundleHash,
    /// How many steps the thread had when it moved.
    pub at_step: usize,
}

/// A line of a thread: a failed thread reopened to continue from the step that failed. It
/// clears the thread's end, and the calls of that step on (journaled before it) are forgotten:
/// they are made again. A DAG's retry carries the records that set its failed step, and those
/// skipped because of it, to run again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetryRecord {
    pub retry: Retry,
    pub timestamp: u64,
}

/// A retry of a failed thread.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Retry {
    /// The steps the thread keeps (all it had, or fewer with `retry --from-step`): those after
    /// are history, and the calls of this step and after, journaled before the retry, are
    /// forgotten.
    pub from_step: usize,
    /// Why it failed (its end's summary).
    pub reason: String,
    /// Steps recorded with the retry (a DAG's `$user` records that set steps to run again).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<super::steps::StepRecord>,
}
