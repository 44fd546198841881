//! The worker: one loop that takes threads through the store's work queue and runs them, one
//! compiled component per bundle and one sandbox per thread, all concurrent on tokio.
//!
//! The same loop serves both ways a store's threads are taken
//! ([`Workers`](crate::store::queue::Workers)). On a home
//! directory it is the worker of one bundle, started on demand by the command that hands it a
//! thread over its socket ([`socket`]: with the command's secrets, and a follower for the
//! thread's progress) and gone with its last thread. On a database it is a pool worker that
//! claims queued threads of any bundle under leases, takes over those of dead workers, and on
//! SIGTERM hands its threads back to the queue. Kill and pause requests reach it through the
//! queue either way.

mod gone;
mod socket;
mod takeover;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::{Notify, broadcast, mpsc, oneshot};

use crate::agents::Secrets;
use crate::agents::human::HumanQuestion;
use crate::clock::now_ms;
use crate::error::{Error, Result};
use crate::ids::{BundleHash, ThreadId};
use crate::limits::Limits;
use crate::run::catalog::Catalog;
use crate::run::events::{PsEntry, PsState};
use crate::run::ipc::Reply;
use crate::run::lifecycle;
use crate::run::runner::{RunContext, RunOutcome, Until, run_thread};
use crate::sandbox::control::{Progress, ThreadControl};
use crate::sandbox::engine::{CacheOutcome, LoadedBundle, Runtime};
use crate::store::Storage;
use crate::store::queue::{Activity, Claimed, ControlRequest, Release, Scope, WorkQueue};
use crate::store::records::{End, EndRecord, EndStatus};

/// Return code recorded for a killed thread (128 + SIGINT, like an interrupted command).
pub const KILLED_RETURN_CODE: i32 = crate::error::exit::INTERRUPTED;

/// How often a worker looks at the queue and its requests when nothing woke it.
const POLL: Duration = Duration::from_millis(500);

/// How often a pool worker says it is alive (and what its threads do).
const HEARTBEAT: Duration = Duration::from_secs(1);

/// How a worker runs.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// The threads it takes: one bundle's (a home directory's worker), or any.
    pub scope: Scope,
    /// Most threads run at once.
    pub max_threads: usize,
    /// A pool worker exits after this long with nothing to run (one `run` started on demand);
    /// `None` runs until SIGTERM or Ctrl-C. A bundle's worker exits a second after its last thread.
    pub exit_when_idle: Option<Duration>,
    /// On SIGTERM, how long threads may take to finish the step at hand before they are
    /// handed back in the middle of it.
    pub grace: Duration,
    /// Starts the child workflows of its threads, and passes a child's result on when one
    /// ends (none: a step that runs a child workflow fails).
    pub children: Option<Arc<dyn crate::sandbox::children::Children>>,
}

/// A thread this worker runs.
struct Running {
    name: String,
    hash: BundleHash,
    control: Arc<ThreadControl>,
    since: u64,
    kill: Option<oneshot::Sender<()>>,
    /// Stops the run where it is, recording nothing, to hand the thread back.
    drop_step: Option<oneshot::Sender<()>>,
}

/// How a run of a claimed thread ended, for what happens to its place in the queue.
enum Finished {
    /// It came to rest (ended, paused, waits), or failed here: it leaves the queue.
    Rest(Result<RunOutcome>),
    /// It stopped to be handed back (this worker is stopping): it stays queued for another.
    HandedBack,
}

/// A thread just started, and what its follower listens to. Followers' channels are opened
/// before the thread's task starts, so they miss nothing.
struct Started {
    accepted: Reply,
    /// How the thread came to rest (or why it could not run).
    ended: broadcast::Receiver<Reply>,
    progress: broadcast::Receiver<Progress>,
    /// `human` agents' questions, for an interactive follower.
    questions: Option<mpsc::UnboundedReceiver<HumanQuestion>>,
}

/// The worker's shared state.
struct Worker {
    store: Storage,
    runtime: Runtime,
    options: WorkerOptions,
    bundles: Mutex<HashMap<BundleHash, Arc<LoadedBundle>>>,
    running: Mutex<HashMap<ThreadId, Running>>,
    /// Connections being served (a bundle's worker): one may be handing it a thread.
    connections: AtomicUsize,
    /// Whether it has run any thread (so an empty table means "last one ended").
    had_threads: AtomicBool,
    /// Woken whenever a thread or a connection ends, or a request is made.
    changed: Notify,
}

/// Runs the worker of one bundle on a home directory, serving its socket, until its last
/// thread ends. Returns at once if the bundle has a live worker already.
pub async fn serve_bundle(store: Storage, options: WorkerOptions) -> Result<()> {
    let Scope::Bundle(hash) = options.scope else {
        return Err(Error::Usage(
            "`worker` without a bundle needs a database store (--store postgres://…)".into(),
        ));
    };
    match Worker::register(store, options)? {
        Some(worker) => socket::serve(worker, hash).await,
        None => Ok(()),
    }
}

/// Runs a pool worker on a database, taking threads of any bundle (or of the scope's one)
/// from the queue, until SIGTERM (or idle, with `exit_when_idle`).
pub async fn serve_pool(store: Storage, options: WorkerOptions) -> Result<()> {
    match Worker::register(store, options)? {
        Some(worker) => worker.pool().await,
        None => Ok(()),
    }
}

impl Worker {
    /// The store's work queue.
    fn queue(&self) -> &dyn WorkQueue {
        self.store.queue()
    }

    /// This process as a worker of `options.scope`, registered with the store's queue; `None`
    /// if the scope has a live worker already (a bundle's, on a home directory).
    fn register(store: Storage, options: WorkerOptions) -> Result<Option<Arc<Worker>>> {
        raise_open_files_limit();
        std::thread::spawn(crate::schema::precompile_meta_schema);
        if !store.queue().register(options.scope, options.max_threads)? {
            tracing::info!("another worker of this scope is live; exiting");
            return Ok(None);
        }
        let limits = Limits::resolve(&store.config()?.limits, &Default::default())?;
        Ok(Some(Arc::new(Worker {
            runtime: Runtime::for_worker(store.home(), &limits)?,
            store,
            options,
            bundles: Mutex::new(HashMap::new()),
            running: Mutex::new(HashMap::new()),
            connections: AtomicUsize::new(0),
            had_threads: AtomicBool::new(false),
            changed: Notify::new(),
        })))
    }

    /// A pool worker's loop: claims, requests and heartbeats, until SIGTERM (or idle, with
    /// `exit_when_idle`). A database that goes away is waited out: the threads at work go on
    /// with their agents, and what they cannot store waits for its return.
    async fn pool(self: Arc<Self>) -> Result<()> {
        let mut wake = match self.queue().wake_ups() {
            Ok(wake) => wake,
            Err(e) => {
                tracing::warn!("no wake-ups (polling every {POLL:?}): {e}");
                None
            }
        };
        let hold = self.queue().hold().map_or_else(|| "none".into(), |h| format!("{h:?}"));
        tracing::info!(
            "worker {} ({} threads at most, leases of {hold})",
            self.queue().owner(),
            self.options.max_threads
        );
        announce_ready();
        let mut idle_since = Instant::now();
        let mut last_heartbeat = Instant::now();
        let stop = shutdown_signal();
        tokio::pin!(stop);
        // Whether the database was out of reach at the last look (said once, not every poll).
        let mut unavailable = false;
        let mut takeover = takeover::Takeover::default();
        // Whether an idle worker said it stays for a dead worker's leases (said once).
        let mut orphans_told = false;
        loop {
            match self.poll(&mut last_heartbeat, &mut wake) {
                Ok(()) if unavailable => {
                    tracing::info!("the database is back");
                    unavailable = false;
                }
                Ok(()) => {}
                Err(e) if e.is_database_unavailable() => {
                    if !unavailable {
                        tracing::warn!("{e}; retrying every {POLL:?}");
                    }
                    unavailable = true;
                }
                Err(e) => return Err(e),
            }
            if !self.running.lock().is_empty() {
                idle_since = Instant::now();
            } else if self.options.exit_when_idle.is_some_and(|idle| idle_since.elapsed() >= idle)
                && takeover::may_exit_idle(self.queue(), &mut orphans_told)
            {
                tracing::info!("worker {} exiting: nothing to run", std::process::id());
                break;
            }
            let room = self.at_work() < self.options.max_threads;
            let look_again = takeover.look_again(self.queue(), room);
            let woken = async {
                match &mut wake {
                    Some(receiver) => receiver.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                note = woken => if note.is_none() {
                    tracing::warn!(
                        "wake-ups stopped (their connection closed); polling every {POLL:?}"
                    );
                    wake = None;
                },
                _ = self.changed.notified() => {}
                _ = tokio::time::sleep(look_again) => {}
                _ = &mut stop => {
                    tracing::info!(
                        "worker {} stopping: handing its threads back to the queue",
                        std::process::id()
                    );
                    self.hand_back_all(self.options.grace).await;
                    break;
                }
            }
        }
        self.queue().unregister()
    }

    /// One look at the queue: kill and pause requests for threads here, queued threads to
    /// claim up to the limit, the heartbeat when due, and wake-ups asked for again if they
    /// were lost.
    fn poll(
        self: &Arc<Self>,
        last_heartbeat: &mut Instant,
        wake: &mut Option<tokio::sync::mpsc::UnboundedReceiver<()>>,
    ) -> Result<()> {
        self.apply_requests()?;
        let running = self.running_ids();
        let free = self.options.max_threads.saturating_sub(self.at_work());
        if free > 0 {
            for claimed in self.queue().claim(self.options.scope, free, &running, None)? {
                if let Some(previous) = &claimed.taken_from {
                    tracing::info!("thread {}: taken over from {previous}", claimed.id);
                }
                let secrets =
                    self.store.config().map(|c| Secrets::from_env(&c)).unwrap_or_default();
                let id = claimed.id;
                if let Err(e) = self.start(claimed, secrets, false) {
                    tracing::error!("thread {id}: {e}");
                }
            }
        }
        if last_heartbeat.elapsed() >= HEARTBEAT {
            self.queue().heartbeat(&self.activities())?;
            *last_heartbeat = Instant::now();
            if wake.is_none() {
                *wake = self.queue().wake_ups().ok().flatten();
            }
        }
        Ok(())
    }

    /// Applies the kill and pause requests made for this worker's threads.
    fn apply_requests(&self) -> Result<()> {
        for (id, request) in self.queue().requests(&self.running_ids())? {
            let mut running = self.running.lock();
            let Some(thread) = running.get_mut(&id) else { continue };
            match request {
                ControlRequest::Pause => {
                    tracing::info!(
                        "thread {id}: pause requested; it pauses after its current step"
                    );
                    thread.control.request_pause()
                }
                ControlRequest::Kill => {
                    if let Some(kill) = thread.kill.take() {
                        let _ = kill.send(());
                    }
                }
            }
        }
        Ok(())
    }

    fn running_ids(&self) -> Vec<ThreadId> {
        self.running.lock().keys().copied().collect()
    }

    /// A bundle compiled (or loaded from this machine's AOT cache) once per worker.
    fn loaded(&self, name: &str, hash: BundleHash) -> Result<Arc<LoadedBundle>> {
        if let Some(bundle) = self.bundles.lock().get(&hash) {
            return Ok(bundle.clone());
        }
        let bundle = Arc::new(Catalog::new(&self.store).load(&self.runtime, name, hash)?);
        self.bundles.lock().insert(hash, bundle.clone());
        Ok(bundle)
    }

    fn activities(&self) -> Vec<(ThreadId, Activity)> {
        self.running
            .lock()
            .iter()
            .map(|(id, running)| {
                let now = running.control.current_activity();
                let activity = Activity {
                    since: running.since,
                    role: now.as_ref().map(|(a, _)| a.role.clone()),
                    agent: now.as_ref().map(|(a, _)| a.agent.clone()),
                    working_since: now.as_ref().map(|(_, since)| *since),
                    waiting_for: running.control.waiting_for(),
                };
                (*id, activity)
            })
            .collect()
    }

    /// What this worker runs, as `ps` lists it.
    fn ps(&self) -> Vec<PsEntry> {
        let mut list: Vec<PsEntry> = self
            .running
            .lock()
            .iter()
            .map(|(id, running)| {
                let activity = running.control.current_activity();
                PsEntry {
                    thread_id: *id,
                    name: running.name.clone(),
                    hash: running.hash,
                    role: activity.as_ref().map(|(a, _)| a.role.clone()),
                    agent: activity.as_ref().map(|(a, _)| a.agent.clone()),
                    working_since: activity.as_ref().map(|(_, since)| *since),
                    steps: running.control.steps(),
                    since: running.since,
                    pid: Some(std::process::id()),
                    host: None,
                    state: PsState::Running,
                    waiting_for: running.control.waiting_for(),
                }
            })
            .collect();
        list.sort_by_key(|entry| entry.thread_id);
        list
    }

    /// The threads that take a slot (`max-threads`): all but those waiting for a provider
    /// limit's capacity, which hold no instance and would otherwise keep threads of other
    /// providers (or none) from running while a limit's line is long.
    fn at_work(&self) -> usize {
        self.running.lock().values().filter(|r| r.control.waiting_for().is_none()).count()
    }

    /// SIGTERM: every thread stops after its current step and goes back to the queue; those
    /// still in a step when `grace` runs out are stopped where they are.
    async fn hand_back_all(&self, grace: Duration) {
        for running in self.running.lock().values() {
            running.control.request_hand_back();
        }
        if tokio::time::timeout(grace, self.all_ended()).await.is_err() {
            let late = self.running.lock().len();
            tracing::warn!(
                "{late} thread(s) still in a step after {}: stopped, their steps to be asked again",
                humantime::format_duration(grace)
            );
            for running in self.running.lock().values_mut() {
                if let Some(drop_step) = running.drop_step.take() {
                    let _ = drop_step.send(());
                }
            }
            self.all_ended().await;
        }
    }

    /// Resolves once no thread runs here.
    async fn all_ended(&self) {
        loop {
            let changed = self.changed.notified();
            if self.running.lock().is_empty() {
                return;
            }
            changed.await;
        }
    }

    /// The control of thread `id`, if this worker runs it.
    fn control_of(&self, id: ThreadId) -> Option<Arc<ThreadControl>> {
        self.running.lock().get(&id).map(|r| r.control.clone())
    }

    /// Runs claimed thread `claimed` (its queued request laid over its recorded one, its agents
    /// given `secrets`) in a task of its own;
    /// `interactive` puts its `human` agents' questions to a follower. A thread that cannot
    /// start here (its bundle fails to load, the worker is full) is released and the error
    /// returned.
    fn start(
        self: &Arc<Self>,
        claimed: Claimed,
        secrets: Secrets,
        interactive: bool,
    ) -> Result<Started> {
        let Claimed { id, record, mut writer, ticket, request, .. } = claimed;
        let prepared = lifecycle::check_continuable(&self.store, &record).and_then(|()| {
            let bundle = self.loaded(&record.start.name, record.version())?;
            let agents = lifecycle::agents_for(&self.store, &record, &bundle, &request, &secrets)?;
            let limits = lifecycle::limits_for(&self.store, &record)?;
            let running = self.at_work();
            if running >= limits.max_threads.min(self.options.max_threads) {
                return Err(Error::ThreadState {
                    id: id.to_string(),
                    status: "not started",
                    reason: format!(
                        "its worker already runs {running} threads, its limit \
                         (limits.max-threads); resume it later"
                    ),
                });
            }
            Ok((bundle, agents, limits))
        });
        let (bundle, agents, limits) = match prepared {
            Ok(prepared) => prepared,
            Err(e) => {
                // Released under the hold, so it does not look runnable for an instant.
                self.settle(id, ticket, Some(&e));
                drop(writer);
                return Err(e);
            }
        };
        let control = Arc::new(ThreadControl::default());
        if let Some(live) = self.store.queue().live() {
            control.set_live(live.publisher(id));
        }
        let progress = control.watch();
        let questions = interactive.then(|| control.human.attach());
        let (ended_sender, ended) = broadcast::channel(4);
        let (kill, killed) = oneshot::channel();
        let (drop_step, dropped) = oneshot::channel();
        self.running.lock().insert(
            id,
            Running {
                name: record.start.name.clone(),
                hash: record.version(),
                control: control.clone(),
                since: now_ms(),
                kill: Some(kill),
                drop_step: Some(drop_step),
            },
        );
        self.had_threads.store(true, Ordering::SeqCst);
        let accepted = Reply::Accepted {
            thread: id,
            pid: std::process::id(),
            cache_hit: bundle.cache == CacheOutcome::Hit,
            steps: record.steps.len(),
        };
        let worker = self.clone();
        tokio::spawn(async move {
            let mut gone = gone::Gone::new(worker.clone(), id, ticket);
            let ctx = RunContext {
                runtime: &worker.runtime,
                store: &worker.store,
                agents,
                limits,
                control,
                children: worker.options.children.clone(),
            };
            // When the run future is dropped (killed, or its step dropped), the guest stops
            // wherever it was, and an agent process it waited on is killed with it.
            let run = run_thread(&ctx, &bundle, &mut *writer, &record, Until::End, |_| {});
            let finished = tokio::select! {
                outcome = run => match outcome {
                    Ok(RunOutcome::HandedBack) => Finished::HandedBack,
                    outcome => Finished::Rest(outcome),
                },
                Ok(()) = killed => {
                    let end = EndRecord {
                        end: End::by_host(KILLED_RETURN_CODE, "killed".into(), EndStatus::Killed),
                        timestamp: now_ms(),
                    };
                    Finished::Rest(writer.append_end(&end).map(|()| RunOutcome::Ended(end)))
                }
                Ok(()) = dropped => Finished::HandedBack,
            };
            let reply = match finished {
                Finished::HandedBack => {
                    if let Err(e) = worker.queue().release(id, ticket, Release::HandBack) {
                        tracing::warn!("thread {id}: {e}");
                    }
                    tracing::info!("thread {id}: handed back to the queue");
                    Reply::Paused { steps: ctx.control.steps() }
                }
                Finished::Rest(outcome) => {
                    worker.settle(id, ticket, outcome.as_ref().err());
                    match outcome {
                        Ok(RunOutcome::Ended(end)) => Reply::Ended { end },
                        Ok(RunOutcome::Waiting { role }) => Reply::Waiting { role },
                        Ok(_) => Reply::Paused { steps: ctx.control.steps() },
                        Err(e) => {
                            if !e.is_database_unavailable() {
                                tracing::error!("thread {id}: {e}");
                            }
                            Reply::Error {
                                message: format!("thread {id}: {e}"),
                                code: e.exit_code(),
                            }
                        }
                    }
                }
            };
            drop(writer);
            let rested = matches!(reply, Reply::Ended { .. } | Reply::Waiting { .. });
            // Counted as a connection while it is passed on: the worker of a home directory's
            // bundle exits once it has no thread, and this work is not done yet.
            worker.connections.fetch_add(1, Ordering::SeqCst);
            gone.leave();
            let _ = ended_sender.send(reply);
            // A child that ended passes its result to its parent, and a parent that waits on
            // a child that ended meanwhile takes it (and may come back to this worker).
            if let (Some(children), true) = (&worker.options.children, rested) {
                crate::faults::crash_point("thread-rested");
                children.rested(id).await;
            }
            worker.connections.fetch_sub(1, Ordering::SeqCst);
            worker.changed.notify_waiters();
            worker.changed.notify_one();
        });
        Ok(Started { accepted, ended, progress, questions })
    }

    /// Takes thread `id` out of the queue, unless the run lost its hold (another worker has
    /// it now: nothing more is written from here). A run stopped because the database went
    /// away stays queued: once it is back, a worker (this one, or another) takes the thread
    /// again and continues it from its journal.
    fn settle(&self, id: ThreadId, ticket: i64, error: Option<&Error>) {
        match error {
            Some(Error::LeaseLost(_)) => return,
            Some(e) if e.is_database_unavailable() => {
                tracing::warn!("thread {id} stopped, to be taken again: {e}");
                return;
            }
            _ => {}
        }
        if let Err(e) = self.queue().release(id, ticket, Release::Settle) {
            tracing::warn!("thread {id}: {e}");
        }
    }
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("install a SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
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
