//! A workflow's tool call: a thread of the workflow, started once per call (the same request id
//! on the same connection, or the same idempotency key in `_meta`, is the same call), followed
//! with a progress notification per step. Its answer is the thread's end; or, when the thread
//! waits for a person, the question (as a task's input, or an `InputRequiredResult` whose
//! answer comes back with the retried call); or, past the wait limit, the thread's id and how to
//! follow it. The thread runs on whatever happens to the connection.

use std::time::Duration;

use rmcp::ErrorData as McpError;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CreateTaskResult, InputRequiredResult,
    ProgressNotificationParam, ProtocolVersion,
};
use rmcp::service::{RequestContext, RoleServer};
use serde::Deserialize;
use serde_json::{Value, json};

use super::answers::{Question, answer_with, ended, input_requests, pending, thread_meta};
use super::{IDEMPOTENCY_KEY, McpServer, protocol_error, tools};
use crate::error::{Error, Result};
use crate::ids::ThreadId;
use crate::run::actions::{self, Once, OnceKey};
use crate::run::dispatch::LiveNews;
use crate::run::events::Event;
use crate::run::lifecycle::{Origin, StartRequest};
use crate::run::watch::ThreadEvents;
use crate::run_request::RunRequest;
use crate::serve::api::Caller;
use crate::store::Storage;
use crate::store::queue::Live;
use crate::store::records::{PauseReason, StartedBy, ThreadStatus};
use crate::store::request_keys::MAX_KEY_LEN;

/// How long a call waits for its thread unless `mcp.wait` says.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(60);

/// How long a call from a client of the tasks extension waits for its thread to end before it
/// answers with a task, unless `mcp.task_after` says.
pub const DEFAULT_TASK_AFTER: Duration = Duration::from_secs(5);

/// How often a followed thread is read besides when its worker says it stored something,
/// unless `mcp.poll` says.
pub const DEFAULT_POLL: Duration = Duration::from_secs(2);

/// How often a followed thread is read where its worker says nothing: soon after a step at
/// first, less often while nothing happens; and while it rests still held by its worker.
const FIRST_LOOKS: Duration = Duration::from_millis(20);
const LATER_LOOKS: Duration = Duration::from_millis(250);
/// How long a thread is read at [`FIRST_LOOKS`] after its last change.
const QUICK_FOR: Duration = Duration::from_secs(2);

/// How often a call whose worker cannot be heard asks again (a worker that takes the thread
/// later, a run that ended and another that began).
const LIVE_RETRY: Duration = Duration::from_secs(1);

/// What an `InputRequiredResult`'s request state holds: the thread the call follows.
const STATE_PREFIX: &str = "thread:";

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
    offered_to(store, caller, &name)?;
    // The steps the client has heard of already (a retried call's thread's), and whether the
    // person it asked declined to answer (then it is not asked again in this call).
    let (mut told, mut declined) = (0, false);
    let id = match &request.request_state {
        // A call retried with a person's answer (or to go on waiting): the thread it follows.
        Some(state) => {
            let (id, steps) = continued(store, &name, state)?;
            told = steps;
            if let Some(responses) = &request.input_responses {
                declined = !answer_with(store, id, responses).await.map_err(protocol_error)?;
            }
            id
        }
        None => match start_call(server, caller, &request, &context).await? {
            Ok(id) => id,
            Err(refused) => return Ok(refused.into()),
        },
    };
    // A client of the tasks extension is answered at once when its thread ends soon, as any
    // client is, and gets a task to poll only for a thread that goes on (or waits for a
    // person): a client that asked for no task gets its result where it can (the MCP
    // Inspector's CLI shows a task it was handed as an empty result).
    let tasks = context.client_capabilities().is_some_and(|caps| caps.supports_tasks());
    let config = store.config().ok();
    let wait = if tasks {
        config.as_ref().and_then(|c| c.mcp.task_after).map_or(DEFAULT_TASK_AFTER, |s| s.0)
    } else {
        config.as_ref().and_then(|c| c.mcp.wait).map_or(DEFAULT_WAIT, |s| s.0)
    };
    let in_flight = server.in_flight(&context, caller, id);
    let looks = Looks::of(store, wait);
    let rest = follow(store, id, told, looks, &context).await.map_err(protocol_error)?;
    if !context.ct.is_cancelled() {
        in_flight.answered();
    }
    let record = store.threads().read(id).map_err(protocol_error)?;
    if tasks && !matches!(rest, Rest::Ended) {
        let task = super::tasks::task(&record);
        return Ok(CallToolResponse::Task(CreateTaskResult::new(task).with_meta(thread_meta(id))));
    }
    let modern = context
        .protocol_version()
        .is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str());
    Ok(match rest {
        Rest::Ended => ended(&record).into(),
        Rest::Asks(question) if modern && !declined => InputRequiredResult::new(
            Some(input_requests(&question)),
            Some(format!("{STATE_PREFIX}{id}")),
        )
        .into(),
        Rest::Asks(question) => pending(&record, Some(&question)).into(),
        Rest::Running => pending(&record, None).into(),
    })
}

/// Whether `caller` may call workflow tool `name`: it is offered, and the caller may act.
pub fn offered_to(
    store: &Storage,
    caller: &Caller,
    name: &str,
) -> std::result::Result<(), McpError> {
    if !tools::is_offered(store, name).map_err(protocol_error)? {
        return Err(McpError::invalid_params(
            format!("no tool `{}` (see tools/list)", crate::terminal::line(name)),
            None,
        ));
    }
    tools::may_act(caller)
}

/// The thread of workflow tool call `request` (checked with [`offered_to`]), started once per
/// call; arguments the workflow cannot start with are the call's error result.
pub async fn start_call(
    server: &McpServer,
    caller: &Caller,
    request: &CallToolRequestParams,
    context: &RequestContext<RoleServer>,
) -> std::result::Result<std::result::Result<ThreadId, CallToolResult>, McpError> {
    let arguments = Value::Object(request.arguments.clone().unwrap_or_default());
    let args: CallArgs = match serde_json::from_value(arguments) {
        Ok(args) => args,
        Err(e) => return Ok(Err(tools::tool_error(&format!("invalid arguments: {e}")))),
    };
    if args.data.as_ref().is_some_and(|d| !d.is_object()) {
        return Ok(Err(tools::tool_error("invalid arguments: `data` must be an object")));
    }
    match start(server, caller, &request.name, args, request, context).await {
        Ok(id) => Ok(Ok(id)),
        Err(e) if e.exit_code() == crate::error::exit::DATA => {
            Ok(Err(tools::tool_error(&crate::error::chain_line(&e))))
        }
        Err(e) => Err(protocol_error(e)),
    }
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

/// How a call follows its thread.
#[derive(Debug, Clone, Copy)]
pub struct Looks {
    /// How long, at most.
    pub wait: Duration,
    /// How often it reads the thread besides when its worker says it stored something.
    pub poll: Duration,
}

impl Looks {
    /// For `wait` at most, at the pace config.yaml's `mcp.poll` says.
    pub fn of(store: &Storage, wait: Duration) -> Looks {
        let config = store.config().ok();
        let poll = config.and_then(|c| c.mcp.poll).map_or(DEFAULT_POLL, |s| s.0);
        Looks { wait, poll }
    }
}

/// Follows thread `id` until it ends, waits for a person, pauses, or `looks.wait` passes,
/// sending a progress notification for each step after its first `told` when the client asked
/// for progress. The thread is read when its worker says it stored something (over the
/// worker's socket, or the database's notifications), and every `looks.poll` besides; where
/// the worker cannot be heard, soon after each change and less often while nothing happens.
pub async fn follow(
    store: &Storage,
    id: ThreadId,
    told: usize,
    looks: Looks,
    context: &RequestContext<RoleServer>,
) -> Result<Rest> {
    let deadline = tokio::time::Instant::now() + looks.wait;
    let progress = context.meta.get_progress_token();
    let dispatch = crate::run::dispatch::of(store);
    let mut live: Option<LiveNews> = None;
    let mut asked_live: Option<tokio::time::Instant> = None;
    let mut events = ThreadEvents::new(store, id);
    let mut changed = tokio::time::Instant::now();
    // Whether to look at the record for a question: at first and after anything happened,
    // and while the thread rests waiting, until its worker lets it go (its events tell the
    // rest at once, but a person can answer only a thread its worker let go).
    let mut look_at_record = true;
    loop {
        // Heard from before it is read: what was stored before is read now, and after, told.
        if live.is_none() && asked_live.is_none_or(|at| at.elapsed() >= LIVE_RETRY) {
            asked_live = Some(tokio::time::Instant::now());
            live = dispatch.live(id).await.ok().flatten();
        }
        let batch = events.poll()?;
        if !batch.is_empty() {
            changed = tokio::time::Instant::now();
            look_at_record = true;
        }
        for event in batch {
            match event {
                Event::Step { index, step, .. } => {
                    if let Some(token) = progress.as_ref().filter(|_| index > told) {
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
                _ => {}
            }
        }
        if look_at_record {
            // Its rest is recorded a moment before its worker lets it go (on a database, the
            // lease): a person can answer only then. The record is the one the events were
            // read from, so every step in it has been told before its question is asked.
            let record =
                events.seen().cloned().ok_or_else(|| Error::UnknownThread(id.to_string()))?;
            if let Some(question) = Question::of(&record) {
                return Ok(Rest::Asks(question));
            }
            match record.status() {
                // Paused before this call looked: its event is not told again.
                ThreadStatus::Paused => return Ok(Rest::Running),
                // Its rest recorded, its worker about to let it go: look again.
                ThreadStatus::Running | ThreadStatus::Queued => {
                    look_at_record =
                        record.paused.as_ref().is_some_and(|p| p.by == PauseReason::Waiting);
                }
                // Waiting on a child thread (which goes on by itself), or not at all.
                _ => look_at_record = false,
            }
        }
        // A thread that rests still held is read until its worker lets it go, which no
        // word tells.
        let look = if live.is_some() && !look_at_record {
            looks.poll
        } else if changed.elapsed() < QUICK_FOR {
            FIRST_LOOKS
        } else {
            LATER_LOOKS
        };
        tokio::select! {
            _ = tokio::time::sleep(look) => {}
            heard = stored(&mut live) => if !heard { live = None },
            _ = tokio::time::sleep_until(deadline) => return Ok(Rest::Running),
            // The client cancelled, or went away: the thread runs on (a cancellation kills it
            // where it is heard, see `on_cancelled`).
            _ = context.ct.cancelled() => return Ok(Rest::Running),
        }
    }
}

/// Waits until `live` says the thread stored something (true), or ends (false); a model's
/// text is passed over (a call tells steps, not text). Never, without one.
async fn stored(live: &mut Option<LiveNews>) -> bool {
    let Some(live) = live else { return std::future::pending().await };
    loop {
        match live.recv().await {
            Some(Live::Stored) => return true,
            Some(Live::Text(_)) => {}
            None => return false,
        }
    }
}
