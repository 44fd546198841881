//! What a running thread writes that need not be durable on its own — journaled calls that
//! are free to make again (a scripted agent's answer) and its debug log — kept in memory
//! until the thread's next record, and written in that record's statement: a step costs
//! one statement, whatever it logged and however many such calls it made.
//!
//! The home directory leaves the same writes to the page cache: a crash loses what came
//! after the last step, never what a step depends on. A thread that logs faster than it
//! steps has its log capped here; lines past the cap are dropped and counted, never its
//! records or its journal.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::ids::ThreadId;

/// The most debug-log bytes a thread keeps waiting for its next record.
const MAX_LOG_BYTES: usize = 1 << 20;

/// What one thread has waiting.
#[derive(Debug, Default)]
pub struct Deferred {
    pub calls: Vec<String>,
    pub log: Vec<String>,
    log_bytes: usize,
    /// Lines of this thread went to the background writer since its last record: they are
    /// to be written before the lines here, for the log to keep its order.
    pub background: bool,
    /// Since when the thread waits on an agent, if it does: it waits until its next record.
    waiting_since: Option<Instant>,
}

/// The deferred writes of every thread this process runs.
#[derive(Debug, Default)]
pub struct DeferredWrites {
    by_thread: Mutex<HashMap<ThreadId, Deferred>>,
    dropped: AtomicU64,
}

impl DeferredWrites {
    /// Keeps journaled call `line` of thread `id` for its next record.
    pub fn call(&self, id: ThreadId, line: String) {
        self.by_thread.lock().entry(id).or_default().calls.push(line);
    }

    /// Keeps debug-log `lines` of thread `id` for its next record, as far as its cap allows.
    pub fn log(&self, id: ThreadId, lines: Vec<String>) {
        let mut by_thread = self.by_thread.lock();
        let deferred = by_thread.entry(id).or_default();
        for line in lines {
            if deferred.log_bytes + line.len() > MAX_LOG_BYTES {
                let total = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                if total.is_power_of_two() {
                    tracing::warn!(
                        "thread {id} logs faster than it steps: {total} debug log line(s) \
                         dropped so far (steps and journaled calls never are)"
                    );
                }
                continue;
            }
            deferred.log_bytes += line.len();
            deferred.log.push(line);
        }
    }

    /// Thread `id` begins to wait on an agent (a wait lasts until its next record).
    pub fn wait_begins(&self, id: ThreadId) {
        self.by_thread.lock().entry(id).or_default().waiting_since = Some(Instant::now());
    }

    /// The log lines of every thread that has waited on an agent for `longer_than` or more,
    /// taken for the background writer (their calls stay), by thread.
    pub fn take_logs_of_long_waits(&self, longer_than: Duration) -> Vec<(ThreadId, Vec<String>)> {
        let mut by_thread = self.by_thread.lock();
        by_thread
            .iter_mut()
            .filter(|(_, deferred)| {
                !deferred.log.is_empty()
                    && deferred.waiting_since.is_some_and(|since| since.elapsed() >= longer_than)
            })
            .map(|(id, deferred)| {
                deferred.log_bytes = 0;
                deferred.background = true;
                (*id, std::mem::take(&mut deferred.log))
            })
            .collect()
    }

    /// What thread `id` has waiting, taken for its record (which ends any wait).
    pub fn take(&self, id: ThreadId) -> Deferred {
        let mut by_thread = self.by_thread.lock();
        let Some(deferred) = by_thread.get_mut(&id) else { return Deferred::default() };
        std::mem::take(deferred)
    }

    /// The calls thread `id` has waiting, taken (its log stays).
    pub fn take_calls(&self, id: ThreadId) -> Vec<String> {
        let mut by_thread = self.by_thread.lock();
        by_thread
            .get_mut(&id)
            .map(|deferred| std::mem::take(&mut deferred.calls))
            .unwrap_or_default()
    }

    /// Forgets thread `id` (this process lets it go): what it had waiting, taken.
    pub fn forget(&self, id: ThreadId) -> Deferred {
        self.by_thread.lock().remove(&id).unwrap_or_default()
    }
}
