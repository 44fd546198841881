//! `kill <id>` and `pause <id>`: reach a running thread through its worker.

use clap::Parser;

use super::GlobalOptions;
use crate::error::{Error, Result};
use crate::ids::ThreadId;
use crate::run::ipc::{self, Reply, Request};
use crate::store::Storage;
use crate::store::records::ThreadStatus;

/// Terminate a running thread now: its guest is interrupted even mid-call, an agent process it
/// waits on is stopped, and its end record says `killed`.
#[derive(Debug, Parser)]
pub struct KillCommand {
    /// The thread
    pub id: String,
}

/// Stop a running thread after its current step is persisted; `resume` continues it.
#[derive(Debug, Parser)]
pub struct PauseCommand {
    /// The thread
    pub id: String,
}

impl KillCommand {
    pub async fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let id = send(&global.store()?, &self.id, |thread| Request::Kill { thread }).await?;
        outln!("killed thread {id}")?;
        Ok(0)
    }
}

impl PauseCommand {
    pub async fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let id = send(&global.store()?, &self.id, |thread| Request::Pause { thread }).await?;
        outln!("thread {id} pauses after its current step")?;
        Ok(0)
    }
}

/// Sends a control request for a running thread to the worker running it.
async fn send(
    store: &Storage,
    id: &str,
    request: impl FnOnce(String) -> Request,
) -> Result<ThreadId> {
    let id: ThreadId = id.parse()?;
    let record = store.threads().read(id)?;
    let status = record.status();
    if status != ThreadStatus::Running {
        return Err(Error::ThreadState {
            id: id.to_string(),
            status: status.as_str(),
            reason: "it is not running".into(),
        });
    }
    let not_in_worker = || Error::ThreadState {
        id: id.to_string(),
        status: "running",
        reason: "it is not run by a worker (a `step` in progress?)".into(),
    };
    let mut connection =
        ipc::connect(store.home(), record.start.hash).await?.ok_or_else(not_in_worker)?;
    let lost = |e: std::io::Error| Error::Host(format!("lost the worker of thread {id}: {e}"));
    connection.send(&request(id.to_string())).await.map_err(lost)?;
    match connection.receive::<Reply>().await.map_err(lost)? {
        Some(Reply::Ok) => Ok(id),
        Some(Reply::Error { message, code }) => Err(Error::Remote { message, code }),
        other => Err(Error::Host(format!("unexpected answer from the worker: {other:?}"))),
    }
}
