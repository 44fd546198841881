//! Reaching threads that run: kill or pause one through the worker that holds it (the request
//! goes through the store's queue, and the worker is woken), end one at rest, list what the
//! live workers run, check that a thread can be resumed. The CLI and the web view both call
//! these.

use std::time::{Duration, Instant};

use crate::clock::now_ms;
use crate::error::{Error, Result};
use crate::ids::ThreadId;
use crate::run::dispatch::Asked;
use crate::run::events::{PsEntry, PsState};
use crate::run::worker::KILLED_RETURN_CODE;
use crate::run::{dispatch, query};
use crate::store::Storage;
use crate::store::queue::ControlRequest;
use crate::store::records::{
    End, EndRecord, EndStatus, PauseReason, Paused, ThreadRecord, ThreadStatus,
};

/// How long `kill` waits for a worker to stop a thread.
const CONTROL_WAIT: Duration = Duration::from_secs(30);

/// Ends thread `id` as `killed`, whatever it is doing: a running thread is stopped now
/// (through its worker), one at rest — paused, waiting for a person or a child, interrupted —
/// is ended where it is. Its child workflows' threads that have not ended are killed after it
/// (so none hands it a result), theirs too. Returns once it is recorded killed.
pub async fn kill(store: &Storage, id: ThreadId) -> Result<()> {
    let descendants = query::live_descendants(store, &store.threads().read(id)?)?;
    kill_one(store, id).await?;
    for child in descendants {
        match kill_one(store, child).await {
            // Ended meanwhile: nothing left to do.
            Ok(()) | Err(Error::ThreadState { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

async fn kill_one(store: &Storage, id: ThreadId) -> Result<()> {
    let mut asked = false;
    loop {
        let record = store.threads().read(id)?;
        let status = record.status();
        if status.is_ended() && asked {
            return Ok(());
        }
        if status.is_ended() {
            return Err(Error::ThreadState {
                id: id.to_string(),
                status: status.as_str(),
                reason: "it has already ended".into(),
            });
        }
        if !record.is_live() {
            match end_at_rest(store, id, ControlRequest::Kill) {
                // Started meanwhile (`resume`, `answer`): stopped as a running one is.
                Err(Error::ThreadBusy(_)) => {}
                done => return done,
            }
        }
        match ask(store, id, ControlRequest::Kill).await {
            // It came to rest (waiting for a person, paused) between the look above and the
            // ask: it is ended where it rests, on the next turn.
            Err(Error::ThreadState { .. }) => continue,
            asked_it => asked_it?,
        }
        // Its worker let it go without ending it: it came to rest before the kill reached
        // it. It is ended where it rests, on the next turn.
        asked = true;
    }
}

/// Stops running thread `id` after its current step, and its child workflows' threads that
/// run after theirs. A thread that waits on a running child is paused by pausing the child.
pub async fn pause(store: &Storage, id: ThreadId) -> Result<()> {
    let descendants = query::live_descendants(store, &store.threads().read(id)?)?;
    let own = ask(store, id, ControlRequest::Pause).await;
    let mut paused_a_child = false;
    for child in descendants {
        if store.threads().read(child)?.is_live() {
            match ask(store, child, ControlRequest::Pause).await {
                Ok(()) => paused_a_child = true,
                // Came to rest meanwhile.
                Err(Error::ThreadState { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
    match own {
        Err(Error::ThreadState { .. }) if paused_a_child => Ok(()),
        own => own,
    }
}

/// Ends (kill) or pauses a thread no process runs, under its run lock; the agent processes a
/// dead worker left it are stopped first.
fn end_at_rest(store: &Storage, id: ThreadId, request: ControlRequest) -> Result<()> {
    let (mut writer, record) = store.threads().open(id)?;
    // Held here, it is ours to end or pause: no worker is to take it after.
    store.queue().withdraw(id)?;
    crate::run::lifecycle::stop_leftover_agents(store, id)?;
    if let Some(end) = &record.end {
        return Err(Error::ended(id, end.end.status.as_str()));
    }
    match request {
        ControlRequest::Kill => writer.append_end(&EndRecord {
            end: End::by_host(KILLED_RETURN_CODE, "killed".into(), EndStatus::Killed),
            timestamp: now_ms(),
        }),
        ControlRequest::Pause => writer.append_pause(Paused::by(PauseReason::Pause)),
    }
}

/// Kills or pauses running thread `id`: through the worker that holds it (the request waits
/// in the queue, and the worker is woken), or, while it still waits in the queue for a
/// worker, by taking it out of the queue here. `kill` returns once the thread is recorded
/// killed.
async fn ask(store: &Storage, id: ThreadId, request: ControlRequest) -> Result<()> {
    let dispatch = dispatch::of(store);
    let deadline = Instant::now() + CONTROL_WAIT;
    loop {
        let record = running(store, id)?;
        if dispatch.ask(id, record.version(), request).await? == Asked::Asked {
            break;
        }
        // Not held by a worker: still queued. Taking it takes it out of the queue.
        match end_at_rest(store, id, request) {
            Err(Error::ThreadBusy(_)) => {}
            done => return done,
        }
        if Instant::now() > deadline {
            return Err(Error::ThreadBusy(id.to_string()));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if request == ControlRequest::Pause {
        // `pause` returning means its worker has the request (it stops after the step at
        // hand), whether it was woken at once or finds it at its next look (no wake-ups
        // behind a transaction-pooling PgBouncer). One that does not look within the wait
        // still finds it when it does.
        while store.queue().is_asked(id)? && store.threads().read(id)?.is_live() {
            if Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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

/// Thread `id`, if it is running (or queued to run).
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

/// The threads live workers run (and those queued for one), and the threads waiting for a
/// human answer (they hold no process, but they are live work), by thread id.
pub async fn ps(store: &Storage) -> Result<Vec<PsEntry>> {
    let mut all = dispatch::of(store).running().await?;
    let summaries = store.threads().summaries()?;
    // A waiting thread with a live child waits on it, not on a person.
    let parents: std::collections::HashSet<ThreadId> =
        summaries.iter().filter(|s| !s.status.is_ended()).filter_map(|s| s.parent).collect();
    for thread in summaries {
        if thread.status == ThreadStatus::Waiting {
            let agent =
                if parents.contains(&thread.thread_id) { "child workflow" } else { "human" };
            all.push(PsEntry {
                thread_id: thread.thread_id,
                name: thread.name.clone(),
                hash: thread.hash,
                role: thread.waiting_role.clone(),
                agent: Some(agent.into()),
                working_since: thread.paused_at,
                steps: thread.steps,
                since: thread.paused_at.unwrap_or(thread.timestamp),
                pid: None,
                host: None,
                state: PsState::Waiting,
                waiting_for: None,
            });
        }
    }
    all.sort_by_key(|entry| entry.thread_id);
    Ok(all)
}

/// The provider limit a request of `record`'s thread waits for its turn in, if the thread runs
/// and one does (as its worker last told).
pub async fn waiting_for(store: &Storage, record: &ThreadRecord) -> Result<Option<String>> {
    if record.status() != ThreadStatus::Running {
        return Ok(None);
    }
    let running = dispatch::of(store).running().await?;
    Ok(running.into_iter().find(|t| t.thread_id == record.id()).and_then(|t| t.waiting_for))
}

/// Thread `id`, if it can be resumed: not running, not ended. A thread queued for a worker
/// can: nobody holds it (a worker that held it died, and its lease ran out), and resuming it
/// makes sure a worker is alive to take it.
pub fn resumable(store: &Storage, id: ThreadId) -> Result<ThreadRecord> {
    let record = store.threads().read(id)?;
    match record.status() {
        ThreadStatus::Running => Err(Error::ThreadBusy(id.to_string())),
        status if status.is_ended() => Err(Error::ended(id, status.as_str())),
        _ => Ok(record),
    }
}
