//! The `openai` agent: any OpenAI-compatible chat-completions endpoint (OpenAI, Ollama, vLLM,
//! llama.cpp server, LM Studio). The API key is read from the environment by the host and
//! sent only as a bearer header: it never enters a thread file, a log line or an error.
//!
//! One request is one model turn ([`OpenAiAgent::turn`]), read whole or, with `stream: true`,
//! as server-sent events whose text is passed on as it comes; the loop of turns and tool calls
//! of a binding with tools is [`super::tool_loop`]'s.
//!
//! A binding that names a provider limit (`limit:`) waits its turn for each request in the
//! limit's line (see [`crate::store::limiter`]), reserving what the request may use, and settles
//! it with the usage the endpoint reports; a 429, or a 503 that says when to come back, closes
//! the limit for every caller of every worker until then.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::host::{TurnHost, Unhosted};
use super::tools::ToolSet;
use super::{AgentFailure, Secrets};
use crate::store::capacity::{Ask, ProviderLimit};
use crate::store::config::{AgentKind, DEFAULT_MAX_TURNS};
use crate::store::journal::ToolCall;
use crate::store::limiter::{Caller, Reserved};
use crate::store::records::Usage;

/// Default time one request may take.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// How much of an error response's body goes into the error.
const BODY_TAIL: usize = 300;

/// The tokens a request's answer is reserved at when its binding sets no `max_tokens` (the
/// answer's real size replaces it when the endpoint reports its usage).
const ANSWER_ESTIMATE: u64 = 1024;

/// How long a limit stays closed after a 429 that does not say when to come back.
const RATE_LIMITED_FOR: Duration = Duration::from_secs(1);

/// How soon a request still waiting for its turn is shown as waiting, and then how often it
/// looks whether its thread was paused meanwhile.
const WAIT_LOOK: Duration = Duration::from_millis(100);

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
    /// The provider limit its requests draw on, when its binding names one and it runs in a
    /// thread.
    limit: Option<Drawn>,
}

/// A provider limit as one thread's agent draws on it.
#[derive(Debug, Clone)]
struct Drawn {
    name: String,
    limit: ProviderLimit,
    caller: Caller,
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
    /// runs in `cwd`. Its requests draw on the provider limit it names (one of `limits`) when
    /// `caller` says for whom (a call outside a thread is not held back).
    pub fn from_config(
        kind: &AgentKind,
        timeout: Option<Duration>,
        secrets: &Secrets,
        cwd: Option<&Path>,
        limits: &BTreeMap<String, ProviderLimit>,
        caller: Option<&Caller>,
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
            limit,
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
        let limit = match (limit, caller) {
            (Some(name), Some(caller)) => Some(Drawn {
                name: name.clone(),
                // Config::load checked that every binding's limit exists.
                limit: *limits.get(name).ok_or_else(|| format!("no provider limit `{name}`"))?,
                caller: caller.clone(),
            }),
            _ => None,
        };
        let timeout = timeout.unwrap_or(DEFAULT_TIMEOUT);
        let client = crate::http::shared_client(timeout)
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
            limit,
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
        let reserved = self.reserve(&body, &Unhosted).await?;
        let reply = self.scrubbed(async {
            let response = self.post(&body).await?;
            self.read_reply(response).await
        });
        let reply = settled(reserved, reply.await)?;
        Ok((self.content_of(&reply)?, reply.usage))
    }

    /// Model turn `turn` (from 1) of an agent call in the thread `host` stands for:
    /// `messages` so far (in the endpoint's words), the `tools` it may call; read as a stream
    /// when the binding says so, each piece of text passed to the host as it comes.
    pub async fn turn(
        &self,
        messages: &[Value],
        tools: &[Value],
        host: &dyn TurnHost,
        turn: u32,
    ) -> Result<Reply, AgentFailure> {
        let mut body = self.body(messages, tools);
        if self.stream {
            body["stream"] = json!(true);
            body["stream_options"] = json!({"include_usage": true});
        }
        let reserved = self.reserve(&body, host).await?;
        let on_delta = |text: &str| host.delta(turn, text);
        let reply = self.scrubbed(async {
            let response = self.post(&body).await?;
            match self.stream {
                true => self.read_stream(response, &on_delta).await,
                false => self.read_reply(response).await,
            }
        });
        settled(reserved, reply.await)
    }

    /// Waits for the turn of a request of `body` in its binding's provider limit, if it has
    /// one: shown to the thread's watchers as waiting for the limit, and given up (its place
    /// left) when the thread is paused or stopped meanwhile.
    async fn reserve(
        &self,
        body: &Value,
        host: &dyn TurnHost,
    ) -> Result<Option<Reserved>, AgentFailure> {
        let Some(drawn) = &self.limit else { return Ok(None) };
        // A request larger than the whole minute's tokens goes alone in an empty window.
        let tokens = self.estimate(body).min(drawn.limit.tokens_per_minute.unwrap_or(u64::MAX));
        let ask = Ask {
            workflow: drawn.caller.workflow.clone(),
            thread: drawn.caller.thread.clone(),
            tokens,
        };
        let started = Instant::now();
        let mut place = drawn.caller.limiter.join(&drawn.name, drawn.limit, ask);
        let mut told = false;
        let turn = loop {
            tokio::select! {
                turn = place.turn() => break turn,
                () = tokio::time::sleep(WAIT_LOOK) => {
                    if !told {
                        host.waits_for(&drawn.name);
                        told = true;
                    }
                    if let Err(stop) = host.before_turn() {
                        host.waited_for(&drawn.name);
                        return Err(stop);
                    }
                }
            }
        };
        if told {
            host.waited_for(&drawn.name);
            tracing::info!(
                limit = %drawn.name,
                waited_ms = started.elapsed().as_millis() as u64,
                "waited for the provider limit"
            );
        }
        turn.map(Some).map_err(|e| AgentFailure::Failed {
            message: format!("provider limit `{}`: {e}", drawn.name),
            transient: true,
        })
    }

    /// The tokens a request of `body` may use: its text's (about four bytes a token, as
    /// OpenAI's guidance has it for English) and its answer's most.
    fn estimate(&self, body: &Value) -> u64 {
        let prompt = body["messages"].to_string().len() + body["tools"].to_string().len();
        (prompt as u64).div_ceil(4) + self.max_tokens.map_or(ANSWER_ESTIMATE, u64::from)
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
        // A 429, or a 503 that says when to come back, is the provider's own limit speaking.
        let rate_limited = status.as_u16() == 429
            || (status.as_u16() == 503 && headers.contains_key(reqwest::header::RETRY_AFTER));
        let mut retry_after = rate_limited
            .then(|| retry_after(&headers))
            .flatten()
            .map(|wait| wait.min(self.timeout));
        if let Some(drawn) = self.limit.as_ref().filter(|_| rate_limited) {
            // Every caller of the limit, on every worker, waits until then; this call's retry
            // waits for its turn in the limit's line like any other, not on a timer of its own.
            let wait = retry_after.unwrap_or(RATE_LIMITED_FOR);
            let until = crate::clock::now_ms() + wait.as_millis() as u64;
            drawn.caller.limiter.close(&drawn.name, drawn.limit, until);
            tracing::warn!(limit = %drawn.name, wait_ms = wait.as_millis() as u64, "the provider asked every caller to wait");
            retry_after = Some(Duration::ZERO);
        }
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

/// A request's reply, its reservation in a provider limit (if any) settled with the tokens the
/// endpoint says it used. A failed request keeps its estimate counted for the minute: it may
/// have been sent and counted by the provider.
fn settled(
    reserved: Option<Reserved>,
    reply: Result<Reply, AgentFailure>,
) -> Result<Reply, AgentFailure> {
    if let (Some(reserved), Ok(reply)) = (reserved, &reply) {
        let used = reply.usage.as_ref().map(|u| u.input_tokens + u.output_tokens);
        reserved.settle(used);
    }
    reply
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
