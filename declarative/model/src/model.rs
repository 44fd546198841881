//! The canonical definition: what a YAML workflow means once the host has validated it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The pseudo-role a graph starts from.
pub const START: &str = "$START";
/// The pseudo-role a graph ends at.
pub const END: &str = "$END";
/// The role whose steps record a DAG step that failed or was skipped (a step that succeeded is
/// recorded as a step of its own role, named by its id).
pub const STATUS_ROLE: &str = "$status";
/// The role the `ask_user` policy asks, answered by a person (`answer <thread> retry|skip|abort`).
pub const USER_ROLE: &str = "$user";

/// A declarative workflow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Definition {
    pub description: String,
    /// The roles agents are bound to. For a DAG, one per step, named by the step's id.
    pub roles: Vec<Role>,
    /// Steps a thread may take when the caller does not say.
    pub max_rounds: u32,
    pub routing: Routing,
}

/// A role: the same data as a code bundle's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Role {
    pub name: String,
    pub description: String,
    pub system_prompt: String,
    pub extract_prompt: String,
    /// JSON Schema of the role's meta.
    pub schema: Value,
}

/// How a thread moves between roles.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Routing {
    /// A role graph: from the role that just finished, the first transition whose condition
    /// holds.
    Graph(Vec<Node>),
    /// A DAG of steps, independent ones in parallel.
    Steps { steps: Vec<DagStep>, failure_policy: FailurePolicy },
}

/// The transitions out of one role (or [`START`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Node {
    pub from: String,
    pub transitions: Vec<Transition>,
}

/// One way out of a role: to a role or [`END`], when `condition` (JSONata) holds, or always.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Transition {
    pub to: String,
    pub condition: Option<String>,
}

/// One step of a DAG. Its role (in [`Definition::roles`]) is named by its id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DagStep {
    pub id: String,
    pub depends_on: Vec<String>,
    /// Given to the step's agent as its input, references resolved (see [`reference`]).
    pub inputs: serde_json::Map<String, Value>,
}

/// What happens when a DAG step fails (its agent gave no answer, or no valid meta), after its
/// retries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailurePolicy {
    pub on_step_failure: OnStepFailure,
    /// Attempts after the first.
    pub max_retries: u32,
    /// Wait before the first retry; each further retry waits twice as long.
    pub retry_delay_ms: u32,
}

impl Default for FailurePolicy {
    fn default() -> Self {
        FailurePolicy { on_step_failure: OnStepFailure::Stop, max_retries: 0, retry_delay_ms: 5000 }
    }
}

/// The three policies of the DAG protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnStepFailure {
    /// No further step runs; the thread fails.
    Stop,
    /// Steps that depend on the failed one, transitively, are skipped; the others run.
    SkipDependents,
    /// The thread waits for a person to answer `retry`, `skip` or `abort`.
    AskUser,
}

/// A reference an input value makes, if it is one: `$prompt`, `$trigger_data`, or
/// `$steps.<id>.output` optionally followed by `.field` segments into the step's meta.
pub mod reference {
    use serde_json::Value;

    /// What an input string refers to.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Reference<'a> {
        Prompt,
        TriggerData,
        /// A step's meta, or a field of it (`path`, possibly empty).
        Step {
            id: &'a str,
            path: Vec<&'a str>,
        },
    }

    /// Why a `$…` string is not a reference.
    pub type Malformed = String;

    /// Parses `text`: `Ok(None)` for a plain value (not starting with `$`).
    pub fn parse(text: &str) -> Result<Option<Reference<'_>>, Malformed> {
        if !text.starts_with('$') {
            return Ok(None);
        }
        match text {
            "$prompt" => return Ok(Some(Reference::Prompt)),
            "$trigger_data" => return Ok(Some(Reference::TriggerData)),
            _ => {}
        }
        let Some(rest) = text.strip_prefix("$steps.") else {
            return Err(format!(
                "`{text}` is not a reference: use `$prompt`, `$trigger_data` or \
                 `$steps.<id>.output[.field…]`"
            ));
        };
        let mut parts = rest.split('.');
        let id = parts.next().unwrap_or_default();
        if id.is_empty() || parts.next() != Some("output") {
            return Err(format!("`{text}` is not a reference: expected `$steps.<id>.output`"));
        }
        let path: Vec<&str> = parts.collect();
        if path.iter().any(|p| p.is_empty()) {
            return Err(format!("`{text}` has an empty field name"));
        }
        Ok(Some(Reference::Step { id, path }))
    }

    /// The field at `path` of `meta`, or null.
    pub fn field(meta: &Value, path: &[&str]) -> Value {
        let mut value = meta;
        for key in path {
            value = match value {
                Value::Object(map) => map.get(*key).unwrap_or(&Value::Null),
                Value::Array(items) => {
                    key.parse::<usize>().ok().and_then(|i| items.get(i)).unwrap_or(&Value::Null)
                }
                _ => &Value::Null,
            };
        }
        value.clone()
    }
}
