//! Handing a thread to its bundle's worker process (started if none is live), or to the queue
//! of a shared store: what `run`, `resume`, a schedule firing and the web view's actions all
//! do to set a thread going.

use crate::agents::{AgentFlags, Secrets};
use crate::error::{Error, Result};
use crate::ids::{BundleHash, ThreadId};
use crate::run::ipc::{self, Connection, Reply, Request};
use crate::run::queued::{self, QueuedThread};
use crate::store::Storage;

/// What the worker said when it took a thread.
#[derive(Debug, Clone, Copy)]
pub struct Accepted {
    /// The worker's process id; none when the thread was queued for any worker.
    pub pid: Option<u32>,
    /// Whether the bundle came precompiled from the AOT cache.
    pub cache_hit: bool,
    /// How many steps the thread had (it continues after them).
    pub steps: usize,
}

/// A thread handed over, to follow.
pub enum Followed {
    /// Streamed by the local worker that runs it.
    Worker(Connection),
    /// Read from the shared store, whichever worker runs it.
    Queued(Box<QueuedThread>),
}

impl Followed {
    /// The next event; `None` when there are no more.
    pub async fn receive(&mut self, hash: BundleHash) -> Result<Option<Reply>> {
        match self {
            Followed::Worker(connection) => {
                connection.receive::<Reply>().await.map_err(|e| lost(hash, e))
            }
            Followed::Queued(thread) => thread.receive().await,
        }
    }

    /// Answers a [`Reply::Question`]: to the local worker that waits for it, or journaled
    /// for a queued thread (which is then queued again).
    pub async fn answer(&mut self, hash: BundleHash, text: Option<String>) -> Result<()> {
        match self {
            Followed::Worker(connection) => connection
                .send(&ipc::ClientMessage::Answer { text })
                .await
                .map_err(|e| lost(hash, e)),
            Followed::Queued(thread) => thread.answer(text).await,
        }
    }
}

/// Hands thread `id` of bundle `hash` to its worker, with `flags` overriding the thread's
/// recorded agents. With `follow`, the returned connection streams the thread's events (and
/// the follower may answer a `human` agent); without, the thread runs on its own.
pub async fn hand_over(
    store: &Storage,
    hash: BundleHash,
    id: ThreadId,
    flags: &AgentFlags,
    follow: bool,
) -> Result<(Followed, Accepted)> {
    if let Some(pg) = store.postgres() {
        let record = store.threads().read(id)?;
        queued::enqueue(store, pg, id, flags).await?;
        let accepted = Accepted { pid: None, cache_hit: false, steps: record.steps.len() };
        return Ok((
            Followed::Queued(Box::new(QueuedThread::new(store, pg, &record, flags, follow))),
            accepted,
        ));
    }
    let mut connection = ipc::connect_or_spawn(store, hash).await?;
    // The thread's agents use this process's secrets, not the worker's environment: the
    // worker may have been started by another shell, before a key was exported or changed.
    let secrets = Secrets::from_env(&store.config()?);
    let request = Request::Run {
        thread: id.to_string(),
        follow,
        interactive: follow,
        agent: flags.default.clone(),
        agent_for: flags.for_roles.clone(),
        cwd: flags.cwd.clone(),
        secrets,
    };
    connection.send(&request).await.map_err(|e| lost(hash, e))?;
    match connection.receive::<Reply>().await.map_err(|e| lost(hash, e))? {
        Some(Reply::Accepted { pid, cache_hit, steps, .. }) => {
            Ok((Followed::Worker(connection), Accepted { pid: Some(pid), cache_hit, steps }))
        }
        Some(Reply::Error { message, code }) => Err(Error::Remote { message, code }),
        other => {
            Err(Error::Host(format!("unexpected answer from the worker of {hash}: {other:?}")))
        }
    }
}

/// The error for a worker connection that broke.
pub fn lost(hash: BundleHash, e: std::io::Error) -> Error {
    Error::Host(format!("lost the worker of bundle {hash}: {e}"))
}
