//! When a pool worker looks at the queue again without being woken: at its next poll, or —
//! with room for a thread — just after another worker's lease on a runnable thread runs out,
//! so that a dead worker's thread is taken over as its lease ends, not up to a poll later; and
//! an idle on-demand worker stays while a dead worker's lease is still to run out.

use std::time::{Duration, Instant};

use super::POLL;
use crate::store::queue::WorkQueue;

/// How long after a lease runs out (by the database's clock) a worker looks to take it over.
const MARGIN: Duration = Duration::from_millis(10);

/// What a worker last learned of other workers' leases. The store is asked at most once a
/// poll: the worker's loop also turns at every wake-up and every thread that ends.
#[derive(Debug, Default)]
pub(super) struct Takeover {
    /// When the store was asked.
    asked: Option<Instant>,
    /// When the first lease another worker holds on a runnable thread runs out, if within a
    /// poll of then.
    due: Option<Instant>,
}

impl Takeover {
    /// How long to wait before looking at `queue` again, for a worker with `room` or not.
    pub(super) fn look_again(&mut self, queue: &dyn WorkQueue, room: bool) -> Duration {
        if !room {
            return POLL;
        }
        let now = Instant::now();
        let stale = self.asked.is_none_or(|asked| now.duration_since(asked) >= POLL)
            || self.due.is_some_and(|due| due <= now);
        if stale {
            let runs_out = queue.next_takeover(POLL).ok().flatten();
            *self = Takeover { asked: Some(now), due: runs_out.map(|d| now + d) };
        }
        match self.due {
            Some(due) => (due.saturating_duration_since(now) + MARGIN).min(POLL),
            None => POLL,
        }
    }
}

/// Whether an idle on-demand worker may exit: not while a dead worker's lease on a
/// runnable thread is still to run out, which this worker then takes over (with no worker
/// service, nobody else would, and the thread would stay queued until someone resumed it).
/// A store that cannot say lets it go.
pub(super) fn may_exit_idle(queue: &dyn WorkQueue, told: &mut bool) -> bool {
    match queue.orphaned_until() {
        Ok(Some(left)) => {
            if !*told {
                tracing::info!(
                    "worker {} stays: a dead worker's lease runs out in {left:?}, and its \
                     thread is taken over then",
                    std::process::id()
                );
                *told = true;
            }
            false
        }
        Ok(None) => true,
        Err(e) => {
            tracing::warn!("looking for a dead worker's leases: {e}");
            true
        }
    }
}
