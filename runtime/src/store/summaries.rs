//! A thread as listings show it: where it is in its life (its status), and the summary every
//! store keeps beside a thread, so that a listing of 100,000 threads reads none of them.

use serde::{Deserialize, Serialize};

use crate::ids::{BundleHash, ThreadId};

/// A thread as listings show it (`threads`, `ps`, `threads prune`): what a store can keep in
/// an index so that a listing reads no thread (the file store's is binary: no field names).
/// Its fields, in this order, are a binary layout (postcard) in the file store's index and in
/// the database's packed listings: a change to them counts up `thread_index::VERSION` and
/// `postgres::summary::LAYOUT`, so that what was written before is read again, not misread.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ThreadSummary {
    pub thread_id: ThreadId,
    pub name: String,
    pub hash: BundleHash,
    pub status: ThreadStatus,
    pub steps: usize,
    /// When the thread started.
    pub timestamp: u64,
    /// The start of the prompt ([`SUMMARY_PROMPT_CHARS`] characters at most).
    pub prompt: String,
    pub return_code: Option<i32>,
    /// When it ended, if it has.
    pub ended: Option<u64>,
    /// For a waiting thread: the role a person must answer for, and since when.
    pub waiting_role: Option<String>,
    pub paused_at: Option<u64>,
    /// The schedule that started it, if one did.
    pub schedule: Option<String>,
    /// The tokens its agents reported, in and out (0 when none did); absent from summaries
    /// stored before they were kept, as their cost (when `prices:` priced any) is.
    #[serde(default)]
    pub tokens: u64,
    #[serde(default)]
    pub cost_usd: Option<f64>,
    /// The thread whose step started this one as a child workflow, if one did.
    #[serde(default)]
    pub parent: Option<ThreadId>,
    /// Who asked for it from outside ([`StartedBy::line`]), if a request did.
    #[serde(default)]
    pub started_by: Option<String>,
}

impl ThreadSummary {
    /// The eval it is a thread of, if it is one (an eval starts its threads as `eval ID`).
    pub fn experiment(&self) -> Option<ThreadId> {
        self.started_by.as_deref()?.strip_prefix(EVAL_STARTER)?.parse().ok()
    }
}

/// How an eval's threads say who started them: `eval ` and the eval's id.
pub const EVAL_STARTER: &str = "eval ";

/// How much of a prompt a [`ThreadSummary`] keeps: enough to tell threads apart in a listing
/// (which shows 40), little enough that an index of 100,000 threads stays small (the whole
/// prompt is in the thread's start record).
pub const SUMMARY_PROMPT_CHARS: usize = 120;

/// Where a thread is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ThreadStatus {
    /// A process is running it now.
    Running,
    /// Stopped between steps; `resume` or `step` continues it.
    Paused,
    /// Stopped until a person answers for a `human` agent (`answer`).
    Waiting,
    /// Its process died mid-run (crash, `kill -9`); `resume` continues from the last step.
    Interrupted,
    Completed,
    Failed,
    Killed,
    /// Waiting in a shared store's queue for a worker to take it. (Last, so that the listing
    /// index written before it was kept reads the same.)
    Queued,
}

impl ThreadStatus {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            ThreadStatus::Running => "running",
            ThreadStatus::Queued => "queued",
            ThreadStatus::Paused => "paused",
            ThreadStatus::Waiting => "waiting",
            ThreadStatus::Interrupted => "interrupted",
            ThreadStatus::Completed => "completed",
            ThreadStatus::Failed => "failed",
            ThreadStatus::Killed => "killed",
        }
    }

    /// Every status, in the order of a thread's life.
    pub const ALL: [ThreadStatus; 8] = [
        ThreadStatus::Queued,
        ThreadStatus::Running,
        ThreadStatus::Paused,
        ThreadStatus::Waiting,
        ThreadStatus::Interrupted,
        ThreadStatus::Completed,
        ThreadStatus::Failed,
        ThreadStatus::Killed,
    ];

    /// The status named `name` (as [`as_str`](Self::as_str) writes it).
    pub fn named(name: &str) -> Option<ThreadStatus> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }
}
