//! The extractor: structured data out of an agent's text, validated against a JSON Schema.
//!
//! Candidates are tried in order — the whole text, each fenced code block (last first), the
//! last JSON object in the text — and the first one valid against the schema wins. When none
//! is, and an LLM extractor is configured, the model is asked for the JSON with the schema as
//! a structured-output constraint, and asked again with the validation errors until an answer
//! validates or its retries are spent.

use serde_json::{Value, json};

use super::openai::{Message, OpenAiAgent};
use super::{AgentFailure, RetryPolicy, with_retries};
use crate::schema::{compile, first_error};
use crate::store::debug_log::{DebugLog, LogLevel};
use crate::store::records::Usage;

/// Why nothing valid was found. Becomes the WIT `extract-error`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ExtractFailure {
    #[error("the schema is not valid JSON Schema: {0}")]
    InvalidSchema(String),
    #[error("no JSON value found in the agent's answer")]
    NoJson,
    #[error("the JSON in the agent's answer does not match the schema: {0}")]
    SchemaMismatch(String),
    /// The LLM extractor could not be asked.
    #[error("the extractor failed: {0}")]
    Unavailable(String),
}

/// Finds schema-valid JSON in agents' answers. Compiled schemas live in a process-wide cache
/// (see [`crate::schema::compile`]), so extractors are free to create, one per thread.
#[derive(Debug, Default)]
pub struct Extractor;

/// How many `{` positions from the end are tried when looking for the last JSON object.
const MAX_OBJECT_STARTS: usize = 64;

impl Extractor {
    /// Extracts a value valid against `schema` (JSON text) from `content`. `preferred` is a
    /// meta the agent supplied itself, tried first.
    pub fn extract(
        &self,
        schema: &str,
        content: &str,
        preferred: Option<&Value>,
    ) -> Result<Value, ExtractFailure> {
        let validator = compile(schema).map_err(ExtractFailure::InvalidSchema)?;
        let mut first_mismatch = None;
        let candidates = preferred.cloned().into_iter().chain(candidates(content));
        for candidate in candidates {
            // Only the first mismatch is reported: the others are not worth formatting.
            if validator.is_valid(&candidate) {
                return Ok(candidate);
            }
            if first_mismatch.is_none() {
                first_mismatch = first_error(&validator, &candidate);
            }
        }
        Err(first_mismatch.map_or(ExtractFailure::NoJson, ExtractFailure::SchemaMismatch))
    }
}

/// An OpenAI-compatible model that extracts what the agent's text does not hold as JSON.
#[derive(Debug)]
pub struct LlmExtractor {
    pub agent: OpenAiAgent,
    /// The binding's name, for logs.
    pub label: String,
    /// Retries of transport failures.
    pub policy: RetryPolicy,
    /// Further attempts after an answer that does not validate.
    pub retries: u32,
    /// What tokens cost, by model (`prices:` in config.yaml).
    pub prices: std::sync::Arc<crate::store::config::Prices>,
}

impl LlmExtractor {
    /// The span of an extraction (all its attempts), as an agent call's.
    pub fn span(&self) -> tracing::Span {
        crate::telemetry::agent_span(crate::telemetry::AgentCall {
            operation: "chat",
            provider: "openai",
            model: Some(self.agent.model()),
            agent: &self.label,
            role: "extractor",
        })
    }
}

/// Log tag of LLM extraction attempts.
const TAG_LLM: &str = "XTR8LLM0";

impl LlmExtractor {
    /// Asks the model for JSON valid against `schema` from `content`, validating each answer
    /// with `local` and feeding the errors back.
    pub async fn extract(
        &self,
        local: &Extractor,
        schema: &str,
        prompt: &str,
        content: &str,
        info: &DebugLog,
    ) -> (Result<Value, ExtractFailure>, Option<Usage>) {
        let mut spent: Option<Usage> = None;
        let result = self.attempts(local, schema, prompt, content, info, &mut spent).await;
        let spent = spent.map(|mut usage| {
            usage.cost_usd = self.prices.get(self.agent.model()).map(|price| price.cost(&usage));
            usage
        });
        (result, spent)
    }

    /// The attempts of [`extract`](Self::extract), adding what each call cost to `spent`.
    async fn attempts(
        &self,
        local: &Extractor,
        schema: &str,
        prompt: &str,
        content: &str,
        info: &DebugLog,
        spent: &mut Option<Usage>,
    ) -> Result<Value, ExtractFailure> {
        let schema_value: Value = serde_json::from_str(schema)
            .map_err(|e| ExtractFailure::InvalidSchema(e.to_string()))?;
        let instructions = format!(
            "You extract structured data from text. {}\nReply with one JSON value, and nothing \
             else, valid against this JSON Schema:\n{}",
            prompt.trim(),
            serde_json::to_string_pretty(&schema_value).expect("JSON values serialize")
        );
        let mut messages = vec![
            Message { role: "system", content: instructions },
            Message { role: "user", content: content.to_string() },
        ];
        let structured = json!({
            "type": "json_schema",
            "json_schema": {"name": "meta", "schema": schema_value, "strict": false}
        });
        let mut format = Some(&structured);
        let mut last_error = String::new();
        let attempts = self.retries + 1;
        let mut attempt = 1;
        while attempt <= attempts {
            let what = format!("extractor `{}`", self.label);
            let answer = with_retries(self.policy, info, &what, || {
                self.agent.chat_with_usage(&messages, format)
            })
            .await;
            let answer = match answer {
                Ok((answer, usage)) => {
                    // Tokens and cost, but no agent call: `calls` (what budgets count) stays 0.
                    if let Some(usage) = usage {
                        spent.get_or_insert_with(Usage::default).add(&Usage { calls: 0, ..usage });
                    }
                    answer
                }
                // Servers without structured outputs refuse `response_format`: ask again with
                // the schema in the prompt only. This does not count as an attempt.
                Err(AgentFailure::Failed { message, transient: false })
                    if format.is_some() && message.contains("HTTP 4") =>
                {
                    info.write(
                        LogLevel::Warn,
                        TAG_LLM,
                        &format!(
                            "{what}: structured output refused ({message}); retrying without it"
                        ),
                    );
                    format = None;
                    continue;
                }
                Err(failure) => return Err(ExtractFailure::Unavailable(failure.to_string())),
            };
            match local.extract(schema, &answer, None) {
                Ok(value) => {
                    info.write(
                        LogLevel::Info,
                        TAG_LLM,
                        &format!("{what}: valid meta on attempt {attempt}/{attempts}"),
                    );
                    return Ok(value);
                }
                Err(failure) => {
                    last_error = failure.to_string();
                    info.write(
                        LogLevel::Warn,
                        TAG_LLM,
                        &format!("{what}: attempt {attempt}/{attempts} invalid: {last_error}"),
                    );
                    messages.push(Message { role: "assistant", content: answer });
                    messages.push(Message {
                        role: "user",
                        content: format!(
                            "That is not valid: {last_error}. Reply again with corrected JSON only."
                        ),
                    });
                }
            }
            attempt += 1;
        }
        Err(ExtractFailure::SchemaMismatch(format!(
            "the extractor's answer still did not validate after {attempts} attempts: {last_error}"
        )))
    }
}

/// JSON values found in `text`, most likely first.
fn candidates(text: &str) -> impl Iterator<Item = Value> + '_ {
    let whole = serde_json::from_str::<Value>(text.trim()).ok();
    let fenced =
        fenced_blocks(text).into_iter().rev().filter_map(|b| serde_json::from_str(b.trim()).ok());
    whole.into_iter().chain(fenced).chain(objects_from_end(text))
}

/// Bodies of ``` fenced blocks (any info string), in order.
fn fenced_blocks(text: &str) -> Vec<&str> {
    let mut blocks = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find("```") {
        let after_fence = &rest[open + 3..];
        // Skip the info string (e.g. `json`) up to the end of the line.
        let Some(newline) = after_fence.find('\n') else {
            break;
        };
        let body = &after_fence[newline + 1..];
        let Some(close) = body.find("```") else { break };
        blocks.push(&body[..close]);
        rest = &body[close + 3..];
    }
    blocks
}

/// `{...}` spans of `text` that parse as JSON objects, by start position from the end: the
/// last object first (after the objects nested in it, which the schema usually rejects).
fn objects_from_end(text: &str) -> impl Iterator<Item = Value> + '_ {
    text.char_indices().rev().filter(|&(_, c)| c == '{').take(MAX_OBJECT_STARTS).filter_map(
        |(i, _)| {
            let mut stream = serde_json::Deserializer::from_str(&text[i..]).into_iter::<Value>();
            match stream.next() {
                Some(Ok(value @ Value::Object(_))) => Some(value),
                _ => None,
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SCHEMA: &str =
        r#"{"type":"object","required":["approved"],"properties":{"approved":{"type":"boolean"}}}"#;

    fn extract(text: &str) -> Result<Value, ExtractFailure> {
        Extractor.extract(SCHEMA, text, None)
    }

    #[test]
    fn finds_whole_fenced_and_trailing_json() {
        assert_eq!(extract(r#" {"approved": true} "#).unwrap(), json!({"approved": true}));
        let fenced = "Looks good.\n```json\n{\"approved\": true}\n```\nThanks";
        assert_eq!(extract(fenced).unwrap(), json!({"approved": true}));
        let trailing = "I reviewed it. Verdict: {\"approved\": false, \"note\": {\"x\": 1}} done";
        assert_eq!(extract(trailing).unwrap(), json!({"approved": false, "note": {"x": 1}}));
        // The last fenced block wins over earlier ones.
        let two = "```\n{\"approved\": false}\n```\nthen\n```json\n{\"approved\": true}\n```";
        assert_eq!(extract(two).unwrap(), json!({"approved": true}));
    }

    #[test]
    fn reports_why_nothing_matched() {
        assert_eq!(extract("no json here"), Err(ExtractFailure::NoJson));
        match extract(r#"{"approved": "yes"}"#) {
            Err(ExtractFailure::SchemaMismatch(msg)) => assert!(msg.contains("approved"), "{msg}"),
            other => panic!("{other:?}"),
        }
        let bad = Extractor.extract("{\"type\": 12}", "{}", None);
        assert!(matches!(bad, Err(ExtractFailure::InvalidSchema(_))), "{bad:?}");
    }

    #[test]
    fn agent_supplied_meta_is_tried_first() {
        let meta = json!({"approved": true});
        let got = Extractor.extract(SCHEMA, "{\"approved\": false}", Some(&meta)).unwrap();
        assert_eq!(got, meta);
    }
}
