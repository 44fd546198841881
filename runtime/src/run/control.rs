//! Reaching threads that run elsewhere: kill or pause one through its worker, list what the
//! live workers run, record a person's answer for a waiting thread, check that a thread can
//! be resumed. The CLI and the web view both call these.

use crate::error::{Error, Result};
use crate::ids::{BundleHash, ThreadId};
use crate::run::ipc::{self, PsEntry, Reply, Request};
use crate::store::Storage;
use crate::store::records::{ThreadRecord, ThreadStatus};

/// Stops running thread `id` now.
pub async fn kill(store: &Storage, id: ThreadId) -> Result<()> {
    send(store, id, Request::Kill { thread: id.to_string() }).await
}

/// Stops running thread `id` after its current step.
pub async fn pause(store: &Storage, id: ThreadId) -> Result<()> {
    send(store, id, Request::Pause { thread: id.to_string() }).await
}

async fn send(store: &Storage, id: ThreadId, request: Request) -> Result<()> {
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
    connection.send(&request).await.map_err(lost)?;
    match connection.receive::<Reply>().await.map_err(lost)? {
        Some(Reply::Ok) => Ok(()),
        Some(Reply::Error { message, code }) => Err(Error::Remote { message, code }),
        other => Err(Error::Host(format!("unexpected answer from the worker: {other:?}"))),
    }
}

/// The threads live workers run, and the threads waiting for a human answer (they hold no
/// process, but they are live work), by thread id.
pub async fn ps(store: &Storage) -> Result<Vec<PsEntry>> {
    let home = store.home();
    let mut all = Vec::new();
    for hash in ipc::live_workers(home)? {
        // A worker that exits between listing and asking simply has no threads.
        let Some(mut connection) = ipc::connect(home, hash).await? else { continue };
        if connection.send(&Request::Ps).await.is_err() {
            continue;
        }
        if let Ok(Some(Reply::Threads { threads })) = connection.receive::<Reply>().await {
            all.extend(threads);
        }
    }
    for thread in store.threads().summaries()? {
        if thread.status == ThreadStatus::Waiting {
            all.push(PsEntry {
                thread_id: thread.thread_id.to_string(),
                name: thread.name.clone(),
                hash: thread.hash.to_string(),
                role: thread.waiting_role.clone(),
                agent: Some("human".into()),
                working_since: thread.paused_at,
                steps: thread.steps,
                since: thread.paused_at.unwrap_or(thread.timestamp),
                pid: None,
                state: "waiting".into(),
            });
        }
    }
    all.sort_by(|a, b| a.thread_id.cmp(&b.thread_id));
    Ok(all)
}

/// Records `text` as the answer waiting thread `id` asked a person for; the thread's bundle
/// is returned, to hand the thread over to its worker, which continues with the answer.
pub fn answer(store: &Storage, id: ThreadId, text: String) -> Result<BundleHash> {
    let record = answerable(store, id)?;
    if text.trim().is_empty() {
        return Err(Error::Usage("the answer is empty; give the text the thread waits for".into()));
    }
    let paused = record.paused.as_ref().expect("a waiting thread has a pause marker");
    let call = paused.call.as_ref().expect("a waiting thread waits on a call");
    let role = paused.role.clone().unwrap_or_default();
    store.threads().journal(record.start.hash, id)?.record_answer(call, &role, text)?;
    Ok(record.start.hash)
}

/// Thread `id`, if it waits for a human answer.
pub fn answerable(store: &Storage, id: ThreadId) -> Result<ThreadRecord> {
    let record = store.threads().read(id)?;
    let status = record.status();
    let waiting =
        status == ThreadStatus::Waiting && record.paused.as_ref().is_some_and(|p| p.call.is_some());
    if !waiting {
        return Err(Error::ThreadState {
            id: id.to_string(),
            status: status.as_str(),
            reason: "it is not waiting for a human answer".into(),
        });
    }
    Ok(record)
}

/// Thread `id`, if it can be resumed: not running, not ended.
pub fn resumable(store: &Storage, id: ThreadId) -> Result<ThreadRecord> {
    let record = store.threads().read(id)?;
    match record.status() {
        ThreadStatus::Running => Err(Error::ThreadBusy(id.to_string())),
        status if status.is_ended() => Err(Error::ended(id, status.as_str())),
        _ => Ok(record),
    }
}
