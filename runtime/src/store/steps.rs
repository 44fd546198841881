//! A thread's role outputs as stored: one record per step, and the parallel group a step may
//! belong to.

use serde::{Deserialize, Serialize};

use crate::spending::Usage;

/// One role output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepRecord {
    pub role: String,
    pub content: String,
    pub meta: serde_json::Value,
    pub timestamp: u64,
    /// Set on each step of a parallel group: the steps that ran together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<StepGroup>,
    /// The agent binding that answered for the role (absent when no agent was asked, and in
    /// records written before it was kept). The host's, like the timestamp: every store and
    /// every view shows the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// How long the step took: the whole generator step, or for a step of a parallel group
    /// its own agent call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// The tokens (and, where a price is configured, the money) the step's agent calls cost,
    /// as their services reported them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// The parallel group a step belongs to: steps `first ..= first + size - 1` (1-based) ran
/// together, and were persisted together. A thread holds a group whole or not at all: one
/// cut short by a crash is dropped when the thread is read, and its calls are answered
/// again from the journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepGroup {
    pub first: usize,
    pub size: usize,
}

impl StepGroup {
    /// The last step of the group (1-based).
    pub fn last(self) -> usize {
        self.first + self.size - 1
    }
}
