//! The worker of a shared (PostgreSQL) store: one process per machine, or several, each
//! claiming runnable threads of any bundle from the database, running up to its limit at once
//! under leases it keeps renewing, and taking over the threads of workers that died.
//!
//! It wakes on `LISTEN` (a thread queued, a kill or pause asked) and polls as well, so a lost
//! notification connection slows it down but never stops it.
//!
//! On SIGTERM (a rolling restart) it stops claiming, lets each thread finish the step at hand
//! within a grace period, and hands every thread back to the queue, where another worker
//! continues it with no command; a step still at work when the grace runs out is dropped (its
//! agent stopped) and asked again there, as after a crash.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::{Notify, oneshot};

use crate::agents::{AgentFlags, Secrets};
use crate::clock::now_ms;
use crate::error::{Error, Result};
use crate::ids::{BundleHash, ThreadId};
use crate::limits::Limits;
use crate::run::catalog::Catalog;
use crate::run::lifecycle;
use crate::run::runner::{RunContext, RunOutcome, Until, run_thread};
use crate::run::worker::{KILLED_RETURN_CODE, announce_ready, raise_open_files_limit};
use crate::sandbox::control::ThreadControl;
use crate::sandbox::engine::{LoadedBundle, Runtime};
use crate::store::Storage;
use crate::store::ThreadWriter;
use crate::store::postgres::Postgres;
use crate::store::postgres::queue::{
    Activity, CONTROL_CHANNEL, Claimed, ControlRequest, HEARTBEAT, QUEUE_CHANNEL, Queue,
};
use crate::store::postgres::threads::{PgThreads, PgWriter};
use crate::store::records::{End, EndRecord, EndStatus, ThreadRecord};

/// How often the worker looks at the queue and its requests when nothing woke it.
const POLL: Duration = Duration::from_millis(500);

/// How a pool worker runs.
#[derive(Debug, Clone)]
pub struct PoolOptions {
    /// Most threads run at once.
    pub max_threads: usize,
    /// Exit after this long with nothing to run (a worker `run` started on demand); `None`
    /// runs until SIGTERM or Ctrl-C.
    pub exit_when_idle: Option<Duration>,
    /// On SIGTERM, how long threads may take to finish the step at hand before they are
    /// handed back mid-step.
    pub grace: Duration,
}

/// A thread this worker runs.
struct Running {
    control: Arc<ThreadControl>,
    since: u64,
    kill: Option<oneshot::Sender<()>>,
    /// Stops the run where it is, recording nothing, to hand the thread back.
    drop_step: Option<oneshot::Sender<()>>,
}

/// How a run of a claimed thread ended, for what happens to its place in the queue.
enum Finished {
    /// It came to rest (ended, paused, waits), or failed here: it leaves the queue.
    Rest(Result<()>),
    /// It stopped to be handed back (this worker is stopping): it stays queued for another.
    HandedBack,
}

struct Pool {
    store: Storage,
    pg: Postgres,
    queue: Queue,
    threads: PgThreads,
    runtime: Runtime,
    bundles: Mutex<HashMap<BundleHash, Arc<LoadedBundle>>>,
    running: Mutex<HashMap<ThreadId, Running>>,
    /// Woken when a thread ends, so its slot is filled at once.
    changed: Notify,
}

/// Notifications on the `LISTEN` connection: a wake-up for each.
type Wake = tokio::sync::mpsc::UnboundedReceiver<String>;

/// Runs the pool worker until it is stopped (or idle long enough, with `exit_when_idle`).
pub async fn serve(store: Storage, options: PoolOptions) -> Result<()> {
    let pg = store.postgres().cloned().ok_or_else(|| {
        Error::Usage(
            "`worker` without a bundle needs a database store (--store postgres://…)".into(),
        )
    })?;
    raise_open_files_limit();
    std::thread::spawn(crate::schema::precompile_meta_schema);
    let limits = Limits::resolve(&store.config()?.limits, &Default::default())?;
    let pool = Arc::new(Pool {
        runtime: Runtime::for_worker(store.home(), &limits)?,
        queue: crate::store::postgres::queue::Queue::new(&pg),
        threads: PgThreads::new(&pg),
        pg,
        store,
        bundles: Mutex::new(HashMap::new()),
        running: Mutex::new(HashMap::new()),
        changed: Notify::new(),
    });
    pool.queue.register(options.max_threads)?;
    let mut wake = match pool.queue.listen(&[QUEUE_CHANNEL, CONTROL_CHANNEL]) {
        Ok(wake) => Some(wake),
        Err(e) => {
            tracing::warn!("no LISTEN wake-ups (polling every {POLL:?}): {e}");
            None
        }
    };
    tracing::info!(
        "worker {} on {} ({} threads at most, leases of {:?})",
        pool.pg.owner(),
        pool.pg.target(),
        options.max_threads,
        pool.pg.lease()
    );
    announce_ready();
    let mut idle_since = Instant::now();
    let mut last_heartbeat = Instant::now();
    let stop = shutdown_signal();
    tokio::pin!(stop);
    // Whether the database was out of reach at the last look (said once, not every poll).
    let mut unavailable = false;
    loop {
        // A database that goes away (restarted, cut off) is waited out: the threads at work
        // go on with their agents, and whatever they cannot store waits for its return.
        match pool.poll_queue(options.max_threads, &mut last_heartbeat, &mut wake) {
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
        if !pool.running.lock().is_empty() {
            idle_since = Instant::now();
        } else if options.exit_when_idle.is_some_and(|idle| idle_since.elapsed() >= idle) {
            tracing::info!("worker {} exiting: nothing to run", std::process::id());
            break;
        }
        let woken = async {
            match &mut wake {
                Some(receiver) => receiver.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            note = woken => if note.is_none() {
                tracing::warn!("lost the LISTEN connection; polling every {POLL:?}");
                wake = None;
            },
            _ = pool.changed.notified() => {}
            _ = tokio::time::sleep(POLL) => {}
            _ = &mut stop => {
                tracing::info!(
                    "worker {} stopping: handing its threads back to the queue",
                    std::process::id()
                );
                pool.hand_back_all(options.grace).await;
                break;
            }
        }
    }
    pool.queue.unregister()?;
    Ok(())
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

impl Pool {
    /// One look at the queue: kill and pause requests for threads here, new threads to claim
    /// up to `max_threads`, the heartbeat when due, and the `LISTEN` connection opened again
    /// if it was lost.
    fn poll_queue(
        self: &Arc<Self>,
        max_threads: usize,
        last_heartbeat: &mut Instant,
        wake: &mut Option<Wake>,
    ) -> Result<()> {
        for (id, request) in self.queue.take_requests()? {
            self.apply(id, request);
        }
        let running: Vec<ThreadId> = self.running.lock().keys().copied().collect();
        let free = max_threads.saturating_sub(running.len());
        if free > 0 {
            for claimed in self.queue.claim(free, &running)? {
                self.start(claimed);
            }
        }
        if last_heartbeat.elapsed() >= HEARTBEAT {
            self.queue.heartbeat(&self.activities())?;
            *last_heartbeat = Instant::now();
            if wake.is_none() {
                *wake = self.queue.listen(&[QUEUE_CHANNEL, CONTROL_CHANNEL]).ok();
            }
        }
        Ok(())
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
                };
                (*id, activity)
            })
            .collect()
    }

    fn apply(&self, id: ThreadId, request: ControlRequest) {
        let mut running = self.running.lock();
        let Some(thread) = running.get_mut(&id) else { return };
        match request {
            ControlRequest::Pause => thread.control.request_pause(),
            ControlRequest::Kill => {
                if let Some(kill) = thread.kill.take() {
                    let _ = kill.send(());
                }
            }
        }
    }

    /// SIGTERM: every thread stops after its current step and goes back to the queue; those
    /// still in a step when `grace` runs out are stopped where they are.
    async fn hand_back_all(&self, grace: Duration) {
        for running in self.running.lock().values() {
            running.control.request_hand_back();
        }
        let finished = async {
            while !self.running.lock().is_empty() {
                let changed = self.changed.notified();
                if self.running.lock().is_empty() {
                    break;
                }
                changed.await;
            }
        };
        if tokio::time::timeout(grace, finished).await.is_err() {
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
            while !self.running.lock().is_empty() {
                let changed = self.changed.notified();
                if self.running.lock().is_empty() {
                    break;
                }
                changed.await;
            }
        }
    }

    /// Runs a claimed thread in a task of its own.
    fn start(self: &Arc<Self>, claimed: Claimed) {
        let Claimed { id, token, request, taken_from } = claimed;
        if let Some(previous) = &taken_from {
            tracing::info!("thread {id}: taken over from {previous} (its lease ran out)");
        }
        let control = Arc::new(ThreadControl::default());
        let (kill, killed) = oneshot::channel();
        let (drop_step, dropped) = oneshot::channel();
        let running = Running {
            control: control.clone(),
            since: now_ms(),
            kill: Some(kill),
            drop_step: Some(drop_step),
        };
        self.running.lock().insert(id, running);
        let pool = self.clone();
        tokio::spawn(async move {
            let secrets = pool.store.config().map(|c| Secrets::from_env(&c)).unwrap_or_default();
            let flags = super::queued::flags_of(request, secrets);
            match pool.run(id, token, flags, control, killed, dropped).await {
                // Said when it was settled: the thread waits in the queue for the database.
                Err(e) if e.is_database_unavailable() => {}
                Err(e) => tracing::error!("thread {id}: {e}"),
                Ok(()) => {}
            }
            pool.running.lock().remove(&id);
            pool.changed.notify_one();
        });
    }

    async fn run(
        &self,
        id: ThreadId,
        token: i64,
        flags: AgentFlags,
        control: Arc<ThreadControl>,
        killed: oneshot::Receiver<()>,
        dropped: oneshot::Receiver<()>,
    ) -> Result<()> {
        let record = match self.threads.read_lines(id) {
            Ok(Some(record)) => record,
            Ok(None) => return Err(Error::UnknownThread(id.to_string())),
            Err(e) => return self.settle(id, token, Err(e)),
        };
        let mut writer = self.threads.writer(id, token, record.clone());
        match self.run_held(&mut writer, &record, flags, control, killed, dropped).await {
            Finished::HandedBack => {
                self.queue.hand_back(id, token)?;
                tracing::info!("thread {id}: handed back to the queue");
                drop(writer);
                Ok(())
            }
            // Settled while the lease is still held: once let go, the thread must not look
            // runnable to another worker for an instant.
            Finished::Rest(outcome) => {
                let outcome = self.settle(id, token, outcome);
                drop(writer);
                outcome
            }
        }
    }

    /// Takes thread `id` out of the queue, unless the run lost its lease (another worker
    /// has it now: nothing more is written from here). A thread that cannot run here (its
    /// bundle fails to load, its records do not fit) leaves the queue too rather than fail
    /// on every worker in turn; it reads `interrupted`, and `resume` tries again.
    ///
    /// A run stopped because the database went away stays queued: once it is back, a worker
    /// (this one, or another) takes the thread again and continues it from its journal.
    fn settle(&self, id: ThreadId, token: i64, outcome: Result<()>) -> Result<()> {
        match &outcome {
            Err(Error::LeaseLost(_)) => return outcome,
            Err(e) if e.is_database_unavailable() => {
                tracing::warn!("thread {id} stopped, to be taken again: {e}");
                return outcome;
            }
            _ => {}
        }
        if let Err(e) = self.queue.settle(id, token) {
            tracing::warn!("thread {id}: {e}");
        }
        outcome
    }

    async fn run_held(
        &self,
        writer: &mut PgWriter,
        record: &ThreadRecord,
        flags: AgentFlags,
        control: Arc<ThreadControl>,
        killed: oneshot::Receiver<()>,
        dropped: oneshot::Receiver<()>,
    ) -> Finished {
        let prepared = lifecycle::check_continuable(&self.store, record).and_then(|()| {
            let bundle = self.loaded(&record.start.name, record.start.hash)?;
            let agents = lifecycle::agents_for(&self.store, record, &bundle, &flags)?;
            let limits = lifecycle::limits_for(&self.store, record)?;
            Ok((bundle, agents, limits))
        });
        let (bundle, agents, limits) = match prepared {
            Ok(prepared) => prepared,
            Err(e) => return Finished::Rest(Err(e)),
        };
        let ctx =
            RunContext { runtime: &self.runtime, store: &self.store, agents, limits, control };
        // When the run future is dropped (killed, or its step dropped), the guest stops
        // wherever it was, and an agent process it waited on is killed with it.
        let run = run_thread(&ctx, &bundle, writer, record, Until::End, |_| {});
        let outcome = tokio::select! {
            outcome = run => outcome,
            Ok(()) = killed => {
                return Finished::Rest(writer.append_end(&EndRecord {
                    end: End::by_host(KILLED_RETURN_CODE, "killed".into(), EndStatus::Killed),
                    timestamp: now_ms(),
                }));
            }
            Ok(()) = dropped => return Finished::HandedBack,
        };
        match outcome {
            Ok(RunOutcome::HandedBack) => Finished::HandedBack,
            Ok(_) => Finished::Rest(Ok(())),
            Err(e) => Finished::Rest(Err(e)),
        }
    }
}
