//! The PostgreSQL store: one database shared by every machine, holding what a home directory
//! holds (registry, bundles, threads, call journals, debug logs, schedules) plus the work
//! queue and the leases that let workers on many machines share threads.
//!
//! The store's interface is synchronous (each call is one short read or append between guest
//! steps), and so is this module's: statements are sent over one pipelined connection driven
//! by a small runtime on its own thread, and the caller waits for their answer. Waiting never
//! runs on the caller's async runtime, so it works the same from a CLI command, a worker's
//! tokio task or a plain thread.

pub mod capacity;
mod commit;
pub mod credentials;
mod debug_log;
mod deferred;
pub mod evals;
mod journal;
mod leases;
pub mod links;
mod listing;
mod live;
pub mod notices;
pub mod push_configs;
pub mod queue;
pub mod registry;
pub mod request_keys;
pub mod schedules;
mod schema;
mod summary;
pub mod threads;
mod tls;
pub mod tokens;

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::runtime::Handle;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::error::{DatabaseFailure, Error, Result};
use crate::ids::ThreadId;

/// The channel a new runnable thread is announced on (by the queue, and by a thread created
/// queued).
pub const QUEUE_CHANNEL: &str = "uncaged_workflow_queue";

/// How long a worker holds a thread without renewing its lease. A worker that stops
/// renewing (killed, frozen, cut off) loses its threads to another after this long.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(15);

/// How long connecting may take before the database counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection to the store's database, shared by everything in this process.
#[derive(Clone)]
pub struct Postgres {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    /// TLS as the connection string's `sslmode` asks (see [`tls`]).
    tls: MakeRustlsConnect,
    /// `postgres://user@host:port/db`, without the password: what errors name.
    target: String,
    /// The runtime that drives connections, on its own thread.
    driver: Handle,
    client: Mutex<Option<Arc<Client>>>,
    /// This process as a lease owner: unique across machines and restarts.
    owner: String,
    lease: Duration,
    /// The threads this process holds leases on, by id, with their tokens.
    held: Mutex<HashMap<ThreadId, i64>>,
    /// Whether the task that renews them has started.
    renewing: AtomicBool,
    /// Whether the task that writes the logs of threads in a long wait has started.
    watching_waits: AtomicBool,
    /// Whether notifications were found not to reach this process (behind a
    /// transaction-pooling PgBouncer): it then polls, and does not listen again.
    no_notifications: AtomicBool,
    /// Gathers the durable writes of all threads into shared transactions.
    committer: commit::Committer,
    /// Writes the debug logs in the background.
    logs: debug_log::LogWriter,
    /// Calls and log lines waiting for their thread's next record.
    deferred: deferred::DeferredWrites,
    /// A dedicated connection given back, for the next caller: a `serve` takes the firing
    /// lock every second, and a connection is a process forked on the server, ~5 ms of its CPU.
    spare: Mutex<Option<Client>>,
}

impl fmt::Debug for Postgres {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Postgres").field("target", &self.inner.target).finish_non_exhaustive()
    }
}

impl Postgres {
    /// Connects to the database at `url`, creating or migrating the store's schema as needed.
    ///
    /// Fails with one line naming the database if it cannot be reached, refuses the
    /// credentials, belongs to another application, or was migrated by a newer version.
    pub fn connect(url: &str) -> Result<Self> {
        let usage = |reason: String| Error::Database {
            target: redact(url),
            failure: DatabaseFailure::Usage,
            reason,
        };
        let (url_known, tls) = tls::Tls::split(url).map_err(usage)?;
        let mut config: Config = url_known
            .parse()
            .map_err(|e| usage(format!("not a PostgreSQL connection string: {e}")))?;
        let tls = tls.connector().map_err(usage)?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("uncaged-workflow");
        }
        // No session state is set at connect (no `options`, no `SET`): every statement names
        // the store's schema, and settings are per transaction (`SET LOCAL`), so that a
        // connection pooler in transaction mode (PgBouncer) may hand each transaction to
        // another server connection.
        let target = describe(&config);
        let driver = driver();
        let client = open_client(&driver, &config, &tls, &target)?;
        let committer = commit::Committer::start(
            &driver,
            config.clone(),
            tls.clone(),
            commit::window_from_env(),
        );
        let logs = debug_log::LogWriter::start(&driver, config.clone(), tls.clone());
        let inner = Inner {
            config,
            tls,
            target,
            driver,
            client: Mutex::new(Some(Arc::new(client))),
            owner: format!("{}:{}:{}", hostname(), std::process::id(), ulid::Ulid::new()),
            lease: lease_from_env(),
            held: Mutex::new(HashMap::new()),
            renewing: AtomicBool::new(false),
            watching_waits: AtomicBool::new(false),
            no_notifications: AtomicBool::new(false),
            committer,
            logs,
            deferred: deferred::DeferredWrites::default(),
            spare: Mutex::new(None),
        };
        let postgres = Postgres { inner: Arc::new(inner) };
        schema::prepare(&postgres)?;
        Ok(postgres)
    }

    /// The database, as errors name it (no password).
    pub fn target(&self) -> &str {
        &self.inner.target
    }

    /// This process as a lease owner.
    pub fn owner(&self) -> &str {
        &self.inner.owner
    }

    /// How long a lease lasts without renewal.
    pub fn lease(&self) -> Duration {
        self.inner.lease
    }

    /// The shared connection, opened again if it was lost (a restarted server).
    pub fn client(&self) -> Result<Arc<Client>> {
        self.open_again(&self.inner.client, &self.inner.config)
    }

    /// The connection in `slot`, or a new one (with `config`) if it is closed. The slot's lock
    /// is never held while connecting: connecting waits on the driver's thread, whose lease
    /// renewals take that lock too.
    fn open_again(
        &self,
        slot: &Mutex<Option<Arc<Client>>>,
        config: &Config,
    ) -> Result<Arc<Client>> {
        if let Some(current) = &*slot.lock()
            && !current.is_closed()
        {
            return Ok(current.clone());
        }
        let fresh =
            Arc::new(open_client(&self.inner.driver, config, &self.inner.tls, self.target())?);
        let mut slot = slot.lock();
        match &*slot {
            // Another thread opened one meanwhile: keep it, drop this one.
            Some(current) if !current.is_closed() => Ok(current.clone()),
            _ => Ok(slot.insert(fresh).clone()),
        }
    }

    /// The shared connection as it is, even if closed (for the driver's own tasks, which must
    /// not wait on the driver to reconnect).
    fn current_client(&self) -> Arc<Client> {
        self.inner.client.lock().clone().expect("the shared connection opens with the store")
    }

    /// A connection of its own, for a transaction or a lock held across statements (the
    /// shared one interleaves statements of many callers): the one the last such caller gave
    /// back, else a new one. See [`Dedicated`].
    pub fn dedicated(&self) -> Result<Dedicated> {
        let spare = self.inner.spare.lock().take().filter(|client| !client.is_closed());
        let client = match spare {
            Some(client) => client,
            None => {
                open_client(&self.inner.driver, &self.inner.config, &self.inner.tls, self.target())?
            }
        };
        Ok(Dedicated { client: Some(client), pg: self.clone(), holds_transaction: false })
    }

    /// Runs `query` and waits for it, turning a database error into one line that says what
    /// was being done.
    pub fn wait<T>(
        &self,
        action: &str,
        query: impl Future<Output = std::result::Result<T, tokio_postgres::Error>>,
    ) -> Result<T> {
        block(query).map_err(|e| self.error(action, &e))
    }

    /// Commits `sql` with `params` in the next group commit (see [`commit`]), and resolves
    /// with its rows once it is on disk.
    pub async fn commit(
        &self,
        action: &str,
        sql: &'static str,
        params: commit::Params,
    ) -> Result<Vec<tokio_postgres::Row>> {
        match self.inner.committer.write(sql, params).await {
            Ok(rows) => Ok(rows),
            Err(commit::Failed::Database(e)) => Err(self.error(action, &e)),
            Err(commit::Failed::Stopped) => Err(Error::Database {
                target: self.target().to_string(),
                failure: DatabaseFailure::Unreachable,
                reason: format!("{action}: this process is shutting down"),
            }),
        }
    }

    /// The background writer of debug logs.
    fn logs(&self) -> &debug_log::LogWriter {
        &self.inner.logs
    }

    /// What running threads wrote that waits for their next record.
    fn deferred(&self) -> &deferred::DeferredWrites {
        &self.inner.deferred
    }

    /// A session of its own listening on `channels` (`LISTEN` needs one: the shared
    /// connection interleaves many callers): the session, to keep while listening, and each
    /// notification on them as `(channel, payload)`, in order; the receiver closes with the
    /// session. Listening when this returns.
    pub fn listening(
        &self,
        channels: &[&str],
    ) -> Result<(Client, tokio::sync::mpsc::UnboundedReceiver<(String, String)>)> {
        use futures::StreamExt;
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        let (config, tls) = (self.inner.config.clone(), self.inner.tls.clone());
        let statements: String = channels.iter().map(|c| format!("LISTEN {c};")).collect();
        let listening = self.spawn(async move {
            let (client, mut connection) = config.connect(tls).await?;
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            // Drives the session, and hands each notification on; it ends with the session.
            tokio::spawn(async move {
                while let Some(Ok(message)) = messages.next().await {
                    let tokio_postgres::AsyncMessage::Notification(note) = message else {
                        continue;
                    };
                    let note = (note.channel().to_string(), note.payload().to_string());
                    if sender.send(note).is_err() {
                        return;
                    }
                }
            });
            client.batch_execute(&statements).await?;
            Ok::<_, tokio_postgres::Error>(client)
        });
        let client = futures::executor::block_on(listening)
            .expect("the listen task is not aborted")
            .map_err(|e| connect_error(self.target(), &e))?;
        Ok((client, receiver))
    }

    /// Runs a future on the driver's runtime (for work that needs tokio, such as timers).
    pub fn spawn<F>(&self, future: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.inner.driver.spawn(future)
    }

    /// The error for a failed statement: [`DatabaseFailure::Unreachable`] if the connection
    /// was lost (a server restarted, a network cut) — what a worker waits out — else a
    /// failed query.
    pub fn error(&self, action: &str, e: &tokio_postgres::Error) -> Error {
        // A server shutting down or restarting says so before it closes the connection
        // (`terminating connection due to administrator command`, SQLSTATE 57P01; class 08 is
        // a connection failure): that is a lost connection too, not a failed query.
        let lost_by_server = e
            .code()
            .is_some_and(|code| code.code().starts_with("57P") || code.code().starts_with("08"));
        if e.is_closed() || lost_by_server {
            return Error::Database {
                target: self.target().to_string(),
                failure: DatabaseFailure::Unreachable,
                reason: format!("{action}: the connection to the server was lost ({})", reason(e)),
            };
        }
        self.bad_data(format!("{action}: {}", reason(e)))
    }

    /// The error for what the database answered but this program cannot use (a row that does
    /// not read).
    pub fn bad_data(&self, reason: String) -> Error {
        Error::Database {
            target: self.target().to_string(),
            failure: DatabaseFailure::Query,
            reason,
        }
    }
}

/// A connection of this process's own (from [`Postgres::dedicated`]). When dropped it is
/// given back for the next caller rather than closed: at once if it is idle (a transaction of
/// tokio-postgres's rolls back when dropped), else, if it was marked as holding a transaction
/// open ([`Dedicated::holds_transaction`]), once that transaction is rolled back, which the
/// driver does at once in the background, so that what it held (a lock) is not held longer
/// than when the connection closed instead.
pub struct Dedicated {
    client: Option<Client>,
    pg: Postgres,
    holds_transaction: bool,
}

impl Dedicated {
    /// Marks the connection as holding a transaction open (begun in SQL, not through
    /// [`Client::transaction`]): it is rolled back when this is dropped.
    pub fn holds_transaction(&mut self) {
        self.holds_transaction = true;
    }
}

impl std::ops::Deref for Dedicated {
    type Target = Client;
    fn deref(&self) -> &Client {
        self.client.as_ref().expect("the client is taken only when dropped")
    }
}

impl std::ops::DerefMut for Dedicated {
    fn deref_mut(&mut self) -> &mut Client {
        self.client.as_mut().expect("the client is taken only when dropped")
    }
}

impl fmt::Debug for Dedicated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dedicated").field("target", &self.pg.target()).finish_non_exhaustive()
    }
}

impl crate::store::schedules::LockHolder for Dedicated {
    fn lost(&self) -> bool {
        self.is_closed()
    }
}

impl Drop for Dedicated {
    fn drop(&mut self) {
        let Some(client) = self.client.take().filter(|client| !client.is_closed()) else {
            return;
        };
        let spare = |pg: &Postgres, client: Client| {
            // One is kept: a second caller at the same time has its own, closed when done.
            let mut slot = pg.inner.spare.lock();
            if slot.is_none() {
                *slot = Some(client);
            }
        };
        if !self.holds_transaction {
            return spare(&self.pg, client);
        }
        let pg = self.pg.clone();
        self.pg.inner.driver.spawn(async move {
            if client.batch_execute("ROLLBACK").await.is_ok() {
                spare(&pg, client);
            }
        });
    }
}

/// Waits for `future` on this thread. On a multi-threaded tokio runtime (a worker) the
/// thread's other tasks are handed to another thread first (`block_in_place`), so that a
/// thread starting or coming to rest does not hold up the steps of the others; anywhere
/// else (a command, a plain thread) it simply waits.
pub(super) fn block<F: Future>(future: F) -> F::Output {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(|| futures::executor::block_on(future))
        }
        _ => futures::executor::block_on(future),
    }
}

/// Starts the runtime that drives this process's connections.
fn driver() -> Handle {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread tokio runtime builds");
    let handle = runtime.handle().clone();
    std::thread::Builder::new()
        .name("postgres".into())
        .spawn(move || runtime.block_on(std::future::pending::<()>()))
        .expect("spawn the PostgreSQL driver thread");
    handle
}

/// Connects, with the connection driven on `driver`.
fn open_client(
    driver: &Handle,
    config: &Config,
    tls: &MakeRustlsConnect,
    target: &str,
) -> Result<Client> {
    let (config, tls) = (config.clone(), tls.clone());
    let connecting = driver.spawn(async move {
        let (client, connection) = config.connect(tls).await?;
        tokio::spawn(async move {
            // The connection ends with an error when the server goes away; the client
            // then reports itself closed and the next use reconnects.
            let _ = connection.await;
        });
        Ok::<_, tokio_postgres::Error>(client)
    });
    let connected =
        futures::executor::block_on(connecting).expect("the connect task is not aborted");
    connected.map_err(|e| connect_error(target, &e))
}

/// One line for a failed connection: unreachable, refused credentials, no such database.
fn connect_error(target: &str, e: &tokio_postgres::Error) -> Error {
    let code = e.code();
    let (failure, reason) = if code == Some(&SqlState::INVALID_PASSWORD)
        || code == Some(&SqlState::INVALID_AUTHORIZATION_SPECIFICATION)
    {
        (DatabaseFailure::Credentials, format!("the server refused the credentials: {}", reason(e)))
    } else if tls::is_untrusted(e) {
        (
            DatabaseFailure::Credentials,
            format!(
                "the server's TLS certificate is not trusted: {} (give its CA with \
                 sslrootcert=PATH)",
                reason(e)
            ),
        )
    } else if code == Some(&SqlState::INVALID_CATALOG_NAME) {
        (
            DatabaseFailure::Unreachable,
            format!("{} (create it with `createdb`, or name another)", reason(e)),
        )
    } else if code.is_some() {
        (DatabaseFailure::Unreachable, reason(e))
    } else {
        (DatabaseFailure::Unreachable, format!("cannot reach the server: {}", reason(e)))
    };
    Error::Database { target: target.to_string(), failure, reason }
}

/// The message of a database error, with the server's own message when there is one.
fn reason(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => db.message().to_string(),
        None => {
            let mut text = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(cause) = source {
                let cause_text = cause.to_string();
                if !text.contains(&cause_text) {
                    text = format!("{text}: {cause_text}");
                }
                source = cause.source();
            }
            text
        }
    }
}

/// `postgres://user@host:port/db` for a parsed configuration: no password, ever.
fn describe(config: &Config) -> String {
    use tokio_postgres::config::Host;
    let user = config.get_user().unwrap_or("");
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(name)) => name.clone(),
        Some(Host::Unix(path)) => path.display().to_string(),
        None => String::from("localhost"),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let db = config.get_dbname().unwrap_or(user);
    let at = if user.is_empty() { String::new() } else { format!("{user}@") };
    format!("postgres://{at}{host}:{port}/{db}")
}

/// A connection string as given, with any password hidden, for the error that says it does
/// not parse.
pub fn redact(url: &str) -> String {
    let mut out = String::new();
    for (i, word) in url.split_whitespace().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        if word.starts_with("password=") {
            out.push_str("password=…");
        } else {
            out.push_str(word);
        }
    }
    if let Some((scheme, rest)) = out.split_once("://")
        && let Some((credentials, host)) = rest.split_once('@')
        && let Some((user, _)) = credentials.split_once(':')
    {
        return format!("{scheme}://{user}:…@{host}");
    }
    out
}

/// Is `value` a PostgreSQL connection string (rather than a directory)?
pub fn is_url(value: &str) -> bool {
    value.starts_with("postgres://") || value.starts_with("postgresql://")
}

/// The lease length: `UNCAGED_WORKFLOW_LEASE_MS` when set (tests and benchmarks shorten it),
/// else [`DEFAULT_LEASE`].
fn lease_from_env() -> Duration {
    std::env::var("UNCAGED_WORKFLOW_LEASE_MS")
        .ok()
        .and_then(|ms| ms.parse::<u64>().ok())
        .filter(|&ms| ms >= 200)
        .map(Duration::from_millis)
        .unwrap_or(DEFAULT_LEASE)
}

/// This machine's name, for `ps` and lease owners.
pub fn hostname() -> String {
    rustix::system::uname().nodename().to_string_lossy().into_owned()
}

/// A record as its JSON line (without the newline).
fn json_line(record: &impl serde::Serialize) -> String {
    serde_json::to_string(record).expect("thread records serialize")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        assert_eq!(redact("postgres://me:secret@db:5432/flows"), "postgres://me:…@db:5432/flows");
        assert_eq!(redact("host=db password=secret user=me"), "host=db password=… user=me");
        let config: Config = "postgres://me:secret@db:6543/flows".parse().unwrap();
        assert_eq!(describe(&config), "postgres://me@db:6543/flows");
    }
}
