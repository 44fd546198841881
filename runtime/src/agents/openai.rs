//! The `openai` agent: any OpenAI-compatible chat-completions endpoint (OpenAI, Ollama, vLLM,
//! llama.cpp server, LM Studio). The API key is read from the environment by the host and
//! sent only as a bearer header: it never enters a thread file, a log line or an error.

use std::time::Duration;

use serde_json::{Value, json};

use super::{AgentAnswer, AgentContext, AgentFailure, Secrets};
use crate::store::config::AgentKind;
use crate::store::records::Usage;

/// Default time one request may take.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// How much of an error response's body goes into the error.
const BODY_TAIL: usize = 300;

/// A chat-completions endpoint bound as an agent (and usable as the extractor).
#[derive(Debug, Clone)]
pub struct OpenAiAgent {
    client: reqwest::Client,
    url: String,
    model: String,
    api_key: Option<String>,
    temperature: Option<f64>,
    max_tokens: Option<u32>,
    /// The longest a call may take; also the longest `Retry-After` this agent waits.
    timeout: Duration,
}

/// One chat message.
#[derive(Debug, Clone)]
pub struct Message {
    pub role: &'static str,
    pub content: String,
}

impl OpenAiAgent {
    /// The model it asks for.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// From an `openai` binding, its key from `secrets` (the environment of the command that
    /// started or resumed the thread).
    pub fn from_config(
        kind: &AgentKind,
        timeout: Option<Duration>,
        secrets: &Secrets,
    ) -> Result<Self, String> {
        let AgentKind::OpenAi { base_url, model, api_key_env, temperature, max_tokens } = kind
        else {
            return Err("not an openai binding".into());
        };
        let api_key = match api_key_env {
            None => None,
            Some(var) => Some(secrets.get(var).map(str::to_string).ok_or_else(|| {
                format!(
                    "the API key variable `{var}` is not set in the environment of the command \
                     that started or resumed the thread"
                )
            })?),
        };
        let timeout = timeout.unwrap_or(DEFAULT_TIMEOUT);
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
        Ok(OpenAiAgent {
            client,
            url: format!("{}/chat/completions", base_url.trim_end_matches('/')),
            model: model.clone(),
            api_key,
            temperature: *temperature,
            max_tokens: *max_tokens,
            timeout,
        })
    }

    /// The role's system prompt, then the thread rendered as the user message.
    pub async fn answer(&self, context: &AgentContext) -> Result<AgentAnswer, AgentFailure> {
        let messages = vec![
            Message { role: "system", content: context.role.system_prompt.clone() },
            Message { role: "user", content: context.render() },
        ];
        let (content, usage) = self.chat_with_usage(&messages, None).await?;
        Ok(AgentAnswer { content, meta: None, usage })
    }

    /// One chat completion; `response_format` constrains the output (structured outputs).
    /// HTTP 429 and 5xx, connection failures and timeouts are transient; other statuses are
    /// permanent. Errors name the endpoint and the status.
    pub async fn chat(
        &self,
        messages: &[Message],
        response_format: Option<&Value>,
    ) -> Result<String, AgentFailure> {
        Ok(self.chat_with_usage(messages, response_format).await?.0)
    }

    /// [`chat`](Self::chat), with the tokens the endpoint says the call cost.
    pub async fn chat_with_usage(
        &self,
        messages: &[Message],
        response_format: Option<&Value>,
    ) -> Result<(String, Option<Usage>), AgentFailure> {
        // The key is sent as a header only; a server that echoes it back (in an error body,
        // say) must not get it into a message, a log or an answer.
        match self.request(messages, response_format).await {
            Ok((content, usage)) => Ok((self.scrub(&content), usage)),
            Err(failure) => Err(failure.map_message(|m| self.scrub(m))),
        }
    }

    /// `text` without this agent's API key.
    fn scrub(&self, text: &str) -> String {
        match &self.api_key {
            Some(key) if !key.is_empty() && text.contains(key.as_str()) => {
                text.replace(key.as_str(), "[redacted]")
            }
            _ => text.to_string(),
        }
    }

    async fn request(
        &self,
        messages: &[Message],
        response_format: Option<&Value>,
    ) -> Result<(String, Option<Usage>), AgentFailure> {
        let mut body = json!({
            "model": self.model,
            "messages": messages.iter().map(|m| json!({"role": m.role, "content": m.content})).collect::<Vec<_>>(),
        });
        if let Some(t) = self.temperature {
            body["temperature"] = json!(t);
        }
        if let Some(n) = self.max_tokens {
            body["max_tokens"] = json!(n);
        }
        if let Some(format) = response_format {
            body["response_format"] = format.clone();
        }
        let mut request = self.client.post(&self.url).json(&body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        // The call's trace context, so that a traced gateway or server joins the thread's trace.
        if let Some(traceparent) = crate::telemetry::traceparent() {
            request = request.header("traceparent", traceparent);
        }
        let url = &self.url;
        let response = request.send().await.map_err(|e| {
            if e.is_timeout() {
                AgentFailure::Timeout(format!("POST {url} timed out"))
            } else {
                AgentFailure::Failed {
                    message: format!("POST {url} failed: {}", without_url(&e)),
                    transient: true,
                }
            }
        })?;
        let status = response.status();
        let headers = response.headers().clone();
        let text = response.text().await.map_err(|e| {
            if e.is_timeout() {
                AgentFailure::Timeout(format!("POST {url} timed out reading the response"))
            } else {
                AgentFailure::Failed {
                    message: format!(
                        "POST {url}: reading the response failed: {}",
                        without_url(&e)
                    ),
                    transient: true,
                }
            }
        })?;
        if !status.is_success() {
            let transient = status.as_u16() == 429 || status.is_server_error();
            let retry_after = (status.as_u16() == 429)
                .then(|| retry_after(&headers))
                .flatten()
                .map(|wait| wait.min(self.timeout));
            let tail: String = text
                .chars()
                .take(BODY_TAIL)
                .collect::<String>()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            let message = format!("POST {url} returned HTTP {status}: {tail}");
            return Err(match retry_after {
                Some(retry_after) => AgentFailure::RateLimited { message, retry_after },
                None => AgentFailure::Failed { message, transient },
            });
        }
        let reply: Value = serde_json::from_str(&text).map_err(|e| {
            AgentFailure::failed(format!("POST {url} returned a body that is not JSON: {e}"))
        })?;
        let content = reply["choices"][0]["message"]["content"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| {
                AgentFailure::failed(format!("POST {url} returned no `choices[0].message.content`"))
            })?;
        // `usage`, when the endpoint sends it: tokens in (cached among them) and out.
        let usage = reply.get("usage").filter(|u| u.is_object()).map(|u| Usage {
            input_tokens: u["prompt_tokens"].as_u64().unwrap_or(0),
            output_tokens: u["completion_tokens"].as_u64().unwrap_or(0),
            cached_tokens: u["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0),
            calls: 1,
            // The model as configured (and priced in `prices:`), not the dated name a
            // service may answer with.
            model: Some(self.model.clone()),
            cost_usd: None,
        });
        Ok((content, usage))
    }

    /// The endpoint, for messages.
    pub fn url(&self) -> &str {
        &self.url
    }
}

/// How long a `Retry-After` header asks to wait: seconds, or an HTTP date.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(std::time::SystemTime::now()).unwrap_or(Duration::ZERO))
}

/// reqwest's message without the URL it already repeats (ours is in the message).
fn without_url(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    if let Some(url) = e.url() {
        text = text.replace(&format!(" ({url})"), "");
    }
    match std::error::Error::source(e) {
        Some(source) => format!("{text}: {source}"),
        None => text,
    }
}
