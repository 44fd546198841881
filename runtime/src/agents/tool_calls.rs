//! A tool as a durable agent's model is offered it (the name it calls it by, whether a
//! person approves each call, whether a call a crash cut may be made again) and what a call of
//! it comes to, as the model and the journal are given it: redacted and bounded.

use rmcp::model::Tool;
use serde_json::Value;

use super::Secrets;
use crate::limits::Size;
use crate::store::tool_servers::ToolServer;

/// A tool the model may call.
#[derive(Debug)]
pub struct Offered {
    /// As the model calls it: `server__tool`.
    pub name: String,
    /// As config.yaml names it: `server.tool`.
    pub label: String,
    pub(super) server: usize,
    pub(super) tool: Tool,
    pub(super) validator: Option<jsonschema::Validator>,
    /// A person says yes before each call (`approve:`).
    pub approve: bool,
    /// A call a crash cut may be made again: the tool says it reads only, or may be repeated,
    /// or its binding lists it in `safe_to_repeat:`.
    pub safe_to_repeat: bool,
    /// The tool says it only reads (MCP's `readOnlyHint`): a call made again changes nothing,
    /// whatever changed since.
    pub read_only: bool,
}

impl Offered {
    /// `tool` of server `name` as offered, if its binding allows it.
    pub(super) fn of(
        server: usize,
        name: &str,
        config: &ToolServer,
        tool: Tool,
        approve: &[String],
    ) -> Option<Self> {
        let local = tool.name.to_string();
        if config.allow.as_ref().is_some_and(|allow| !allow.contains(&local)) {
            return None;
        }
        let hints = tool.annotations.as_ref();
        let read_only = hints.is_some_and(|h| h.read_only_hint == Some(true));
        let safe_to_repeat = config.safe_to_repeat.contains(&local)
            || read_only
            || hints.is_some_and(|h| h.idempotent_hint == Some(true));
        // A schema the validator cannot compile is offered all the same: the server checks
        // what it is sent.
        let validator =
            jsonschema::validator_for(&Value::Object((*tool.input_schema).clone())).ok();
        Some(Offered {
            name: model_name(name, &local),
            label: format!("{name}.{local}"),
            server,
            approve: config.approve.contains(&local)
                || approve
                    .iter()
                    .any(|p| *p == format!("{name}.{local}") || *p == format!("{name}.*")),
            safe_to_repeat,
            read_only,
            validator,
            tool,
        })
    }
}

/// The name a model calls `tool` of server `server` by: `server__tool`, with what a function
/// name may not hold (OpenAI's `^[a-zA-Z0-9_-]{1,64}$`) replaced by `_`.
pub fn model_name(server: &str, tool: &str) -> String {
    let name: String = format!("{server}__{tool}")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' })
        .collect();
    name.chars().take(64).collect()
}

/// What a tool call came to, as the model is given it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutcome {
    pub content: String,
    pub is_error: bool,
    /// The result's size before it was cut, when it was.
    pub cut_from: Option<u64>,
}

impl ToolOutcome {
    /// A failure the model is told of (it may try something else).
    pub fn error(message: impl Into<String>) -> Self {
        ToolOutcome { content: message.into(), is_error: true, cut_from: None }
    }
}

/// A block of a tool result as text: its text, or a line saying what it was.
pub(super) fn content_text(block: &impl serde::Serialize) -> String {
    let value = serde_json::to_value(block).unwrap_or(Value::Null);
    let kind = value["type"].as_str().unwrap_or("content");
    match kind {
        "text" => value["text"].as_str().unwrap_or_default().to_string(),
        "resource" => match value["resource"]["text"].as_str() {
            Some(text) => text.to_string(),
            None => {
                format!("[a binary resource: {}]", value["resource"]["uri"].as_str().unwrap_or("?"))
            }
        },
        "resource_link" => format!("[a resource: {}]", value["uri"].as_str().unwrap_or("?")),
        other => {
            let bytes = value["data"].as_str().map_or(0, |d| d.len() / 4 * 3);
            let mime = value["mimeType"].as_str().unwrap_or("?");
            format!("[{other} ({mime}, {}), not shown]", Size(bytes))
        }
    }
}

/// `outcome` as the model and the journal may have it: every secret redacted, and cut to
/// `max` bytes (at a character boundary) with a marker saying how much there was.
pub fn bounded(mut outcome: ToolOutcome, max: usize, secrets: &Secrets) -> ToolOutcome {
    // Redacted first: a cut through a secret would leave its head unredacted.
    outcome.content = secrets.redact(&outcome.content);
    if outcome.content.len() > max {
        let size = outcome.content.len();
        let end = (0..=max).rev().find(|&i| outcome.content.is_char_boundary(i)).unwrap_or(0);
        outcome.content.truncate(end);
        outcome.content.push_str(&format!(
            "\n[… cut: the result was {}, of which the first {} are shown]",
            Size(size),
            Size(end)
        ));
        outcome.cut_from = Some(size as u64);
    }
    outcome
}
