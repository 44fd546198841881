//! A budget several threads draw from at once: an eval's, over every thread it runs in its
//! process. Each live agent call's usage is added as it is answered; a thread about to ask
//! more than is left comes to rest (paused, reason `budget`) instead, as a thread over its own
//! budget does, and `eval resume` with a larger budget goes on.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::spending::{Budget, Usage};

/// What the threads may spend together, and what they have spent.
#[derive(Debug)]
pub struct SharedBudget {
    budget: Budget,
    /// When it began (ms since the epoch): its duration counts from then.
    since: u64,
    spent: Mutex<Usage>,
}

impl SharedBudget {
    /// `budget`, of which `spent` is spent since `since`.
    pub fn new(budget: Budget, since: u64, spent: Usage) -> Arc<Self> {
        Arc::new(SharedBudget { budget, since, spent: Mutex::new(spent) })
    }

    /// Why `calls` more agent calls would go over it, if they would.
    pub fn exceeded(&self, calls: u64) -> Option<String> {
        let elapsed = crate::clock::now_ms().saturating_sub(self.since);
        self.budget
            .exceeded(&self.spent.lock(), elapsed, calls)
            .map(|reason| format!("the eval's budget: {reason}"))
    }

    /// An agent call answered live, with what it reported it cost (a call is counted either
    /// way).
    pub fn spend(&self, usage: Option<&Usage>) {
        let mut spent = self.spent.lock();
        match usage {
            Some(usage) => spent.add(usage),
            None => spent.calls += 1,
        }
    }
}
