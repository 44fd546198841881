//! A step that runs another workflow, as the sandbox sees it: the run layer (which can start
//! threads) starts the child thread, once per call whatever crashes in between, and says
//! whether it has ended; the call is answered with the child's result, or the thread waits on
//! the child with no worker busy.

use futures::future::BoxFuture;

use crate::agents::{AgentAnswer, AgentFailure};
use crate::ids::ThreadId;

/// How deep children may nest: a workflow that runs itself stops here, not at the disk's end.
pub const MAX_DEPTH: u32 = 8;

/// A call of a parent's step that runs a child workflow.
#[derive(Debug, Clone)]
pub struct ChildCall {
    pub parent: ThreadId,
    /// The step (its role) that runs the child.
    pub role: String,
    /// The call's place in the parent (step, 0-based, and position) and its request digest:
    /// what makes the child started for it the same one when the call is made again.
    pub step: usize,
    pub seq: usize,
    pub digest: String,
    pub workflow: String,
    pub prompt: String,
    /// The step's input (`{"step", "inputs", "item"?}`): its `inputs` are the trigger data.
    pub input: Option<String>,
    /// How deep the parent is (0: no thread started it).
    pub depth: u32,
    /// What the child runs with: the parent's default agent and directory.
    pub request: crate::run_request::RunRequest,
}

/// Where a child is.
#[derive(Debug)]
pub enum ChildState {
    /// It has ended: its result is the call's answer, or its failure the call's.
    Ended(Result<AgentAnswer, AgentFailure>),
    /// It runs (or waits): the parent waits on it.
    Running(ThreadId),
}

/// Starts and looks up child threads for the sandbox (implemented by the run layer).
pub trait Children: Send + Sync + std::fmt::Debug {
    /// The child `call` runs, started if it is not yet (once per call), and where it is.
    fn call(&self, call: ChildCall) -> BoxFuture<'_, ChildState>;

    /// Thread `id` came to rest (ended, or waiting): a parent waiting on it, or a child it
    /// waits on that has ended, is passed on.
    fn rested(&self, id: ThreadId) -> BoxFuture<'_, ()>;
}
