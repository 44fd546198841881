//! Fault injection for crash tests: `UNCAGED_WORKFLOW_CRASH_AT=<point>:<n>` makes the process
//! abort (no cleanup, like `kill -9`) the n-th time it passes `point`. Points:
//! `agent-call` (an agent is about to be asked), `agent-recorded` (its answer was journaled,
//! not yet given to the guest), `step-persisted` (a step was appended to the data file),
//! `thread-create` (a new thread's records are written and synced, not yet in place),
//! `thread-removing` (a removed thread's data file is renamed away, its journal not deleted),
//! `child-started` (a child workflow's thread exists, its parent's wait not recorded),
//! `thread-rested` (a thread ended or began to wait; a child's result not yet passed on),
//! `child-delivered` (a child's result is journaled in its parent, which is not handed over),
//! `upgrade-judged` / `upgrade-recorded` (before and after a thread's move to a version is
//! appended), `retry-reopening` / `retry-reopened` (before and after a retry is appended),
//! `hand-over-queued` (a home directory's thread is queued, not yet handed to its worker),
//! `start-created` (a started thread exists, not yet queued on a home directory),
//! `start-queued` (a started thread is queued, its start not yet answered nor handed over).
//! Unset, it costs one atomic load per point.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Environment variable naming the crash point.
pub const CRASH_ENV: &str = "UNCAGED_WORKFLOW_CRASH_AT";

static TARGET: OnceLock<Option<(String, usize)>> = OnceLock::new();
static PASSED: AtomicUsize = AtomicUsize::new(0);

/// Aborts the process if this is the configured crash point's n-th pass.
pub fn crash_point(point: &str) {
    let target = TARGET.get_or_init(|| {
        let value = std::env::var(CRASH_ENV).ok()?;
        let (name, n) = value.split_once(':')?;
        Some((name.to_string(), n.parse().ok()?))
    });
    if let Some((name, n)) = target
        && name == point
        && PASSED.fetch_add(1, Ordering::SeqCst) + 1 == *n
    {
        eprintln!("uncaged-workflow: crashing at `{point}` #{n} ({CRASH_ENV})");
        std::process::abort();
    }
}
