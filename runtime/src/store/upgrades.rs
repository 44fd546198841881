//! A thread's moves to other versions of its workflow: each recorded as a line of its own,
//! kept wherever it falls among the steps. The thread runs the version of its last move (or
//! the one it started on); its records stay where they were first stored.

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
