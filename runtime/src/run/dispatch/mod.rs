//! The one way a thread runs, whatever the store: [`Dispatch`] hands a thread to a worker and
//! follows it, asks the worker that runs it to kill or pause it, lists what the workers run,
//! and runs a worker of the store's kind. Its two implementations are chosen
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

use crate::error::Result;
use crate::ids::{BundleHash, ThreadId};
use crate::run::events::{Event, PsEntry};
use crate::run::worker::WorkerOptions;
use crate::run_request::RunRequest;
use crate::store::Storage;
use crate::store::queue::{ControlRequest, Workers};
use crate::store::records::StartRecord;

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
    /// For a durable agent: the tool call a person decides about, instead of the role's
    /// answer (the answer is a decision: see [`crate::agents::human::parse_decision`]).
    pub tool: Option<crate::store::pauses::ToolWait>,
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

/// How a kill or pause asked of a thread's worker went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asked {
    /// The worker that holds the thread has the request, and was woken for it.
    Asked,
    /// No worker holds the thread (it waits in the queue, or is at rest).
    NotHeld,
}

/// How threads reach the workers that run them, on one store. The choice between a home
/// directory's per-bundle workers and a database's pools is made once, in [`of`].
pub trait Dispatch: Send + Sync {
    /// Hands thread `id` of bundle `hash` to a worker, with `over` laid over its recorded run
    /// request (empty to run it as recorded); with `follow`, what it does is heard through the
    /// follower (and a person following may answer its `human` agents).
    fn hand_over<'a>(
        &'a self,
        id: ThreadId,
        hash: BundleHash,
        over: &'a RunRequest,
        follow: bool,
    ) -> BoxFuture<'a, Result<(Box<dyn Follower>, Accepted)>>;

    /// Creates the thread `start` records (a new one, with no steps) and hands it to a worker,
    /// detached: as [`ThreadStore::create_at_rest`] and [`hand_over`](Self::hand_over) do, in
    /// as few durable writes as the store allows (on a database, one statement creates it
    /// queued; the workers' notification goes out as it commits). It returns once the thread
    /// is durable and sure to run: on a database once it is queued; on a home directory once
    /// a worker has it, or, for a store [handing over after the
    /// answer](crate::store::Storage::handing_over_after_answer), once it is queued.
    ///
    /// [`ThreadStore::create_at_rest`]: crate::store::ThreadStore::create_at_rest
    fn start<'a>(&'a self, start: &'a StartRecord) -> BoxFuture<'a, Result<()>>;

    /// Hands over the starts answered once queued whose process died before it handed them
    /// to a worker ([`WorkQueue::orphaned_starts`](crate::store::queue::WorkQueue::orphaned_starts)),
    /// with this process's secrets; how many. A database's workers claim queued threads
    /// themselves: none there, but a worker is made sure of when threads wait in its queue.
    fn hand_over_orphaned_starts(&self) -> BoxFuture<'_, Result<usize>>;

    /// Asks the worker that holds thread `id` (of bundle `hash`) to kill or pause it, and
    /// wakes it. A thread held by a process that is no worker (a `step` in progress) is
    /// refused with [`Error::ThreadState`](crate::Error::ThreadState).
    fn ask(
        &self,
        id: ThreadId,
        hash: BundleHash,
        request: ControlRequest,
    ) -> BoxFuture<'_, Result<Asked>>;

    /// The threads live workers run (and, on a shared store, those queued for one).
    fn running(&self) -> BoxFuture<'_, Result<Vec<PsEntry>>>;

    /// Runs a worker of this store until it is done: a bundle's, serving its socket, on a home
    /// directory; a pool worker taking threads from the queue, on a database.
    fn work(&self, options: WorkerOptions) -> BoxFuture<'_, Result<()>>;

    /// Follows thread `id` from now on, for a follower that does not hold the thread's run
    /// (the web view, the API, an MCP call): a model's deltas, and a word each time a step of
    /// it is stored (read the store then, rather than polling it). From the worker that runs
    /// it, over its socket, on a home directory (none when no worker runs it now: the news
    /// ends with the run); through the store's notifications, on a database.
    fn live(&self, id: ThreadId) -> BoxFuture<'_, Result<Option<LiveNews>>>;
}

/// What a follower hears of a thread as it happens (see [`Dispatch::live`]).
pub type LiveNews = tokio::sync::mpsc::UnboundedReceiver<crate::store::queue::Live>;

/// The dispatch of `store`.
pub fn of(store: &Storage) -> Arc<dyn Dispatch> {
    match store.queue().workers() {
        Workers::PerBundle => Arc::new(local::LocalDispatch::new(store)),
        Workers::Pool => Arc::new(shared::SharedDispatch::new(store)),
    }
}
