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
//! Statements are prepared once per connection (named), which saves the server parsing and
//! planning each step again (~40 µs of a step's ~120 µs in the server) — but only on a
//! connection that is shown to reach the server itself: the server names this process's
//! socket as both ends of its connection. Through anything between (a transaction-pooling
//! PgBouncer, which hands each transaction to another server connection and would run a
//! statement another client prepared under the same name; a proxy; a Unix socket, which
//! cannot be told apart) statements are sent unnamed, with their parameter types
//! (`query_typed`): one round trip each, and nothing kept in the session.
//!
//! One failed statement aborts the transaction it shares: the batch is then sent again, each
//! statement on its own, so that a write fails only for its own fault. The fences of the
//! statements (a lease token in their `WHERE`) make a stale writer's statement match no row
//! rather than fail, so that case never costs the others a retry.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::config::Host;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Config, Row, Statement};
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
    let mut connected: Option<Connected> = None;
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
        if connected.as_ref().is_none_or(|c| c.client.is_closed()) {
            match connect(&config, &tls).await {
                Ok(fresh) => connected = Some(fresh),
                Err(e) => {
                    let e = Failed::Database(Arc::new(e));
                    for write in batch {
                        let _ = write.reply.send(Err(e.clone()));
                    }
                    continue;
                }
            }
        }
        let connection = connected.as_mut().expect("connected above");
        if batch.len() == 1 {
            let write = batch.pop().expect("one write");
            let answer = alone(connection, &write).await;
            let _ = write.reply.send(answer);
            continue;
        }
        // The crash tests kill the process on either side of a shared commit: before it (the
        // whole batch lost) and after it (every write durable, none acknowledged).
        crash_point("group-commit");
        let answers = together(connection, &batch).await;
        crash_point("group-committed");
        for (write, answer) in batch.into_iter().zip(answers) {
            let _ = write.reply.send(answer);
        }
    }
}

/// The committer's connection, and the statements prepared on it.
struct Connected {
    client: Client,
    /// By their text; `None` if this connection may not keep them (see the module).
    prepared: Option<HashMap<&'static str, Statement>>,
}

impl Connected {
    /// The prepared statement for `write`, prepared now if it is new; `None` if statements
    /// are sent unnamed on this connection.
    async fn statement(
        &mut self,
        write: &Write,
    ) -> Option<std::result::Result<Statement, tokio_postgres::Error>> {
        let prepared = self.prepared.as_mut()?;
        if let Some(statement) = prepared.get(write.sql) {
            return Some(Ok(statement.clone()));
        }
        let types: Vec<Type> = write.params.iter().map(|(_, ty)| ty.clone()).collect();
        let statement = self.client.prepare_typed(write.sql, &types).await;
        if let Ok(statement) = &statement {
            prepared.insert(write.sql, statement.clone());
        }
        Some(statement)
    }

    /// Runs `write`'s statement, prepared or unnamed as the connection allows.
    async fn run(&self, write: &Write, statement: Option<&Statement>) -> Answer {
        let answer = match statement {
            Some(statement) => self.client.query(statement, &values(&write.params)).await,
            None => self.client.query_typed(write.sql, &borrowed(&write.params)).await,
        };
        answer.map_err(failed)
    }

    /// Forgets the prepared statement of `sql` after it failed (the server may have dropped
    /// its plan, as when a migration changed what it returns): the next use prepares it again.
    fn forget(&mut self, sql: &'static str) {
        if let Some(prepared) = self.prepared.as_mut() {
            prepared.remove(sql);
        }
    }
}

/// Connects, and finds whether statements may be prepared on the connection (see
/// [`connect_here`]); connected as tokio-postgres connects otherwise.
async fn connect(
    config: &Config,
    tls: &MakeRustlsConnect,
) -> std::result::Result<Connected, tokio_postgres::Error> {
    if let Some(connected) = connect_here(config, tls).await? {
        return Ok(connected);
    }
    let (client, connection) = config.connect(tls.clone()).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(Connected { client, prepared: None })
}

/// For a TCP connection to one host: connects over a socket made here (set up as
/// tokio-postgres sets up its own) and asks the server for both ends of its connection;
/// statements may be prepared if they are this socket's (see [`is_this_socket`]). `None` for
/// any other connection string, or if the socket could not be made (then tokio-postgres
/// connects, and says why).
async fn connect_here(
    config: &Config,
    tls: &MakeRustlsConnect,
) -> std::result::Result<Option<Connected>, tokio_postgres::Error> {
    let (host, port) = match (config.get_hosts(), config.get_ports(), config.get_hostaddrs()) {
        ([Host::Tcp(host)], [], []) => (host.clone(), 5432),
        ([Host::Tcp(host)], [port], []) => (host.clone(), *port),
        _ => return Ok(None),
    };
    let timeout = config.get_connect_timeout().copied().unwrap_or(Duration::from_secs(10));
    let connecting = tokio::net::TcpStream::connect((host.as_str(), port));
    let Ok(Ok(stream)) = tokio::time::timeout(timeout, connecting).await else {
        return Ok(None);
    };
    let (Ok(local), Ok(peer)) = (stream.local_addr(), stream.peer_addr()) else {
        return Ok(None);
    };
    if set_up(&stream, config).is_err() {
        return Ok(None);
    }
    // The server's name is checked as the connection string asks (tls.rs): this never fails.
    let Ok(tls_connect) =
        MakeTlsConnect::<tokio::net::TcpStream>::make_tls_connect(&mut tls.clone(), &host);
    let (client, connection) = config.connect_raw(stream, tls_connect).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    // Unnamed (`query_typed`), as every statement that may pass a pooler: tokio-postgres
    // names the statement of a plain `query`.
    let rows = client
        .query_typed(
            "SELECT host(inet_client_addr()), inet_client_port(), \
                    host(inet_server_addr()), inet_server_port()",
            &[],
        )
        .await?;
    let Some(seen) = rows.first() else { return Ok(Some(Connected { client, prepared: None })) };
    let seen = [(seen.get(0), seen.get(1)), (seen.get(2), seen.get(3))];
    let direct = is_this_socket(local, peer, seen);
    Ok(Some(Connected { client, prepared: direct.then(HashMap::new) }))
}

/// The socket options tokio-postgres sets on its own TCP connections: no delay (a statement
/// is one small write), and the keep-alives and user timeout the connection string asks for.
fn set_up(stream: &tokio::net::TcpStream, config: &Config) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let socket = socket2::SockRef::from(stream);
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let Some(timeout) = config.get_tcp_user_timeout() {
        socket.set_tcp_user_timeout(Some(*timeout))?;
    }
    if config.get_keepalives() {
        let mut keepalive = socket2::TcpKeepalive::new().with_time(config.get_keepalives_idle());
        if let Some(interval) = config.get_keepalives_interval() {
            keepalive = keepalive.with_interval(interval);
        }
        if let Some(retries) = config.get_keepalives_retries() {
            keepalive = keepalive.with_retries(retries);
        }
        socket.set_tcp_keepalive(&keepalive)?;
    }
    Ok(())
}

/// An end of a connection as the server names it: its address (`host(…)`) and port; `None`
/// for a Unix socket.
type SeenEnd = (Option<String>, Option<i32>);

/// Whether the server's connection is this process's socket: the server names this socket's
/// own end (`local`) as its client and the end it reaches (`peer`) as itself. Then nothing
/// stands between them that could share the server's session with another client. One end is
/// not enough: a pooler on this machine may well use, for its own connection to the server,
/// the port this process's socket has (a port is unique per pair of ends, not per machine).
fn is_this_socket(local: SocketAddr, peer: SocketAddr, [client, server]: [SeenEnd; 2]) -> bool {
    let same = |address: SocketAddr, (host, port): SeenEnd| {
        host.and_then(|host| host.parse::<std::net::IpAddr>().ok())
            .is_some_and(|ip| ip.to_canonical() == address.ip().to_canonical())
            && port == Some(i32::from(address.port()))
    };
    same(local, client) && same(peer, server)
}

/// One statement, committed on its own.
async fn alone(connection: &mut Connected, write: &Write) -> Answer {
    let statement = match connection.statement(write).await {
        Some(Ok(statement)) => Some(statement),
        Some(Err(e)) => return Err(failed(e)),
        None => None,
    };
    let answer = connection.run(write, statement.as_ref()).await;
    if answer.is_err() && statement.is_some() {
        connection.forget(write.sql);
    }
    answer
}

/// Every statement of `batch` in one transaction, sent in one go. If any failed, the
/// transaction did not commit: each is then sent again on its own.
async fn together(connection: &mut Connected, batch: &[Write]) -> Vec<Answer> {
    // Prepared first (once per connection and statement), so that the batch stays one
    // round trip. One that does not prepare is sent unnamed: it fails in the batch as it
    // would have failed to prepare, and its retry alone says why.
    let mut statements = Vec::with_capacity(batch.len());
    for write in batch {
        statements.push(match connection.statement(write).await {
            Some(Ok(statement)) => Some(statement),
            Some(Err(_)) | None => None,
        });
    }
    let client = &connection.client;
    let begin = client.batch_execute("BEGIN");
    let all = run_all(connection, batch, &statements);
    let commit = client.batch_execute("COMMIT");
    let (began, answers, committed) = tokio::join!(begin, all, commit);
    if let Err(e) = began.and(committed) {
        // The connection went, or the server refused the transaction: nobody knows
        // whether it committed, as with a lone statement whose answer was lost.
        let e = failed(e);
        return batch.iter().map(|_| Err(e.clone())).collect();
    }
    if answers.iter().all(Result::is_ok) {
        return answers;
    }
    // `COMMIT` of an aborted transaction rolls it back: nothing of the batch was written.
    // Each is sent again on its own (pipelined, each its own transaction).
    let again = run_all(connection, batch, &statements).await;
    for ((write, statement), answer) in batch.iter().zip(&statements).zip(&again) {
        if answer.is_err() && statement.is_some() {
            connection.forget(write.sql);
        }
    }
    again
}

/// Every write of `batch` with its statement (see [`Connected::run`]), pipelined.
async fn run_all(
    connection: &Connected,
    batch: &[Write],
    statements: &[Option<Statement>],
) -> Vec<Answer> {
    join_all(
        batch
            .iter()
            .zip(statements)
            .map(|(write, statement)| connection.run(write, statement.as_ref())),
    )
    .await
}

/// `params` as a prepared statement takes them.
fn values(params: &Params) -> Vec<&(dyn ToSql + Sync)> {
    params.iter().map(|(value, _)| &**value as &(dyn ToSql + Sync)).collect()
}

/// `params` as a statement takes them.
pub(super) fn borrowed(params: &Params) -> Vec<(&(dyn ToSql + Sync), Type)> {
    params.iter().map(|(value, ty)| (&**value as &(dyn ToSql + Sync), ty.clone())).collect()
}

fn failed(e: tokio_postgres::Error) -> Failed {
    Failed::Database(Arc::new(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_are_prepared_only_on_a_connection_the_server_sees_as_this_socket() {
        let local: SocketAddr = "127.0.0.1:41234".parse().unwrap();
        let server: SocketAddr = "127.0.0.1:5432".parse().unwrap();
        let end = |host: &str, port: i32| (Some(host.to_string()), Some(port));
        let direct = |client, seen_server| is_this_socket(local, server, [client, seen_server]);
        assert!(direct(end("127.0.0.1", 41234), end("127.0.0.1", 5432)));
        // The same addresses as IPv4-mapped IPv6 ones (a server listening on `::`).
        assert!(direct(end("::ffff:127.0.0.1", 41234), end("::ffff:127.0.0.1", 5432)));
        // Through a pooler or a proxy: the server names its socket's ends, not this one's.
        assert!(!direct(end("127.0.0.1", 39232), end("127.0.0.1", 5432)));
        assert!(!direct(end("10.0.0.7", 41234), end("10.0.0.8", 5432)));
        // ... even when its own connection happens to have this socket's port (PgBouncer on
        // this machine, this process connected to it on port 6432).
        let via_pooler: SocketAddr = "127.0.0.1:6432".parse().unwrap();
        let seen = [end("127.0.0.1", 41234), end("127.0.0.1", 5432)];
        assert!(!is_this_socket(local, via_pooler, seen));
        // A Unix socket (no addresses), or an answer that does not read.
        assert!(!direct((None, None), (None, None)));
        assert!(!direct(end("nonsense", 41234), end("127.0.0.1", 5432)));
    }
}
