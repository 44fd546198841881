//! The local protocol between CLI processes and a bundle's worker process: newline-delimited
//! JSON over a Unix socket `run/<HASH>.sock`, and how a client finds a live worker or starts
//! one (the worker holds `run/<HASH>.lock` for its whole life, so a socket whose lock is free
//! is stale and is removed, never trusted).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use crate::agents::Secrets;
use crate::error::{Error, Result};
use crate::home::Home;
use crate::ids::{BundleHash, ThreadId};
use crate::run::events::PsEntry;
use crate::store::Storage;
use crate::store::pauses::ToolWait;
use crate::store::queue::LiveText;
use crate::store::records::{EndRecord, StepRecord};

/// How long a client waits for a worker to come up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

/// What a client asks a worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Request {
    /// Take (and run, or continue) a thread queued for this worker's bundle. `follow` streams
    /// its events back.
    Take {
        thread: ThreadId,
        follow: bool,
        /// The follower can answer `human` agents' questions.
        #[serde(default)]
        interactive: bool,
        /// The secrets the thread's bindings name, from the client's environment.
        #[serde(default)]
        secrets: Secrets,
    },
    /// The threads this worker is running.
    Ps,
    /// Read the kill and pause requests the queue holds for this worker's threads.
    Wake,
    /// Stream what a thread this worker runs does as it happens (after a [`Reply::Ok`]: a
    /// [`Reply::Delta`] for its model's text, a [`Reply::Stored`] for each step stored),
    /// until its run here ends.
    Watch { thread: ThreadId },
}

/// What a worker answers. A request gets one or more of these, then the connection closes.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum Reply {
    /// The worker took the thread.
    Accepted { thread: ThreadId, pid: u32, cache_hit: bool, steps: usize },
    /// A role started working, with this agent.
    Working { role: String, agent: String },
    /// A `human` agent asks the (interactive) follower; answer with [`ClientMessage::Answer`].
    Question {
        role: String,
        system_prompt: String,
        context: String,
        /// A JSON value of the shape the answer must have, if it must have one.
        #[serde(default)]
        expected: Option<String>,
        /// Why the last answer was refused, when the question is asked again.
        #[serde(default)]
        error: Option<String>,
        /// For a durable agent: the tool call to decide about (instead of the role's answer).
        #[serde(default)]
        tool: Option<ToolWait>,
    },
    /// A model wrote some text.
    Delta(LiveText),
    /// A step of the watched thread was stored (read it from the store).
    Stored,
    /// The thread stopped to wait for a human answer (`answer`).
    Waiting { role: String },
    /// A step was persisted (its agent and duration are in it).
    Step { index: usize, step: StepRecord },
    /// The thread ended.
    Ended { end: EndRecord },
    /// The thread paused after a step.
    Paused { steps: usize },
    /// Threads running in this worker.
    Threads { threads: Vec<PsEntry> },
    /// Done, nothing to report.
    Ok,
    /// The request failed; `code` is the exit code the client should use.
    Error { message: String, code: i32 },
}

/// What a follower sends back during a run.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum ClientMessage {
    /// The answer to a [`Reply::Question`]; `None` declines (the thread then waits).
    Answer { text: Option<String> },
}

/// `run/<HASH>.sock`.
pub fn socket_path(home: &Home, hash: BundleHash) -> PathBuf {
    home.run_dir().join(format!("{hash}.sock"))
}

/// `run/<HASH>.log`: the worker's own diagnostics.
pub fn log_path(home: &Home, hash: BundleHash) -> PathBuf {
    home.run_dir().join(format!("{hash}.log"))
}

/// A connection to a worker.
pub struct Connection {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
}

impl Connection {
    fn new(stream: UnixStream) -> Self {
        let (read, write) = stream.into_split();
        Connection { reader: BufReader::new(read), writer: write }
    }

    /// Sends one message.
    pub async fn send(&mut self, message: &impl Serialize) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(message).expect("messages serialize");
        line.push(b'\n');
        self.writer.write_all(&line).await
    }

    /// Receives one message; `None` when the other side closed the connection.
    pub async fn receive<T: for<'de> Deserialize<'de>>(&mut self) -> std::io::Result<Option<T>> {
        let mut line = String::new();
        if self.reader.read_line(&mut line).await? == 0 {
            return Ok(None);
        }
        serde_json::from_str(&line).map(Some).map_err(std::io::Error::other)
    }

    /// Wraps an accepted stream (worker side).
    pub fn accepted(stream: UnixStream) -> Self {
        Connection::new(stream)
    }
}

/// Connects to the live worker of `hash`, if there is one; stale sockets are removed.
pub async fn connect(home: &Home, hash: BundleHash) -> Result<Option<Connection>> {
    let socket = socket_path(home, hash);
    if let Ok(stream) = UnixStream::connect(&socket).await {
        return Ok(Some(Connection::new(stream)));
    }
    if socket.exists() && lock_is_free(&home.worker_lock(hash))? {
        // A worker that crashed left its socket behind: nobody holds its lock.
        let _ = std::fs::remove_file(&socket);
    }
    Ok(None)
}

/// Connects to the live worker of `hash`, starting one if there is none.
pub async fn connect_or_spawn(store: &Storage, hash: BundleHash) -> Result<Connection> {
    let home = store.home();
    crate::durable::create_dir(&home.run_dir())?;
    let deadline = Instant::now() + CONNECT_TIMEOUT;
    let mut spawned = false;
    loop {
        if let Some(connection) = connect(home, hash).await? {
            return Ok(connection);
        }
        if !spawned && lock_is_free(&home.worker_lock(hash))? {
            let announced = spawn_worker(store, hash)?;
            spawned = true;
            // Wait for the worker's "ready" line (or for its exit, when another worker won the
            // lock) rather than polling the socket alone: start-up is on every cold `run`'s
            // path. Another worker, started a moment before by a command that raced this one,
            // may be serving already, while this one waits up to a second for the lock it
            // holds: its socket is looked at meanwhile.
            let mut ready = tokio::task::spawn_blocking(move || {
                let mut line = String::new();
                std::io::BufRead::read_line(&mut std::io::BufReader::new(announced), &mut line)
            });
            while Instant::now() < deadline {
                tokio::select! {
                    _ = &mut ready => break,
                    () = tokio::time::sleep(Duration::from_millis(5)) => {
                        if let Some(connection) = connect(home, hash).await? {
                            return Ok(connection);
                        }
                    }
                }
            }
            continue;
        }
        if Instant::now() > deadline {
            return Err(Error::Host(format!(
                "no worker for bundle {hash} came up within {}s (see {})",
                CONNECT_TIMEOUT.as_secs(),
                log_path(home, hash).display()
            )));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Starts `uncaged-workflow worker <HASH>` in the background. Returns the worker's stdout, on
/// which it announces that its socket accepts connections.
fn spawn_worker(store: &Storage, hash: BundleHash) -> Result<std::process::ChildStdout> {
    start_worker_process(store, &[&hash.to_string()], &log_path(store.home(), hash))
}

/// Starts `uncaged-workflow worker ARGS` on `store` in the background, in its own process
/// group so a Ctrl-C in the terminal that started it does not reach the threads it runs, its
/// diagnostics (at the info level: cache hits, threads taken, exits) appended to `log_file`.
/// Returns its stdout, where it says `ready` once it is up.
pub fn start_worker_process(
    store: &Storage,
    args: &[&str],
    log_file: &Path,
) -> Result<std::process::ChildStdout> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe()
        .map_err(Error::io("locate the running executable", "uncaged-workflow"))?;
    let log = crate::durable::open_private(
        std::fs::OpenOptions::new().create(true).append(true),
        log_file,
    )
    .map_err(Error::io("open worker log", log_file))?;
    let mut command = std::process::Command::new(exe);
    // The worker uses the same store; a connection string may hold a password, so it goes
    // in the environment, which other users cannot read, never on the command line.
    match store.url() {
        Some(url) => command.env(crate::store::STORE_ENV, url),
        None => command.env_remove(crate::store::STORE_ENV),
    };
    let mut child = command
        .arg("--home")
        .arg(store.home().root())
        .args(["-v", "worker"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .process_group(0)
        .spawn()
        .map_err(Error::io("start a worker process, logging to", log_file))?;
    Ok(child.stdout.take().expect("stdout is piped"))
}

/// Is nobody holding the lock at `path`?
fn lock_is_free(path: &Path) -> Result<bool> {
    let file = match crate::durable::open_private(
        std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false),
        path,
    ) {
        Ok(file) => file,
        Err(e) => return Err(Error::io("open worker lock", path)(e)),
    };
    Ok(file.try_lock().is_ok())
}

/// Every bundle that has a live worker now.
pub fn live_workers(home: &Home) -> Result<Vec<BundleHash>> {
    let dir = home.run_dir();
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(Error::io("list", &dir)(e)),
    };
    let mut hashes = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(hash) =
            name.to_str().and_then(|n| n.strip_suffix(".sock")).and_then(|h| h.parse().ok())
        else {
            continue;
        };
        if !lock_is_free(&home.worker_lock(hash))? {
            hashes.push(hash);
        }
    }
    Ok(hashes)
}
