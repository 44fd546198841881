//! Dispatch on a home directory: a thread is queued in `run/queue/` and handed to its bundle's
//! worker over the worker's socket (`run/<HASH>.sock`, the worker started if none is live),
//! with this command's secrets; the worker streams what the thread does back to a follower.

use futures::FutureExt;
use futures::future::BoxFuture;

use super::{Accepted, Asked, Dispatch, Follower, Heard, Question};
use crate::agents::Secrets;
use crate::error::{Error, Result};
use crate::ids::{BundleHash, ThreadId};
use crate::run::events::{Event, PsEntry};
use crate::run::ipc::{self, ClientMessage, Connection, Reply, Request};
use crate::run::worker::{self, WorkerOptions};
use crate::run_request::RunRequest;
use crate::store::Storage;
use crate::store::queue::{ControlRequest, Live};
use crate::store::records::StartRecord;

/// How many times a thread is handed to its bundle's worker when the worker dies during the
/// hand-over.
const HAND_OVER_ATTEMPTS: usize = 3;

/// Where each start says how long its parts took (`RUST_LOG=uncaged_workflow::starts=debug`):
/// the trace that finds where the slowest starts wait.
const TRACE: &str = "uncaged_workflow::starts";

/// Dispatch over a home directory's per-bundle workers.
pub struct LocalDispatch {
    store: Storage,
}

impl LocalDispatch {
    pub fn new(store: &Storage) -> Self {
        LocalDispatch { store: store.clone() }
    }

    async fn take(
        &self,
        id: ThreadId,
        hash: BundleHash,
        over: &RunRequest,
        follow: bool,
    ) -> Result<(Box<dyn Follower>, Accepted)> {
        let queueing = std::time::Instant::now();
        self.store.queue().enqueue(id, hash, over)?;
        tracing::debug!(target: TRACE, "thread {id}: queued in {:?}", queueing.elapsed());
        crate::faults::crash_point("hand-over-queued");
        let taken = self.take_queued(id, hash, follow).await;
        if taken.is_err() {
            // Not taken: it leaves the queue, and waits at rest for `resume`, as it was.
            let _ = self.store.queue().withdraw(id);
        }
        taken
    }

    /// Hands queued thread `id` to its bundle's worker (started if none is live). A worker
    /// that dies while it is handed the thread (its connection breaks before it says it took
    /// it) is no failure of the thread: the hand-over is made again, to a worker started for
    /// it, a few times.
    async fn take_queued(
        &self,
        id: ThreadId,
        hash: BundleHash,
        follow: bool,
    ) -> Result<(Box<dyn Follower>, Accepted)> {
        let mut attempt = 1;
        loop {
            match self.hand_to_worker(id, hash, follow).await {
                Err(Error::WorkerLost { cause, .. }) if attempt < HAND_OVER_ATTEMPTS => {
                    tracing::warn!(
                        "thread {id}: the worker of bundle {hash} died while it was handed the                          thread ({cause}); handing it over again"
                    );
                    attempt += 1;
                }
                taken => return taken,
            }
        }
    }

    /// One hand-over of queued thread `id` to its bundle's worker.
    async fn hand_to_worker(
        &self,
        id: ThreadId,
        hash: BundleHash,
        follow: bool,
    ) -> Result<(Box<dyn Follower>, Accepted)> {
        let connecting = std::time::Instant::now();
        let mut connection = ipc::connect_or_spawn(&self.store, hash).await?;
        let connected = connecting.elapsed();
        // The thread's agents use this process's secrets, not the worker's environment: the
        // worker may have been started by another shell, before a key was exported or changed.
        let secrets = Secrets::from_env(&self.store.config()?);
        let request = Request::Take { thread: id, follow, interactive: follow, secrets };
        connection.send(&request).await.map_err(|e| lost(id, hash, e))?;
        match connection.receive::<Reply>().await.map_err(|e| lost(id, hash, e))? {
            Some(Reply::Accepted { pid, cache_hit, steps, .. }) => {
                tracing::debug!(
                    target: TRACE,
                    "thread {id}: worker connected in {connected:?}, took it in {:?}",
                    connecting.elapsed() - connected
                );
                let follower = LocalFollower { connection, id, hash };
                Ok((Box::new(follower), Accepted { pid: Some(pid), cache_hit, steps }))
            }
            Some(Reply::Error { message, code }) => Err(Error::Remote { message, code }),
            None => Err(lost(id, hash, std::io::ErrorKind::UnexpectedEof.into())),
            other => {
                Err(Error::Host(format!("unexpected answer from the worker of {hash}: {other:?}")))
            }
        }
    }

    /// Hands thread `id`, queued by a start already answered, to its bundle's worker; whether
    /// this did (not when someone else did first: a `resume`, another `serve` finding it
    /// orphaned). A hand-over that fails takes it out of the queue, and says so: the client
    /// had its answer, so the thread waits at rest, interrupted, for `resume`, as a thread a
    /// command failed to hand over does.
    async fn hand_over_answered(&self, id: ThreadId, hash: BundleHash) -> bool {
        match self.take_queued(id, hash, false).await {
            Ok(_) => true,
            Err(e) if e.is_busy() => false,
            Err(e) => {
                let _ = self.store.queue().withdraw(id);
                tracing::warn!(
                    "thread {id}: started, but not handed to a worker of bundle {hash}: {}; \
                     it waits at rest for `resume`",
                    crate::error::chain_line(&e)
                );
                false
            }
        }
    }

    /// Sends `request` to the live worker of `hash`, if there is one, and reads its answer.
    async fn request(&self, hash: BundleHash, request: &Request) -> Result<Option<Reply>> {
        let Some(mut connection) = ipc::connect(self.store.home(), hash).await? else {
            return Ok(None);
        };
        connection.send(request).await.map_err(|e| worker_gone(hash, e))?;
        connection.receive::<Reply>().await.map_err(|e| worker_gone(hash, e))
    }
}

impl Dispatch for LocalDispatch {
    fn hand_over<'a>(
        &'a self,
        id: ThreadId,
        hash: BundleHash,
        over: &'a RunRequest,
        follow: bool,
    ) -> BoxFuture<'a, Result<(Box<dyn Follower>, Accepted)>> {
        self.take(id, hash, over, follow).boxed()
    }

    /// Created at rest, then handed over as [`hand_over`](Self::hand_over) does: a bundle's
    /// worker takes only the threads it is handed over its socket, so a creator that dies
    /// between the two must leave a thread that never ran (which whoever finishes its start
    /// hands over), not one queued for nobody. A store [handing over after the
    /// answer](Storage::handing_over_after_answer) (`serve`) answers once the thread is queued
    /// and hands it over in the background: should this process die first, the start is an
    /// orphan the next `serve` hands over ([`hand_over_orphaned_starts`](Self::hand_over_orphaned_starts)).
    fn start<'a>(&'a self, start: &'a StartRecord) -> BoxFuture<'a, Result<()>> {
        async move {
            let (id, hash) = (start.thread_id, start.hash);
            let creating = std::time::Instant::now();
            let Some(hand_overs) = self.store.hand_overs() else {
                self.store.threads().create_at_rest(start, &[], &[])?;
                tracing::debug!(target: TRACE, "thread {id}: created in {:?}", creating.elapsed());
                crate::faults::crash_point("start-created");
                return self.take(id, hash, &RunRequest::default(), false).await.map(drop);
            };
            self.store.queue().create_queued(start, &RunRequest::default())?;
            tracing::debug!(target: TRACE, "thread {id}: created queued in {:?}", creating.elapsed());
            crate::faults::crash_point("start-queued");
            let dispatch = LocalDispatch::new(&self.store);
            hand_overs.spawn(async move { dispatch.hand_over_answered(id, hash).await });
            Ok(())
        }
        .boxed()
    }

    fn hand_over_orphaned_starts(&self) -> BoxFuture<'_, Result<usize>> {
        async move {
            let mut handed = 0;
            for (id, hash) in self.store.queue().orphaned_starts()? {
                // Handed over meanwhile (by another `serve`, or a `resume`): its worker has it.
                if !self.store.threads().read(id).is_ok_and(|record| record.never_ran()) {
                    continue;
                }
                tracing::info!(
                    "thread {id}: its start was answered by a `serve` that died before \
                     handing it to a worker; handing it over now"
                );
                handed += usize::from(self.hand_over_answered(id, hash).await);
            }
            Ok(handed)
        }
        .boxed()
    }

    /// The request goes in the queue, and the bundle's worker is told over its socket (its
    /// workers listen to nothing else). A bundle with no live worker runs no thread: one held
    /// is held by a `step` in its own process.
    fn ask(
        &self,
        id: ThreadId,
        hash: BundleHash,
        request: ControlRequest,
    ) -> BoxFuture<'_, Result<Asked>> {
        async move {
            if ipc::connect(self.store.home(), hash).await?.is_none() {
                return Err(Error::ThreadState {
                    id: id.to_string(),
                    status: "running",
                    reason: "it is not run by a worker (a `step` in progress?)".into(),
                });
            }
            if !self.store.queue().ask(id, request)? {
                return Ok(Asked::NotHeld);
            }
            match self.request(hash, &Request::Wake).await? {
                None | Some(Reply::Ok) => Ok(Asked::Asked),
                Some(Reply::Error { message, code }) => Err(Error::Remote { message, code }),
                Some(other) => {
                    Err(Error::Host(format!("unexpected answer from the worker: {other:?}")))
                }
            }
        }
        .boxed()
    }

    fn running(&self) -> BoxFuture<'_, Result<Vec<PsEntry>>> {
        async move {
            let mut all = Vec::new();
            for hash in ipc::live_workers(self.store.home())? {
                // A worker that exits between listing and asking simply has no threads.
                if let Ok(Some(Reply::Threads { threads })) = self.request(hash, &Request::Ps).await
                {
                    all.extend(threads);
                }
            }
            Ok(all)
        }
        .boxed()
    }

    /// A bundle's worker, serving its socket; started on demand, gone with its last thread.
    fn work(&self, options: WorkerOptions) -> BoxFuture<'_, Result<()>> {
        worker::serve_bundle(self.store.clone(), options).boxed()
    }

    fn live(&self, id: ThreadId) -> BoxFuture<'_, Result<Option<super::LiveNews>>> {
        async move {
            let hash = self.store.threads().read(id)?.version();
            let Some(mut connection) = ipc::connect(self.store.home(), hash).await? else {
                return Ok(None);
            };
            connection
                .send(&Request::Watch { thread: id })
                .await
                .map_err(|e| worker_gone(hash, e))?;
            match connection.receive::<Reply>().await.map_err(|e| worker_gone(hash, e))? {
                Some(Reply::Ok) => {}
                // Not running there (any more).
                _ => return Ok(None),
            }
            let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
            tokio::spawn(async move {
                loop {
                    let heard = match connection.receive::<Reply>().await {
                        Ok(Some(Reply::Delta(text))) => Live::Text(text),
                        Ok(Some(Reply::Stored)) => Live::Stored,
                        // Its run there is over (then what it stored last is in the store).
                        _ => return,
                    };
                    if sender.send(heard).is_err() {
                        return;
                    }
                }
            });
            Ok(Some(receiver))
        }
        .boxed()
    }
}

/// A thread followed through its worker's socket.
struct LocalFollower {
    connection: Connection,
    id: ThreadId,
    hash: BundleHash,
}

impl Follower for LocalFollower {
    fn next(&mut self) -> BoxFuture<'_, Result<Option<Heard>>> {
        async move {
            let reply = self
                .connection
                .receive::<Reply>()
                .await
                .map_err(|e| lost(self.id, self.hash, e))?;
            let thread = self.id;
            Ok(reply.map(|reply| match reply {
                Reply::Working { role, agent } => {
                    Heard::Event(Event::working(thread, &role, &agent))
                }
                Reply::Step { index, step } => Heard::Event(Event::Step { thread, index, step }),
                Reply::Waiting { role } => Heard::Event(Event::Waiting { thread, role }),
                Reply::Paused { steps } => Heard::Event(Event::Paused { thread, steps }),
                Reply::Ended { end } => Heard::Event(Event::Ended { thread, end: end.end }),
                Reply::Question { role, system_prompt, context, expected, error, tool } => {
                    Heard::Question(Question {
                        role,
                        system_prompt,
                        context,
                        expected,
                        error,
                        tool,
                    })
                }
                Reply::Delta(text) => Heard::Event(Event::Delta { thread, text }),
                Reply::Error { message, code } => Heard::Failed { message, code },
                other => Heard::Failed {
                    message: format!(
                        "unexpected answer from the worker of {}: {other:?}",
                        self.hash
                    ),
                    code: crate::error::exit::SOFTWARE,
                },
            }))
        }
        .boxed()
    }

    fn answer(&mut self, text: Option<String>) -> BoxFuture<'_, Result<()>> {
        async move {
            self.connection
                .send(&ClientMessage::Answer { text })
                .await
                .map_err(|e| lost(self.id, self.hash, e))
        }
        .boxed()
    }
}

/// The error for the connection to the worker handed thread `thread` that broke.
fn lost(thread: ThreadId, hash: BundleHash, e: std::io::Error) -> Error {
    Error::WorkerLost { thread: thread.to_string(), hash: hash.to_string(), cause: e.to_string() }
}

/// The error for a connection to a worker, asked about no thread, that broke.
fn worker_gone(hash: BundleHash, e: std::io::Error) -> Error {
    Error::Host(format!("lost the worker of bundle {hash}: {e}"))
}
