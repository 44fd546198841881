//! The work queue: where a thread waits for a worker, how a worker takes it (holding the
//! store's run lock on it: a file lock, or a lease), what is asked of the worker that holds
//! it (kill, pause), and which workers are alive.
//!
//! A home directory keeps its queue in `run/queue/` and its workers are the per-bundle
//! processes `run` starts on demand ([`queue_files::FileQueue`](super::queue_files)); a
//! database keeps it in its `threads` and `workers` tables, and its workers are pools that take
//! threads of any bundle, on any machine. One shape for both: the run layer takes work through
//! this trait alone.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::ids::{BundleHash, ThreadId};
use crate::run_request::RunRequest;
use crate::store::ThreadWriter;
use crate::store::records::{StartRecord, ThreadRecord, ThreadSummary};

/// A thread a worker took. Its writer holds the thread (the run lock or the lease) until it is
/// dropped; [`WorkQueue::release`] says what becomes of its place in the queue.
#[derive(Debug)]
pub struct Claimed {
    pub id: ThreadId,
    pub record: ThreadRecord,
    pub writer: Box<dyn ThreadWriter>,
    /// What the run was asked, laid over the thread's recorded request (`resume --agent …`).
    pub request: RunRequest,
    /// What the queue needs back to release the thread (a lease's token).
    pub ticket: i64,
    /// The worker whose hold ran out, when this is a takeover.
    pub taken_from: Option<String>,
}

/// What a process asks of the worker that holds a thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ControlRequest {
    Kill,
    Pause,
}

impl ControlRequest {
    /// Its name, as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            ControlRequest::Kill => "kill",
            ControlRequest::Pause => "pause",
        }
    }

    /// The request named `name`.
    pub fn named(name: &str) -> Option<Self> {
        match name.trim() {
            "kill" => Some(ControlRequest::Kill),
            "pause" => Some(ControlRequest::Pause),
            _ => None,
        }
    }
}

/// What becomes of a claimed thread's place in the queue when its run stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// It came to rest (ended, paused, waits for a person), or cannot run here: it leaves
    /// the queue.
    Settle,
    /// Its worker is stopping: it goes back in the queue, for another worker to take at once.
    HandBack,
}

/// Which threads a worker takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Threads of any bundle (a pool worker).
    Any,
    /// Threads of one bundle (the worker a home directory starts for a bundle).
    Bundle(BundleHash),
}

impl Scope {
    /// Whether thread of bundle `hash` is in this scope.
    pub fn takes(self, hash: BundleHash) -> bool {
        match self {
            Scope::Any => true,
            Scope::Bundle(mine) => mine == hash,
        }
    }
}

/// How a store's threads are taken by workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workers {
    /// A worker per bundle, started on demand on this machine and gone with its last thread;
    /// handed its threads one by one by the commands that queue them.
    PerBundle,
    /// Pools of workers on any machine, each taking threads of any bundle from the queue.
    Pool,
}

/// What a worker's thread is doing, published for `ps`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Activity {
    /// When the worker took the thread (ms since the epoch).
    pub since: u64,
    pub role: Option<String>,
    pub agent: Option<String>,
    pub working_since: Option<u64>,
    /// The provider limit one of its requests waits for its turn in, if one does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
}

/// A thread that is queued, or held by a live worker, as `ps` lists it.
#[derive(Debug, Clone)]
pub struct LiveThread {
    pub summary: ThreadSummary,
    pub activity: Option<Activity>,
    /// The worker's host and pid, when a worker holds it (else it is queued).
    pub worker: Option<(String, u32)>,
}

/// The work queue of a store.
pub trait WorkQueue: Send + Sync + fmt::Debug {
    /// How this store's threads are taken.
    fn workers(&self) -> Workers;

    /// Creates thread `start` (no steps) as [`ThreadStore::create_at_rest`] does, queued to
    /// run with `request`, and wakes the workers that listen for work: one durable write where
    /// the queue is a part of the threads' store (a database: a start is then one statement,
    /// committed with the other writes of the moment), two where it is not.
    ///
    /// [`ThreadStore::create_at_rest`]: crate::store::ThreadStore::create_at_rest
    fn create_queued(&self, start: &StartRecord, request: &RunRequest) -> Result<ThreadRecord>;

    /// Starts answered once queued ([`create_queued`](Self::create_queued)) that nobody hands
    /// to a worker: on a home directory, those whose `serve` died between the answer and the
    /// hand-over (the thread and its bundle), for a `serve` to hand over. A database's workers
    /// claim queued threads themselves: it has none.
    fn orphaned_starts(&self) -> Result<Vec<(ThreadId, BundleHash)>> {
        Ok(Vec::new())
    }

    /// Queues thread `id` (of bundle `hash`) to run with `request` laid over its recorded one;
    /// wakes the workers that listen for work.
    fn enqueue(&self, id: ThreadId, hash: BundleHash, request: &RunRequest) -> Result<()>;

    /// Takes up to `max` queued threads of `scope` (oldest first), or only thread `only`,
    /// never one of `running` (the threads this worker runs already). A thread another
    /// process holds is left where it is.
    fn claim(
        &self,
        scope: Scope,
        max: usize,
        running: &[ThreadId],
        only: Option<ThreadId>,
    ) -> Result<Vec<Claimed>>;

    /// Releases claimed thread `id` (with its ticket) as `how` says. Its writer must still be
    /// held: a thread settled must not look runnable to another worker for an instant.
    fn release(&self, id: ThreadId, ticket: i64, how: Release) -> Result<()>;

    /// Takes thread `id` out of the queue if it waits there, taken by no worker: the caller
    /// holds it (its writer), and decides what becomes of it (a kill, a pause), or could not
    /// hand it to a worker. Holding a thread does not take it out of the queue by itself: an
    /// answer refused under the run lock must leave the answered thread queued.
    fn withdraw(&self, id: ThreadId) -> Result<()>;

    /// Asks the worker holding thread `id` to kill or pause it. False if no worker holds it.
    fn ask(&self, id: ThreadId, request: ControlRequest) -> Result<bool>;

    /// Whether a request [`WorkQueue::ask`]ed for thread `id` still waits for its worker to
    /// take it.
    fn is_asked(&self, id: ThreadId) -> Result<bool>;

    /// The requests for threads of `running` (this worker's), taken as they are read.
    fn requests(&self, running: &[ThreadId]) -> Result<Vec<(ThreadId, ControlRequest)>>;

    /// Whether a worker took thread `id` from the queue: it holds it, or has run it already.
    fn is_taken(&self, id: ThreadId) -> Result<bool>;

    /// Registers this process as a worker of `scope` running up to `max_threads`. False if
    /// another live worker has this scope to itself (a bundle's worker on a home directory).
    fn register(&self, scope: Scope, max_threads: usize) -> Result<bool>;

    /// Says this worker is alive, and what its threads are doing.
    fn heartbeat(&self, activities: &[(ThreadId, Activity)]) -> Result<()>;

    /// Removes this worker from the live ones (a clean exit).
    fn unregister(&self) -> Result<()>;

    /// How many workers are alive.
    fn live_workers(&self) -> Result<usize>;

    /// Threads that are queued, or that live workers hold and publish.
    fn live_threads(&self) -> Result<Vec<LiveThread>>;

    /// What thread `id` is doing, as the worker holding it last published it.
    fn activity(&self, id: ThreadId) -> Result<Option<Activity>>;

    /// A wake-up for each thread queued or request made, if the store pushes them (else a
    /// worker polls).
    fn wake_ups(&self) -> Result<Option<tokio::sync::mpsc::UnboundedReceiver<()>>>;

    /// How long a claimed thread stays held without its worker (the lease); none for a file
    /// lock, which dies with its process.
    fn hold(&self) -> Option<Duration>;

    /// How long until the first lease another worker holds on a runnable thread runs out, if
    /// one does within `within`: a worker with room looks again then, so that a dead worker's
    /// thread is taken over as its lease ends, not at the next poll. None where nothing is
    /// held under a lease (a home directory's locks die with their process).
    fn next_takeover(&self, _within: Duration) -> Result<Option<Duration>> {
        Ok(None)
    }

    /// How long until the last lease on a runnable thread that a worker no longer alive holds
    /// runs out, if one is still to: an on-demand worker stays until then and takes those
    /// threads over (on one machine with no worker service, nobody else would). None where
    /// nothing is held under a lease (a home directory's locks die with their process).
    fn orphaned_until(&self) -> Result<Option<Duration>> {
        Ok(None)
    }

    /// This process as the queue knows it (for messages).
    fn owner(&self) -> String;

    /// Where a worker's live text (a model's deltas) reaches followers in other processes,
    /// when the store carries it: a database's notifications. None on a home directory, whose
    /// followers hear each bundle's worker over its socket.
    fn live(&self) -> Option<&dyn LiveChannel>;
}

/// Text a model writes for a thread's role as it comes, carried from the worker that runs the
/// thread to whoever follows it elsewhere. Nothing is kept: a follower hears what is written
/// after it starts following, and the turn's whole message is journaled when it ends.
pub trait LiveChannel: Send + Sync + fmt::Debug {
    /// What publishes thread `id`'s text: each `(role, text)` is sent in order, in the
    /// background (the model is not slowed by followers), and lost when nobody follows.
    fn publisher(&self, id: ThreadId) -> LivePublisher;

    /// Follows thread `id` from now on: its text as it is published, and a word each time
    /// something of it is stored. None when it cannot reach this process (`LISTEN` behind a
    /// transaction-pooling PgBouncer).
    fn follow(&self, id: ThreadId) -> Result<Option<tokio::sync::mpsc::UnboundedReceiver<Live>>>;
}

/// What a follower of a thread hears from its worker as it happens, before (or instead of)
/// reading it in the store.
#[derive(Debug, Clone, PartialEq)]
pub enum Live {
    /// A model wrote some text.
    Text(LiveText),
    /// Records of the thread were stored: read it now (what they are is in the store).
    Stored,
}

/// A piece of text a model wrote for a role, in one of its turns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LiveText {
    pub role: String,
    /// The turn of the agent call it belongs to (1 for the first).
    pub turn: u32,
    pub text: String,
}

/// Publishes one thread's live text (see [`LiveChannel::publisher`]).
pub type LivePublisher = std::sync::Arc<dyn Fn(LiveText) + Send + Sync>;
