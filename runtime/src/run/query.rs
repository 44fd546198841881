//! Which threads a listing shows: by workflow, status and age, newest first, a page at a time;
//! and what a durable agent did within each step of a thread. The CLI's `threads` and
//! `thread`, the web view and the HTTP API all ask these questions here.

use crate::error::Result;
use crate::ids::ThreadId;
use crate::store::Storage;
use crate::store::call_loop::{LoopView, TurnView};
use crate::store::records::{ThreadRecord, ThreadStatus, ThreadSummary};

/// What a listing asks for.
#[derive(Debug, Clone, Default)]
pub struct ThreadQuery {
    /// Only threads of this workflow.
    pub workflow: Option<String>,
    /// Only threads in one of these statuses (any, if empty).
    pub statuses: Vec<ThreadStatus>,
    /// Only threads started at or after this instant (ms since the epoch).
    pub started_after: Option<u64>,
    /// Only threads older than this one: the cursor of the page before.
    pub before: Option<ThreadId>,
    /// At most this many (the newest).
    pub limit: Option<usize>,
    /// Only the threads of this eval; none: only threads that are no eval's (an eval's
    /// threads are kept beside the recorded ones, not among them).
    pub experiment: Option<ThreadId>,
}

/// A page of threads, newest first, and where the next page starts (if there are more).
#[derive(Debug)]
pub struct ThreadPage {
    pub threads: Vec<ThreadSummary>,
    pub next: Option<ThreadId>,
}

/// The threads `query` asks for.
pub fn threads(store: &Storage, query: &ThreadQuery) -> Result<ThreadPage> {
    // Oldest first, as every store lists them: a thread id orders by its creation, so newest
    // first is the reverse, and "older than the cursor" an id comparison.
    let mut threads = store.threads().summaries()?;
    // Filtered in place: a listing of 100,000 threads copied into a second list spent more
    // in page faults than in filtering.
    threads.retain(|t| {
        query.before.is_none_or(|before| t.thread_id < before)
            && query.workflow.as_ref().is_none_or(|w| *w == t.name)
            && (query.statuses.is_empty() || query.statuses.contains(&t.status))
            && query.started_after.is_none_or(|after| t.timestamp >= after)
            && t.experiment() == query.experiment
    });
    threads.reverse();
    let next = match query.limit {
        Some(limit) if threads.len() > limit => {
            threads.truncate(limit);
            threads.last().map(|t| t.thread_id)
        }
        _ => None,
    };
    Ok(ThreadPage { threads, next })
}

/// How long a listing waits for the workers to say what their threads wait for.
const ASK_WORKERS_FOR: std::time::Duration = std::time::Duration::from_millis(500);

/// The provider limit each running thread of `threads` waits for its turn in, as its worker
/// last told, by thread id: how a listing shows "waiting for openai-main" rather than
/// "running". The workers are asked only when one of `threads` runs, and only briefly: a
/// worker that does not answer (stopped, swamped) leaves its threads shown as running, and
/// never holds a listing up.
pub async fn limit_waits(
    store: &Storage,
    threads: &[ThreadSummary],
) -> Result<std::collections::HashMap<ThreadId, String>> {
    if !threads.iter().any(|t| t.status == ThreadStatus::Running) {
        return Ok(Default::default());
    }
    let dispatch = crate::run::dispatch::of(store);
    let running = match tokio::time::timeout(ASK_WORKERS_FOR, dispatch.running()).await {
        Ok(running) => running?,
        Err(_) => return Ok(Default::default()),
    };
    Ok(running.into_iter().filter_map(|t| Some((t.thread_id, t.waiting_for?))).collect())
}

/// The children of thread `record` that have not ended, and theirs: what killing or pausing it
/// does the same to, parents before their children.
pub fn live_descendants(store: &Storage, record: &ThreadRecord) -> Result<Vec<ThreadId>> {
    if !may_have_children(record) {
        return Ok(Vec::new());
    }
    let summaries = store.threads().summaries()?;
    let mut found = Vec::new();
    let mut parents = vec![record.id()];
    while let Some(parent) = parents.pop() {
        for summary in summaries.iter().filter(|s| s.parent == Some(parent)) {
            if !summary.status.is_ended() && found.len() < 10_000 {
                found.push(summary.thread_id);
                parents.push(summary.thread_id);
            }
        }
    }
    Ok(found)
}

/// The children thread `record` started, oldest first, as listings show them.
pub fn children_of(store: &Storage, record: &ThreadRecord) -> Result<Vec<ThreadSummary>> {
    if !may_have_children(record) {
        return Ok(Vec::new());
    }
    let id = record.id();
    let mut children: Vec<_> =
        store.threads().summaries()?.into_iter().filter(|s| s.parent == Some(id)).collect();
    children.sort_by_key(|s| s.thread_id);
    Ok(children)
}

/// Whether thread `record` may have started a child workflow: it is at work (a child may be
/// starting), it waits on one, or a step of it was a child's result. Threads that cannot are
/// answered without listing every thread of the store.
fn may_have_children(record: &ThreadRecord) -> bool {
    record.is_live()
        || record.waited_child().is_some()
        || record
            .steps
            .iter()
            .any(|s| s.agent.as_deref().is_some_and(|a| a.starts_with("workflow:")))
}

/// What durable agents did within a thread: each step's turns (in step order; none for a step
/// whose agent had no loop), and the loops of calls not answered yet (a call in progress, or
/// one that waits on a person).
#[derive(Debug, Default)]
pub struct ThreadTurns {
    pub by_step: Vec<Vec<TurnView>>,
    pub in_progress: Vec<LoopView>,
}

/// The turns of thread `record`'s steps, from its journal.
pub fn turns(store: &Storage, record: &ThreadRecord) -> Result<ThreadTurns> {
    let journal = store.threads().journal(record.start.hash, record.id())?;
    let mut loops = journal.loop_views();
    let mut by_step = vec![Vec::new(); record.steps.len()];
    for (i, step) in record.steps.iter().enumerate() {
        // A parallel group's calls are journaled under its first step.
        let first = step.group.as_ref().map_or(i, |g| g.first - 1);
        let mine = |l: &LoopView| l.step == first && l.role.as_deref() == Some(step.role.as_str());
        while let Some(at) = loops.iter().position(mine) {
            by_step[i].extend(loops.remove(at).turns);
        }
    }
    // What is left belongs to the step in progress (or to steps the thread no longer has).
    loops.retain(|l| l.step >= record.steps.len());
    Ok(ThreadTurns { by_step, in_progress: loops })
}
