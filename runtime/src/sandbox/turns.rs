//! What a durable agent's call, running in a thread, may know and do between its model
//! turns: the thread's budget and pause checked before each turn, each turn's cost added to
//! what the thread spent, its live text published to followers, and a person at the terminal
//! asked about a tool call.

use std::sync::Arc;

use futures::future::BoxFuture;
use parking_lot::Mutex;

use super::control::ThreadControl;
use crate::agents::{AgentFailure, ToolReplay, TurnHost};
use crate::store::config::Prices;
use crate::store::journal::Decision;
use crate::store::pauses::ToolWait;
use crate::store::queue::LiveText;
use crate::store::records::{Budget, Usage};

/// What a batch of agent calls has spent: the journal's count when the batch began, and each
/// turn since (shared by the batch's calls, which run concurrently).
#[derive(Debug, Default)]
pub struct Spending(Mutex<Usage>);

impl Spending {
    /// Starting from `spent`.
    pub fn from(spent: Usage) -> Arc<Self> {
        Arc::new(Spending(Mutex::new(spent)))
    }
}

/// The host of one durable agent call in a thread.
pub struct ThreadTurns {
    pub control: Arc<ThreadControl>,
    pub budget: Budget,
    /// When the thread started (ms since the epoch), for its duration budget.
    pub started: u64,
    pub spending: Arc<Spending>,
    pub prices: Arc<Prices>,
    /// The role the call answers (for the text followers see).
    pub role: String,
    /// The store's OAuth credentials of tool servers.
    pub credentials: Option<Arc<dyn crate::store::credentials::CredentialBackend>>,
    /// For a thread of an eval: the recorded thread whose tool results answer the same calls.
    pub baseline: Option<Arc<super::baseline::Baseline>>,
}

impl TurnHost for ThreadTurns {
    fn before_turn(&self) -> Result<(), AgentFailure> {
        // A hand-back (the worker stops) stops the loop here too: the thread goes on
        // elsewhere from its journal, at the turn it would have asked now.
        if self.control.pause_requested() || self.control.hand_back_requested() {
            return Err(AgentFailure::Paused);
        }
        if self.budget.is_empty() {
            return Ok(());
        }
        let elapsed = crate::clock::now_ms().saturating_sub(self.started);
        // The call itself was counted when it began: a turn is no new call.
        match self.budget.exceeded(&self.spending.0.lock(), elapsed, 0) {
            Some(reason) => Err(AgentFailure::OverBudget(reason)),
            None => Ok(()),
        }
    }

    fn price(&self, usage: &mut Usage) {
        usage.cost_usd = usage
            .model
            .as_ref()
            .and_then(|model| self.prices.get(model).map(|price| price.cost(usage)));
    }

    fn spent(&self, usage: &Usage) {
        self.spending.0.lock().add(&Usage { calls: 0, ..usage.clone() });
    }

    fn delta(&self, turn: u32, text: &str) {
        let role = self.role.clone();
        self.control.publish_delta(LiveText { role, turn, text: text.to_string() });
    }

    fn waits_for(&self, limit: &str) {
        self.control.waits_for(limit);
    }

    fn waited_for(&self, limit: &str) {
        self.control.waited_for(limit);
    }

    fn decide<'a>(&'a self, wait: &'a ToolWait) -> BoxFuture<'a, Option<Decision>> {
        Box::pin(self.control.human.decide(&self.role, wait))
    }

    fn credentials(&self) -> Option<Arc<dyn crate::store::credentials::CredentialBackend>> {
        self.credentials.clone()
    }

    fn replayed_tool(&self, tool: &str, arguments: &str) -> ToolReplay {
        match &self.baseline {
            Some(baseline) => baseline.replayed_tool(tool, arguments),
            None => ToolReplay::Make,
        }
    }
}
