//! The one way a thread runs, whatever the store: [`Dispatch`] hands a thread to a worker and
//! follows it, reaches the worker that runs it, lists what the workers run, and runs a worker
//! that takes its threads through the store's work queue. Its two implementations are chosen
//! once, by how the store's threads are taken ([`Workers`]): [`local`] for a home directory
//! (a worker per bundle, started on demand, reached over its socket), [`shared`] for a
//! database (pools of workers on any machine, reached through the queue).
//!
//! What a follower hears is the library's [`Event`] (and a person's [`Question`]): the CLI,
//! `--json` and the web view render it; the worker's socket protocol is only how a local
//! worker sends it.

pub mod local;
pub mod shared;

use std::sync::Arc;

use futures::future::BoxFuture;

use crate::agents::AgentFlags;
use crate::error::Result;
use crate::ids::{BundleHash, ThreadId};
use crate::run::events::Event;
use crate::run::ipc::PsEntry;
use crate::run::worker::WorkerOptions;
use crate::store::Storage;
use crate::store::queue::Workers;

/// What a worker said when it took a thread.
#[derive(Debug, Clone, Copy)]
pub struct Accepted {
    /// The worker's process id; none when the thread was queued for any worker.
    pub pid: Option<u32>,
    /// Whether the bundle came precompiled from the AOT cache.
    pub cache_hit: bool,
    /// How many steps the thread had (it continues after them).
    pub steps: usize,
}

/// A `human` agent's question, for a person following the thread.
#[derive(Debug, Clone, PartialEq)]
pub struct Question {
    pub role: String,
    pub system_prompt: String,
    /// The thread rendered for reading.
    pub context: String,
    /// A JSON value of the shape the answer must have, if it must have one.
    pub expected: Option<String>,
    /// Why the last answer was refused, when the question is asked again.
    pub error: Option<String>,
}

/// What a follower of a thread hears.
#[derive(Debug, Clone)]
pub enum Heard {
    /// Something happened to the thread.
    Event(Event),
    /// A person is asked for an answer: [`Follower::answer`] gives it.
    Question(Question),
    /// The run failed where it ran (not the thread: its store, its worker); `code` is the
    /// exit code it maps to.
    Failed { message: String, code: i32 },
}

/// A thread handed over, followed.
pub trait Follower: Send {
    /// What is heard next; `None` when the run went away without a last event.
    fn next(&mut self) -> BoxFuture<'_, Result<Option<Heard>>>;

    /// Answers the question last heard; `None` declines (the thread then waits).
    fn answer(&mut self, text: Option<String>) -> BoxFuture<'_, Result<()>>;
}

/// How threads reach the workers that run them, on one store.
pub trait Dispatch: Send + Sync {
    /// The store.
    fn store(&self) -> &Storage;

    /// Hands thread `id` of bundle `hash` to a worker, with `flags` overriding the thread's
    /// recorded agents; with `follow`, what it does is heard through the follower (and a
    /// person following may answer its `human` agents).
    fn hand_over<'a>(
        &'a self,
        id: ThreadId,
        hash: BundleHash,
        flags: &'a AgentFlags,
        follow: bool,
    ) -> BoxFuture<'a, Result<(Box<dyn Follower>, Accepted)>>;

    /// Whether a worker that runs thread `id` of bundle `hash` can be reached (a thread a
    /// `step` command runs in its own process has none).
    fn reachable(&self, hash: BundleHash) -> BoxFuture<'_, Result<bool>>;

    /// Tells the workers of bundle `hash` that a request for one of their threads waits in the
    /// queue (where the store does not wake them itself).
    fn wake(&self, hash: BundleHash) -> BoxFuture<'_, Result<()>>;

    /// The threads live workers run (and, on a shared store, those queued for one).
    fn running(&self) -> BoxFuture<'_, Result<Vec<PsEntry>>>;

    /// Runs a worker that takes threads through the store's queue, until it is done.
    fn work(&self, options: WorkerOptions) -> BoxFuture<'_, Result<()>>;
}

/// The dispatch of `store`.
pub fn of(store: &Storage) -> Arc<dyn Dispatch> {
    match store.queue().workers() {
        Workers::PerBundle => Arc::new(local::LocalDispatch::new(store)),
        Workers::Pool => Arc::new(shared::SharedDispatch::new(store)),
    }
}
