//! What a call's thread answers it with: its end (the last step's meta, or an error saying why),
//! where it is when the call stops waiting, and the question it asks a person — as the form a
//! client shows (an elicitation), and the person's answer read back from the client's response.

use rmcp::model::{
    CallToolResult, ContentBlock, ElicitRequest, ElicitRequestParams, InputRequest, InputRequests,
    InputResponses, MetaObject, RequestMetaObject,
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::THREAD_KEY;
use crate::error::{Error, Result};
use crate::ids::ThreadId;
use crate::run::actions::{self, Hand};
use crate::run::answer::Answer;
use crate::run::waits::{self, WaitKind};
use crate::serve::api::types::DecisionKind;
use crate::store::Storage;
use crate::store::pauses::DecidedBy;
use crate::store::records::{EndStatus, ThreadRecord, ThreadStatus};

/// The key under which a question is asked in `inputRequests`.
pub const QUESTION_KEY: &str = "answer";

/// What a thread that waits for a person asks.
#[derive(Debug, Clone)]
pub struct Question {
    pub role: String,
    /// The question, for a person: the role's input (or its instructions) or the tool call.
    pub text: String,
    pub kind: QuestionKind,
}

/// What answers a question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuestionKind {
    /// The role's answer, as text.
    Text,
    /// Approve or deny a tool call.
    Approval,
    /// Redo a tool call a crash cut, or give its result.
    Cut,
}

/// The most of a question's text sent to a client.
const MAX_QUESTION: usize = 4000;

impl Question {
    /// The question thread `record` asks a person, if it waits for one's answer or decision
    /// (not for a child, a budget or a sign-in): [`waits::of`] tells what it waits for, this
    /// only words it for a client. The record in hand says it: nothing is read again.
    pub fn of(record: &ThreadRecord) -> Option<Question> {
        if record.status() != ThreadStatus::Waiting {
            return None;
        }
        let wait = waits::of(record)?;
        let role = wait.role.clone().unwrap_or_default();
        let (text, kind) = match (wait.kind, &wait.tool) {
            (WaitKind::Approve | WaitKind::Cut, Some(tool)) => {
                let arguments = crate::terminal::line(&tool.arguments.to_string()).into_owned();
                let (kind, asked) = match wait.kind {
                    WaitKind::Cut => (
                        QuestionKind::Cut,
                        "was cut short by a crash: make it again (redo), or give its result (skip, with the text)",
                    ),
                    _ => (
                        QuestionKind::Approval,
                        "waits for approval: approve or deny it (with why)",
                    ),
                };
                (
                    format!(
                        "Role `{role}` wants to call tool `{}` with {arguments}; the call {asked}.",
                        tool.tool
                    ),
                    kind,
                )
            }
            (WaitKind::Answer, _) => (
                format!(
                    "Role `{role}` of workflow `{}` asks: {}",
                    record.start.name, wait.question
                ),
                QuestionKind::Text,
            ),
            _ => return None,
        };
        let text: String = text.chars().take(MAX_QUESTION).collect();
        Some(Question { role, text, kind })
    }
}

/// The question as the input a client asks a person for (an `elicitation/create`).
pub fn input_requests(question: &Question) -> InputRequests {
    let mut requests = InputRequests::new();
    let form = ElicitRequest::new(form(question, None));
    requests.insert(QUESTION_KEY.into(), InputRequest::Elicitation(form));
    requests
}

/// The question as a form the client shows a person, with `meta` (a related task, say).
pub fn form(question: &Question, meta: Option<RequestMetaObject>) -> ElicitRequestParams {
    let schema = match question.kind {
        QuestionKind::Text => json!({"type": "object", "properties": {
            "answer": {"type": "string", "title": "Answer", "description": "The role's answer"}},
            "required": ["answer"]}),
        QuestionKind::Approval => json!({"type": "object", "properties": {
            "decision": {"type": "string", "enum": ["approve", "deny"], "title": "Decision"},
            "text": {"type": "string", "title": "Why (for deny)"}},
            "required": ["decision"]}),
        QuestionKind::Cut => json!({"type": "object", "properties": {
            "decision": {"type": "string", "enum": ["redo", "skip"], "title": "Decision"},
            "text": {"type": "string", "title": "The result to use (for skip)"}},
            "required": ["decision"]}),
    };
    ElicitRequestParams::FormElicitationParams {
        meta,
        message: question.text.clone(),
        requested_schema: serde_json::from_value(schema).expect("the form's schema is valid"),
    }
}

/// A person's answer, as an elicitation's result.
#[derive(Debug, Deserialize)]
struct Elicited {
    action: String,
    #[serde(default)]
    content: Option<Elicitation>,
}

#[derive(Debug, Default, Deserialize)]
struct Elicitation {
    answer: Option<String>,
    decision: Option<DecisionKind>,
    text: Option<String>,
}

/// Answers waiting thread `id` with the client's response to its question; a person who
/// declined (or cancelled the form) leaves it waiting. Whether it was answered.
pub async fn answer_with(
    store: &Storage,
    id: ThreadId,
    responses: &InputResponses,
) -> Result<bool> {
    let Some(response) = responses.get(QUESTION_KEY) else {
        return Err(Error::Usage(format!("no response under `{QUESTION_KEY}` in inputResponses")));
    };
    let elicited: Elicited = serde_json::from_value(response.clone())
        .map_err(|e| Error::Usage(format!("the response to the question does not read: {e}")))?;
    if elicited.action != "accept" {
        return Ok(false);
    }
    let content = elicited.content.unwrap_or_default();
    let answer = match (content.decision, content.answer) {
        (Some(decision), _) => Answer::Decision(decision.with(content.text).map_err(Error::Usage)?),
        (None, Some(text)) => Answer::Text(text),
        (None, None) => {
            return Err(Error::Usage(
                "the response holds neither an `answer` nor a `decision`".into(),
            ));
        }
    };
    // The client answers for its person, through the question the server asked it.
    let by = DecidedBy::new("an MCP client's person", "mcp");
    actions::answer(store, id, answer, &by, Hand::Detach).await?;
    Ok(true)
}

/// The result of an ended thread: its last step's meta as structured content and its summary
/// as text; a failed or killed thread is an error result saying why.
pub fn ended(record: &ThreadRecord) -> CallToolResult {
    let id = record.id();
    let Some(end) = record.end.as_ref().map(|e| &e.end) else { return pending(record, None) };
    let mut result = match end.status {
        EndStatus::Completed => {
            let meta = record.steps.last().map_or(Value::Null, |s| s.meta.clone());
            let structured = match meta {
                Value::Object(_) => meta,
                other => json!({ "meta": other }),
            };
            let mut result = CallToolResult::structured(structured);
            result.content = vec![ContentBlock::text(end.summary.clone())];
            result
        }
        EndStatus::Failed | EndStatus::Killed => CallToolResult::error(vec![ContentBlock::text(
            format!("thread {id} {}: {}", end.status.as_str(), end.summary),
        )]),
    };
    result.meta = Some(thread_meta(id));
    result
}

/// The result of a call whose thread has not ended: its id, where it is, the question it asks
/// a person (if it does), and how to go on.
pub fn pending(record: &ThreadRecord, question: Option<&Question>) -> CallToolResult {
    let id = record.id();
    let status = record.status();
    let workflow = &record.start.name;
    let text = match (status, question) {
        (_, Some(question)) => format!(
            "Thread {id} of workflow `{workflow}` waits for a person. {} Answer it with \
             answer_thread (thread `{id}`); follow it with get_thread; stop it with kill_thread.",
            question.text
        ),
        (ThreadStatus::Paused, None) => format!(
            "Thread {id} of workflow `{workflow}` is paused; it goes on when resumed \
             (`uncaged-workflow resume {id}`). Follow it with get_thread (thread `{id}`)."
        ),
        (status, None) => format!(
            "Thread {id} of workflow `{workflow}` is {} and goes on without this call. Follow it \
             with get_thread (thread `{id}`); stop it with kill_thread.",
            status.as_str()
        ),
    };
    let mut result = CallToolResult::structured(json!({
        "thread": id.to_string(),
        "status": status.as_str(),
        "steps": record.steps.len(),
        "question": question.map(|q| q.text.clone()),
    }));
    result.content = vec![ContentBlock::text(text)];
    result.meta = Some(thread_meta(id));
    result
}

/// A result's `_meta`, naming the call's thread.
pub fn thread_meta(id: ThreadId) -> MetaObject {
    let mut meta = MetaObject::default();
    meta.insert(THREAD_KEY.into(), json!(id.to_string()));
    meta
}
