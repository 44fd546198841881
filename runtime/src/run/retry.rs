//! Retrying a failed thread from the step that failed (the DAG protocol's "failed → executing:
//! the user retries, and the run re-enters from the failed step"): one record reopens the
//! thread — its end undone, the calls of the failed step on forgotten so they are made again —
//! and `resume` continues it. The steps that succeeded stay, with their journaled calls. In a
//! DAG the record also sets the failed steps, and those skipped because of them, to run again,
//! and nothing else. It is the same thread; `fork` keeps its meaning.

use uncaged_workflow_declarative::dag::{self, Status};
use uncaged_workflow_declarative::{STATUS_ROLE, StepView, USER_ROLE};

use crate::clock::now_ms;
use crate::error::{Error, Result};
use crate::ids::ThreadId;
use crate::store::Storage;
use crate::store::records::{Retry, RetryRecord, StepRecord, ThreadRecord, ThreadStatus};

/// Reopens failed thread `id` to continue from the step that failed, or after its first
/// `from_step` steps (the steps after them left as history); what was retried.
pub fn reopen(store: &Storage, id: ThreadId, from_step: Option<usize>) -> Result<Retry> {
    let (mut writer, record) = store.threads().open(id)?;
    let status = record.status_at_rest();
    if status != ThreadStatus::Failed {
        return Err(Error::ThreadState {
            id: id.to_string(),
            status: status.as_str(),
            reason: "only a failed thread is retried (`resume` continues a paused or \
                     interrupted one)"
                .into(),
        });
    }
    let reason = record.end.as_ref().map(|e| e.end.summary.clone()).unwrap_or_default();
    let keep = match from_step {
        None => record.steps.len(),
        Some(n) => super::lifecycle::fork_point(&record, &super::lifecycle::ForkAt::Steps(n))?,
    };
    let mut kept = record.clone();
    kept.steps.truncate(keep);
    let descriptor = store.bundles().descriptor(record.version())?;
    let steps = match descriptor.role(STATUS_ROLE) {
        Some(_) => dag_retries(&kept),
        None => Vec::new(),
    };
    let retry = Retry { from_step: keep, reason, steps };
    crate::faults::crash_point("retry-reopening");
    writer.append_retry(&RetryRecord { retry: retry.clone(), timestamp: now_ms() })?;
    crate::faults::crash_point("retry-reopened");
    Ok(retry)
}

/// Where failed thread `record` failed: the step of a DAG's first failure record, or after its
/// last step (a code bundle's or a graph's failure records no step). What a version it moves
/// to for a retry must do the same up to.
pub fn failure_point(record: &ThreadRecord) -> usize {
    record
        .steps
        .iter()
        .position(|s| s.role == STATUS_ROLE && s.meta.get("status").is_some_and(|v| v == "failed"))
        .unwrap_or(record.steps.len())
}

/// A declarative DAG's steps to run again: each that failed, and each skipped because a step
/// it depends on failed or was skipped (not one a condition or a person skipped), as the
/// `$user` decisions the interpreter reads as "run it again".
fn dag_retries(record: &ThreadRecord) -> Vec<StepRecord> {
    let history: Vec<StepView<'_>> =
        record.steps.iter().map(|s| StepView { role: &s.role, meta: &s.meta }).collect();
    let (statuses, _) = dag::statuses(&history);
    // In the order the thread recorded them, so the retry reads as the failure did.
    let mut ids: Vec<&str> = Vec::new();
    for step in record.steps.iter().filter(|s| s.role == STATUS_ROLE) {
        let Some(id) = step.meta.get("step").and_then(|v| v.as_str()) else { continue };
        let again = match statuses.get(id) {
            Some(Status::Failed(_)) => true,
            Some(Status::Skipped(reason)) => reason.starts_with("it depends on"),
            _ => false,
        };
        if again && !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids.into_iter()
        .map(|id| StepRecord {
            role: USER_ROLE.into(),
            content: format!("retry `{id}` (uncaged-workflow retry)"),
            meta: serde_json::json!({"step": id, "decision": "retry"}),
            timestamp: now_ms(),
            group: None,
            agent: None,
            duration_ms: None,
            usage: None,
        })
        .collect()
}
