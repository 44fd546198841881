//! The tasks extension (`io.modelcontextprotocol/tasks`): a call from a client that declares it
//! returns at once with a task, and the task is the call's thread — its id the thread's id,
//! `tasks/get` its state (`input_required` with the question while it waits for a person),
//! `tasks/update` the person's answer, `tasks/cancel` a kill.

use rmcp::ErrorData as McpError;
use rmcp::model::{DetailedTask, InputResponses, JsonObject, Task, TaskPayload, TaskStatus};

use super::answers::{self, Question};
use super::protocol_error;
use crate::ids::ThreadId;
use crate::store::Storage;
use crate::store::records::{ThreadRecord, ThreadStatus};

/// How often a client is asked to poll a task.
pub const POLL_INTERVAL_MS: u64 = 500;

/// The task of thread `record`, without its payload.
pub fn task(record: &ThreadRecord) -> Task {
    let status = match record.status() {
        ThreadStatus::Completed | ThreadStatus::Failed => TaskStatus::Completed,
        ThreadStatus::Killed => TaskStatus::Cancelled,
        ThreadStatus::Waiting if record.waited_child().is_none() => TaskStatus::InputRequired,
        _ => TaskStatus::Working,
    };
    let last = record.last_changed();
    Task::new(record.id().to_string(), status, rfc3339(record.start.timestamp), rfc3339(last))
        .with_status_message(format!("thread {} is {}", record.id(), record.status().as_str()))
        .with_poll_interval_ms(POLL_INTERVAL_MS)
}

pub use crate::clock::rfc3339;

/// The thread a task id names.
fn thread_of(store: &Storage, task_id: &str) -> Result<ThreadId, McpError> {
    let id: ThreadId = task_id.parse().map_err(|_| {
        McpError::invalid_params(format!("no task `{}`", crate::terminal::line(task_id)), None)
    })?;
    store.threads().read(id).map_err(protocol_error)?;
    Ok(id)
}

/// `tasks/get`: the thread as a task; its result once it has ended, its question while it
/// waits for a person.
pub async fn get(store: &Storage, task_id: &str) -> Result<DetailedTask, McpError> {
    let id = thread_of(store, task_id)?;
    let record = store.threads().read(id).map_err(protocol_error)?;
    let task = task(&record);
    let payload = match task.status {
        TaskStatus::Completed => {
            TaskPayload::Completed { result: object(&answers::ended(&record)) }
        }
        TaskStatus::Cancelled => TaskPayload::Cancelled,
        TaskStatus::InputRequired => match Question::of(&record) {
            Some(question) => {
                TaskPayload::InputRequired { input_requests: answers::input_requests(&question) }
            }
            None => TaskPayload::Working,
        },
        _ => TaskPayload::Working,
    };
    Ok(DetailedTask::new(task, payload))
}

fn object(result: &rmcp::model::CallToolResult) -> JsonObject {
    match serde_json::to_value(result).expect("a result serializes") {
        serde_json::Value::Object(map) => map,
        _ => JsonObject::new(),
    }
}

/// `tasks/update`: a person's answer to the task's question.
pub async fn update(
    store: &Storage,
    task_id: &str,
    responses: &InputResponses,
) -> Result<(), McpError> {
    let id = thread_of(store, task_id)?;
    answers::answer_with(store, id, responses).await.map_err(protocol_error)?;
    Ok(())
}

/// `tasks/cancel`: kills the thread.
pub async fn cancel(store: &Storage, task_id: &str) -> Result<(), McpError> {
    let id = thread_of(store, task_id)?;
    crate::run::control::kill(store, id).await.map_err(protocol_error)
}
