//! Threads as A2A tasks: a thread told as a task — its state, its question while it waits on a
//! person, its result once it completed. A task's id and its context's are the thread's id.
//! `serve`'s A2A bindings answer with it, and push notifications carry it.

use a2a::{Artifact, Message, Part, Role, Task, TaskState, TaskStatus};
use serde_json::json;

use crate::ids::ThreadId;
use crate::run::waits::{self, WaitKind};
use crate::store::records::{EndStatus, ThreadRecord, ThreadStatus};

/// An agent's message of `text`, on task `id`.
pub fn agent_message(id: ThreadId, text: String) -> Message {
    let mut message = Message::new(Role::Agent, vec![Part::text(text)]);
    message.task_id = Some(id.to_string());
    message.context_id = Some(id.to_string());
    message
}

/// The state of thread `record`, as A2A names it, and what its status message says.
pub fn state(record: &ThreadRecord) -> (TaskState, Option<String>) {
    if let Some(end) = &record.end {
        let state = match end.end.status {
            EndStatus::Completed => TaskState::Completed,
            EndStatus::Killed => TaskState::Canceled,
            _ => TaskState::Failed,
        };
        let summary = (state != TaskState::Completed).then(|| end.end.summary.clone());
        return (state, summary);
    }
    if let Some(wait) = waits::of(record) {
        let asked = match wait.kind {
            WaitKind::Answer => format!(
                "Role `{}` asks: {}\nAnswer with a message on this task.",
                wait.role.as_deref().unwrap_or("?"),
                wait.question
            ),
            WaitKind::Approve => format!(
                "May tool call {} be made? Answer `approve`, or `deny: WHY`.",
                wait.question
            ),
            WaitKind::Cut => {
                format!("A crash cut tool call {}. Answer `redo`, or `skip: TEXT`.", wait.question)
            }
            WaitKind::Budget => format!("Its budget is spent: {}", wait.question),
            WaitKind::SignIn => format!("A tool server's sign-in ran out: {}", wait.question),
        };
        let state = match wait.kind {
            WaitKind::SignIn => TaskState::AuthRequired,
            _ => TaskState::InputRequired,
        };
        return (state, Some(asked));
    }
    match record.status() {
        ThreadStatus::Queued => (TaskState::Submitted, None),
        _ => (TaskState::Working, None),
    }
}

/// What thread `record` made, once it completed: its last step's text and output.
pub fn result(record: &ThreadRecord) -> Option<Artifact> {
    if record.end.as_ref().is_none_or(|e| e.end.status != EndStatus::Completed) {
        return None;
    }
    let step = record.steps.iter().rev().find(|s| {
        ![uncaged_workflow_declarative::STATUS_ROLE, uncaged_workflow_declarative::USER_ROLE]
            .contains(&s.role.as_str())
    })?;
    Some(Artifact {
        artifact_id: "result".into(),
        name: Some(step.role.clone()),
        description: None,
        parts: vec![Part::text(step.content.clone()), Part::data(step.meta.clone())],
        metadata: None,
        extensions: None,
    })
}

/// Thread `record` as a task.
pub fn task(record: &ThreadRecord) -> Task {
    let id = record.id();
    let (state, said) = state(record);
    Task {
        id: id.to_string(),
        context_id: id.to_string(),
        status: TaskStatus {
            state,
            message: said.map(|text| agent_message(id, text)),
            timestamp: chrono::DateTime::from_timestamp_millis(record.last_changed() as i64),
        },
        artifacts: result(record).map(|a| vec![a]),
        history: None,
        metadata: Some(
            [
                ("workflow".to_string(), json!(record.start.name)),
                ("steps".to_string(), json!(record.steps.len())),
            ]
            .into(),
        ),
    }
}
