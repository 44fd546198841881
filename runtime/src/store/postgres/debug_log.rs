//! A thread's debug log in PostgreSQL, off the hot path: a running thread's lines ride in its
//! next record's statement (see [`deferred`](super::deferred)); the rest (a thread about to
//! wait, or logged to by a process that does not run it) go to one background task that
//! writes whatever has gathered in one transaction that does not wait for the WAL flush. A
//! step never waits for its log; under pressure (the task cannot keep up, or the database
//! refuses a batch) lines are dropped and counted, never the records or the journal.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::ids::ThreadId;
use crate::store::debug_log::LogSink;
use crate::store::postgres::Postgres;
use crate::store::postgres::leases::Leases;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Config};
use tokio_postgres_rustls::MakeRustlsConnect;

/// A thread's debug log.
#[derive(Debug)]
pub struct PgLog {
    pg: Postgres,
    leases: Leases,
    id: ThreadId,
}

impl PgLog {
    pub(super) fn new(pg: &Postgres, leases: &Leases, id: ThreadId) -> Self {
        PgLog { pg: pg.clone(), leases: leases.clone(), id }
    }
}

impl LogSink for PgLog {
    /// Kept for the thread's next record while this process runs it (see
    /// [`deferred`](super::deferred)); else handed to the background writer. Not durable
    /// either way, as in the home directory, and never waited for by a step.
    fn write(&mut self, lines: &[u8]) -> std::io::Result<()> {
        let lines: Vec<String> = String::from_utf8_lossy(lines)
            .lines()
            .filter(|line| !line.is_empty())
            .map(str::to_string)
            .collect();
        if self.leases.token(self.id).is_some() {
            self.pg.deferred().log(self.id, lines);
        } else {
            self.pg.logs().write(self.id.to_string(), lines);
        }
        Ok(())
    }

    /// The thread is about to wait on an agent. Most answer within a step's time, and what
    /// was logged goes with the step; one still waited on after [`LONG_WAIT`] has its lines
    /// written in the background, so that a long call shows in the log while it lasts (and
    /// is not lost with the process if it is killed meanwhile).
    fn release(&mut self) {
        self.pg.deferred().wait_begins(self.id);
        watch_long_waits(&self.pg);
    }

    fn describe(&self) -> String {
        format!("the debug log of thread {} in {}", self.id, self.pg.target())
    }
}

/// How long a thread waits on a call before what it logged is written without its step.
const LONG_WAIT: Duration = Duration::from_secs(1);

/// How often the waits are looked at: a long wait's lines are written between [`LONG_WAIT`]
/// and this much later.
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// Starts, once per process, the task that hands the lines of threads in a long wait to the
/// background writer. One task looking a few times a second, not one timer per wait: a step
/// on PostgreSQL is a fraction of a millisecond, and a task spawned on the driver's thread
/// for each agent call woke that thread, and took its time, once more per step.
fn watch_long_waits(pg: &Postgres) {
    // Called for every agent call: a read, not a write of the shared flag, once it is set.
    let watching = &pg.inner.watching_waits;
    if watching.load(Ordering::Relaxed) || watching.swap(true, Ordering::SeqCst) {
        return;
    }
    let watcher = pg.clone();
    pg.spawn(async move {
        let mut ticks = tokio::time::interval(LOOK_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            for (id, lines) in watcher.deferred().take_logs_of_long_waits(LONG_WAIT) {
                watcher.logs().write(id.to_string(), lines);
            }
        }
    });
}

/// Messages (a thread's lines, or a barrier) the task may hold before lines are dropped.
const CAPACITY: usize = 8192;

/// The most lines one statement writes.
const MAX_LINES: usize = 4096;

enum Message {
    Lines {
        thread: String,
        lines: Vec<String>,
    },
    /// Answered once everything sent before it is written (or dropped).
    Barrier(oneshot::Sender<()>),
}

/// The process's debug-log writer.
#[derive(Debug)]
pub struct LogWriter {
    sender: mpsc::Sender<Message>,
    dropped: Arc<AtomicU64>,
    /// When the last warning of dropped lines was given (ms since the epoch), 0 for never.
    warned_at: AtomicU64,
}

/// How often the count of dropped lines is told again while lines keep being dropped.
const WARN_EVERY_MS: u64 = 60_000;

impl LogWriter {
    /// Starts the writer on `driver`; it connects with `config` when it first has lines.
    pub fn start(driver: &tokio::runtime::Handle, config: Config, tls: MakeRustlsConnect) -> Self {
        let (sender, receiver) = mpsc::channel(CAPACITY);
        let dropped = Arc::new(AtomicU64::new(0));
        driver.spawn(run(receiver, config, tls, dropped.clone()));
        LogWriter { sender, dropped, warned_at: AtomicU64::new(0) }
    }

    /// Queues `lines` of thread `thread`'s log; drops (and counts) them if the writer is
    /// too far behind.
    pub fn write(&self, thread: String, lines: Vec<String>) {
        let count = lines.len() as u64;
        if self.sender.try_send(Message::Lines { thread, lines }).is_err() {
            let total = self.dropped.fetch_add(count, Ordering::Relaxed) + count;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            let last = self.warned_at.load(Ordering::Relaxed);
            if now.saturating_sub(last) >= WARN_EVERY_MS
                && self
                    .warned_at
                    .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                tracing::warn!(
                    "the debug log falls behind: {total} line(s) dropped so far \
                     (steps and journaled calls never are)"
                );
            }
        }
    }

    /// Waits until every line queued before this call is written (or dropped): a thread that
    /// comes to rest has its whole log readable.
    pub fn barrier(&self) {
        super::block(self.settled());
    }

    /// [`LogWriter::barrier`], awaited.
    pub async fn settled(&self) {
        let (done, wait) = oneshot::channel();
        if self.sender.send(Message::Barrier(done)).await.is_ok() {
            let _ = wait.await;
        }
    }
}

async fn run(
    mut receiver: mpsc::Receiver<Message>,
    config: Config,
    tls: MakeRustlsConnect,
    dropped: Arc<AtomicU64>,
) {
    let mut client: Option<Client> = None;
    while let Some(first) = receiver.recv().await {
        let (mut threads, mut lines, mut barriers) = (Vec::new(), Vec::new(), Vec::new());
        let mut next = Some(first);
        while let Some(message) = next.take() {
            match message {
                Message::Lines { thread, lines: more } => {
                    threads.extend(std::iter::repeat_n(thread, more.len()));
                    lines.extend(more);
                }
                Message::Barrier(done) => barriers.push(done),
            }
            if lines.len() < MAX_LINES {
                next = receiver.try_recv().ok();
            }
        }
        if !lines.is_empty() && write(&mut client, &config, &tls, &threads, &lines).await.is_err() {
            dropped.fetch_add(lines.len() as u64, Ordering::Relaxed);
        }
        for done in barriers {
            let _ = done.send(());
        }
    }
}

async fn write(
    client: &mut Option<Client>,
    config: &Config,
    tls: &MakeRustlsConnect,
    threads: &[String],
    lines: &[String],
) -> std::result::Result<(), tokio_postgres::Error> {
    if client.as_ref().is_none_or(Client::is_closed) {
        let (fresh, connection) = config.connect(tls.clone()).await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        *client = Some(fresh);
    }
    let client = client.as_ref().expect("connected above");
    // One pipelined transaction (one round trip) that does not wait for the WAL flush: the
    // lines are not durable in a home directory either, and reach the disk with the next
    // step. `SET LOCAL` rather than a connection option, so that it holds behind a pooler.
    let begin = client.batch_execute("BEGIN; SET LOCAL synchronous_commit TO off");
    let params = [(&threads as &(dyn ToSql + Sync), Type::TEXT_ARRAY), (&lines, Type::TEXT_ARRAY)];
    let insert = client.query_typed(
        "INSERT INTO uncaged_workflow.thread_log (thread, line) \
         SELECT l.thread, l.line \
         FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS l(thread, line, i) \
         JOIN uncaged_workflow.threads t ON t.id = l.thread \
         ORDER BY l.i \
         FOR KEY SHARE OF t",
        &params,
    );
    let commit = client.batch_execute("COMMIT");
    let (begun, inserted, committed) = tokio::join!(begin, insert, commit);
    let written = begun.and(inserted.map(drop)).and(committed);
    if let Err(e) = &written {
        tracing::warn!("{} debug log line(s) dropped: {e}", lines.len());
    }
    written
}
