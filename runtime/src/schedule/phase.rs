//! A workflow's phase as a whole (the DAG protocol's `WorkflowPhase`), read from what the
//! store already holds — its schedules and its threads — and pausing a workflow: its triggers
//! stop, and resuming it lets them fire again from then on.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::store::Storage;
use crate::store::records::{ThreadStatus, ThreadSummary};
use crate::store::schedules::Schedule;

/// Where a workflow is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// A thread of it runs, or waits in the queue for a worker.
    Executing,
    /// Its triggers are registered and fire: it waits for the next one.
    Active,
    /// Its triggers are paused; or, without triggers, its last thread is paused or waits.
    Paused,
    /// Without triggers: its last thread completed.
    Completed,
    /// Without triggers: its last thread failed or was killed.
    Failed,
    /// Without triggers, and never run.
    Ready,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Executing => "executing",
            Phase::Active => "active",
            Phase::Paused => "paused",
            Phase::Completed => "completed",
            Phase::Failed => "failed",
            Phase::Ready => "ready",
        }
    }

    /// The phase of a workflow with these schedules and threads. A run in progress comes
    /// first; then a workflow with triggers is active unless every one is paused (one failed
    /// run leaves it active: the next trigger starts another); a workflow without triggers is
    /// where its last thread is.
    pub fn of(schedules: &[&Schedule], threads: &[&ThreadSummary]) -> Phase {
        if threads.iter().any(|t| matches!(t.status, ThreadStatus::Running | ThreadStatus::Queued))
        {
            return Phase::Executing;
        }
        if !schedules.is_empty() {
            return if schedules.iter().all(|s| s.paused) { Phase::Paused } else { Phase::Active };
        }
        match threads.iter().max_by_key(|t| t.timestamp).map(|t| t.status) {
            None => Phase::Ready,
            Some(ThreadStatus::Completed) => Phase::Completed,
            Some(ThreadStatus::Failed | ThreadStatus::Killed) => Phase::Failed,
            Some(_) => Phase::Paused,
        }
    }
}

/// The phase of each registered workflow.
pub fn phases(store: &Storage) -> Result<BTreeMap<String, Phase>> {
    let registry = crate::run::catalog::Catalog::new(store).registry().load()?;
    let schedules = store.schedules().list()?;
    let threads = store.threads().summaries()?;
    Ok(registry
        .workflows
        .keys()
        .map(|name| {
            let own: Vec<&Schedule> = schedules.iter().filter(|s| &s.workflow == name).collect();
            let runs: Vec<&ThreadSummary> = threads.iter().filter(|t| &t.name == name).collect();
            (name.clone(), Phase::of(&own, &runs))
        })
        .collect())
}

/// Pauses (or resumes) every trigger of `workflow`: its schedules stop firing (or fire again
/// from now on, not catching up). Returns the schedules changed. A workflow without triggers
/// has nothing to pause: its threads are paused one by one (`pause THREAD`).
pub fn set_workflow_paused(store: &Storage, workflow: &str, paused: bool) -> Result<Vec<Schedule>> {
    let names: Vec<String> = store
        .schedules()
        .list()?
        .into_iter()
        .filter(|s| s.workflow == workflow)
        .map(|s| s.name)
        .collect();
    if names.is_empty() {
        return Err(Error::Usage(format!(
            "workflow `{workflow}` has no trigger or schedule to pause or resume (pause its \
             threads with `pause THREAD`)"
        )));
    }
    names.iter().map(|name| super::set_paused(store, name, paused)).collect()
}

/// What pausing a workflow as a whole paused.
#[derive(Debug, Default)]
pub struct PausedWorkflow {
    /// Its schedules (its `trigger:`, and any added for it), paused.
    pub schedules: Vec<Schedule>,
    /// Its threads that were running or queued: each pauses after its current step.
    pub threads: Vec<crate::ids::ThreadId>,
}

/// Pauses workflow `workflow` as a whole (the DAG protocol's `executing → paused`): its
/// triggers stop firing, and each of its threads that runs pauses after its current step (its
/// child workflows' threads with it). `schedule resume --workflow` lets the triggers fire
/// again; `resume THREAD` continues each thread.
pub async fn pause_workflow(store: &Storage, workflow: &str) -> Result<PausedWorkflow> {
    store.registry().get(workflow)?;
    let schedules = match set_workflow_paused(store, workflow, true) {
        Ok(schedules) => schedules,
        // No trigger: its threads are all there is to pause.
        Err(Error::Usage(_)) => Vec::new(),
        Err(e) => return Err(e),
    };
    let mut threads = Vec::new();
    for thread in store.threads().summaries()? {
        let runs = matches!(thread.status, ThreadStatus::Running | ThreadStatus::Queued);
        if thread.name != workflow || !runs {
            continue;
        }
        match crate::run::control::pause(store, thread.thread_id).await {
            Ok(()) => threads.push(thread.thread_id),
            // It came to rest meanwhile.
            Err(Error::ThreadState { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(PausedWorkflow { schedules, threads })
}
