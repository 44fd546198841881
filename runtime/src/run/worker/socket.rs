//! The socket of a bundle's worker on a home directory (`run/<HASH>.sock`): the commands that
//! queue a thread hand it over here (with their secrets, and to follow it), `ps` asks what the
//! worker runs, and `kill` and `pause` wake it to read their requests from the queue. The
//! worker serves it until a second after its last thread has ended, then exits.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::net::UnixListener;
use tokio::sync::broadcast;

use super::{Started, Worker, announce_ready};
use crate::agents::human::HumanQuestion;
use crate::error::{Error, Result};
use crate::ids::{BundleHash, ThreadId};
use crate::run::ipc::{self, ClientMessage, Connection, Reply, Request};
use crate::sandbox::control::{Activity, Progress};
use crate::store::queue::Scope;

/// How long a thread handed over may be held by another process before it is busy.
const TAKE_WAIT: Duration = Duration::from_secs(1);

/// How long a worker with no threads waits for one before it exits.
const IDLE_EXIT: Duration = Duration::from_secs(5);

/// How long a worker stays after its last thread has ended, for the next one. Threads that
/// come in a burst, each quick, leave their worker without a thread now and then: exiting at
/// once made the next start spawn a new worker (a process start, the engine, the pool) while
/// the burst waited — the tail of starts on a home directory (a trace of the slowest 1% of 1,200
/// API starts from 8 clients: 100–530 ms each, all of it in connecting to a worker).
const LINGER: Duration = Duration::from_millis(1000);

/// Counts a connection while it is served.
struct ConnectionGuard(Arc<Worker>);

impl ConnectionGuard {
    fn new(worker: &Arc<Worker>) -> Self {
        worker.connections.fetch_add(1, Ordering::SeqCst);
        ConnectionGuard(worker.clone())
    }
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::SeqCst);
        self.0.changed.notify_one();
    }
}

/// Serves bundle `hash`'s socket until no thread is left and none came for [`LINGER`].
pub(super) async fn serve(worker: Arc<Worker>, hash: BundleHash) -> Result<()> {
    let home = worker.store.home().clone();
    let socket = ipc::socket_path(&home, hash);
    let _ = std::fs::remove_file(&socket);
    let mut listener = UnixListener::bind(&socket).map_err(Error::io("listen on", &socket))?;
    tracing::info!("worker {} serving {hash}", std::process::id());
    announce_ready();
    let mut idle_since = Some(Instant::now());
    loop {
        let wait = || if worker.had_threads.load(Ordering::SeqCst) { LINGER } else { IDLE_EXIT };
        let timeout =
            idle_since.map_or(Duration::from_secs(3600), |t| wait().saturating_sub(t.elapsed()));
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((stream, _)) = accepted {
                    let guard = ConnectionGuard::new(&worker);
                    tokio::spawn(async move {
                        handle(guard.0.clone(), hash, Connection::accepted(stream)).await;
                        drop(guard);
                    });
                }
            }
            _ = worker.changed.notified() => {}
            _ = tokio::time::sleep(timeout) => {}
        }
        let empty =
            worker.running.lock().is_empty() && worker.connections.load(Ordering::SeqCst) == 0;
        if !empty {
            idle_since = None;
            continue;
        }
        let idle = *idle_since.get_or_insert_with(Instant::now);
        // Exit a moment after the last thread has ended, or after waiting idle for a first
        // one. A client that connected just before the socket was removed is still served.
        if idle.elapsed() >= wait() {
            let _ = std::fs::remove_file(&socket);
            let mut late = false;
            while let Ok(Ok((stream, _))) =
                tokio::time::timeout(Duration::from_millis(20), listener.accept()).await
            {
                late = true;
                handle(worker.clone(), hash, Connection::accepted(stream)).await;
            }
            if late && !worker.running.lock().is_empty() {
                listener = UnixListener::bind(&socket).map_err(Error::io("listen on", &socket))?;
                idle_since = None;
                continue;
            }
            tracing::info!("worker {} exiting: no threads left", std::process::id());
            return worker.queue().unregister();
        }
    }
}

/// Serves one connection: one request, its replies, then close.
async fn handle(worker: Arc<Worker>, hash: BundleHash, mut connection: Connection) {
    let request = match connection.receive::<Request>().await {
        Ok(Some(request)) => request,
        _ => return,
    };
    let reply = match request {
        Request::Ps => Reply::Threads { threads: worker.ps() },
        Request::Wake => match worker.apply_requests() {
            Ok(()) => Reply::Ok,
            Err(e) => Reply::Error { message: e.to_string(), code: e.exit_code() },
        },
        Request::Watch { thread } => {
            let Some(control) = worker.control_of(thread) else {
                let reply = Reply::Error {
                    message: format!("thread {thread} does not run in this worker"),
                    code: crate::error::exit::STATE,
                };
                let _ = connection.send(&reply).await;
                return;
            };
            let mut progress = control.watch();
            drop(control);
            if connection.send(&Reply::Ok).await.is_err() {
                return;
            }
            loop {
                let reply = match progress.recv().await {
                    Ok(Progress::Delta(text)) => Reply::Delta((*text).clone()),
                    // The step is in the store: the watcher reads it there (a step can be
                    // megabytes, and the watcher may have read it already).
                    Ok(Progress::Step { .. }) | Err(broadcast::error::RecvError::Lagged(_)) => {
                        Reply::Stored
                    }
                    Ok(Progress::Working(_)) => continue,
                    // Its run here is over.
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                if connection.send(&reply).await.is_err() {
                    return;
                }
            }
        }
        Request::Take { thread, follow, interactive, secrets } => {
            match take(&worker, hash, thread, secrets, follow && interactive).await {
                Err(e) => Reply::Error { message: e.to_string(), code: e.exit_code() },
                Ok(started) => {
                    if connection.send(&started.accepted).await.is_ok() && follow {
                        follow_thread(&mut connection, started).await;
                    }
                    return;
                }
            }
        }
    };
    let _ = connection.send(&reply).await;
}

/// Claims queued thread `id` of this worker's bundle and starts it with `secrets`. Another
/// process may hold the thread for an instant (an answer refused under its run lock): that
/// is waited out, for [`TAKE_WAIT`] at most; a thread held longer (a `step` at work) is busy.
async fn take(
    worker: &Arc<Worker>,
    hash: BundleHash,
    id: ThreadId,
    secrets: crate::agents::Secrets,
    interactive: bool,
) -> Result<Started> {
    let deadline = Instant::now() + TAKE_WAIT;
    let claimed = loop {
        let running = worker.running_ids();
        let claimed = worker.queue().claim(Scope::Bundle(hash), 1, &running, Some(id))?;
        if let Some(claimed) = claimed.into_iter().next() {
            break claimed;
        }
        if worker.queue().is_taken(id)? || Instant::now() >= deadline {
            return Err(Error::ThreadBusy(id.to_string()));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    worker.start(claimed, secrets, interactive)
}

/// Streams a thread's progress to its follower until it ends, pauses or waits, putting
/// `human` agents' questions to an interactive follower.
async fn follow_thread(connection: &mut Connection, started: Started) {
    let Started { mut ended, mut progress, mut questions, .. } = started;
    let mut progressing = true;
    loop {
        let next_question = async {
            match &mut questions {
                Some(questions) => questions.recv().await,
                None => std::future::pending().await,
            }
        };
        // In this order: what the thread did (roles at work, steps, in the order they
        // happened) before how it came to rest, and before a question its agent asks.
        tokio::select! {
            biased;
            heard = progress.recv(), if progressing => {
                let reply = match heard {
                    Ok(Progress::Working(Activity { role, agent })) => Reply::Working { role, agent },
                    Ok(Progress::Step { index, step }) => Reply::Step { index, step },
                    Ok(Progress::Delta(text)) => Reply::Delta((*text).clone()),
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    // The thread's run is over: how it came to rest follows.
                    Err(broadcast::error::RecvError::Closed) => {
                        progressing = false;
                        continue;
                    }
                };
                if connection.send(&reply).await.is_err() {
                    return;
                }
            }
            rest = ended.recv() => {
                if let Ok(reply) = rest {
                    let _ = connection.send(&reply).await;
                }
                return;
            }
            Some(question) = next_question => ask(connection, question).await,
        }
    }
}

/// Puts a `human` agent's question to the follower, and hands its answer (or `None`) back.
async fn ask(connection: &mut Connection, question: HumanQuestion) {
    let asked = Reply::Question {
        role: question.role,
        system_prompt: question.system_prompt,
        context: question.context,
        expected: question.expected,
        error: question.error,
        tool: question.tool,
    };
    let text = match connection.send(&asked).await {
        Ok(()) => match connection.receive::<ClientMessage>().await {
            Ok(Some(ClientMessage::Answer { text })) => text,
            _ => None,
        },
        Err(_) => None,
    };
    let _ = question.reply.send(text);
}
