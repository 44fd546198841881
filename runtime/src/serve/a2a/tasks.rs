//! A2A messages and listings over threads: a message that starts a task (a thread) or answers
//! the one it rests in, following it to its next rest, and the listing. How a thread is told
//! as a task is [`crate::reach::a2a_tasks`]'s (push notifications tell it too).

use std::collections::HashMap;
use std::time::Duration;

use a2a::{
    A2AError, ListTasksRequest, ListTasksResponse, Message, PartContent, SendMessageRequest,
    TaskState,
};
use serde_json::{Value, json};

use super::{a2a_error, thread_of};
use crate::ids::ThreadId;
pub use crate::reach::a2a_tasks::{agent_message, result, state, task};
use crate::run::actions::{self, Once, OnceKey};
use crate::run::lifecycle::{Origin, StartRequest};
use crate::run::query::{self, ThreadQuery};
use crate::run::waits::{self, Decision, Expected, WaitKind};
use crate::run_request::RunRequest;
use crate::store::Storage;
use crate::store::pauses::DecidedBy;
use crate::store::records::{StartedBy, ThreadRecord, ThreadStatus};

/// The longest message text taken as a prompt or an answer.
const MAX_TEXT: usize = 256 * 1024;

/// The longest a message id is kept as its start's key.
const MAX_MESSAGE_ID: usize = 200;

/// How long `SendMessage` waits for its thread to come to rest unless `mcp.wait` says.
const DEFAULT_WAIT: Duration = Duration::from_secs(60);

/// How long a blocking `SendMessage` waits for its task to end or ask: `mcp.wait`, as a tool
/// call waits (one setting for both).
pub fn wait_for(store: &Storage) -> Duration {
    store.config().ok().and_then(|c| c.mcp.wait).map_or(DEFAULT_WAIT, |w| w.0)
}

/// The message's text parts, joined, and its first data part.
fn content(message: &Message) -> Result<(String, Option<Value>), A2AError> {
    let mut text = String::new();
    let mut data = None;
    for part in &message.parts {
        match &part.content {
            PartContent::Text(t) => {
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(t);
            }
            PartContent::Data(value) if data.is_none() => data = Some(value.clone()),
            PartContent::Data(_) => {}
            PartContent::Raw(_) | PartContent::Url(_) => {
                return Err(A2AError::content_type_not_supported());
            }
        }
    }
    if text.len() > MAX_TEXT {
        return Err(A2AError::invalid_params(format!(
            "the message's text is over {} bytes",
            MAX_TEXT
        )));
    }
    Ok((text, data))
}

/// The workflow a new task runs: the message's (or the request's) `metadata.skill`, or the one
/// workflow offered.
fn skill(store: &Storage, req: &SendMessageRequest) -> Result<String, A2AError> {
    let named = |metadata: &Option<HashMap<String, Value>>| {
        metadata.as_ref().and_then(|m| m.get("skill")).and_then(Value::as_str).map(str::to_string)
    };
    let offered = crate::serve::mcp::tools::offered_names(store).map_err(a2a_error)?;
    match named(&req.message.metadata).or_else(|| named(&req.metadata)) {
        Some(skill) if offered.contains(&skill) => Ok(skill),
        Some(skill) => Err(A2AError::invalid_params(format!(
            "no skill `{}` (the agent card lists them)",
            crate::terminal::line(&skill)
        ))),
        None if offered.len() == 1 => Ok(offered[0].clone()),
        None => Err(A2AError::invalid_params(format!(
            "name the workflow to run as the message's metadata.skill (one of: {})",
            offered.join(", ")
        ))),
    }
}

/// What a message sent to task `thread` decides about the wait it rests in: its text answers a
/// question; for a tool call, `approve`, `deny: WHY`, `redo` or `skip: TEXT` (or a data part
/// `{"decision": …, "text": …}`).
fn decision(kind: WaitKind, text: &str, data: Option<&Value>) -> Result<Decision, A2AError> {
    let (word, rest) = match data.and_then(|d| d.get("decision")).and_then(Value::as_str) {
        Some(word) => (
            word.to_string(),
            data.and_then(|d| d.get("text")).and_then(Value::as_str).unwrap_or(text).to_string(),
        ),
        None => {
            let (word, rest) = text.split_once(':').unwrap_or((text, ""));
            (word.trim().to_ascii_lowercase(), rest.trim().to_string())
        }
    };
    let decided = match (kind, word.as_str()) {
        (WaitKind::Answer, _) => Decision::Answer { text: text.to_string() },
        (WaitKind::Approve, "approve") => Decision::Approve,
        (WaitKind::Approve, "deny") => Decision::Deny { reason: rest },
        (WaitKind::Cut, "redo") => Decision::Redo,
        (WaitKind::Cut, "skip") => Decision::Skip { text: rest },
        (WaitKind::Approve, _) => {
            return Err(A2AError::invalid_params("answer `approve`, or `deny: WHY`"));
        }
        (WaitKind::Cut, _) => {
            return Err(A2AError::invalid_params(
                "answer `redo` (make the call again), or `skip: TEXT` (give the model TEXT)",
            ));
        }
        (WaitKind::Budget | WaitKind::SignIn, _) => {
            return Err(A2AError::unsupported_operation(
                "the task waits for a budget or a sign-in, which a message does not give",
            ));
        }
    };
    Ok(decided)
}

/// The thread a message takes up: a new one it starts (once per message id, by caller), or the
/// one it answers; and the wait it answered, to tell the thread's next rest from it.
pub async fn take(
    store: &Storage,
    caller: &str,
    req: &SendMessageRequest,
) -> Result<(ThreadId, Option<Expected>), A2AError> {
    let message = &req.message;
    if message.message_id.is_empty() || message.message_id.len() > MAX_MESSAGE_ID {
        return Err(A2AError::invalid_params(format!(
            "a message needs a messageId of 1 to {MAX_MESSAGE_ID} characters"
        )));
    }
    let (text, data) = content(message)?;
    if let Some(task) = &message.task_id {
        let id = thread_of(task)?;
        let record = store.threads().read(id).map_err(a2a_error)?;
        offered(store, &record)?;
        let Some(wait) = waits::of(&record) else {
            return Err(A2AError::unsupported_operation(format!(
                "task {id} is {}: it takes no message now",
                record.status_at_rest().as_str()
            )));
        };
        let decided = decision(wait.kind, &text, data.as_ref())?;
        let expected = Expected { key: wait.key.clone(), digest: wait.digest.clone() };
        let by = DecidedBy::new(caller, "a2a");
        waits::decide(store, id, Some(&expected), &decided, &by).await.map_err(a2a_error)?;
        return Ok((id, Some(expected)));
    }
    let workflow = skill(store, req)?;
    if text.trim().is_empty() {
        return Err(A2AError::invalid_params("the message has no text to give as the prompt"));
    }
    let fingerprint = crate::store::bundles::sha256_hex(
        json!({"workflow": workflow, "text": text, "data": data}).to_string().as_bytes(),
    );
    let key = OnceKey {
        scope: caller.to_string(),
        key: format!("a2a:{}", message.message_id),
        fingerprint,
    };
    let start = StartRequest {
        name: workflow,
        prompt: text,
        trigger_data: data.filter(Value::is_object),
        request: RunRequest::default(),
        origin: Origin {
            started_by: Some(StartedBy::new("a2a", caller, None)),
            ..Origin::default()
        },
    };
    match actions::start_once(store, start, Some(key)).await.map_err(a2a_error)? {
        Once::Started(id) | Once::Replayed(id) => Ok((id, None)),
    }
}

/// Whether thread `record` is one A2A may see: of a workflow offered, not an eval's.
pub fn offered(store: &Storage, record: &ThreadRecord) -> Result<(), A2AError> {
    let names = crate::serve::mcp::tools::offered_names(store).map_err(a2a_error)?;
    if record.start.eval.is_some() || !names.contains(&record.start.name) {
        return Err(A2AError::task_not_found(&record.id().to_string()));
    }
    Ok(())
}

/// Whether thread `record` is at rest past `before` (the wait a message answered): ended,
/// waiting on a person for something else, or paused.
fn at_rest(record: &ThreadRecord, before: Option<&Expected>) -> bool {
    match record.status() {
        ThreadStatus::Completed | ThreadStatus::Failed | ThreadStatus::Killed => true,
        ThreadStatus::Paused => true,
        ThreadStatus::Waiting => match (waits::of(record), before) {
            (Some(wait), Some(b)) => wait.key != b.key || wait.digest != b.digest,
            (Some(_), None) => true,
            // Waiting on a child workflow's thread: it works on.
            (None, _) => false,
        },
        _ => false,
    }
}

/// Thread `id` once it is at rest past `before`, or as it is when `wait` has passed.
pub async fn settled(
    store: &Storage,
    id: ThreadId,
    before: Option<&Expected>,
    wait: Duration,
) -> Result<ThreadRecord, A2AError> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut pause = Duration::from_millis(20);
    loop {
        let record = store.threads().read(id).map_err(a2a_error)?;
        if at_rest(&record, before) || tokio::time::Instant::now() >= deadline {
            return Ok(record);
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(250));
    }
}

/// The state a listed thread is in, from its summary alone (a listing reads no thread whole
/// but those of its page): a thread waiting on a child workflow's thread lists as waiting for
/// input here, and working once read.
fn listed_state(status: ThreadStatus) -> TaskState {
    match status {
        ThreadStatus::Queued => TaskState::Submitted,
        ThreadStatus::Waiting | ThreadStatus::Paused => TaskState::InputRequired,
        ThreadStatus::Completed => TaskState::Completed,
        ThreadStatus::Killed => TaskState::Canceled,
        ThreadStatus::Failed => TaskState::Failed,
        _ => TaskState::Working,
    }
}

/// The threads that list as `req` asks: newest first, of the workflows offered, a page at a
/// time (the page token is the last thread of the page before).
pub fn list(store: &Storage, req: &ListTasksRequest) -> Result<ListTasksResponse, A2AError> {
    let page_size = req.page_size.unwrap_or(50).clamp(1, 100) as usize;
    let offered = crate::serve::mcp::tools::offered_names(store).map_err(a2a_error)?;
    let before = match req.page_token.as_deref().filter(|t| !t.is_empty()) {
        Some(token) => Some(
            token
                .parse::<ThreadId>()
                .map_err(|_| A2AError::invalid_params("a page token this server did not give"))?,
        ),
        None => None,
    };
    let wanted = req.status.clone().filter(|s| *s != TaskState::Unspecified);
    let matching: Vec<ThreadId> = query::threads(store, &ThreadQuery::default())
        .map_err(a2a_error)?
        .threads
        .into_iter()
        .filter(|t| offered.contains(&t.name))
        .filter(|t| req.context_id.as_ref().is_none_or(|c| *c == t.thread_id.to_string()))
        .filter(|t| wanted.as_ref().is_none_or(|w| *w == listed_state(t.status)))
        .map(|t| t.thread_id)
        .collect();
    let rest = matching.iter().filter(|id| before.is_none_or(|b| **id < b));
    let page: Vec<ThreadId> = rest.clone().take(page_size).copied().collect();
    let next = match rest.count() > page.len() {
        true => page.last().map(ThreadId::to_string).unwrap_or_default(),
        false => String::new(),
    };
    let mut tasks = Vec::with_capacity(page.len());
    for id in page {
        // One removed meanwhile is left out.
        if let Ok(record) = store.threads().read(id) {
            tasks.push(task(&record));
        }
    }
    Ok(ListTasksResponse {
        tasks,
        next_page_token: next,
        page_size: page_size as i32,
        total_size: i32::try_from(matching.len()).unwrap_or(i32::MAX),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_decides_the_wait_it_answers() {
        let approve = decision(WaitKind::Approve, "approve", None).unwrap();
        assert_eq!(approve, Decision::Approve);
        let deny = decision(WaitKind::Approve, "Deny: not today", None).unwrap();
        assert_eq!(deny, Decision::Deny { reason: "not today".into() });
        let data = json!({"decision": "skip", "text": "nothing"});
        assert_eq!(
            decision(WaitKind::Cut, "", Some(&data)).unwrap(),
            Decision::Skip { text: "nothing".into() }
        );
        assert!(decision(WaitKind::Approve, "ok", None).is_err());
        let answer = decision(WaitKind::Answer, "approve: it", None).unwrap();
        assert_eq!(answer, Decision::Answer { text: "approve: it".into() });
    }
}
