//! Reaching threads that run elsewhere: kill or pause one through its worker (over its socket,
//! or through the database of a shared store), list what the live workers run, record a
//! person's answer for a waiting thread, check that a thread can be resumed. The CLI and the
//! web view both call these.

use std::time::{Duration, Instant};

use crate::agents::human::AnswerShape;
use crate::clock::now_ms;
use crate::error::{Error, Result};
use crate::ids::{BundleHash, ThreadId};
use crate::run::ipc::{self, PsEntry, Reply, Request};
use crate::run::worker::KILLED_RETURN_CODE;
use crate::store::Storage;
use crate::store::postgres::queue::{ControlRequest, Queue};
use crate::store::records::{
    End, EndRecord, EndStatus, PauseReason, Paused, PendingCall, ThreadRecord, ThreadStatus,
    ThreadSummary,
};

/// How long `kill` waits for a shared store's worker to stop a thread.
const CONTROL_WAIT: Duration = Duration::from_secs(30);

/// Ends thread `id` as `killed`, whatever it is doing: a running thread is stopped now
/// (through its worker), one at rest — paused, waiting for a person, interrupted — is ended
/// where it is. Returns once it is recorded killed.
pub async fn kill(store: &Storage, id: ThreadId) -> Result<()> {
    let record = store.threads().read(id)?;
    let status = record.status();
    if status.is_ended() {
        return Err(Error::ThreadState {
            id: id.to_string(),
            status: status.as_str(),
            reason: "it has already ended".into(),
        });
    }
    if status != ThreadStatus::Running {
        match end_at_rest(store, id) {
            // Started meanwhile (`resume`, `answer`): stopped as a running one is.
            Err(Error::ThreadBusy(_)) => {}
            done => return done,
        }
    }
    if store.postgres().is_some() {
        return ask_queued(store, id, ControlRequest::Kill).await;
    }
    send(store, id, Request::Kill { thread: id.to_string() }).await
}

/// Ends a thread no process runs as `killed`, under its run lock; the agent processes a dead
/// worker left it are stopped first.
fn end_at_rest(store: &Storage, id: ThreadId) -> Result<()> {
    let (mut writer, record) = store.threads().open(id)?;
    crate::run::lifecycle::stop_leftover_agents(store, id)?;
    if let Some(end) = &record.end {
        return Err(Error::ended(id, end.end.status.as_str()));
    }
    writer.append_end(&EndRecord {
        end: End::by_host(KILLED_RETURN_CODE, "killed".into(), EndStatus::Killed),
        timestamp: now_ms(),
    })
}

/// Stops running thread `id` after its current step.
pub async fn pause(store: &Storage, id: ThreadId) -> Result<()> {
    if store.postgres().is_some() {
        return ask_queued(store, id, ControlRequest::Pause).await;
    }
    send(store, id, Request::Pause { thread: id.to_string() }).await
}

/// Kills or pauses a thread of a shared store: through the worker that holds it, or, while
/// it still waits in the queue, by taking it out of the queue here.
async fn ask_queued(store: &Storage, id: ThreadId, request: ControlRequest) -> Result<()> {
    let pg = store.postgres().expect("a database store");
    let queue = Queue::new(pg);
    let deadline = Instant::now() + CONTROL_WAIT;
    loop {
        running(store, id)?;
        if queue.request(id, request)? {
            break;
        }
        // Not held by a worker: still queued. Taking its lease takes it out of the queue.
        if let Ok((mut writer, _)) = store.threads().open(id) {
            return match request {
                ControlRequest::Kill => writer.append_end(&EndRecord {
                    end: End::by_host(KILLED_RETURN_CODE, "killed".into(), EndStatus::Killed),
                    timestamp: now_ms(),
                }),
                ControlRequest::Pause => writer.append_pause(Paused::by(PauseReason::Pause)),
            };
        }
        if Instant::now() > deadline {
            return Err(Error::ThreadBusy(id.to_string()));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if request == ControlRequest::Kill {
        // `kill` returning means killed: wait for the worker to record it.
        while store.threads().read(id)?.is_live() {
            if Instant::now() > deadline {
                return Err(Error::Host(format!(
                    "thread {id}: its worker did not stop it within {}s",
                    CONTROL_WAIT.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(())
}

/// Thread `id`, if it is running (or queued to run, on a shared store).
fn running(store: &Storage, id: ThreadId) -> Result<ThreadRecord> {
    let record = store.threads().read(id)?;
    let status = record.status();
    if !record.is_live() {
        return Err(Error::ThreadState {
            id: id.to_string(),
            status: status.as_str(),
            reason: "it is not running".into(),
        });
    }
    Ok(record)
}

async fn send(store: &Storage, id: ThreadId, request: Request) -> Result<()> {
    let record = running(store, id)?;
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
    let mut all = match store.postgres() {
        Some(pg) => queued_ps(pg)?,
        None => Vec::new(),
    };
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
                host: None,
                state: "waiting".into(),
            });
        }
    }
    all.sort_by(|a, b| a.thread_id.cmp(&b.thread_id));
    Ok(all)
}

/// The threads of a shared store that workers hold or that wait in its queue.
fn queued_ps(pg: &crate::store::postgres::Postgres) -> Result<Vec<PsEntry>> {
    let mut entries = Vec::new();
    for live in Queue::new(pg).live_threads()? {
        let Ok(summary) = serde_json::from_value::<ThreadSummary>(live.summary) else { continue };
        let activity = live.activity;
        entries.push(PsEntry {
            thread_id: live.id,
            name: summary.name,
            hash: summary.hash.to_string(),
            role: activity.as_ref().and_then(|a| a.role.clone()),
            agent: activity.as_ref().and_then(|a| a.agent.clone()),
            working_since: activity.as_ref().and_then(|a| a.working_since),
            steps: summary.steps,
            since: activity.as_ref().map_or(summary.timestamp, |a| a.since),
            pid: live.worker.as_ref().map(|(_, pid)| *pid),
            host: live.worker.as_ref().map(|(host, _)| host.clone()),
            state: if live.worker.is_some() { "running" } else { "queued" }.into(),
        });
    }
    Ok(entries)
}

/// Records `text` as the answer waiting thread `id` asked a person for; the thread's bundle
/// is returned, to hand the thread over to its worker, which continues with the answer.
///
/// Answers sent at once are settled under the thread's run lock: the first is checked against
/// the role's schema and journaled, and it is the one the thread goes on with; every other is
/// refused ([`Error::ThreadBusy`] while the first holds the lock, [`Error::ThreadState`] once
/// it is recorded) and leaves no trace. An answer that does not fit the role is refused with
/// the reason ([`Error::InvalidAnswer`]), and the thread waits on.
pub fn answer(store: &Storage, id: ThreadId, text: String) -> Result<BundleHash> {
    if text.trim().is_empty() {
        return Err(Error::Usage("the answer is empty; give the text the thread waits for".into()));
    }
    answerable(store, id)?;
    let (writer, record) = store.threads().open(id)?;
    let (role, call) = waited_call(&record)?;
    let mut journal = store.threads().journal(record.start.hash, id)?;
    if journal.answered(call) {
        return Err(Error::ThreadState {
            id: id.to_string(),
            status: "answered",
            reason: "another answer to its question was recorded first".into(),
        });
    }
    if let Some(shape) = answer_shape(store, &record)?
        && let Some(reason) = shape.mismatch(&text)
    {
        return Err(Error::InvalidAnswer {
            id: id.to_string(),
            role: role.to_string(),
            reason,
            expected: shape.example(),
        });
    }
    journal.record_answer(call, role, text)?;
    drop(writer);
    Ok(record.start.hash)
}

/// The role and the call waiting thread `record` needs answered.
fn waited_call(record: &ThreadRecord) -> Result<(&str, &PendingCall)> {
    match &record.paused {
        Some(Paused { by: PauseReason::Waiting, role, call: Some(call) }) => {
            Ok((role.as_deref().unwrap_or_default(), call))
        }
        _ => Err(Error::ThreadState {
            id: record.id().to_string(),
            status: record.status_at_rest().as_str(),
            reason: "it is not waiting for a human answer".into(),
        }),
    }
}

/// What the answer thread `record` waits for must hold, if anything: the waited role's schema
/// (see [`AnswerShape`]).
pub fn answer_shape(store: &Storage, record: &ThreadRecord) -> Result<Option<AnswerShape>> {
    let Some(Paused { role: Some(role), .. }) = &record.paused else { return Ok(None) };
    let descriptor = store.bundles().descriptor(record.start.hash)?;
    let llm_extractor = store.config()?.extractor.is_some();
    Ok(descriptor.role(role).and_then(|spec| AnswerShape::of(role, &spec.schema, llm_extractor)))
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
        ThreadStatus::Running | ThreadStatus::Queued => Err(Error::ThreadBusy(id.to_string())),
        status if status.is_ended() => Err(Error::ended(id, status.as_str())),
        _ => Ok(record),
    }
}
