//! The worker process of one bundle: one compiled component, one store per thread, all threads
//! concurrent on tokio. It serves its socket until its last thread ends, then exits.
//!
//! Over 400 lines because its parts share one private state and one lifetime: the accept loop
//! and idle exit, the table of running threads, and the connection handler that starts,
//! follows, pauses and kills them. Split apart, each would reach into the others' fields.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::net::UnixListener;
use tokio::sync::{Notify, broadcast, mpsc, oneshot};

use crate::agents::AgentFlags;
use crate::agents::human::HumanQuestion;
use crate::clock::now_ms;
use crate::error::{Error, Result, exit};
use crate::ids::{BundleHash, ThreadId};
use crate::limits::Limits;
use crate::run::catalog::Catalog;
use crate::run::ipc::{self, ClientMessage, Connection, PsEntry, Reply, Request};
use crate::run::lifecycle;
use crate::run::runner::{RunContext, RunOutcome, Until, run_thread};
use crate::sandbox::control::{Activity, Progress, ThreadControl};
use crate::sandbox::engine::{CacheOutcome, LoadedBundle, Runtime};
use crate::store::Storage;
use crate::store::records::{End, EndRecord, EndStatus};

/// How long a worker with no threads waits for one before it exits.
const IDLE_EXIT: Duration = Duration::from_secs(5);

/// How long a new worker tries to take the bundle's worker lock.
const LOCK_WAIT: Duration = Duration::from_secs(1);

/// Return code recorded for a killed thread (128 + SIGINT, like an interrupted command).
pub const KILLED_RETURN_CODE: i32 = crate::error::exit::INTERRUPTED;

/// A thread this worker runs.
struct Running {
    name: String,
    control: Arc<ThreadControl>,
    since: u64,
    kill: Option<oneshot::Sender<()>>,
}

/// The worker's shared state.
struct Worker {
    store: Storage,
    hash: BundleHash,
    runtime: Runtime,
    bundle: Mutex<Option<Arc<LoadedBundle>>>,
    threads: Mutex<HashMap<ThreadId, Running>>,
    /// Connections being served. A worker with no threads still serves these before it
    /// exits: one of them may be handing it a thread.
    connections: AtomicUsize,
    /// Woken whenever a thread or a connection ends.
    changed: Notify,
}

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

/// Serves bundle `hash` until no thread is left. Returns at once if another worker is live.
pub async fn serve(store: Storage, hash: BundleHash) -> Result<()> {
    raise_open_files_limit();
    std::thread::spawn(crate::schema::precompile_meta_schema);
    let home = store.home().clone();
    crate::durable::create_dir(&home.run_dir())?;
    let lock_file = ipc::lock_path(&home, hash);
    let lock = crate::durable::open_private(
        std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false),
        &lock_file,
    )
    .map_err(Error::io("open worker lock", &lock_file))?;
    let deadline = Instant::now() + LOCK_WAIT;
    while lock.try_lock().is_err() {
        if Instant::now() > deadline {
            tracing::info!("another worker of {hash} is live; exiting");
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let socket = ipc::socket_path(&home, hash);
    let _ = std::fs::remove_file(&socket);
    let mut listener = UnixListener::bind(&socket).map_err(Error::io("listen on", &socket))?;
    tracing::info!("worker {} serving {hash}", std::process::id());
    announce_ready();

    let worker = Arc::new(Worker {
        runtime: Runtime::for_worker(
            &home,
            &Limits::resolve(&store.config()?.limits, &Default::default())?,
        )?,
        store,
        hash,
        bundle: Mutex::new(None),
        threads: Mutex::new(HashMap::new()),
        connections: AtomicUsize::new(0),
        changed: Notify::new(),
    });
    let mut idle_since = Some(Instant::now());
    loop {
        let timeout =
            idle_since.map_or(Duration::from_secs(3600), |t| IDLE_EXIT.saturating_sub(t.elapsed()));
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((stream, _)) = accepted {
                    let guard = ConnectionGuard::new(&worker);
                    tokio::spawn(async move {
                        handle(guard.0.clone(), Connection::accepted(stream)).await;
                        drop(guard);
                    });
                }
            }
            _ = worker.changed.notified() => {}
            _ = tokio::time::sleep(timeout) => {}
        }
        let empty =
            worker.threads.lock().is_empty() && worker.connections.load(Ordering::SeqCst) == 0;
        if !empty {
            idle_since = None;
            continue;
        }
        let idle = *idle_since.get_or_insert_with(Instant::now);
        // Exit when the last thread has ended, or after waiting idle for a first one. A
        // client that connected just before the socket was removed is still served.
        if worker.had_threads() || idle.elapsed() >= IDLE_EXIT {
            let _ = std::fs::remove_file(&socket);
            let mut late = false;
            while let Ok(Ok((stream, _))) =
                tokio::time::timeout(Duration::from_millis(20), listener.accept()).await
            {
                late = true;
                handle(worker.clone(), Connection::accepted(stream)).await;
            }
            if late && !worker.threads.lock().is_empty() {
                listener = UnixListener::bind(&socket).map_err(Error::io("listen on", &socket))?;
                idle_since = None;
                continue;
            }
            tracing::info!("worker {} exiting: no threads left", std::process::id());
            drop(lock);
            return Ok(());
        }
    }
}

/// Tells whoever started this worker that it is up (its socket accepts connections, or it
/// listens to the queue): one line on stdout, which `run` and friends read through a pipe
/// instead of polling.
pub fn announce_ready() {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    // The starter may be gone already; nothing else is ever written here.
    let _ = writeln!(out, "ready {}", std::process::id()).and_then(|()| out.flush());
}

/// Raises the soft limit of open files to the hard one: each running thread holds its data
/// file open (its lock says the thread runs), and the usual soft limit (1,024) would cap a
/// worker below a thousand threads.
pub fn raise_open_files_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, limit) {
            tracing::warn!("cannot raise the open-files limit: {e}");
        }
    }
}

impl Worker {
    /// Has this worker run any thread (so an empty table means "last one ended")?
    fn had_threads(&self) -> bool {
        self.bundle.lock().is_some()
    }

    fn loaded(&self, name: &str) -> Result<Arc<LoadedBundle>> {
        let mut slot = self.bundle.lock();
        if let Some(bundle) = &*slot {
            return Ok(bundle.clone());
        }
        let bundle = Arc::new(Catalog::new(&self.store).load(&self.runtime, name, self.hash)?);
        *slot = Some(bundle.clone());
        Ok(bundle)
    }

    fn ps(&self) -> Vec<PsEntry> {
        let threads = self.threads.lock();
        let mut list: Vec<_> = threads
            .iter()
            .map(|(id, running)| {
                let activity = running.control.current_activity();
                PsEntry {
                    thread_id: id.to_string(),
                    name: running.name.clone(),
                    hash: self.hash.to_string(),
                    role: activity.as_ref().map(|(a, _)| a.role.clone()),
                    agent: activity.as_ref().map(|(a, _)| a.agent.clone()),
                    working_since: activity.as_ref().map(|(_, since)| *since),
                    steps: running.control.steps(),
                    since: running.since,
                    pid: Some(std::process::id()),
                    host: None,
                    state: "running".into(),
                }
            })
            .collect();
        list.sort_by(|a, b| a.thread_id.cmp(&b.thread_id));
        list
    }
}

/// Serves one connection: one request, its replies, then close.
async fn handle(worker: Arc<Worker>, mut connection: Connection) {
    let request = match connection.receive::<Request>().await {
        Ok(Some(request)) => request,
        _ => return,
    };
    let reply = match request {
        Request::Ps => Reply::Threads { threads: worker.ps() },
        Request::Pause { thread } => {
            control(&worker, &thread, |running| running.control.request_pause())
        }
        Request::Kill { thread } => {
            let done = control(&worker, &thread, |running| {
                if let Some(kill) = running.kill.take() {
                    let _ = kill.send(());
                }
            });
            // Wait until the end record is written, so `kill` returning means killed.
            if let Ok(id) = thread.parse::<ThreadId>() {
                while worker.threads.lock().contains_key(&id) {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            done
        }
        Request::Run { thread, follow, interactive, agent, agent_for, cwd, secrets } => {
            let flags = AgentFlags { default: agent, for_roles: agent_for, cwd, secrets };
            match start(&worker, &thread, flags, follow && interactive) {
                Err(e) => Reply::Error { message: e.to_string(), code: e.exit_code() },
                Ok(started) => {
                    if connection.send(&started.accepted).await.is_ok() && follow {
                        follow_thread(
                            &mut connection,
                            started.events,
                            started.progress,
                            started.questions,
                        )
                        .await;
                    }
                    return;
                }
            }
        }
    };
    let _ = connection.send(&reply).await;
}

/// Streams a thread's events to its follower until it ends, pauses or waits, putting `human`
/// agents' questions to an interactive follower.
async fn follow_thread(
    connection: &mut Connection,
    mut events: broadcast::Receiver<Reply>,
    mut progress: broadcast::Receiver<Progress>,
    mut questions: Option<mpsc::UnboundedReceiver<HumanQuestion>>,
) {
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
            event = events.recv() => match event {
                Ok(reply) => {
                    let last = matches!(reply, Reply::Ended { .. } | Reply::Paused { .. } | Reply::Waiting { .. } | Reply::Error { .. });
                    if connection.send(&reply).await.is_err() || last {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return,
            },
            Some(question) = next_question => {
                let asked = Reply::Question {
                    role: question.role,
                    system_prompt: question.system_prompt,
                    context: question.context,
                    expected: question.expected,
                    error: question.error,
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
        }
    }
}

/// Applies `action` to a running thread of this worker.
fn control(worker: &Worker, thread: &str, action: impl FnOnce(&mut Running)) -> Reply {
    let Ok(id) = thread.parse::<ThreadId>() else {
        return Reply::Error {
            message: format!("invalid thread id `{thread}`"),
            code: exit::USAGE,
        };
    };
    let mut threads = worker.threads.lock();
    match threads.get_mut(&id) {
        Some(running) => {
            action(running);
            Reply::Ok
        }
        None => Reply::Error {
            message: format!("thread `{id}` is not running in this worker"),
            code: exit::STATE,
        },
    }
}

/// A thread just taken, and what its follower listens to.
struct Started {
    accepted: Reply,
    events: broadcast::Receiver<Reply>,
    progress: broadcast::Receiver<Progress>,
    /// `human` agents' questions, for an interactive follower.
    questions: Option<mpsc::UnboundedReceiver<HumanQuestion>>,
}

/// Takes a thread on disk and runs it in a task of its own. Followers' channels are opened
/// before the task starts, so they miss nothing.
fn start(
    worker: &Arc<Worker>,
    thread: &str,
    flags: AgentFlags,
    interactive: bool,
) -> Result<Started> {
    let id: ThreadId = thread.parse()?;
    let (mut writer, record) = lifecycle::open(&worker.store, id)?;
    if record.start.hash != worker.hash {
        return Err(Error::Host(format!(
            "thread {id} belongs to bundle {}, not to this worker's {}",
            record.start.hash, worker.hash
        )));
    }
    let bundle = worker.loaded(&record.start.name)?;
    let agents = lifecycle::agents_for(&worker.store, &record, &bundle, &flags)?;
    let limits = lifecycle::limits_for(&worker.store, &record)?;
    let running = worker.threads.lock().len();
    if running >= limits.max_threads {
        return Err(Error::ThreadState {
            id: id.to_string(),
            status: "not started",
            reason: format!(
                "the worker of bundle {} already runs {running} threads, its limit (limits.max-threads); resume it later",
                worker.hash
            ),
        });
    }
    let control = Arc::new(ThreadControl::default());
    let progress = control.watch();
    let questions = interactive.then(|| control.human.attach());
    let (events, receiver) = broadcast::channel(1024);
    let (kill, killed) = oneshot::channel();
    worker.threads.lock().insert(
        id,
        Running {
            name: record.start.name.clone(),
            control: control.clone(),
            since: now_ms(),
            kill: Some(kill),
        },
    );
    let accepted = Reply::Accepted {
        thread: id.to_string(),
        pid: std::process::id(),
        cache_hit: bundle.cache == CacheOutcome::Hit,
        steps: record.steps.len(),
    };
    let worker = worker.clone();
    tokio::spawn(async move {
        let ctx =
            RunContext { runtime: &worker.runtime, store: &worker.store, agents, limits, control };
        let finished = {
            // Steps reach followers through the thread's progress, in order with its roles at
            // work (see `follow_thread`).
            let run = run_thread(&ctx, &bundle, &mut *writer, &record, Until::End, |_| {});
            tokio::select! {
                outcome = run => Some(outcome),
                Ok(()) = killed => None,
            }
        };
        // On kill the run future has been dropped: the guest is interrupted wherever it was,
        // and an agent process it was waiting on is killed with it.
        let outcome = finished.unwrap_or_else(|| {
            let end = EndRecord {
                end: End::by_host(KILLED_RETURN_CODE, "killed".into(), EndStatus::Killed),
                timestamp: now_ms(),
            };
            writer.append_end(&end).map(|()| RunOutcome::Ended(end))
        });
        let reply = match outcome {
            Ok(RunOutcome::Ended(end)) => Reply::Ended { end },
            Ok(RunOutcome::Paused | RunOutcome::Stepped | RunOutcome::HandedBack) => {
                Reply::Paused { steps: ctx.control.steps() }
            }
            Ok(RunOutcome::Waiting { role }) => Reply::Waiting { role },
            Err(e) => {
                tracing::error!("thread {id}: {e}");
                Reply::Error { message: format!("thread {id}: {e}"), code: e.exit_code() }
            }
        };
        drop(writer);
        worker.threads.lock().remove(&id);
        let _ = events.send(reply);
        worker.changed.notify_one();
    });
    Ok(Started { accepted, events: receiver, progress, questions })
}
