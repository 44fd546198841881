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
    /// The most bytes of a step's output a reference hands on (a DAG's `reference_limit`);
    /// longer is cut and marked [`reference::TRUNCATED`]. Absent: [`reference::DEFAULT_LIMIT`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_limit: Option<u32>,
    /// JSON Schema of the data a thread starts with (`inputs:`, what `$trigger_data` reads);
    /// absent, a thread takes any data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<Value>,
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
    /// A JSONata condition over `$steps`, `$trigger_data` and `$prompt`: when it does not hold
    /// once the step is ready, the step is skipped (see [`crate::dag::plan`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// This step's retries, in place of the workflow's `failure_policy`'s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<Retry>,
    /// What this step's failure does, in place of the workflow's `on_step_failure`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<OnStepFailure>,
    /// Runs the step once per item of an array (a fan-out); its output is the items' outputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub for_each: Option<FanOut>,
    /// The longest an agent call of this step may take (each attempt, each item): the host
    /// cancels it then, and the step fails with a timeout under its policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u32>,
    /// Runs this registered workflow as a child thread in place of an agent: the step's inputs
    /// are its trigger data, the step's description its prompt, and its result the step's
    /// output (the host starts it, and answers the step's call when it ends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow: Option<String>,
    /// The step's `description` when it embeds `${…}` references: resolved at each of its
    /// calls, as its inputs are, and given to the agent as the input's `instructions` (the
    /// role's prompt says to follow them); for a child workflow, the child's prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// Its `expected_output` when it embeds references: resolved at each call, given as the
    /// input's `expected_output`, and the extractor's prompt where it is the role's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_output: Option<String>,
}

/// A step run once per item: `items` is a JSONata expression (over the variables a `when`
/// reads) giving a JSON array; at most `max_parallel` items are asked at once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FanOut {
    pub items: String,
    pub max_parallel: u32,
}

impl FanOut {
    /// The most items one fan-out may have: each is an agent call and a part of one step.
    pub const MAX_ITEMS: usize = 1000;
    /// Items asked at once unless the step says.
    pub const DEFAULT_PARALLEL: u32 = 8;
}

impl DagStep {
    /// What happens when this step fails, under the workflow's `policy`.
    pub fn on_failure(&self, policy: &FailurePolicy) -> OnStepFailure {
        self.on_failure.unwrap_or(policy.on_step_failure)
    }

    /// How this step is retried, under the workflow's `policy`.
    pub fn retry(&self, policy: &FailurePolicy) -> Retry {
        self.retry.clone().unwrap_or(Retry {
            max: policy.max_retries,
            delay_ms: policy.retry_delay_ms,
            backoff: 2.0,
            max_delay_ms: None,
        })
    }
}

/// How a failed step is tried again: up to `max` more times, waiting `delay_ms` before the
/// first retry and `backoff` times as long before each next one, never more than
/// `max_delay_ms` (an hour when absent).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Retry {
    pub max: u32,
    pub delay_ms: u32,
    pub backoff: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_delay_ms: Option<u32>,
}

impl Retry {
    /// The longest wait between attempts when the workflow does not bound it.
    pub const LONGEST_DELAY_MS: u32 = 3_600_000;

    /// The wait before retry `n` (1-based).
    pub fn delay_before(&self, n: u32) -> u32 {
        let cap = self.max_delay_ms.unwrap_or(Self::LONGEST_DELAY_MS);
        let factor = self.backoff.max(1.0).powi(n.saturating_sub(1).min(64) as i32);
        let delay = f64::from(self.delay_ms) * factor;
        if delay.is_finite() && delay < f64::from(cap) { delay as u32 } else { cap }
    }
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
    /// A step's own policy only: the step is recorded as failed, and the steps that depend on
    /// it run as if it had succeeded with a null output.
    Continue,
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
        /// In a fan-out step: the item at hand, or a field of it.
        Item {
            path: Vec<&'a str>,
        },
        /// In a fan-out step: the item's position (from 0).
        Index,
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
            "$index" => return Ok(Some(Reference::Index)),
            "$item" => return Ok(Some(Reference::Item { path: vec![] })),
            _ => {}
        }
        if let Some(path) = text.strip_prefix("$item.") {
            return item(path).map(Some);
        }
        if !text.starts_with("$steps.") {
            return Err(format!(
                "`{text}` is not a reference: use `$prompt`, `$trigger_data`, \
                 `$steps.<id>.output[.field…]`, or in a `for_each` step `$item[.field…]` and \
                 `$index`"
            ));
        }
        parse_dotted(&text[1..], "$").map(Some)
    }

    /// How many bytes of a step's output a reference hands on, unless a workflow says.
    pub const DEFAULT_LIMIT: u32 = 10 * 1024;
    /// What ends an output cut at the limit.
    pub const TRUNCATED: &str = "[truncated]";

    /// A piece of a string with `${…}` references in it.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Part<'a> {
        Text(String),
        Ref(Reference<'a>),
    }

    /// Parses a string that embeds references — `"Review this: ${steps.plan.output}"` —
    /// into its pieces; `$${` is a literal `${`. `Ok(None)` when it embeds none (and has no
    /// `$${` to unescape): the string is itself.
    pub fn template(text: &str) -> Result<Option<Vec<Part<'_>>>, Malformed> {
        if !text.contains("${") {
            return Ok(None);
        }
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        while let Some(at) = rest.find("${") {
            if rest[..at].ends_with('$') {
                // `$${`: the text `${`, not a reference.
                literal.push_str(&rest[..at - 1]);
                literal.push_str("${");
                rest = &rest[at + 2..];
                continue;
            }
            literal.push_str(&rest[..at]);
            let inner = &rest[at + 2..];
            let Some(end) = inner.find('}') else {
                return Err(format!(
                    "`{text}`: a `${{` without its `}}` (write `$${{` for the text `${{`)"
                ));
            };
            let name = inner[..end].trim();
            let reference = match name {
                "prompt" => Reference::Prompt,
                "trigger_data" => Reference::TriggerData,
                "index" => Reference::Index,
                "item" => Reference::Item { path: vec![] },
                _ if name.starts_with("item.") => {
                    item(&name["item.".len()..]).map_err(|e| format!("`{text}`: {e}"))?
                }
                _ if name.starts_with("steps.") => {
                    parse_dotted(name, "").map_err(|e| format!("`{text}`: {e}"))?
                }
                _ => {
                    return Err(format!(
                        "`{text}`: `${{{name}}}` is not a reference: use `${{prompt}}`, \
                         `${{trigger_data}}` or `${{steps.<id>.output[.field…]}}` (`$${{` for the \
                         text `${{`)"
                    ));
                }
            };
            if !literal.is_empty() {
                parts.push(Part::Text(std::mem::take(&mut literal)));
            }
            parts.push(Part::Ref(reference));
            rest = &inner[end + 1..];
        }
        literal.push_str(rest);
        if !literal.is_empty() {
            parts.push(Part::Text(literal));
        }
        Ok(Some(parts))
    }

    /// `$item.<field>…` as a reference, `path` being what follows `item.`.
    fn item(path: &str) -> Result<Reference<'_>, Malformed> {
        let path: Vec<&str> = path.split('.').collect();
        if path.iter().any(|p| p.is_empty()) {
            return Err(format!("`$item.{}` has an empty field name", path.join(".")));
        }
        Ok(Reference::Item { path })
    }

    /// `steps.<id>.output[.field…]` as a reference; `sigil` is what it was written after
    /// (`$` for a whole value, nothing inside `${…}`), for the error.
    fn parse_dotted<'a>(name: &'a str, sigil: &str) -> Result<Reference<'a>, Malformed> {
        let rest = name.strip_prefix("steps.").unwrap_or(name);
        let mut parts = rest.split('.');
        let id = parts.next().unwrap_or_default();
        if id.is_empty() || parts.next() != Some("output") {
            return Err(format!(
                "`{sigil}{name}` is not a reference: expected `{sigil}steps.<id>.output`"
            ));
        }
        let path: Vec<&str> = parts.collect();
        if path.iter().any(|p| p.is_empty()) {
            return Err(format!("`{sigil}{name}` has an empty field name"));
        }
        Ok(Reference::Step { id, path })
    }

    /// A step's output as a reference hands it on: itself, or when its text is over `limit`
    /// bytes, that text cut (at a character boundary) and marked [`TRUNCATED`].
    pub fn bounded(value: Value, limit: u32) -> Value {
        let limit = limit as usize;
        let text = match &value {
            Value::String(text) if text.len() <= limit => return value,
            Value::String(text) => text.clone(),
            other => {
                let text = other.to_string();
                if text.len() <= limit {
                    return value;
                }
                text
            }
        };
        let mut cut = limit;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        Value::String(format!("{}{TRUNCATED}", &text[..cut]))
    }

    /// A resolved value as it reads inside a string: a string as itself, anything else as JSON.
    pub fn as_text(value: &Value) -> String {
        match value {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        }
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

#[cfg(test)]
mod tests {
    use super::reference::{self, Part, Reference};
    use serde_json::json;

    #[test]
    fn a_string_embeds_references_and_dollar_dollar_is_a_literal() {
        let parts = reference::template("Review ${steps.plan.output.files} for ${prompt}.")
            .unwrap()
            .unwrap();
        assert_eq!(
            parts,
            [
                Part::Text("Review ".into()),
                Part::Ref(Reference::Step { id: "plan", path: vec!["files"] }),
                Part::Text(" for ".into()),
                Part::Ref(Reference::Prompt),
                Part::Text(".".into()),
            ]
        );
        assert_eq!(
            reference::template("costs $${price}").unwrap().unwrap(),
            [Part::Text("costs ${price}".into())]
        );
        assert_eq!(reference::template("plain $5").unwrap(), None);
        assert!(reference::template("${steps.plan}").unwrap_err().contains("steps.<id>.output"));
        assert!(reference::template("${nope}").unwrap_err().contains("not a reference"));
        assert!(reference::template("${prompt").unwrap_err().contains("without its"));
    }

    #[test]
    fn a_fan_out_step_names_its_item_and_index() {
        assert_eq!(reference::parse("$item").unwrap(), Some(Reference::Item { path: vec![] }));
        assert_eq!(
            reference::parse("$item.file.path").unwrap(),
            Some(Reference::Item { path: vec!["file", "path"] })
        );
        assert_eq!(reference::parse("$index").unwrap(), Some(Reference::Index));
        assert!(reference::parse("$item.").is_err());
        assert_eq!(
            reference::template("Review ${item.name} (${index})").unwrap().unwrap(),
            [
                Part::Text("Review ".into()),
                Part::Ref(Reference::Item { path: vec!["name"] }),
                Part::Text(" (".into()),
                Part::Ref(Reference::Index),
                Part::Text(")".into()),
            ]
        );
        let items = crate::expr::value_with_variables(
            "$steps.list.output.files",
            &json!({"steps": {"list": {"output": {"files": ["a", "b"]}}}}),
        )
        .unwrap();
        assert_eq!(items, json!(["a", "b"]));
        assert_eq!(crate::expr::value_with_variables("$nothing", &json!({})).unwrap(), json!(null));
    }

    #[test]
    fn a_long_output_is_cut_at_the_limit_and_marked() {
        assert_eq!(reference::bounded(json!("short"), 10), json!("short"));
        assert_eq!(reference::bounded(json!("éééééé"), 5), json!("éé[truncated]"));
        assert_eq!(reference::bounded(json!({"a": 1}), 100), json!({"a": 1}));
        assert_eq!(reference::bounded(json!({"a": 12345}), 6), json!("{\"a\":1[truncated]"));
    }
}
