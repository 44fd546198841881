//! The built-in scripted agent: offline, deterministic answers per role, for demos and tests.
//!
//! Answers come from a YAML file mapping each role to a list of answers (the n-th time a role
//! runs in a thread it gets the n-th answer; the last one repeats):
//!
//! ```yaml
//! planner:
//!   - "Plan: fix the parser.\n```json\n{\"steps\": [\"fix the parser\"]}\n```"
//! reviewer:
//!   - { approved: false, comments: ["add a test"] }   # a mapping is answered as JSON text
//!   - { approved: true }
//! ```
//!
//! Roles the file does not mention (or every role, without a file) are answered from the
//! role's schema: its `examples` in order, or else the smallest value the schema accepts.
//! The answer depends only on the thread, never on earlier calls, so a resumed or forked
//! thread gets the same answers as an uninterrupted one.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};

use super::{AgentAnswer, AgentContext, AgentFailure};
use crate::store::descriptor::Descriptor;

/// Answers per role.
#[derive(Debug, Clone)]
pub struct ScriptedAgent {
    answers: BTreeMap<String, Vec<String>>,
    delay: Option<std::time::Duration>,
}

impl ScriptedAgent {
    /// Answers from `file` where it has them, else from the descriptor's schemas. A file that
    /// does not exist is [`Error::MissingFile`](crate::Error::MissingFile), one that does not
    /// parse [`Error::Corrupt`](crate::Error::Corrupt).
    pub fn new(file: Option<&Path>, descriptor: &Descriptor) -> crate::Result<Self> {
        let mut answers: BTreeMap<String, Vec<String>> = descriptor
            .roles
            .iter()
            .map(|role| (role.name.clone(), answers_from_schema(&role.name, &role.schema)))
            .collect();
        if let Some(path) = file {
            answers.extend(read_answers(path)?);
        }
        Ok(ScriptedAgent { answers, delay: None })
    }

    /// Waits `delay` before each answer, standing in for a slow agent.
    pub fn with_delay(mut self, delay: Option<std::time::Duration>) -> Self {
        self.delay = delay;
        self
    }

    /// The configured delay.
    pub fn delay(&self) -> Option<std::time::Duration> {
        self.delay
    }

    /// The answer for the role's next run in this thread.
    pub fn answer(&self, context: &AgentContext) -> Result<AgentAnswer, AgentFailure> {
        let role = &context.role.name;
        let list = self.answers.get(role).filter(|l| !l.is_empty()).ok_or_else(|| {
            AgentFailure::Unavailable(format!("the scripted agent has no answer for role `{role}`"))
        })?;
        let runs = context.steps.iter().filter(|s| &s.role == role).count();
        let content = list[runs.min(list.len() - 1)].clone();
        Ok(AgentAnswer { content, meta: None, usage: None })
    }
}

fn read_answers(path: &Path) -> crate::Result<BTreeMap<String, Vec<String>>> {
    let text = crate::durable::read_text(path, "read scripted answers")?.ok_or_else(|| {
        crate::Error::MissingFile { what: "scripted answers file", path: path.into() }
    })?;
    let raw: BTreeMap<String, Value> =
        serde_yaml::from_str(&text).map_err(|e| crate::Error::Corrupt {
            path: path.into(),
            reason: format!("scripted answers do not parse: {}", e.to_string().replace('\n', " ")),
        })?;
    Ok(raw
        .into_iter()
        .map(|(role, value)| {
            let list = match value {
                Value::Array(items) => items.into_iter().map(answer_text).collect(),
                other => vec![answer_text(other)],
            };
            (role, list)
        })
        .collect())
}

/// A string answer is sent as is; anything else as JSON text.
fn answer_text(value: Value) -> String {
    match value {
        Value::String(text) => text,
        other => other.to_string(),
    }
}

/// A value `schema` accepts, to show as an example: its first `examples` entry, or else the
/// smallest value it accepts.
pub fn example_of(schema: &Value) -> Value {
    match schema.get("examples").and_then(Value::as_array).and_then(|e| e.first()) {
        Some(example) => example.clone(),
        None => minimal_instance(schema),
    }
}

fn answers_from_schema(role: &str, schema: &Value) -> Vec<String> {
    let metas = match schema.get("examples").and_then(Value::as_array) {
        Some(examples) if !examples.is_empty() => examples.clone(),
        _ => vec![minimal_instance(schema)],
    };
    metas
        .iter()
        .enumerate()
        .map(|(i, meta)| {
            let pretty = serde_json::to_string_pretty(meta).expect("JSON value serializes");
            format!("Scripted answer {} for role `{role}`.\n\n```json\n{pretty}\n```", i + 1)
        })
        .collect()
}

/// The smallest value a (simple) schema accepts: required properties only, empty strings,
/// zeros, `false`, the first `enum` value, `const`, `default` where given.
fn minimal_instance(schema: &Value) -> Value {
    if let Some(value) = schema.get("const").or_else(|| schema.get("default")) {
        return value.clone();
    }
    if let Some(first) = schema.get("enum").and_then(Value::as_array).and_then(|e| e.first()) {
        return first.clone();
    }
    if let Some(first) = ["anyOf", "oneOf", "allOf"]
        .iter()
        .find_map(|k| schema.get(*k).and_then(Value::as_array).and_then(|a| a.first()))
    {
        return minimal_instance(first);
    }
    let ty = match schema.get("type") {
        Some(Value::Array(types)) => types.first().and_then(Value::as_str).unwrap_or("null"),
        Some(Value::String(ty)) => ty.as_str(),
        _ if schema.get("properties").is_some() => "object",
        _ => "object",
    };
    match ty {
        "object" => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let required = schema.get("required").and_then(Value::as_array);
            let mut object = serde_json::Map::new();
            for name in required.into_iter().flatten().filter_map(Value::as_str) {
                let property = properties.and_then(|p| p.get(name)).unwrap_or(&Value::Null);
                object.insert(name.to_string(), minimal_instance(property));
            }
            Value::Object(object)
        }
        "array" => {
            let count = schema.get("minItems").and_then(Value::as_u64).unwrap_or(0);
            let item = schema.get("items").map(minimal_instance).unwrap_or(Value::Null);
            Value::Array((0..count).map(|_| item.clone()).collect())
        }
        "string" => {
            let len = schema.get("minLength").and_then(Value::as_u64).unwrap_or(0) as usize;
            Value::String("x".repeat(len))
        }
        "integer" | "number" => schema.get("minimum").cloned().unwrap_or(json!(0)),
        "boolean" => json!(false),
        _ => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal_instances_satisfy_their_schemas() {
        let schemas = [
            json!({"type": "object", "required": ["a", "b"], "properties": {
                "a": {"type": "string", "minLength": 2},
                "b": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 3}},
                "c": {"type": "boolean"}
            }}),
            json!({"enum": ["x", "y"]}),
            json!({"type": ["boolean", "null"]}),
            json!({"anyOf": [{"type": "number"}, {"type": "string"}]}),
        ];
        for schema in schemas {
            let value = minimal_instance(&schema);
            let validator = jsonschema::validator_for(&schema).unwrap();
            assert!(validator.is_valid(&value), "{value} does not satisfy {schema}");
        }
    }
}
