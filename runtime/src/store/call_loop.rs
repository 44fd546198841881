//! An agent call's loop as the journal keeps it: what a durable agent (an `openai` binding
//! with tools) did within one call, each entry journaled before the agent acts on it — each
//! model turn's whole message, each tool call as it starts and its result, and each decision a
//! person made about a call — under the call's step and position. A call that runs again
//! before its answer is recorded hands its agent those entries ([`CallLoop`]), and the agent
//! goes on from the last of them; views show them as turns ([`turns`]).

use serde::{Deserialize, Serialize};

/// An entry of an agent call's loop, as the journal keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoopRecord {
    /// The call's step (0-based) and position in it.
    pub step: usize,
    pub seq: usize,
    #[serde(rename = "loop")]
    pub entry: LoopEntry,
    pub timestamp: u64,
}

/// What a durable agent did within one call, journaled before it acted on it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "entry", rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum LoopEntry {
    /// The tools the model was offered when the call began (named as the model calls them):
    /// a tool its server adds later is not offered to this call unless its binding names it.
    Offered { tools: Vec<String> },
    /// A model turn's whole message: its text, and the tool calls it asked for.
    Model {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<crate::spending::Usage>,
        duration_ms: u64,
    },
    /// A tool call about to be made: recorded before it is, so that a crash in the middle of
    /// it is known (it has no result).
    ToolStarted { call_id: String },
    /// A tool call's result, as the model is given it (cut to its binding's size).
    ToolResult {
        call_id: String,
        content: String,
        #[serde(default)]
        is_error: bool,
        duration_ms: u64,
        /// Its size before it was cut, when it was.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cut_from: Option<u64>,
    },
    /// A person's decision about a tool call, and who made it (absent from decisions
    /// journaled before it was kept).
    Decision {
        call_id: String,
        decision: Decision,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<crate::store::pauses::DecidedBy>,
    },
}

/// A tool call as the model asked for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    /// The tool, as the model knows it (`server__tool`).
    pub name: String,
    /// Its arguments, as the model wrote them (JSON text).
    pub arguments: String,
}

/// What a person decided about a tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum Decision {
    /// Make the call (a call its binding wants approved).
    Approve,
    /// Do not make it; the model is told why.
    Deny { reason: String },
    /// Make again a call a crash cut in the middle.
    Redo,
    /// Do not make again a call a crash cut; the model is given this text as its result.
    Skip { text: String },
}

/// What the model turns of a loop cost, added up (no calls counted: the agent call that holds
/// them is one call).
pub fn loop_spent<'a>(entries: impl IntoIterator<Item = &'a LoopEntry>) -> crate::spending::Usage {
    let mut spent = crate::spending::Usage::default();
    for entry in entries {
        if let LoopEntry::Model { usage: Some(usage), .. } = entry {
            spent.add(&crate::spending::Usage { calls: 0, ..usage.clone() });
        }
    }
    spent
}

/// An agent call's loop, as views show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LoopView {
    /// The call's step (0-based: the first step of the generator step that made it) and
    /// position in it.
    pub step: usize,
    pub seq: usize,
    /// The role the call answered, once its answer is recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    pub turns: Vec<TurnView>,
}

/// How much of a tool call's result a view shows.
pub const RESULT_HEAD: usize = 2000;

/// A model turn of an agent call's loop, as views show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnView {
    /// 1 for the call's first turn.
    pub turn: usize,
    /// What the model said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<crate::spending::Usage>,
    pub duration_ms: u64,
    /// The tools it called in the turn, in its order.
    pub tool_calls: Vec<ToolCallView>,
}

/// A tool call of a turn, as views show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCallView {
    pub id: String,
    /// The tool, as config.yaml names it: `server.tool`.
    pub tool: String,
    /// Its arguments, as the model wrote them (JSON text).
    pub arguments: String,
    pub status: CallStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// The head of its result (the first [`RESULT_HEAD`] bytes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// The result's size before it was cut to its binding's size, when it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cut_from: Option<u64>,
    /// What a person decided about it, last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
}

/// Where a tool call stands, as its journal tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CallStatus {
    /// The model asked for it; not started (its tool wants a person's yes first).
    Asked,
    /// Approved by a person, or to be made again: not started yet.
    Approved,
    /// Started, with no result: running, or cut by a crash if its thread is not running.
    Started,
    /// It returned.
    Ok,
    /// It failed, or was refused (a tool not offered, arguments its schema does not take); the
    /// model was told.
    Error,
    /// A person did not let it be made; the model was told why.
    Denied,
    /// A person had it not made again after a crash cut it; the model was given their text.
    Skipped,
}

/// The turns of a loop's `entries`, each with its tool calls and where they stand.
pub fn turns(entries: &[LoopEntry]) -> Vec<TurnView> {
    let mut turns: Vec<TurnView> = Vec::new();
    for entry in entries {
        match entry {
            LoopEntry::Offered { .. } => {}
            LoopEntry::Model { content, tool_calls, usage, duration_ms } => turns.push(TurnView {
                turn: turns.len() + 1,
                content: content.clone(),
                usage: usage.clone(),
                duration_ms: *duration_ms,
                tool_calls: tool_calls
                    .iter()
                    .map(|c| ToolCallView {
                        id: c.id.clone(),
                        tool: c.name.replacen("__", ".", 1),
                        arguments: c.arguments.clone(),
                        status: CallStatus::Asked,
                        duration_ms: None,
                        result: None,
                        cut_from: None,
                        decision: None,
                    })
                    .collect(),
            }),
            LoopEntry::ToolStarted { call_id } => {
                if let Some(view) = find(&mut turns, call_id) {
                    view.status = CallStatus::Started;
                }
            }
            LoopEntry::ToolResult { call_id, content, is_error, duration_ms, cut_from } => {
                if let Some(view) = find(&mut turns, call_id) {
                    view.status = if *is_error { CallStatus::Error } else { CallStatus::Ok };
                    view.duration_ms = Some(*duration_ms);
                    view.result = Some(head(content, RESULT_HEAD));
                    view.cut_from = *cut_from;
                }
            }
            LoopEntry::Decision { call_id, decision, .. } => {
                if let Some(view) = find(&mut turns, call_id) {
                    view.status = match decision {
                        Decision::Approve | Decision::Redo => CallStatus::Approved,
                        Decision::Deny { .. } => CallStatus::Denied,
                        Decision::Skip { .. } => CallStatus::Skipped,
                    };
                    view.decision = Some(decision.clone());
                }
            }
        }
    }
    turns
}

/// The view of call `id` among `turns` (the latest turn's, if an id repeats).
fn find<'a>(turns: &'a mut [TurnView], id: &str) -> Option<&'a mut ToolCallView> {
    turns.iter_mut().rev().flat_map(|t| t.tool_calls.iter_mut()).find(|c| c.id == id)
}

/// At most the first `max` bytes of `text`, at a character boundary.
fn head(text: &str, max: usize) -> String {
    let end = (0..=max.min(text.len())).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
    text[..end].to_string()
}
