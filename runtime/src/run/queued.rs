//! Threads on a shared (PostgreSQL) store: queued for whichever worker claims them, with a
//! worker started on this machine when none is alive anywhere (no daemon to set up for one
//! machine), and followed from any machine by reading what the worker writes — the same
//! events a local worker streams over its socket. A follower at a terminal is asked the
//! question a `human` agent waits on: its answer is journaled and the thread queued again,
//! as `answer` would, so no worker ever holds a thread (or its lease) while a person types.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use crate::agents::human::WaitingQuestion;
use crate::agents::{AgentFlags, Secrets};
use crate::error::{Error, Result};
use crate::ids::ThreadId;
use crate::run::ipc::{self, Reply};
use crate::store::Storage;
use crate::store::postgres::Postgres;
use crate::store::postgres::queue::{ALIVE_WITHIN, HEARTBEAT, Queue, RunRequest};
use crate::store::postgres::threads::PgThreads;
use crate::store::records::{PendingCall, ThreadLines, ThreadRecord, ThreadStatus};

/// How often a follower reads what was stored since it last looked (one indexed read of the
/// new rows, usually none).
const FOLLOW_POLL: Duration = Duration::from_millis(100);

/// How often a follower checks that a worker is alive to run its thread.
const WORKER_CHECK: Duration = Duration::from_secs(2);

/// How long a worker started on demand waits for work before it exits.
pub const ON_DEMAND_IDLE: Duration = Duration::from_secs(5);

/// Queues thread `id` (its agents overridden by `flags`) and makes sure a worker is alive to
/// take it.
pub async fn enqueue(
    store: &Storage,
    pg: &Postgres,
    id: ThreadId,
    flags: &AgentFlags,
) -> Result<()> {
    let queue = Queue::new(pg);
    queue.enqueue(id, &request_of(flags))?;
    ensure_taken(store, &queue, id).await
}

/// Makes sure some worker takes queued thread `id`. A worker that looks alive may have just
/// died (its heartbeat has not aged yet): until the thread is taken, or for as long as a
/// heartbeat takes to go stale, a worker is started here as soon as none is alive. Workers
/// alive but busy past that take the thread when they can.
async fn ensure_taken(store: &Storage, queue: &Queue, id: ThreadId) -> Result<()> {
    let deadline = std::time::Instant::now() + ALIVE_WITHIN + HEARTBEAT;
    loop {
        if queue.live_workers()? == 0 {
            return start_worker(store);
        }
        if queue.is_taken(id)? || std::time::Instant::now() >= deadline {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The agent overrides of `flags` as the queue keeps them (never their secrets).
fn request_of(flags: &AgentFlags) -> RunRequest {
    RunRequest {
        agent: flags.default.clone(),
        agent_for: flags.for_roles.clone(),
        cwd: flags.cwd.clone(),
    }
}

/// The flags a queued thread runs with: its queued overrides, and `secrets` from the
/// environment of the worker that claimed it.
pub fn flags_of(request: RunRequest, secrets: Secrets) -> AgentFlags {
    AgentFlags { default: request.agent, for_roles: request.agent_for, cwd: request.cwd, secrets }
}

/// Starts a worker on this machine if none is alive anywhere.
fn ensure_worker(store: &Storage, queue: &Queue) -> Result<()> {
    if queue.live_workers()? == 0 {
        start_worker(store)?;
    }
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

/// Follows a queued thread: its steps as they are stored, the role at work, and how it comes
/// to rest — as [`Reply`] events, like a local worker's.
pub struct QueuedThread {
    store: Storage,
    pg: Postgres,
    /// The agent overrides it was queued with (and is queued with again once answered).
    flags: AgentFlags,
    /// Whether the follower puts a `human` agent's question to its user.
    interactive: bool,
    /// The call a question was put for, until it is answered or declined.
    asked: Option<PendingCall>,
    /// The last call answered from here: a thread still reading as waiting on it is about to
    /// be taken by a worker, not asking again.
    answered: Option<PendingCall>,
    /// When it was last checked that some worker is alive to run the thread.
    checked_workers: std::time::Instant,
    threads: PgThreads,
    queue: Queue,
    id: ThreadId,
    /// The thread's records read so far, the last one's sequence number, and whether a
    /// worker held it, or it was queued, at the last read.
    lines: ThreadLines,
    read_to: i32,
    live: Option<(bool, bool)>,
    /// The thread as those records make it (rebuilt only when they change).
    current: Option<Arc<ThreadRecord>>,
    /// Steps already reported.
    seen: usize,
    last_working: Option<(String, String)>,
    pending: VecDeque<Reply>,
    done: bool,
}

impl QueuedThread {
    /// Follows the thread of `record` (as it was when queued with `flags`); `interactive`
    /// puts a `human` agent's questions to the follower.
    pub fn new(
        store: &Storage,
        pg: &Postgres,
        record: &ThreadRecord,
        flags: &AgentFlags,
        interactive: bool,
    ) -> Self {
        QueuedThread {
            store: store.clone(),
            pg: pg.clone(),
            flags: flags.clone(),
            interactive,
            asked: None,
            answered: None,
            checked_workers: std::time::Instant::now(),
            threads: PgThreads::new(pg),
            queue: Queue::new(pg),
            id: record.id(),
            lines: ThreadLines::default(),
            read_to: -1,
            live: None,
            current: None,
            seen: record.steps.len(),
            last_working: None,
            pending: VecDeque::new(),
            done: false,
        }
    }

    /// The next event; `None` after the last.
    pub async fn receive(&mut self) -> Result<Option<Reply>> {
        loop {
            if let Some(reply) = self.pending.pop_front() {
                return Ok(Some(reply));
            }
            if self.done {
                return Ok(None);
            }
            self.read()?;
            if self.pending.is_empty() {
                tokio::time::sleep(FOLLOW_POLL).await;
            }
        }
    }

    /// The thread as it is now, reading only the records stored since the last call.
    fn catch_up(&mut self) -> Result<Arc<ThreadRecord>> {
        let stored = self
            .threads
            .read_after(self.id, self.read_to)?
            .ok_or_else(|| Error::UnknownThread(self.id.to_string()))?;
        let live = (stored.held, stored.queued);
        if let Some(current) = &self.current
            && stored.lines.is_empty()
            && self.live == Some(live)
        {
            return Ok(current.clone());
        }
        if let Some(last) = stored.add_to(&mut self.lines) {
            self.read_to = last;
        }
        self.live = Some(live);
        let record = Arc::new(self.threads.record(self.id, self.lines.clone(), live.0, live.1)?);
        self.current = Some(record.clone());
        Ok(record)
    }

    fn read(&mut self) -> Result<()> {
        let record = self.catch_up()?;
        let working = self.working()?;
        // Each step carries its agent and duration, as the worker stored it.
        for (offset, step) in record.steps.iter().enumerate().skip(self.seen) {
            self.pending.push_back(Reply::Step { index: offset + 1, step: step.clone() });
        }
        self.seen = self.seen.max(record.steps.len());
        if let Some((role, agent)) = working
            && self.last_working.as_ref() != Some(&(role.clone(), agent.clone()))
        {
            self.last_working = Some((role.clone(), agent.clone()));
            self.pending.push_back(Reply::Working { role, agent });
        }
        let waits_on = record.paused.as_ref().and_then(|p| p.call.clone());
        let rest = match record.status() {
            ThreadStatus::Running | ThreadStatus::Queued => {
                self.check_workers()?;
                None
            }
            _ if record.end.is_some() => {
                Some(Reply::Ended { end: record.end.clone().expect("an ended thread") })
            }
            ThreadStatus::Waiting if waits_on.is_some() && waits_on == self.answered => {
                self.check_workers()?;
                None
            }
            ThreadStatus::Waiting if self.interactive && self.asked.is_none() => {
                self.ask(&record, None)?;
                return Ok(());
            }
            ThreadStatus::Waiting => Some(Reply::Waiting {
                role: record.paused.as_ref().and_then(|p| p.role.clone()).unwrap_or_default(),
            }),
            ThreadStatus::Paused => Some(Reply::Paused { steps: record.steps.len() }),
            _ => Some(Reply::Error {
                message: format!(
                    "thread {} stopped without ending (its worker failed; see the worker's log); \
                     `uncaged-workflow resume {}` continues it",
                    self.id, self.id
                ),
                code: crate::error::exit::SOFTWARE,
            }),
        };
        if let Some(rest) = rest {
            self.pending.push_back(rest);
            self.done = true;
        }
        Ok(())
    }

    /// Puts the question waiting thread `record` asks to the follower (again, with `error`,
    /// after an answer that did not fit).
    fn ask(&mut self, record: &ThreadRecord, error: Option<String>) -> Result<()> {
        let Some(question) = WaitingQuestion::of(record) else { return Ok(()) };
        let expected = crate::run::control::answer_shape(&self.store, record)?.map(|s| s.example());
        self.asked = record.paused.as_ref().and_then(|p| p.call.clone());
        let WaitingQuestion { role, system_prompt, context } = question;
        self.pending.push_back(Reply::Question { role, system_prompt, context, expected, error });
        Ok(())
    }

    /// Answers the question the follower was asked: journals `text` under the call the
    /// thread waits on and queues it again (as `answer` does); `None` declines, and the
    /// thread is left waiting. An answer that does not fit the role is asked again.
    pub async fn answer(&mut self, text: Option<String>) -> Result<()> {
        let Some(call) = self.asked.take() else { return Ok(()) };
        let Some(text) = text else {
            let role = self.catch_up()?.paused.as_ref().and_then(|p| p.role.clone());
            let role = role.unwrap_or_default();
            self.pending.push_back(Reply::Waiting { role });
            self.done = true;
            return Ok(());
        };
        match crate::run::control::answer(&self.store, self.id, text) {
            Ok(_) => enqueue(&self.store, &self.pg, self.id, &self.flags).await?,
            Err(Error::InvalidAnswer { reason, .. }) => {
                let record = self.catch_up()?;
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

    /// Makes sure some worker is alive to run the thread, every few seconds: its worker may
    /// have died, and with it the last worker alive, and the thread would wait forever.
    fn check_workers(&mut self) -> Result<()> {
        if self.checked_workers.elapsed() >= WORKER_CHECK {
            ensure_worker(&self.store, &self.queue)?;
            self.checked_workers = std::time::Instant::now();
        }
        Ok(())
    }

    /// The role at work and its agent, as the worker last published it.
    fn working(&self) -> Result<Option<(String, String)>> {
        Ok(self.queue.activity(self.id)?.and_then(|a| Some((a.role?, a.agent?))))
    }
}
