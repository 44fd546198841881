//! The `openai` agent: any OpenAI-compatible chat-completions endpoint (OpenAI, Ollama, vLLM,
//! llama.cpp server, LM Studio). The API key is read from the environment by the host and
//! sent only as a bearer header: it never enters a thread file, a log line or an error.
//!
//! One request is one model turn ([`OpenAiAgent::turn`]), read whole or, with `stream: true`,
//! as server-sent events whose text is passed on as it comes; the loop of turns and tool calls
//! of a binding with tools is [`super::tool_loop`]'s.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::tools::ToolSet;
use super::{AgentFailure, Secrets};
use crate::store::config::{AgentKind, DEFAULT_MAX_TURNS};
use crate::store::journal::ToolCall;
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
    /// Read each answer as a stream of deltas.
    stream: bool,
    /// The MCP servers whose tools the model may call (a durable agent), if any.
    tools: Option<Arc<ToolSet>>,
    /// The most model turns one call may take with its tools.
    max_turns: u32,
}

/// One chat message.
#[derive(Debug, Clone)]
pub struct Message {
    pub role: &'static str,
    pub content: String,
}

/// What one model turn said: its text, the tools it asked for, and what it cost.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reply {
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Option<Usage>,
}

impl OpenAiAgent {
    /// The model it asks for.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The tool servers of the binding, if it has any.
    pub fn tools(&self) -> Option<&Arc<ToolSet>> {
        self.tools.as_ref()
    }

    /// The most model turns one call may take with its tools.
    pub fn max_turns(&self) -> u32 {
        self.max_turns
    }

    /// From an `openai` binding, its key and its tool servers' variables from `secrets` (the
    /// environment of the command that started or resumed the thread); a tool server's program
    /// runs in `cwd`.
    pub fn from_config(
        kind: &AgentKind,
        timeout: Option<Duration>,
        secrets: &Secrets,
        cwd: Option<&Path>,
    ) -> Result<Self, String> {
        let AgentKind::OpenAi {
            base_url,
            model,
            api_key_env,
            temperature,
            max_tokens,
            stream,
            max_turns,
            tools,
        } = kind
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
        let tools = match tools.is_empty() {
            true => None,
            false => Some(Arc::new(ToolSet::bind(tools, secrets, cwd)?)),
        };
        let timeout = timeout.unwrap_or(DEFAULT_TIMEOUT);
        let client = crate::http::client_builder()
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
            stream: *stream,
            tools,
            max_turns: max_turns.unwrap_or(DEFAULT_MAX_TURNS),
        })
    }

    /// The same agent, a person approving each call of the tools `approve` names
    /// (`server.tool`, `server.*`), beside what its binding's `approve:` lists.
    pub fn approving(mut self, approve: &[String]) -> Self {
        if let Some(tools) = &mut self.tools
            && !approve.is_empty()
        {
            Arc::make_mut(tools).approve(approve);
        }
        self
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
        let messages: Vec<Value> =
            messages.iter().map(|m| json!({"role": m.role, "content": m.content})).collect();
        let mut body = self.body(&messages, &[]);
        if let Some(format) = response_format {
            body["response_format"] = format.clone();
        }
        let reply = self.scrubbed(async {
            let response = self.post(&body).await?;
            self.read_reply(response).await
        });
        let reply = reply.await?;
        Ok((self.content_of(&reply)?, reply.usage))
    }

    /// One model turn of an agent call: `messages` so far (in the endpoint's words), the
    /// `tools` it may call; read as a stream when the binding says so, each piece of text
    /// passed to `on_delta` as it comes.
    pub async fn turn(
        &self,
        messages: &[Value],
        tools: &[Value],
        on_delta: &(dyn Fn(&str) + Send + Sync),
    ) -> Result<Reply, AgentFailure> {
        let mut body = self.body(messages, tools);
        if self.stream {
            body["stream"] = json!(true);
            body["stream_options"] = json!({"include_usage": true});
        }
        self.scrubbed(async {
            let response = self.post(&body).await?;
            match self.stream {
                true => self.read_stream(response, on_delta).await,
                false => self.read_reply(response).await,
            }
        })
        .await
    }

    /// The text of a reply that must have one (a turn that asked for no tools).
    pub fn content_of(&self, reply: &Reply) -> Result<String, AgentFailure> {
        reply.content.clone().ok_or_else(|| {
            AgentFailure::failed(format!(
                "POST {} returned no `choices[0].message.content`",
                self.url
            ))
        })
    }

    /// A request's body: the model, the messages, the tools, the binding's settings.
    fn body(&self, messages: &[Value], tools: &[Value]) -> Value {
        let mut body = json!({"model": self.model, "messages": messages});
        if !tools.is_empty() {
            body["tools"] = json!(tools);
        }
        if let Some(t) = self.temperature {
            body["temperature"] = json!(t);
        }
        if let Some(n) = self.max_tokens {
            body["max_tokens"] = json!(n);
        }
        body
    }

    /// `reply` with this agent's API key scrubbed from it, or from its failure: the key is
    /// sent as a header only, and a server that echoes it back (in an error body, say) must
    /// not get it into a message, a log or an answer.
    async fn scrubbed(
        &self,
        reply: impl std::future::Future<Output = Result<Reply, AgentFailure>>,
    ) -> Result<Reply, AgentFailure> {
        match reply.await {
            Ok(mut reply) => {
                reply.content = reply.content.map(|c| self.scrub(&c));
                for call in &mut reply.tool_calls {
                    call.arguments = self.scrub(&call.arguments);
                }
                Ok(reply)
            }
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

    /// Sends `body`; the response if its status is a success, else the failure it says.
    async fn post(&self, body: &Value) -> Result<reqwest::Response, AgentFailure> {
        let mut request = self.client.post(&self.url).json(body);
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
        if status.is_success() {
            return Ok(response);
        }
        let headers = response.headers().clone();
        let text = response.text().await.map_err(|e| self.reading(&e))?;
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
        Err(match retry_after {
            Some(retry_after) => AgentFailure::RateLimited { message, retry_after },
            None => AgentFailure::Failed { message, transient },
        })
    }

    /// A failure reading a response's body.
    fn reading(&self, e: &reqwest::Error) -> AgentFailure {
        let url = &self.url;
        if e.is_timeout() {
            AgentFailure::Timeout(format!("POST {url} timed out reading the response"))
        } else {
            AgentFailure::Failed {
                message: format!("POST {url}: reading the response failed: {}", without_url(e)),
                transient: true,
            }
        }
    }

    /// A whole JSON reply: `choices[0].message`, and `usage`.
    async fn read_reply(&self, response: reqwest::Response) -> Result<Reply, AgentFailure> {
        let url = &self.url;
        let text = response.text().await.map_err(|e| self.reading(&e))?;
        let reply: Value = serde_json::from_str(&text).map_err(|e| {
            AgentFailure::failed(format!("POST {url} returned a body that is not JSON: {e}"))
        })?;
        let message = &reply["choices"][0]["message"];
        if !message.is_object() {
            return Err(AgentFailure::failed(format!(
                "POST {url} returned no `choices[0].message`"
            )));
        }
        let tool_calls = message["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|call| ToolCall {
                id: call["id"].as_str().unwrap_or_default().to_string(),
                name: call["function"]["name"].as_str().unwrap_or_default().to_string(),
                arguments: call["function"]["arguments"].as_str().unwrap_or_default().to_string(),
            })
            .collect();
        Ok(Reply {
            content: message["content"].as_str().map(str::to_string),
            tool_calls,
            usage: self.usage(&reply["usage"]),
        })
    }

    /// A reply read as server-sent events (`stream: true`): the text passed to `on_delta` as
    /// it comes, the tool calls put together from their pieces, and the usage of the last
    /// chunk (`stream_options.include_usage`).
    async fn read_stream(
        &self,
        response: reqwest::Response,
        on_delta: &(dyn Fn(&str) + Send + Sync),
    ) -> Result<Reply, AgentFailure> {
        use futures::StreamExt;
        let url = &self.url;
        let mut events =
            std::pin::pin!(sse_stream::SseStream::from_bytes_stream(response.bytes_stream()));
        let mut content: Option<String> = None;
        let mut calls: Vec<ToolCall> = Vec::new();
        let mut usage = None;
        let mut done = false;
        while let Some(event) = events.next().await {
            let event = event.map_err(|e| match e {
                sse_stream::Error::Body(e) => AgentFailure::Failed {
                    message: format!("POST {url}: the stream broke off: {e}"),
                    transient: true,
                },
                other => {
                    AgentFailure::failed(format!("POST {url}: a bad event in the stream: {other}"))
                }
            })?;
            let Some(data) = event.data else { continue };
            if data.trim() == "[DONE]" {
                done = true;
                break;
            }
            let chunk: Value = serde_json::from_str(&data).map_err(|e| {
                AgentFailure::failed(format!("POST {url} streamed a chunk that is not JSON: {e}"))
            })?;
            if let Some(u) = self.usage(&chunk["usage"]) {
                usage = Some(u);
            }
            let delta = &chunk["choices"][0]["delta"];
            if let Some(text) = delta["content"].as_str().filter(|t| !t.is_empty()) {
                on_delta(text);
                content.get_or_insert_with(String::new).push_str(text);
            }
            for piece in delta["tool_calls"].as_array().into_iter().flatten() {
                let index = piece["index"].as_u64().unwrap_or(calls.len() as u64) as usize;
                if index > calls.len() + 64 {
                    return Err(AgentFailure::failed(format!(
                        "POST {url} streamed a tool call at index {index}, out of order"
                    )));
                }
                while calls.len() <= index {
                    calls.push(ToolCall {
                        id: String::new(),
                        name: String::new(),
                        arguments: String::new(),
                    });
                }
                let call = &mut calls[index];
                if let Some(id) = piece["id"].as_str() {
                    call.id = id.to_string();
                }
                if let Some(name) = piece["function"]["name"].as_str() {
                    call.name.push_str(name);
                }
                if let Some(arguments) = piece["function"]["arguments"].as_str() {
                    call.arguments.push_str(arguments);
                }
            }
            if chunk["choices"][0]["finish_reason"].is_string() {
                done = true;
            }
        }
        // A stream cut before its end may have cut the answer: it is asked again.
        if !done {
            return Err(AgentFailure::Failed {
                message: format!("POST {url}: the stream ended before its answer"),
                transient: true,
            });
        }
        Ok(Reply { content, tool_calls: calls, usage })
    }

    /// `usage`, when the endpoint sends it: tokens in (cached among them) and out.
    fn usage(&self, u: &Value) -> Option<Usage> {
        u.is_object().then(|| Usage {
            input_tokens: u["prompt_tokens"].as_u64().unwrap_or(0),
            output_tokens: u["completion_tokens"].as_u64().unwrap_or(0),
            cached_tokens: u["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0),
            calls: 1,
            // The model as configured (and priced in `prices:`), not the dated name a
            // service may answer with.
            model: Some(self.model.clone()),
            cost_usd: None,
        })
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
