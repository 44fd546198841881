//! A workflow's tool call: a thread of the workflow, started once per call (the same request id
//! on the same connection, or the same idempotency key in `_meta`, is the same call), followed
//! with a progress notification per step. Its answer is the thread's end; or, when the thread
//! waits for a person, the question (as a task's input, or an `InputRequiredResult` whose
//! answer comes back with the retried call); or, past the wait limit, the thread's id and how to
//! follow it. The thread runs on whatever happens to the connection.

use std::time::Duration;

use rmcp::ErrorData as McpError;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, CreateTaskResult,
    ElicitRequest, ElicitRequestParams, InputRequest, InputRequests, InputRequiredResult,
    InputResponses, MetaObject, ProgressNotificationParam, ProtocolVersion,
};
use rmcp::service::{RequestContext, RoleServer};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{IDEMPOTENCY_KEY, McpServer, THREAD_KEY, protocol_error, tools};
use crate::error::{Error, Result};
use crate::ids::ThreadId;
use crate::run::actions::{self, Hand, Once, OnceKey};
use crate::run::answer::{self, Answer};
use crate::run::events::Event;
use crate::run::lifecycle::{Origin, StartRequest};
use crate::run::watch::ThreadEvents;
use crate::run_request::RunRequest;
use crate::serve::api::Caller;
use crate::serve::api::types::DecisionKind;
use crate::store::Storage;
use crate::store::pauses::ToolWaitReason;
use crate::store::records::{EndStatus, StartedBy, ThreadRecord, ThreadStatus};
use crate::store::request_keys::MAX_KEY_LEN;

/// How long a call waits for its thread unless `mcp.wait` says.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(60);

/// How often a followed thread is read: soon after a step at first, less often while nothing
/// happens.
const FIRST_LOOKS: Duration = Duration::from_millis(20);
const LATER_LOOKS: Duration = Duration::from_millis(250);
/// How long a thread is read at [`FIRST_LOOKS`] after its last change.
const QUICK_FOR: Duration = Duration::from_secs(2);

/// What an `InputRequiredResult`'s request state holds: the thread the call follows.
const STATE_PREFIX: &str = "thread:";

/// The key under which a question is asked in `inputRequests`.
pub const QUESTION_KEY: &str = "answer";

/// A call's arguments.
#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct CallArgs {
    prompt: String,
    #[serde(default)]
    data: Option<Value>,
}

/// Calls workflow tool `request.name` for `caller`.
pub async fn call(
    server: &McpServer,
    caller: &Caller,
    request: CallToolRequestParams,
    context: RequestContext<RoleServer>,
) -> std::result::Result<CallToolResponse, McpError> {
    let store = server.store();
    let name = request.name.to_string();
    if !tools::is_offered(store, &name).map_err(protocol_error)? {
        return Err(McpError::invalid_params(
            format!("no tool `{}` (see tools/list)", crate::terminal::line(&name)),
            None,
        ));
    }
    tools::may_act(caller)?;
    // The steps the client has heard of already (a retried call's thread's).
    let mut told = 0;
    let id = match &request.request_state {
        // A call retried with a person's answer (or to go on waiting): the thread it follows.
        Some(state) => {
            let (id, steps) = continued(store, &name, state)?;
            told = steps;
            if let Some(responses) = &request.input_responses {
                answer_with(store, id, responses).await.map_err(protocol_error)?;
            }
            id
        }
        None => {
            let args: CallArgs = match serde_json::from_value(Value::Object(
                request.arguments.clone().unwrap_or_default(),
            )) {
                Ok(args) => args,
                Err(e) => {
                    return Ok(tools::tool_error(&format!("invalid arguments: {e}")).into());
                }
            };
            if args.data.as_ref().is_some_and(|d| !d.is_object()) {
                return Ok(tools::tool_error("invalid arguments: `data` must be an object").into());
            }
            match start(server, caller, &name, args, &request, &context).await {
                Ok(id) => id,
                Err(e) if e.exit_code() == crate::error::exit::DATA => {
                    return Ok(tools::tool_error(&crate::error::chain_line(&e)).into());
                }
                Err(e) => return Err(protocol_error(e)),
            }
        }
    };
    if context.client_capabilities().is_some_and(|caps| caps.supports_tasks()) {
        let record = store.threads().read(id).map_err(protocol_error)?;
        let task = super::tasks::task(&record);
        let mut meta = MetaObject::default();
        meta.insert(THREAD_KEY.into(), json!(id.to_string()));
        return Ok(CallToolResponse::Task(CreateTaskResult::new(task).with_meta(meta)));
    }
    let in_flight = server.in_flight(&context, caller, id);
    let wait = store.config().ok().and_then(|c| c.mcp.wait).map_or(DEFAULT_WAIT, |s| s.0);
    let rest = follow(store, id, told, wait, &context).await.map_err(protocol_error)?;
    if !context.ct.is_cancelled() {
        in_flight.answered();
    }
    let record = store.threads().read(id).map_err(protocol_error)?;
    let modern = context
        .protocol_version()
        .is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str());
    Ok(match rest {
        Rest::Ended => ended(&record).into(),
        Rest::Asks(question) if modern => InputRequiredResult::new(
            Some(input_requests(&question)),
            Some(format!("{STATE_PREFIX}{id}")),
        )
        .into(),
        Rest::Asks(question) => pending(&record, Some(&question)).into(),
        Rest::Running => pending(&record, None).into(),
    })
}

/// Starts the thread of a call, once per call.
async fn start(
    server: &McpServer,
    caller: &Caller,
    workflow: &str,
    args: CallArgs,
    request: &CallToolRequestParams,
    context: &RequestContext<RoleServer>,
) -> Result<ThreadId> {
    let store = server.store();
    let client = context.client_info().map(|c| c.name);
    let fingerprint = {
        let asked = serde_json::to_vec(&json!({"workflow": workflow, "args": &args}))
            .expect("a call serializes");
        crate::store::bundles::sha256_hex(&asked)
    };
    let meta_key = request
        .meta
        .as_ref()
        .and_then(|meta| meta.get(IDEMPOTENCY_KEY))
        .or_else(|| context.meta.get(IDEMPOTENCY_KEY));
    let key = match meta_key {
        Some(Value::String(key)) if !key.is_empty() && key.len() <= MAX_KEY_LEN => {
            Some(format!("mcp:{key}"))
        }
        Some(_) => {
            return Err(Error::Usage(format!(
                "`_meta.{IDEMPOTENCY_KEY}` must be a string of 1 to {MAX_KEY_LEN} characters"
            )));
        }
        // A request id is unique on its connection: the same one again is the same call.
        None => server
            .connection(context)
            .map(|connection| format!("mcp-request:{connection}:{}", context.id)),
    };
    let key = key.map(|key| OnceKey { scope: caller.name.clone(), key, fingerprint });
    let start = StartRequest {
        name: workflow.to_string(),
        prompt: args.prompt,
        trigger_data: args.data,
        request: RunRequest::default(),
        origin: Origin {
            started_by: Some(StartedBy::new("mcp", &caller.name, client.as_deref())),
            ..Origin::default()
        },
    };
    match actions::start_once(store, start, key).await? {
        Once::Started(id) => {
            tracing::info!("mcp: {} started thread {id} of {workflow}", caller.name);
            Ok(id)
        }
        Once::Replayed(id) => Ok(id),
    }
}

/// The thread an `InputRequiredResult`'s request state names, if it is one of `workflow`, and
/// the steps it has.
fn continued(
    store: &Storage,
    workflow: &str,
    state: &str,
) -> std::result::Result<(ThreadId, usize), McpError> {
    let bad = || McpError::invalid_params("requestState is not one this server gave", None);
    let id: ThreadId =
        state.strip_prefix(STATE_PREFIX).ok_or_else(bad)?.parse().map_err(|_| bad())?;
    let record = store.threads().read(id).map_err(protocol_error)?;
    if record.start.name != workflow {
        return Err(bad());
    }
    Ok((id, record.steps.len()))
}

/// Where a followed thread came to rest, as far as the call is concerned.
#[derive(Debug)]
pub enum Rest {
    /// It ended.
    Ended,
    /// It waits for a person.
    Asks(Question),
    /// It runs on (past the wait), or paused.
    Running,
}

/// Follows thread `id` until it ends, waits for a person, pauses, or `wait` passes, sending a
/// progress notification for each step after its first `told` when the client asked for
/// progress.
pub async fn follow(
    store: &Storage,
    id: ThreadId,
    told: usize,
    wait: Duration,
    context: &RequestContext<RoleServer>,
) -> Result<Rest> {
    let deadline = tokio::time::Instant::now() + wait;
    let progress = context.meta.get_progress_token();
    let mut events = ThreadEvents::new(store, id);
    let mut changed = tokio::time::Instant::now();
    loop {
        let batch = events.poll()?;
        if !batch.is_empty() {
            changed = tokio::time::Instant::now();
        }
        for event in batch {
            match event {
                Event::Step { index, step, .. } if index > told => {
                    if let Some(token) = &progress {
                        let line =
                            step.content.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
                        let line: String = crate::terminal::line(line).chars().take(200).collect();
                        let note = ProgressNotificationParam::new(token.clone(), index as f64)
                            .with_message(format!("step {index}: {}: {line}", step.role));
                        // A client gone away misses its progress; the thread goes on.
                        let _ = context.peer.notify_progress(note).await;
                    }
                }
                Event::Ended { .. } => return Ok(Rest::Ended),
                Event::Paused { .. } => return Ok(Rest::Running),
                Event::Waiting { .. } => {
                    let record = store.threads().read(id)?;
                    if let Some(question) = Question::of(store, &record) {
                        return Ok(Rest::Asks(question));
                    }
                    // Waiting on a child thread: it goes on by itself.
                }
                _ => {}
            }
        }
        let look = if changed.elapsed() < QUICK_FOR { FIRST_LOOKS } else { LATER_LOOKS };
        tokio::select! {
            _ = tokio::time::sleep(look) => {}
            _ = tokio::time::sleep_until(deadline) => return Ok(Rest::Running),
            // The client cancelled, or went away: the thread runs on (a cancellation kills it
            // where it is heard, see `on_cancelled`).
            _ = context.ct.cancelled() => return Ok(Rest::Running),
        }
    }
}

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
    /// The question thread `record` asks a person, if it waits for one (not for a child).
    pub fn of(store: &Storage, record: &ThreadRecord) -> Option<Question> {
        if record.status() != ThreadStatus::Waiting {
            return None;
        }
        answer::answerable(store, record.id()).ok()?;
        let paused = record.paused.as_ref()?;
        let call = paused.call.as_ref()?;
        let role = paused.role.clone().unwrap_or_default();
        let (text, kind) = match &call.tool {
            Some(tool) => {
                let arguments = crate::terminal::line(&tool.arguments.to_string()).into_owned();
                let kind = match tool.why {
                    ToolWaitReason::Approve => QuestionKind::Approval,
                    ToolWaitReason::Cut => QuestionKind::Cut,
                };
                let asked = match kind {
                    QuestionKind::Cut => {
                        "was cut short by a crash: make it again (redo), or give its result (skip, with the text)"
                    }
                    _ => "waits for approval: approve or deny it (with why)",
                };
                (
                    format!(
                        "Role `{role}` wants to call tool `{}` with {arguments}; the call {asked}.",
                        tool.tool
                    ),
                    kind,
                )
            }
            None => {
                let asked = call
                    .input
                    .as_deref()
                    .filter(|i| !i.trim().is_empty())
                    .or(call.system_prompt.as_deref())
                    .unwrap_or("");
                (
                    format!("Role `{role}` of workflow `{}` asks: {asked}", record.start.name),
                    QuestionKind::Text,
                )
            }
        };
        let text: String = text.chars().take(MAX_QUESTION).collect();
        Some(Question { role, text, kind })
    }
}

/// The question as a form the client shows a person (`elicitation/create`).
pub fn input_requests(question: &Question) -> InputRequests {
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
    let params = ElicitRequestParams::FormElicitationParams {
        meta: None,
        message: question.text.clone(),
        requested_schema: serde_json::from_value(schema).expect("the form's schema is valid"),
    };
    let mut requests = InputRequests::new();
    requests.insert(QUESTION_KEY.into(), InputRequest::Elicitation(ElicitRequest::new(params)));
    requests
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
    actions::answer(store, id, answer, Hand::Detach).await?;
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

fn thread_meta(id: ThreadId) -> MetaObject {
    let mut meta = MetaObject::default();
    meta.insert(THREAD_KEY.into(), json!(id.to_string()));
    meta
}
