//! A thread whose run panicked, let go: the worker's list and the queue are left as if it had
//! stopped on an error, so that the worker neither waits for it forever nor takes it up again.

use std::sync::Arc;

use super::Worker;
use crate::ids::ThreadId;

/// Lets a thread go if its task ends without doing so itself — it panicked — so that the
/// worker does not wait for it forever (to hand it back at SIGTERM, or to exit when idle).
/// Its writer was dropped as the task unwound; it is taken out of the queue as well, so that
/// no worker (this one included) takes it up at once to fail the same way: it waits for
/// `resume`, as a thread stopped by an error does.
pub(super) struct Gone {
    worker: Arc<Worker>,
    id: ThreadId,
    ticket: i64,
    /// Whether the task took it off the list itself (the same thread may be on it again by
    /// then, claimed anew: that entry is not this task's).
    left: bool,
}

impl Gone {
    /// Watches the task that runs thread `id`, claimed with `ticket`.
    pub(super) fn new(worker: Arc<Worker>, id: ThreadId, ticket: i64) -> Self {
        Gone { worker, id, ticket, left: false }
    }

    /// The task takes its thread off the list, as it ends normally.
    pub(super) fn leave(&mut self) {
        self.worker.running.lock().remove(&self.id);
        self.left = true;
    }
}

impl Drop for Gone {
    fn drop(&mut self) {
        if self.left {
            return;
        }
        let (worker, id, ticket) = (self.worker.clone(), self.id, self.ticket);
        tracing::error!("thread {id}: its run stopped unexpectedly (see the panic above)");
        // The store may block: not on the unwinding task.
        tokio::task::spawn_blocking(move || {
            worker.settle(id, ticket, None);
            worker.running.lock().remove(&id);
            worker.changed.notify_waiters();
            worker.changed.notify_one();
        });
    }
}
