//! Handing a thread to its bundle's worker process (started if none is live): what `run`,
//! `resume`, a schedule firing and the web view's actions all do to set a thread going.

use crate::agents::{AgentFlags, Secrets};
use crate::error::{Error, Result};
use crate::ids::{BundleHash, ThreadId};
use crate::run::ipc::{self, Connection, Reply, Request};
use crate::store::Storage;

/// What the worker said when it took a thread.
#[derive(Debug, Clone, Copy)]
pub struct Accepted {
    /// The worker's process id.
    pub pid: u32,
    /// Whether the bundle came precompiled from the AOT cache.
    pub cache_hit: bool,
    /// How many steps the thread had (it continues after them).
    pub steps: usize,
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
) -> Result<(Connection, Accepted)> {
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
            Ok((connection, Accepted { pid, cache_hit, steps }))
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
