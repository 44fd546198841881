//! What the MCP server offers: each registered workflow (or those `mcp.workflows` names) as a
//! tool taking a `prompt` and trigger `data`, and four operations on threads with the API's
//! rules — `list_threads` and `get_thread` for any caller, `answer_thread` and `kill_thread`
//! for one that may act.

use std::borrow::Cow;
use std::sync::Arc;

use rmcp::ErrorData as McpError;
use rmcp::model::{CallToolResult, ContentBlock, JsonObject, Tool, ToolAnnotations};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::ids::ThreadId;
use crate::run::actions::{self, Hand};
use crate::run::answer::Answer;
use crate::run::control;
use crate::run::query::{self, ThreadQuery};
use crate::serve::api::Caller;
use crate::serve::api::types::{DecisionKind, ThreadItem};
use crate::store::Storage;
use crate::store::pauses::DecidedBy;
use crate::store::records::ThreadStatus;

/// The most threads `list_threads` returns, and how many unless asked.
const MAX_LISTED: usize = 100;
const DEFAULT_LISTED: usize = 20;

/// An operation on threads, offered beside the workflows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    ListThreads,
    GetThread,
    AnswerThread,
    KillThread,
}

impl Operation {
    const ALL: [Operation; 4] = [
        Operation::ListThreads,
        Operation::GetThread,
        Operation::AnswerThread,
        Operation::KillThread,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Operation::ListThreads => "list_threads",
            Operation::GetThread => "get_thread",
            Operation::AnswerThread => "answer_thread",
            Operation::KillThread => "kill_thread",
        }
    }

    /// The operation a tool name names; a workflow of the same name is not offered.
    pub fn named(name: &str) -> Option<Operation> {
        Operation::ALL.into_iter().find(|op| op.name() == name)
    }

    /// Whether it changes a thread (a read-only token may not call it).
    fn acts(self) -> bool {
        matches!(self, Operation::AnswerThread | Operation::KillThread)
    }

    fn tool(self) -> Tool {
        let thread = json!({"type": "string",
            "description": "A thread id (as a workflow tool's result names it), or a unique prefix of one"});
        let (description, schema) = match self {
            Operation::ListThreads => (
                "Lists threads, newest first: their workflow, status and steps.",
                json!({"type": "object", "properties": {
                    "status": {"type": "string", "enum": ThreadStatus::ALL.map(ThreadStatus::as_str),
                        "description": "Only threads in this status"},
                    "workflow": {"type": "string", "description": "Only threads of this workflow"},
                    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LISTED,
                        "description": format!("At most this many (default {DEFAULT_LISTED})")}},
                    "additionalProperties": false}),
            ),
            Operation::GetThread => (
                "Reads a thread: its status, its steps (each role's output and meta), the person \
                 it waits for, its end.",
                json!({"type": "object", "properties": {"thread": thread},
                    "required": ["thread"], "additionalProperties": false}),
            ),
            Operation::AnswerThread => (
                "Answers a thread that waits for a person: the role's answer as `text`, or for a \
                 tool call an agent wants to make, a `decision` (approve or deny it; redo or skip \
                 one a crash cut short) with `text` saying why or what to use instead.",
                json!({"type": "object", "properties": {"thread": thread,
                    "text": {"type": "string", "description": "The answer; with deny, why; with skip, the text the model is given instead"},
                    "decision": {"type": "string", "enum": ["approve", "deny", "redo", "skip"]}},
                    "required": ["thread"], "additionalProperties": false}),
            ),
            Operation::KillThread => (
                "Stops a thread for good: it ends `killed`.",
                json!({"type": "object", "properties": {"thread": thread},
                    "required": ["thread"], "additionalProperties": false}),
            ),
        };
        let annotations = ToolAnnotations::new()
            .read_only(!self.acts())
            .destructive(self == Operation::KillThread)
            .idempotent(self != Operation::AnswerThread)
            .open_world(false);
        Tool::new(self.name(), description, object(schema)).annotate(annotations)
    }
}

fn object(value: Value) -> Arc<JsonObject> {
    match value {
        Value::Object(map) => Arc::new(map),
        _ => unreachable!("a tool's schema is an object"),
    }
}

/// A workflow offered as a tool: its name and description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offered {
    pub name: String,
    pub description: String,
    /// The JSON Schema of the data its threads take, if the workflow declares one.
    pub input_schema: Option<Value>,
}

/// The workflows offered, by name: every registered one, or those `mcp.workflows` in
/// config.yaml names; never one named as an operation.
pub fn offered(store: &Storage) -> Result<Vec<Offered>> {
    let bundles = store.bundles();
    Ok(offered_versions(store)?
        .into_iter()
        .map(|(name, hash)| {
            let descriptor = bundles.descriptor(hash).ok();
            let input_schema = descriptor.as_ref().and_then(|d| d.input_schema.clone());
            let description = descriptor
                .map(|d| d.description)
                .filter(|d| !d.trim().is_empty())
                .unwrap_or_else(|| format!("Runs workflow `{name}`."));
            Offered { name, description, input_schema }
        })
        .collect())
}

/// The workflows offered and their current versions, from the registry and config.yaml alone
/// (a call asks this, not every descriptor).
fn offered_versions(store: &Storage) -> Result<Vec<(String, crate::ids::BundleHash)>> {
    let only = store.config()?.mcp.workflows;
    let registry = store.registry().load()?;
    Ok(registry
        .workflows
        .into_iter()
        .filter(|(name, _)| {
            Operation::named(name).is_none()
                && only.as_ref().is_none_or(|only| only.iter().any(|n| n == name))
        })
        .map(|(name, entry)| (name, entry.hash))
        .collect())
}

/// The names of the workflows offered, to tell when they change.
pub fn offered_names(store: &Storage) -> Result<Vec<String>> {
    Ok(offered_versions(store)?.into_iter().map(|(name, _)| name).collect())
}

/// Whether workflow `name` is offered.
pub fn is_offered(store: &Storage, name: &str) -> Result<bool> {
    Ok(offered_versions(store)?.iter().any(|(offered, _)| offered == name))
}

/// Every tool a caller may call, in a stable order: the workflows by name, then the
/// operations. A caller that may not act sees only the operations that read.
pub fn list(store: &Storage, may_act: bool) -> Result<Vec<Tool>> {
    let mut tools = Vec::new();
    if may_act {
        tools.extend(offered(store)?.into_iter().map(workflow_tool));
    }
    tools
        .extend(Operation::ALL.into_iter().filter(|op| may_act || !op.acts()).map(Operation::tool));
    Ok(tools)
}

/// A workflow's tool: a call starts a thread of it. Its `data` is the workflow's input
/// schema when it declares one (required when that schema requires a field), and any object
/// when it does not.
fn workflow_tool(workflow: Offered) -> Tool {
    const DATA: &str = "Data for the thread: what its workflow reads as $trigger_data";
    let mut required = vec!["prompt"];
    let mut definitions = serde_json::Map::new();
    let data = match workflow.input_schema {
        Some(Value::Object(mut schema)) => {
            // Definitions move to the tool's schema, whose root `#/$defs/…` resolves against.
            for key in ["$defs", "definitions"] {
                if let Some(Value::Object(defs)) = schema.remove(key) {
                    definitions.insert(key.to_string(), Value::Object(defs));
                }
            }
            schema.remove("$schema");
            schema.remove("$id");
            if schema.get("required").and_then(Value::as_array).is_some_and(|r| !r.is_empty()) {
                required.push("data");
            }
            schema.entry("description").or_insert_with(|| DATA.into());
            Value::Object(schema)
        }
        Some(other) => other,
        None => json!({"type": "object", "description": DATA}),
    };
    let mut schema = json!({
        "type": "object",
        "properties": {
            "prompt": {"type": "string", "description": "What the thread is asked to do: its prompt"},
            "data": data
        },
        "required": required,
        "additionalProperties": false
    });
    if let Value::Object(root) = &mut schema {
        root.extend(definitions);
    }
    let annotations = ToolAnnotations::new()
        .read_only(false)
        .destructive(false)
        .idempotent(false)
        .open_world(true);
    Tool::new(Cow::Owned(workflow.name), workflow.description, object(schema)).annotate(annotations)
}

/// Refuses a caller that may only read.
pub fn may_act(caller: &Caller) -> std::result::Result<(), McpError> {
    if caller.may_act {
        return Ok(());
    }
    Err(McpError::invalid_request(
        format!("{} may read, not act (make a token without --read-only)", caller.name),
        None,
    ))
}

/// The arguments of an operation, checked: a call with others is refused as a tool error the
/// model can read.
fn arguments<T: for<'de> Deserialize<'de>>(
    arguments: Option<JsonObject>,
) -> std::result::Result<T, CallToolResult> {
    serde_json::from_value(Value::Object(arguments.unwrap_or_default()))
        .map_err(|e| tool_error(&format!("invalid arguments: {e}")))
}

/// A tool's failure, as the model reads it (`isError`), not a protocol error.
pub fn tool_error(message: &str) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message.to_string())])
}

/// A tool's answer: `value` as structured content, and as its text.
pub fn structured(value: Value) -> CallToolResult {
    CallToolResult::structured(value)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListArgs {
    status: Option<String>,
    workflow: Option<String>,
    limit: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ThreadArgs {
    thread: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AnswerArgs {
    thread: String,
    text: Option<String>,
    decision: Option<DecisionKind>,
}

/// Calls operation `operation` for `caller`. What the library refuses (no such thread, not
/// waiting) is the tool's error, which the model reads; a read-only caller acting is the
/// protocol's.
pub async fn operate(
    store: &Storage,
    operation: Operation,
    caller: &Caller,
    args: Option<JsonObject>,
) -> std::result::Result<CallToolResult, McpError> {
    if operation.acts() {
        may_act(caller)?;
    }
    let done = match operation {
        Operation::ListThreads => match arguments::<ListArgs>(args) {
            Ok(args) => list_threads(store, args),
            Err(refused) => return Ok(refused),
        },
        Operation::GetThread => match arguments::<ThreadArgs>(args) {
            Ok(args) => get_thread(store, &args.thread).await,
            Err(refused) => return Ok(refused),
        },
        Operation::AnswerThread => match arguments::<AnswerArgs>(args) {
            Ok(args) => answer_thread(store, args, caller).await,
            Err(refused) => return Ok(refused),
        },
        Operation::KillThread => match arguments::<ThreadArgs>(args) {
            Ok(args) => kill_thread(store, &args.thread).await,
            Err(refused) => return Ok(refused),
        },
    };
    Ok(done.unwrap_or_else(|e| tool_error(&crate::error::chain_line(&e))))
}

fn list_threads(store: &Storage, args: ListArgs) -> Result<CallToolResult> {
    let statuses = match args.status.as_deref() {
        None => vec![],
        Some(name) => vec![ThreadStatus::named(name).ok_or_else(|| {
            Error::Usage(format!("status `{}`: not a thread status", crate::terminal::line(name)))
        })?],
    };
    let limit = args.limit.unwrap_or(DEFAULT_LISTED);
    if !(1..=MAX_LISTED).contains(&limit) {
        return Err(Error::Usage(format!("limit {limit}: from 1 to {MAX_LISTED}")));
    }
    let query = ThreadQuery {
        workflow: args.workflow,
        statuses,
        started_after: None,
        before: None,
        limit: Some(limit),
        experiment: None,
    };
    let page = query::threads(store, &query)?;
    let threads: Vec<ThreadItem> = page.threads.into_iter().map(ThreadItem::from).collect();
    Ok(structured(json!({ "threads": threads })))
}

async fn get_thread(store: &Storage, thread: &str) -> Result<CallToolResult> {
    let id = store.threads().resolve(thread)?;
    Ok(structured(crate::serve::views::thread(store, id).await?))
}

async fn answer_thread(
    store: &Storage,
    args: AnswerArgs,
    caller: &Caller,
) -> Result<CallToolResult> {
    let id = store.threads().resolve(&args.thread)?;
    let answer = match (args.text, args.decision) {
        (text, Some(decision)) => Answer::Decision(decision.with(text).map_err(Error::Usage)?),
        (Some(text), None) => Answer::Text(text),
        (None, None) => {
            return Err(Error::Usage(
                "give the answer's `text` (or, for a tool call, a `decision`)".into(),
            ));
        }
    };
    let by = DecidedBy::new(&caller.name, "mcp");
    actions::answer(store, id, answer, &by, Hand::Detach).await?;
    Ok(acted(id, "answered: it goes on"))
}

async fn kill_thread(store: &Storage, thread: &str) -> Result<CallToolResult> {
    let id = store.threads().resolve(thread)?;
    control::kill(store, id).await?;
    Ok(acted(id, "killed"))
}

fn acted(id: ThreadId, what: &str) -> CallToolResult {
    let mut result = structured(json!({ "thread": id.to_string(), "done": what }));
    result.content = vec![ContentBlock::text(format!("thread {id} {what}"))];
    result
}
