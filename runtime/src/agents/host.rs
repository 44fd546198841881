//! What the thread an agent's call runs in lets the call know and do: its budget and a pause
//! checked before each model turn, each turn's cost priced and added up, its live text and its
//! waits for a provider limit told to watchers, a person at the terminal asked about a tool
//! call. A call outside a thread has [`Unhosted`].

use std::sync::Arc;

use futures::future::BoxFuture;

use super::AgentFailure;
use crate::store::journal::Decision;
use crate::store::pauses::ToolWait;
use crate::store::records::Usage;

/// What the thread a durable agent's call runs in lets it know and do between turns.
///
/// Each method's default is a host with nothing to enforce or tell: no budget, no pause,
/// nobody to ask (a call outside a thread).
pub trait TurnHost: Send + Sync {
    /// Before each model turn: whether it may be asked (the thread's budget, a pause).
    fn before_turn(&self) -> Result<(), AgentFailure> {
        Ok(())
    }
    /// A turn's usage, priced, as the journal keeps it.
    fn price(&self, _usage: &mut Usage) {}
    /// What a turn cost, once journaled.
    fn spent(&self, _usage: &Usage) {}
    /// Text the model is writing in turn `turn` (from 1), as it comes (`stream: true`).
    fn delta(&self, _turn: u32, _text: &str) {}
    /// A request waits for its turn in provider limit `limit`…
    fn waits_for(&self, _limit: &str) {}
    /// …and no longer does.
    fn waited_for(&self, _limit: &str) {}
    /// A person's decision about a tool call, if one is at a terminal to make it now;
    /// `None`: the thread waits for one.
    fn decide<'a>(&'a self, _wait: &'a ToolWait) -> BoxFuture<'a, Option<Decision>> {
        Box::pin(async { None })
    }
    /// Where the OAuth credentials of tool servers are kept (none: a server that needs them
    /// cannot be reached).
    fn credentials(&self) -> Option<Arc<dyn crate::store::credentials::CredentialBackend>> {
        None
    }
    /// What to do with a tool call the model asks for (`tool` as the model names it, its
    /// `arguments` as it wrote them): a thread of an eval may answer it from the recorded
    /// thread, refuse it, or stop the call; anywhere else it is made.
    fn replayed_tool(&self, _tool: &str, _arguments: &str) -> ToolReplay {
        ToolReplay::Make
    }
}

/// What a thread of an eval says of a tool call a durable agent is about to make.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolReplay {
    /// Make it.
    Make,
    /// Do not: the recorded thread made it, and this was its result.
    Answer { content: String, is_error: bool },
    /// Do not: the model is given this refusal as its result.
    Deny(String),
    /// Do not, and stop the call: the thread diverged from the recorded one here.
    Diverged(String),
}

/// The host of a call outside a thread (the planner, the extractor, a test): no budget, no
/// pause, nobody to ask or tell.
#[derive(Default)]
pub struct Unhosted;

impl TurnHost for Unhosted {}
