//! Dispatch on a shared store (a database): a thread is queued for whichever worker claims it,
//! with a worker started on this machine when none is alive anywhere (no daemon to set up for
//! one machine), and followed from any machine by reading what the worker stores. A follower
//! at a terminal is asked the question a `human` agent waits on: its answer is journaled and
//! the thread queued again, as `answer` would, so no worker holds a thread (or its lease)
//! while a person types.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;

use super::{Accepted, Asked, Dispatch, Follower, Heard, Question};
use crate::agents::human::{WaitingQuestion, parse_decision};
use crate::error::{Error, Result};
use crate::ids::{BundleHash, ThreadId};
use crate::run::answer::{self, Answer};
use crate::run::events::{Event, PsEntry, PsState};
use crate::run::ipc;
use crate::run::watch::ThreadReader;
use crate::run::worker::{self, WorkerOptions};
use crate::run_request::RunRequest;
use crate::store::Storage;
use crate::store::pauses::DecidedBy;
use crate::store::queue::{ControlRequest, Live};
use crate::store::records::{PendingCall, StartRecord, ThreadRecord, ThreadStatus};

/// How often a follower reads what was stored since it last looked (one indexed read of the
/// new records, usually none).
const FOLLOW_POLL: Duration = Duration::from_millis(100);

/// How often a follower checks that a worker is alive to run its thread.
const WORKER_CHECK: Duration = Duration::from_secs(2);

/// How long a worker started on demand waits for work before it exits.
pub const ON_DEMAND_IDLE: Duration = Duration::from_secs(5);

/// Dispatch over a shared store's queue and pool workers.
pub struct SharedDispatch {
    store: Storage,
}

impl SharedDispatch {
    pub fn new(store: &Storage) -> Self {
        SharedDispatch { store: store.clone() }
    }
}

impl Dispatch for SharedDispatch {
    fn hand_over<'a>(
        &'a self,
        id: ThreadId,
        hash: BundleHash,
        over: &'a RunRequest,
        follow: bool,
    ) -> BoxFuture<'a, Result<(Box<dyn Follower>, Accepted)>> {
        async move {
            let record = self.store.threads().read(id)?;
            enqueue(&self.store, id, hash, over).await?;
            let accepted = Accepted { pid: None, cache_hit: false, steps: record.steps.len() };
            // Live text is listened for only by a follower: a detached start opens no
            // session for it (a connection a start, which the server forks a process for).
            let follower = QueuedThread::new(&self.store, &record, over, follow, follow);
            Ok((Box::new(follower) as Box<dyn Follower>, accepted))
        }
        .boxed()
    }

    /// Created queued, in one statement; a start waits for no worker (one alive takes it when
    /// it has room), but makes sure one is alive (started here if none is, anywhere).
    fn start<'a>(&'a self, start: &'a StartRecord) -> BoxFuture<'a, Result<()>> {
        async move {
            self.store.queue().create_queued(start, &RunRequest::default())?;
            crate::faults::crash_point("start-created");
            crate::faults::crash_point("start-queued");
            ensure_worker(&self.store)
        }
        .boxed()
    }

    /// The request goes in the thread's row; the store wakes the workers itself.
    fn ask(
        &self,
        id: ThreadId,
        _hash: BundleHash,
        request: ControlRequest,
    ) -> BoxFuture<'_, Result<Asked>> {
        async move {
            Ok(match self.store.queue().ask(id, request)? {
                true => Asked::Asked,
                false => Asked::NotHeld,
            })
        }
        .boxed()
    }

    fn running(&self) -> BoxFuture<'_, Result<Vec<PsEntry>>> {
        async move { Ok(self.store.queue().live_threads()?.into_iter().map(listed).collect()) }
            .boxed()
    }

    /// A pool worker, taking threads of any bundle (or one) from the queue under leases.
    fn work(&self, options: WorkerOptions) -> BoxFuture<'_, Result<()>> {
        worker::serve_pool(self.store.clone(), options).boxed()
    }

    /// None to hand over: the pool's workers claim whatever is queued. A start whose process
    /// died before it made sure a worker is alive waits for one, though: made sure of here.
    fn hand_over_orphaned_starts(&self) -> BoxFuture<'_, Result<usize>> {
        async move {
            // Any live worker claims what is queued: only with none is the queue read.
            let queue = self.store.queue();
            if queue.live_workers()? == 0
                && queue.live_threads()?.iter().any(|thread| thread.worker.is_none())
            {
                ensure_worker(&self.store)?;
            }
            Ok(0)
        }
        .boxed()
    }

    fn live(&self, id: ThreadId) -> BoxFuture<'_, Result<Option<super::LiveNews>>> {
        let store = self.store.clone();
        async move { live_through_store(&store, id) }.boxed()
    }
}

/// Queues thread `id` (with `over` laid over its recorded request), with a worker alive to
/// take it.
/// Returns once the thread is queued: a worker that is alive but busy takes it when it has
/// room, and one that died holding it is taken over from when its lease runs out.
async fn enqueue(store: &Storage, id: ThreadId, hash: BundleHash, over: &RunRequest) -> Result<()> {
    store.queue().enqueue(id, hash, over)?;
    ensure_worker(store)
}

/// A thread the store's queue lists as queued or held (see
/// [`WorkQueue::live_threads`](crate::store::queue::WorkQueue::live_threads)), as `ps` lists it.
fn listed(live: crate::store::queue::LiveThread) -> PsEntry {
    let (summary, activity) = (live.summary, live.activity);
    PsEntry {
        thread_id: summary.thread_id,
        name: summary.name,
        hash: summary.hash,
        role: activity.as_ref().and_then(|a| a.role.clone()),
        agent: activity.as_ref().and_then(|a| a.agent.clone()),
        working_since: activity.as_ref().and_then(|a| a.working_since),
        steps: summary.steps,
        since: activity.as_ref().map_or(summary.timestamp, |a| a.since),
        pid: live.worker.as_ref().map(|(_, pid)| *pid),
        host: live.worker.as_ref().map(|(host, _)| host.clone()),
        state: if live.worker.is_some() { PsState::Running } else { PsState::Queued },
        waiting_for: activity.as_ref().and_then(|a| a.waiting_for.clone()),
    }
}

/// How long a worker seen alive (or started) by this process is taken to be alive still,
/// without asking the store again: a dead one's threads wait for the next look at most this
/// much longer (or for any worker, which takes them over by their leases).
const SEEN_ALIVE_FOR: Duration = Duration::from_millis(500);

/// When this process last saw a worker alive, by store. Starts that arrive together look
/// once: each looking for itself would find none, and start a worker each.
static SEEN_ALIVE: parking_lot::Mutex<BTreeMap<String, Instant>> =
    parking_lot::Mutex::new(BTreeMap::new());

/// Starts a worker on this machine if none is alive anywhere (no daemon to set up for one
/// machine).
fn ensure_worker(store: &Storage) -> Result<()> {
    let mut seen = SEEN_ALIVE.lock();
    let key = store.url().unwrap_or_default().to_string();
    if seen.get(&key).is_some_and(|at| at.elapsed() < SEEN_ALIVE_FOR) {
        return Ok(());
    }
    if store.queue().live_workers()? == 0 {
        start_worker(store)?;
    }
    seen.insert(key, Instant::now());
    Ok(())
}

/// Starts `worker --exit-when-idle` on this machine and waits for it to say it is up.
fn start_worker(store: &Storage) -> Result<()> {
    let home = store.home();
    crate::durable::create_dir(&home.run_dir())?;
    let log_file = home.run_dir().join("pool-worker.log");
    let stdout = ipc::start_worker_process(store, &["--exit-when-idle"], &log_file)?;
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)
        .map_err(Error::io("wait for the worker logging to", &log_file))?;
    if !line.starts_with("ready") {
        return Err(Error::Host(format!(
            "the worker started for the queue exited at once (see {})",
            log_file.display()
        )));
    }
    Ok(())
}

/// A follower of thread `record` through its store, on any store: its steps after the first
/// `seen`, and how it comes to rest (a parent waiting on a child workflow is followed on,
/// through the child's run and its own).
pub fn follow_stored(store: &Storage, record: &ThreadRecord, seen: usize) -> Box<dyn Follower> {
    let mut follower = QueuedThread::new(store, record, &RunRequest::default(), false, true);
    follower.seen = seen;
    Box::new(follower)
}

/// Follows a queued thread: its steps as they are stored, the role at work, and how it comes
/// to rest.
struct QueuedThread {
    store: Storage,
    /// The request it was queued with (and is queued with again once answered).
    over: RunRequest,
    /// Whether the follower puts a `human` agent's question to its user.
    interactive: bool,
    /// The call a question was put for, until it is answered or declined.
    asked: Option<PendingCall>,
    /// The last call answered from here: a thread still reading as waiting on it is about to
    /// be taken by a worker, not asking again.
    answered: Option<PendingCall>,
    /// When it was last checked that some worker is alive to run the thread.
    checked_workers: Instant,
    id: ThreadId,
    /// The thread's records read so far.
    reader: ThreadReader,
    /// Steps already reported.
    seen: usize,
    last_working: Option<(String, String)>,
    pending: VecDeque<Heard>,
    done: bool,
    /// The thread's live text, as its worker publishes it (none where the store cannot carry
    /// it to this process).
    live: Option<super::LiveNews>,
    /// When the store was last read.
    last_read: Option<Instant>,
}

impl QueuedThread {
    /// Follows the thread of `record` (as it was when queued with `over`); `interactive`
    /// puts a `human` agent's questions to the follower, and `live` hears its live text.
    fn new(
        store: &Storage,
        record: &ThreadRecord,
        over: &RunRequest,
        interactive: bool,
        live: bool,
    ) -> Self {
        QueuedThread {
            store: store.clone(),
            over: over.clone(),
            interactive,
            asked: None,
            answered: None,
            checked_workers: Instant::now(),
            id: record.id(),
            reader: ThreadReader::new(store, record.id()),
            seen: record.steps.len(),
            last_working: None,
            pending: VecDeque::new(),
            done: false,
            last_read: None,
            live: live.then(|| store.queue().live()).flatten().and_then(|live| {
                match live.follow(record.id()) {
                    Ok(live) => live,
                    Err(e) => {
                        tracing::warn!(
                            "the live text of thread {} is not followed: {e}",
                            record.id()
                        );
                        None
                    }
                }
            }),
        }
    }

    fn read(&mut self) -> Result<()> {
        let record = self.reader.catch_up()?;
        let thread = self.id;
        let working = self.working()?;
        // Each step carries its agent and duration, as the worker stored it.
        for (offset, step) in record.steps.iter().enumerate().skip(self.seen) {
            let step = step.clone();
            self.pending.push_back(Heard::Event(Event::Step { thread, index: offset + 1, step }));
        }
        self.seen = self.seen.max(record.steps.len());
        if let Some((role, agent)) = working
            && self.last_working.as_ref() != Some(&(role.clone(), agent.clone()))
        {
            self.pending.push_back(Heard::Event(Event::working(thread, &role, &agent)));
            self.last_working = Some((role, agent));
        }
        let waits_on = record.paused.as_ref().and_then(|p| p.call.clone());
        let rest = match record.status() {
            ThreadStatus::Running | ThreadStatus::Queued => {
                self.check_workers()?;
                None
            }
            _ if record.end.is_some() => {
                let end = record.end.clone().expect("an ended thread").end;
                Some(Event::Ended { thread, end })
            }
            ThreadStatus::Waiting if waits_on.is_some() && waits_on == self.answered => {
                self.check_workers()?;
                None
            }
            // A child workflow's thread answers it: it goes on when the child ends, unless the
            // child has stopped where only a person moves it on.
            ThreadStatus::Waiting if waits_on.as_ref().is_some_and(|c| c.child.is_some()) => {
                let child = waits_on.and_then(|c| c.child).expect("a child");
                if let Some(stuck) = self.stuck_child(child)? {
                    self.pending.push_back(Heard::Failed {
                        message: format!(
                            "thread {thread} waits for its child thread {child}, which {stuck}"
                        ),
                        code: crate::error::exit::STATE,
                    });
                    self.done = true;
                }
                return Ok(());
            }
            ThreadStatus::Waiting if self.interactive && self.asked.is_none() => {
                self.ask(&record, None)?;
                return Ok(());
            }
            ThreadStatus::Waiting => Some(Event::Waiting {
                thread,
                role: record.paused.as_ref().and_then(|p| p.role.clone()).unwrap_or_default(),
            }),
            ThreadStatus::Paused => Some(Event::Paused { thread, steps: record.steps.len() }),
            _ => {
                self.pending.push_back(Heard::Failed {
                    message: format!(
                        "thread {thread} stopped without ending (its worker failed; see the \
                         worker's log); `uncaged-workflow resume {thread}` continues it"
                    ),
                    code: crate::error::exit::SOFTWARE,
                });
                self.done = true;
                return Ok(());
            }
        };
        if let Some(rest) = rest {
            self.pending.push_back(Heard::Event(rest));
            self.done = true;
        }
        Ok(())
    }

    /// Why child thread `child` will not end by itself, if it will not: paused, interrupted,
    /// or waiting for a person (checked every few seconds, not on every read).
    fn stuck_child(&mut self, child: ThreadId) -> Result<Option<String>> {
        if self.checked_workers.elapsed() < WORKER_CHECK {
            return Ok(None);
        }
        self.checked_workers = Instant::now();
        let record = self.store.threads().read(child)?;
        Ok(match record.status() {
            ThreadStatus::Paused | ThreadStatus::Interrupted => Some(format!(
                "is {}; `uncaged-workflow resume {}` continues both",
                record.status().as_str(),
                self.id
            )),
            ThreadStatus::Waiting if record.waited_child().is_none() => {
                Some(format!("waits for a human answer: `uncaged-workflow answer {child} TEXT`"))
            }
            _ => None,
        })
    }

    /// Puts the question waiting thread `record` asks to the follower (again, with `error`,
    /// after an answer that did not fit).
    fn ask(&mut self, record: &ThreadRecord, error: Option<String>) -> Result<()> {
        let Some(question) = WaitingQuestion::of(record) else { return Ok(()) };
        let expected = answer::answer_shape(&self.store, record)?.map(|s| s.example());
        self.asked = record.paused.as_ref().and_then(|p| p.call.clone());
        let WaitingQuestion { role, system_prompt, context, tool } = question;
        let expected = if tool.is_some() { None } else { expected };
        self.pending.push_back(Heard::Question(Question {
            role,
            system_prompt,
            context,
            expected,
            error,
            tool,
        }));
        Ok(())
    }

    /// Makes sure some worker is alive to run the thread, every few seconds: its worker may
    /// have died, and with it the last worker alive, and the thread would wait forever.
    fn check_workers(&mut self) -> Result<()> {
        // A home directory's threads have a worker per bundle, started when handed one.
        if self.store.queue().workers() != crate::store::queue::Workers::Pool {
            return Ok(());
        }
        if self.checked_workers.elapsed() >= WORKER_CHECK {
            ensure_worker(&self.store)?;
            self.checked_workers = Instant::now();
        }
        Ok(())
    }

    /// The role at work and its agent, as the worker last published it.
    fn working(&self) -> Result<Option<(String, String)>> {
        Ok(self.store.queue().activity(self.id)?.and_then(|a| Some((a.role?, a.agent?))))
    }
}

/// Thread `id`'s live text, through the store.
pub(super) fn live_through_store(store: &Storage, id: ThreadId) -> Result<Option<super::LiveNews>> {
    match store.queue().live() {
        Some(live) => live.follow(id),
        None => Ok(None),
    }
}

impl Follower for QueuedThread {
    fn next(&mut self) -> BoxFuture<'_, Result<Option<Heard>>> {
        async move {
            loop {
                if let Some(heard) = self.pending.pop_front() {
                    return Ok(Some(heard));
                }
                if self.done {
                    return Ok(None);
                }
                // The store is read a poll apart, however much live text comes between.
                let due = self
                    .last_read
                    .map_or(Duration::ZERO, |at| FOLLOW_POLL.saturating_sub(at.elapsed()));
                if due.is_zero() {
                    self.read()?;
                    self.last_read = Some(Instant::now());
                    if !self.pending.is_empty() {
                        continue;
                    }
                }
                let due = if due.is_zero() { FOLLOW_POLL } else { due };
                let Some(live) = &mut self.live else {
                    tokio::time::sleep(due).await;
                    continue;
                };
                let heard = tokio::time::timeout(due, live.recv()).await;
                match heard {
                    Ok(Some(Live::Text(text))) => {
                        let thread = self.id;
                        self.pending.push_back(Heard::Event(Event::Delta { thread, text }));
                    }
                    // Something was stored: read it now, not a poll later.
                    Ok(Some(Live::Stored)) => self.last_read = None,
                    Ok(None) => self.live = None,
                    Err(_) => {}
                }
            }
        }
        .boxed()
    }

    /// Answers the question the follower was asked: journals `text` under the call the
    /// thread waits on and queues it again (as `answer` does); `None` declines, and the
    /// thread is left waiting. An answer that does not fit the role is asked again.
    fn answer(&mut self, text: Option<String>) -> BoxFuture<'_, Result<()>> {
        async move {
            let Some(call) = self.asked.take() else { return Ok(()) };
            let thread = self.id;
            let Some(text) = text else {
                let role = self.reader.catch_up()?.paused.as_ref().and_then(|p| p.role.clone());
                let role = role.unwrap_or_default();
                self.pending.push_back(Heard::Event(Event::Waiting { thread, role }));
                self.done = true;
                return Ok(());
            };
            // A tool call's question is answered with a decision, typed.
            let reply = match &call.tool {
                None => Answer::Text(text),
                Some(tool) => match parse_decision(tool.why, &text) {
                    Ok(decision) => Answer::Decision(decision),
                    Err(reason) => {
                        let record = self.reader.catch_up()?;
                        return self.ask(&record, Some(reason));
                    }
                },
            };
            match answer::record(&self.store, thread, reply, &DecidedBy::local("terminal")) {
                Ok(hash) => enqueue(&self.store, thread, hash, &self.over).await?,
                Err(Error::InvalidAnswer { reason, .. }) => {
                    let record = self.reader.catch_up()?;
                    return self.ask(&record, Some(reason));
                }
                // Answered meanwhile from elsewhere (`answer`, the web view), which queued it:
                // follow on.
                Err(Error::ThreadState { .. } | Error::ThreadBusy(_)) => {}
                Err(e) => return Err(e),
            }
            self.answered = Some(call);
            Ok(())
        }
        .boxed()
    }
}
