//! Tasks as protocol 2025-11-25 has them in its core, for the clients that negotiated it (the
//! TypeScript SDK 1.x, the MCP Inspector on an older server): a `tools/call` that carries a
//! `task` returns a task at once, whose id is the call's thread's; `tasks/get` is the thread
//! as a task (`input_required` while it waits for a person); `tasks/result` waits for its end
//! — asking the person through the client (`elicitation/create`, related to the task) when it
//! waits for one — and answers with the call's result; `tasks/list` lists the caller's calls;
//! `tasks/cancel` kills the thread. The server says so in `initialize` (`capabilities.tasks`)
//! and in `tools/list` (each workflow's `execution.taskSupport: optional`).
//!
//! The SDK (`rmcp`) knows only the tasks of 2026-07-28 (the extension, see [`super::tasks`]):
//! it drops a call's `task` field while reading it and refuses `tasks/get` from a client that
//! did not declare the extension. So the transports ([`super::http`], [`super::stdio`]) route
//! a 2025-11-25 client's task messages, before the SDK reads them, to methods of this server's
//! own ([`route`]), which [`handle`] answers; and put the capability into the handshake's
//! answer ([`advertise`]).

use std::time::Duration;

use rmcp::ErrorData as McpError;
use rmcp::model::{CallToolRequestParams, CustomRequest, CustomResult, ElicitationAction};
use rmcp::service::{RequestContext, RoleServer};
use serde_json::{Value, json};

use super::answers::{self, Question};
use super::calls::{self, Rest};
use super::{McpServer, protocol_error, tools};
use crate::ids::ThreadId;
use crate::store::Storage;
use crate::store::records::{ThreadRecord, ThreadStatus, ThreadSummary};

/// The protocol version whose core has tasks.
pub const VERSION: &str = "2025-11-25";

/// Where this server's own methods for them start.
const ROUTED: &str = "uncaged-workflow/2025-11-25/";

/// The `_meta` key relating a message to a task.
const RELATED_TASK: &str = "io.modelcontextprotocol/related-task";

/// Tasks listed a page at most.
const PAGE: usize = 100;

/// How long `tasks/result` waits for a thread between looks at a rest it cannot answer with.
const RESULT_WAIT: Duration = Duration::from_secs(3600);

/// Routes message `message` of a client on [`VERSION`] to this server's own method, if it is
/// one of the task messages the SDK cannot read: a `tools/call` with a `task`, `tasks/*`, and
/// `tools/list` (whose tools say they run as tasks).
pub fn route(message: &mut Value) {
    let Some(method) = message.get("method").and_then(Value::as_str) else { return };
    let routed = match method {
        "tools/call" => message.pointer("/params/task").is_some(),
        "tasks/get" | "tasks/result" | "tasks/list" | "tasks/cancel" | "tools/list" => true,
        _ => false,
    };
    if routed {
        message["method"] = Value::String(format!("{ROUTED}{method}"));
    }
}

/// Puts the tasks capability into `message` if it is the answer to an `initialize` that
/// negotiated [`VERSION`]; whether it did.
pub fn advertise(message: &mut Value) -> bool {
    let Some(result) = message.get_mut("result") else { return false };
    if result.get("protocolVersion").and_then(Value::as_str) != Some(VERSION) {
        return false;
    }
    let Some(capabilities) = result.get_mut("capabilities").and_then(Value::as_object_mut) else {
        return false;
    };
    capabilities.insert(
        "tasks".into(),
        json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}),
    );
    true
}

/// Answers a routed message; `None` for a custom method that is not one of them.
pub async fn handle(
    server: &McpServer,
    request: &CustomRequest,
    context: RequestContext<RoleServer>,
) -> Option<Result<CustomResult, McpError>> {
    let method = request.method.strip_prefix(ROUTED)?;
    let params = request.params.clone().unwrap_or(Value::Null);
    let answer = match method {
        "tools/call" => call(server, params, &context).await,
        "tools/list" => list_tools(server, &context),
        "tasks/get" => with_task(server, &params, &context, |store, id| {
            let record = store.threads().read(id).map_err(protocol_error)?;
            Ok(task(&record))
        }),
        "tasks/result" => result(server, &params, &context).await,
        "tasks/list" => list(server, &params, &context),
        "tasks/cancel" => cancel(server, &params, &context).await,
        _ => Err(McpError::new(rmcp::model::ErrorCode::METHOD_NOT_FOUND, method.to_string(), None)),
    };
    Some(answer.map(CustomResult))
}

/// A workflow's call as a task: its thread started (once per call, as any call's), the task
/// returned at once.
async fn call(
    server: &McpServer,
    params: Value,
    context: &RequestContext<RoleServer>,
) -> Result<Value, McpError> {
    let caller = server.caller(context)?;
    let request: CallToolRequestParams = serde_json::from_value(params).map_err(|e| {
        McpError::invalid_params(format!("a tools/call that does not read: {e}"), None)
    })?;
    if tools::Operation::named(&request.name).is_some() {
        return Err(McpError::invalid_params(
            format!("tool `{}` does not run as a task (call it without `task`)", request.name),
            None,
        ));
    }
    calls::offered_to(server.store(), &caller, &request.name)?;
    let id = match calls::start_call(server, &caller, &request, context).await? {
        Ok(id) => id,
        // The arguments cannot start the workflow: said as the call's error, not a task.
        Err(refused) => {
            let why = refused.content.first().and_then(|c| c.as_text()).map(|t| t.text.clone());
            return Err(McpError::invalid_params(why.unwrap_or_default(), None));
        }
    };
    let record = server.store().threads().read(id).map_err(protocol_error)?;
    Ok(json!({ "task": task(&record), "_meta": answers::thread_meta(id) }))
}

/// The tools, each workflow saying it may run as a task.
fn list_tools(server: &McpServer, context: &RequestContext<RoleServer>) -> Result<Value, McpError> {
    let caller = server.caller(context)?;
    let tools = tools::list(server.store(), caller.may_act).map_err(protocol_error)?;
    let tools: Vec<Value> = tools
        .into_iter()
        .map(|tool| {
            let workflow = tools::Operation::named(&tool.name).is_none();
            let mut tool = serde_json::to_value(tool).expect("a tool serializes");
            if workflow {
                tool["execution"] = json!({"taskSupport": "optional"});
            }
            tool
        })
        .collect();
    Ok(json!({ "tools": tools }))
}

/// Runs `f` on the thread the request's `taskId` names, for a caller who may see it.
fn with_task(
    server: &McpServer,
    params: &Value,
    context: &RequestContext<RoleServer>,
    f: impl FnOnce(&Storage, ThreadId) -> Result<Value, McpError>,
) -> Result<Value, McpError> {
    server.caller(context)?;
    f(server.store(), task_thread(server.store(), params)?)
}

/// The thread a request's `taskId` names.
fn task_thread(store: &Storage, params: &Value) -> Result<ThreadId, McpError> {
    let task_id = params.get("taskId").and_then(Value::as_str).unwrap_or_default();
    let unknown =
        || McpError::invalid_params(format!("no task `{}`", crate::terminal::line(task_id)), None);
    let id: ThreadId = task_id.parse().map_err(|_| unknown())?;
    store.threads().read(id).map_err(|_| unknown())?;
    Ok(id)
}

/// `tasks/result`: the call's result once its thread has ended. While the thread waits for a
/// person, the person is asked through the client, and the thread goes on with the answer; a
/// person who declines, or a paused thread, is answered with where the thread is.
async fn result(
    server: &McpServer,
    params: &Value,
    context: &RequestContext<RoleServer>,
) -> Result<Value, McpError> {
    let caller = server.caller(context)?;
    let store = server.store();
    let id = task_thread(store, params)?;
    let related = json!({ RELATED_TASK: { "taskId": id.to_string() } });
    let answer = |result: rmcp::model::CallToolResult| {
        let mut value = serde_json::to_value(result).expect("a result serializes");
        value["_meta"][RELATED_TASK] = related[RELATED_TASK].clone();
        Ok(value)
    };
    let mut told = store.threads().read(id).map_err(protocol_error)?.steps.len();
    loop {
        let rest = calls::follow(store, id, told, calls::Looks::of(store, RESULT_WAIT), context)
            .await
            .map_err(protocol_error)?;
        let record = store.threads().read(id).map_err(protocol_error)?;
        told = record.steps.len();
        match rest {
            Rest::Ended => return answer(answers::ended(&record)),
            Rest::Asks(question) => {
                tools::may_act(&caller)?;
                if !ask(store, id, &question, &related, context).await? {
                    return answer(answers::pending(&record, Some(&question)));
                }
            }
            Rest::Running if context.ct.is_cancelled() => {
                return Err(McpError::internal_error("the request was cancelled", None));
            }
            Rest::Running if record.status() == ThreadStatus::Paused => {
                return answer(answers::pending(&record, None));
            }
            Rest::Running => {}
        }
    }
}

/// Asks the person `question` of thread `id` through the client, and answers the thread;
/// whether the person answered.
async fn ask(
    store: &Storage,
    id: ThreadId,
    question: &Question,
    related: &Value,
    context: &RequestContext<RoleServer>,
) -> Result<bool, McpError> {
    let meta = serde_json::from_value(related.clone()).expect("a related task is an object");
    let asked = context
        .peer
        .create_elicitation(answers::form(question, Some(meta)))
        .await
        .map_err(|e| McpError::internal_error(format!("asking the person: {e}"), None))?;
    if asked.action != ElicitationAction::Accept {
        return Ok(false);
    }
    let response = serde_json::to_value(&asked).expect("an elicitation's result serializes");
    let responses = [(answers::QUESTION_KEY.to_string(), response)].into_iter().collect();
    answers::answer_with(store, id, &responses).await.map_err(protocol_error)
}

/// `tasks/list`: the calls of this caller (threads it started over MCP), newest first, a
/// page at a time (the cursor: the last thread of the page before).
fn list(
    server: &McpServer,
    params: &Value,
    context: &RequestContext<RoleServer>,
) -> Result<Value, McpError> {
    let caller = server.caller(context)?;
    let before: Option<ThreadId> =
        match params.get("cursor").and_then(Value::as_str) {
            Some(cursor) => Some(cursor.parse().map_err(|_| {
                McpError::invalid_params("a cursor this server did not give", None)
            })?),
            None => None,
        };
    let started = format!("mcp {}", caller.name);
    let mut mine: Vec<ThreadSummary> = server
        .store()
        .threads()
        .summaries()
        .map_err(protocol_error)?
        .into_iter()
        .filter(|t| {
            t.started_by.as_deref().is_some_and(|by| {
                by == started
                    || by.strip_prefix(&started).is_some_and(|rest| rest.starts_with(" ("))
            })
        })
        .filter(|t| before.is_none_or(|before| t.thread_id < before))
        .collect();
    mine.sort_by_key(|t| std::cmp::Reverse(t.thread_id));
    let more = mine.len() > PAGE;
    mine.truncate(PAGE);
    let next = more.then(|| mine.last().map(|t| t.thread_id.to_string())).flatten();
    let tasks: Vec<Value> = mine.iter().map(listed_task).collect();
    Ok(match next {
        Some(cursor) => json!({ "tasks": tasks, "nextCursor": cursor }),
        None => json!({ "tasks": tasks }),
    })
}

/// `tasks/cancel`: kills the thread; a task that has ended cannot be cancelled.
async fn cancel(
    server: &McpServer,
    params: &Value,
    context: &RequestContext<RoleServer>,
) -> Result<Value, McpError> {
    tools::may_act(&server.caller(context)?)?;
    let store = server.store();
    let id = task_thread(store, params)?;
    let record = store.threads().read(id).map_err(protocol_error)?;
    if record.status().is_ended() {
        return Err(McpError::invalid_params(
            format!("task `{id}` has ended ({}): it cannot be cancelled", record.status().as_str()),
            None,
        ));
    }
    crate::run::control::kill(store, id).await.map_err(protocol_error)?;
    let record = store.threads().read(id).map_err(protocol_error)?;
    Ok(task(&record))
}

/// A task's status, as the thread's is.
fn status(status: ThreadStatus, waits_for_a_person: bool) -> &'static str {
    match status {
        ThreadStatus::Completed => "completed",
        ThreadStatus::Failed => "failed",
        ThreadStatus::Killed => "cancelled",
        ThreadStatus::Waiting if waits_for_a_person => "input_required",
        _ => "working",
    }
}

/// Thread `record` as a task.
fn task(record: &ThreadRecord) -> Value {
    // As the extension's task says it (see `super::tasks::task`): waiting, but not on a child.
    let waits = record.waited_child().is_none();
    let last = record.last_changed();
    task_json(record.id(), status(record.status(), waits), record.start.timestamp, last)
}

/// A listed thread as a task.
fn listed_task(summary: &ThreadSummary) -> Value {
    // A listing does not say whether a thread waits for a person or a child: a person, as
    // most do; `tasks/get` says which.
    let status = status(summary.status, summary.waiting_role.is_some());
    let last = summary.ended.or(summary.paused_at).unwrap_or(summary.timestamp);
    task_json(summary.thread_id, status, summary.timestamp, last)
}

fn task_json(id: ThreadId, status: &str, created: u64, updated: u64) -> Value {
    json!({
        "taskId": id.to_string(),
        "status": status,
        "statusMessage": format!("thread {id} is {status}"),
        "createdAt": super::tasks::rfc3339(created),
        "lastUpdatedAt": super::tasks::rfc3339(updated),
        // A thread is kept until removed (`thread rm`, `prune`).
        "ttl": null,
        "pollInterval": super::tasks::POLL_INTERVAL_MS,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_messages_are_routed_and_the_rest_left_alone() {
        let routed = |message: Value| {
            let mut message = message;
            route(&mut message);
            message["method"].as_str().unwrap_or_default().to_string()
        };
        let call = json!({"method": "tools/call", "params": {"name": "x", "task": {"ttl": 1}}});
        assert_eq!(routed(call), "uncaged-workflow/2025-11-25/tools/call");
        let plain = json!({"method": "tools/call", "params": {"name": "x"}});
        assert_eq!(routed(plain), "tools/call");
        for method in ["tasks/get", "tasks/result", "tasks/list", "tasks/cancel", "tools/list"] {
            assert_eq!(routed(json!({"method": method})), format!("{ROUTED}{method}"));
        }
        assert_eq!(routed(json!({"method": "initialize"})), "initialize");
        assert_eq!(routed(json!({"id": 1, "result": {}})), "");
    }

    #[test]
    fn only_a_handshake_on_2025_11_25_is_told_of_tasks() {
        let mut old = json!({"result": {"protocolVersion": "2025-06-18", "capabilities": {}}});
        assert!(!advertise(&mut old));
        assert!(old["result"]["capabilities"].get("tasks").is_none());
        let mut v1 = json!({"result": {"protocolVersion": VERSION, "capabilities": {"tools": {}}}});
        assert!(advertise(&mut v1));
        assert_eq!(v1["result"]["capabilities"]["tasks"]["requests"]["tools"]["call"], json!({}));
        assert_eq!(v1["result"]["capabilities"]["tools"], json!({}));
    }
}
