//! Group commit: the durable writes of every thread this process runs (steps, pause markers,
//! ends, journaled calls) gathered into one transaction, so that many steps share one WAL
//! flush instead of paying one each.
//!
//! Writers hand a statement to the committer and wait for its answer; the answer comes only
//! after the transaction holding it committed, so a step is never shown, nor its thread's
//! next agent called, before it is on disk. The committer sends a batch as one pipelined
//! round trip (`BEGIN`, every statement, `COMMIT`) on a connection of its own, and gathers
//! the next batch while the database flushes this one: with one thread it costs what a lone
//! statement does, and with many each flush carries the steps that arrived meanwhile. A
//! `window` (`UNCAGED_WORKFLOW_PG_COMMIT_WINDOW_US`) may also hold a batch open a little
//! longer, trading latency for fewer flushes.
//!
//! Statements are sent with their parameter types (`query_typed`): one round trip each, and
//! no named prepared statement, which a transaction-pooling PgBouncer could not keep.
//!
//! One failed statement aborts the transaction it shares: the batch is then sent again, each
//! statement on its own, so that a write fails only for its own fault. The fences of the
//! statements (a lease token in their `WHERE`) make a stale writer's statement match no row
//! rather than fail, so that case never costs the others a retry.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Config, Row};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::faults::crash_point;

/// The most statements one transaction carries.
const MAX_BATCH: usize = 512;

/// A statement's parameters, owned so that they can cross to the committer's task.
pub type Params = Vec<(Box<dyn ToSql + Send + Sync>, Type)>;

/// What a statement answered: its rows, or why it (or the transaction it was in) failed.
pub type Answer = std::result::Result<Vec<Row>, Failed>;

/// Why a write was not committed.
#[derive(Debug, Clone)]
pub enum Failed {
    /// The database's answer (shared by every statement of a transaction that failed whole).
    Database(Arc<tokio_postgres::Error>),
    /// The committer is gone: this process is shutting down.
    Stopped,
}

/// One statement to commit, and where its answer goes.
struct Write {
    sql: &'static str,
    params: Params,
    reply: oneshot::Sender<Answer>,
}

/// The group committer of this process's store connection.
#[derive(Debug)]
pub struct Committer {
    sender: mpsc::UnboundedSender<Write>,
}

impl Committer {
    /// Starts the committer on `driver`, connecting with `config` when it first has work.
    pub fn start(
        driver: &tokio::runtime::Handle,
        config: Config,
        tls: MakeRustlsConnect,
        window: Duration,
    ) -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        driver.spawn(run(receiver, config, tls, window));
        Committer { sender }
    }

    /// Commits `sql` with `params` in the next batch; resolves once it is committed.
    pub async fn write(&self, sql: &'static str, params: Params) -> Answer {
        let (reply, answer) = oneshot::channel();
        if self.sender.send(Write { sql, params, reply }).is_err() {
            return Err(Failed::Stopped);
        }
        answer.await.unwrap_or(Err(Failed::Stopped))
    }
}

/// The longest window: every step of the process waits for it.
const MAX_WINDOW: Duration = Duration::from_millis(100);

/// The window from the environment (microseconds, at most [`MAX_WINDOW`]), else none.
pub fn window_from_env() -> Duration {
    std::env::var("UNCAGED_WORKFLOW_PG_COMMIT_WINDOW_US")
        .ok()
        .and_then(|us| us.parse::<u64>().ok())
        .map(|us| Duration::from_micros(us).min(MAX_WINDOW))
        .unwrap_or(Duration::ZERO)
}

async fn run(
    mut receiver: mpsc::UnboundedReceiver<Write>,
    config: Config,
    tls: MakeRustlsConnect,
    window: Duration,
) {
    let mut client: Option<Client> = None;
    while let Some(first) = receiver.recv().await {
        let mut batch = vec![first];
        if !window.is_zero() {
            let until = tokio::time::Instant::now() + window;
            while batch.len() < MAX_BATCH {
                match tokio::time::timeout_at(until, receiver.recv()).await {
                    Ok(Some(write)) => batch.push(write),
                    _ => break,
                }
            }
        }
        while batch.len() < MAX_BATCH {
            match receiver.try_recv() {
                Ok(write) => batch.push(write),
                Err(_) => break,
            }
        }
        if client.as_ref().is_none_or(Client::is_closed) {
            match connect(&config, &tls).await {
                Ok(fresh) => client = Some(fresh),
                Err(e) => {
                    let e = Failed::Database(Arc::new(e));
                    for write in batch {
                        let _ = write.reply.send(Err(e.clone()));
                    }
                    continue;
                }
            }
        }
        let client = client.as_ref().expect("connected above");
        if batch.len() == 1 {
            let write = batch.pop().expect("one write");
            let answer = alone(client, &write).await;
            let _ = write.reply.send(answer);
            continue;
        }
        // The crash tests kill the process on either side of a shared commit: before it (the
        // whole batch lost) and after it (every write durable, none acknowledged).
        crash_point("group-commit");
        let answers = together(client, &batch).await;
        crash_point("group-committed");
        for (write, answer) in batch.into_iter().zip(answers) {
            let _ = write.reply.send(answer);
        }
    }
}

async fn connect(
    config: &Config,
    tls: &MakeRustlsConnect,
) -> std::result::Result<Client, tokio_postgres::Error> {
    let (client, connection) = config.connect(tls.clone()).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// One statement, committed on its own.
async fn alone(client: &Client, write: &Write) -> Answer {
    client.query_typed(write.sql, &borrowed(&write.params)).await.map_err(failed)
}

/// Every statement of `batch` in one transaction, sent in one go. If any failed, the
/// transaction did not commit: each is then sent again on its own.
async fn together(client: &Client, batch: &[Write]) -> Vec<Answer> {
    let params: Vec<_> = batch.iter().map(|write| borrowed(&write.params)).collect();
    let begin = client.batch_execute("BEGIN");
    let statements = join_all(
        batch.iter().zip(&params).map(|(write, params)| client.query_typed(write.sql, params)),
    );
    let commit = client.batch_execute("COMMIT");
    let (began, answers, committed) = tokio::join!(begin, statements, commit);
    if let Err(e) = began.and(committed) {
        // The connection went, or the server refused the transaction: nobody knows
        // whether it committed, as with a lone statement whose answer was lost.
        let e = failed(e);
        return batch.iter().map(|_| Err(e.clone())).collect();
    }
    if answers.iter().all(Result::is_ok) {
        return answers.into_iter().map(|answer| answer.map_err(failed)).collect();
    }
    // `COMMIT` of an aborted transaction rolls it back: nothing of the batch was written.
    join_all(batch.iter().map(|write| alone(client, write))).await
}

/// `params` as a statement takes them.
pub(super) fn borrowed(params: &Params) -> Vec<(&(dyn ToSql + Sync), Type)> {
    params.iter().map(|(value, ty)| (&**value as &(dyn ToSql + Sync), ty.clone())).collect()
}

fn failed(e: tokio_postgres::Error) -> Failed {
    Failed::Database(Arc::new(e))
}
