//! A durable agent's tools: the MCP servers its binding names (`tools:` in config.yaml),
//! connected for one agent call through the official Rust SDK, their tools offered to the
//! model under names it can call, and each call checked, bounded and redacted.
//!
//! The servers run with the authority of whoever configured them; what comes back from them
//! is untrusted text. So a server process gets only the variables its binding names (and
//! `PATH`), in a process group of its own that dies with the call; an argument is checked
//! against the tool's input schema before the server sees it; a result is cut to its binding's
//! size and has every secret the host holds redacted before the model or the journal sees it.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation, JsonObject, Tool,
};
use rmcp::service::{RoleClient, RunningService, ServiceExt};
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransport, StreamableHttpClientTransportConfig,
};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

use super::processes::{GroupGuard, Reaped, spawn_group};
use super::{AgentFailure, AgentProcesses, Secrets};
use crate::limits::Size;
use crate::store::credentials::CredentialBackend;
use crate::store::tool_servers::{DEFAULT_MAX_RESULT_BYTES, DEFAULT_TOOL_TIMEOUT, ToolServer};

/// The largest message a server may send (a result is cut to its binding's size after it
/// arrives; one past this is dropped unread by the SDK, and its call times out).
const MAX_MESSAGE_BYTES: usize = 256 << 20;

/// How much of a server's standard error a failure message quotes.
const STDERR_TAIL: usize = 400;

/// The tool servers of one binding, with the values of the variables they name.
#[derive(Debug, Clone)]
pub struct ToolSet {
    servers: Vec<(String, ToolServer)>,
    /// The values of the variables the servers name (their env, their headers' `${NAME}`).
    values: BTreeMap<String, String>,
    /// Where a server's program runs: the directory the run was asked from.
    cwd: Option<PathBuf>,
    /// Tools a person approves before each call beside the bindings' own, as a run asked
    /// (`server.tool`, `server.*`).
    approve: Vec<String>,
}

impl ToolSet {
    /// The servers of a binding, each variable they name taken from `secrets` (the
    /// environment of the command that started or resumed the thread): one that is unset is
    /// an error now, not a server that fails later.
    pub fn bind(
        servers: &BTreeMap<String, ToolServer>,
        secrets: &Secrets,
        cwd: Option<&Path>,
    ) -> Result<Self, String> {
        let mut values = BTreeMap::new();
        for (name, server) in servers {
            for var in server.variables() {
                let value = secrets.get(var).ok_or_else(|| {
                    format!(
                        "tools.{name}: the variable `{var}` is not set in the environment of the \
                         command that started or resumed the thread"
                    )
                })?;
                values.insert(var.to_string(), value.to_string());
            }
            if let Some(command) = &server.command {
                super::command::find_program(command, cwd)
                    .map_err(|e| format!("tools.{name}: {e}"))?;
            }
        }
        let servers = servers.iter().map(|(n, s)| (n.clone(), s.clone())).collect();
        Ok(ToolSet { servers, values, cwd: cwd.map(Path::to_path_buf), approve: Vec::new() })
    }

    /// Has a person approve each call of the tools `patterns` name too.
    pub fn approve(&mut self, patterns: &[String]) {
        self.approve.extend(patterns.iter().cloned());
    }

    /// Starts or reaches every server, lists their tools, and keeps those the model may be
    /// offered: the ones each binding allows, and of them, when `offered` is given (the set
    /// this call was first offered, from its journal), only those — a tool a server added
    /// since is not offered.
    pub async fn connect(
        self: &Arc<Self>,
        processes: Option<&Arc<AgentProcesses>>,
        offered: Option<&[String]>,
        credentials: Option<Arc<dyn CredentialBackend>>,
    ) -> Result<ToolBox, AgentFailure> {
        let credentials = credentials.as_ref();
        let connecting = self.servers.iter().map(|(name, server)| async move {
            let timeout = server.timeout.map_or(DEFAULT_TOOL_TIMEOUT, |t| t.0);
            let started = self.start(name, server, processes, credentials);
            let connected = tokio::time::timeout(timeout, started).await.unwrap_or_else(|_| {
                Err(AgentFailure::Failed {
                    message: format!(
                        "tool server `{name}` did not answer within {}",
                        humantime::format_duration(timeout)
                    ),
                    transient: true,
                })
            })?;
            let listed = tokio::time::timeout(timeout, connected.client.list_all_tools())
                .await
                .map_err(|_| AgentFailure::Failed {
                    message: format!("tool server `{name}` did not list its tools in time"),
                    transient: true,
                })?
                .map_err(|e| AgentFailure::Failed {
                    message: format!("tool server `{name}` could not list its tools: {e}"),
                    transient: true,
                })?;
            Ok::<_, AgentFailure>((connected, listed))
        });
        let mut servers = Vec::new();
        let mut tools = Vec::new();
        for (index, connected) in
            futures::future::join_all(connecting).await.into_iter().enumerate()
        {
            let (server, listed) = connected?;
            let config = &self.servers[index].1;
            for tool in listed {
                if let Some(offer) = Offered::of(index, &server.name, config, tool, &self.approve) {
                    tools.push(offer);
                }
            }
            servers.push(tokio::sync::Mutex::new(Arc::new(server)));
        }
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        // Two tools the model would know by one name: neither is offered (which one it meant
        // could not be told).
        let mut seen: HashMap<String, usize> = HashMap::new();
        for tool in &tools {
            *seen.entry(tool.name.clone()).or_default() += 1;
        }
        tools.retain(|t| seen[&t.name] == 1);
        if let Some(offered) = offered {
            tools.retain(|t| offered.contains(&t.name));
        }
        Ok(ToolBox {
            servers,
            tools,
            set: self.clone(),
            processes: processes.cloned(),
            credentials: credentials.cloned(),
        })
    }

    /// Starts or reaches one server and does the MCP handshake.
    async fn start(
        &self,
        name: &str,
        server: &ToolServer,
        processes: Option<&Arc<AgentProcesses>>,
        credentials: Option<&Arc<dyn CredentialBackend>>,
    ) -> Result<Server, AgentFailure> {
        let info = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("uncaged-workflow", env!("CARGO_PKG_VERSION")),
        );
        let handshake = |e: &dyn std::fmt::Display| AgentFailure::Failed {
            message: format!("tool server `{name}`: the MCP handshake failed: {e}"),
            transient: true,
        };
        if let Some(url) = &server.url {
            let mut headers = HashMap::new();
            for (header, value) in &server.headers {
                let value = self.expand(value);
                let (Ok(header), Ok(value)) = (
                    reqwest::header::HeaderName::try_from(header.as_str()),
                    reqwest::header::HeaderValue::try_from(value.as_str()),
                ) else {
                    return Err(AgentFailure::Unavailable(format!(
                        "tool server `{name}`: header `{}` is not a valid HTTP header",
                        crate::terminal::line(header)
                    )));
                };
                headers.insert(header, value);
            }
            let mut config =
                StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(headers);
            config.max_sse_event_size = MAX_MESSAGE_BYTES;
            config.max_json_response_size = MAX_MESSAGE_BYTES;
            let client = crate::http::client_builder()
                .build()
                .map_err(|e| AgentFailure::Unavailable(format!("an HTTP client: {e}")))?;
            let served = match &server.oauth {
                None => serve_http(info, client, config).await,
                Some(_) => {
                    let Some(credentials) = credentials else {
                        return Err(AgentFailure::Unavailable(format!(
                            "tool server `{name}` signs in with OAuth, which only a thread's \
                             call can"
                        )));
                    };
                    let client =
                        super::oauth::authorized_client(credentials, name, url, client).await?;
                    serve_http(info, client, config).await
                }
            };
            let client = served.map_err(|e| handshake(&e))?;
            return Ok(Server { name: name.to_string(), client, _process: None, stderr: None });
        }
        let program = server.command.as_deref().expect("a server is a command or a URL");
        let mut command = tokio::process::Command::new(program);
        if let Some(cwd) = &self.cwd {
            command.current_dir(cwd);
        }
        // Only what the binding names, and PATH (a server started by `npx` or `uvx` must find
        // its interpreter): no API key of the host's reaches a server unless named.
        command.env_clear();
        if let Some(path) = std::env::var_os("PATH") {
            command.env("PATH", path);
        }
        for var in &server.env {
            command.env(var, &self.values[var]);
        }
        // What it starts (`npx`'s node) is in its group, stopped with it.
        let (mut child, group) =
            spawn_group(command.args(&server.args), processes).map_err(|e| {
                AgentFailure::Unavailable(format!(
                    "tool server `{name}`: cannot start `{program}`: {e}"
                ))
            })?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let stdin = child.stdin.take().expect("stdin is piped");
        let stderr = child.stderr.take().map(StderrTail::collect);
        let transport =
            AsyncRwTransport::new(stdout, stdin).with_max_line_length(MAX_MESSAGE_BYTES);
        let client = match info.serve(transport).await {
            Ok(client) => client,
            Err(e) => {
                let tail = match &stderr {
                    Some(stderr) => stderr.tail().await,
                    None => String::new(),
                };
                let _ = child.start_kill();
                return Err(AgentFailure::Failed {
                    message: with_tail(
                        format!("tool server `{name}`: the MCP handshake failed: {e}"),
                        &tail,
                    ),
                    transient: true,
                });
            }
        };
        let process = Reaped::watch(child, format!("tool server `{name}`"));
        Ok(Server { name: name.to_string(), client, _process: Some((process, group)), stderr })
    }

    /// `value` with each `${NAME}` replaced by that variable's value.
    fn expand(&self, value: &str) -> String {
        let mut text = value.to_string();
        for (name, value) in &self.values {
            text = text.replace(&format!("${{{name}}}"), value);
        }
        text
    }
}

/// The MCP handshake over Streamable HTTP through `client`: a plain one, or one that signs
/// in with OAuth.
async fn serve_http<C>(
    info: ClientConfig,
    client: C,
    config: StreamableHttpClientTransportConfig,
) -> Result<RunningService<RoleClient, ClientConfig>, rmcp::service::ClientInitializeError>
where
    C: rmcp::transport::streamable_http_client::StreamableHttpClient + Send + Sync + 'static,
{
    info.serve(StreamableHttpClientTransport::with_client(client, config)).await
}

/// A connected server.
struct Server {
    name: String,
    client: RunningService<RoleClient, ClientConfig>,
    /// A server run over stdio: its process (reaped once it exits, killed when dropped), and
    /// the guard that kills its process group (what it started) and unlists it.
    _process: Option<(Reaped, Option<GroupGuard>)>,
    stderr: Option<StderrTail>,
}

/// The end of what a server printed on its standard error, for the message when it fails.
#[derive(Clone)]
struct StderrTail(Arc<tokio::sync::Mutex<Vec<u8>>>);

impl StderrTail {
    /// Reads `stderr` as it comes, keeping its last bytes.
    fn collect(mut stderr: tokio::process::ChildStderr) -> Self {
        let tail = StderrTail(Default::default());
        let sink = tail.0.clone();
        tokio::spawn(async move {
            let mut chunk = [0u8; 4096];
            while let Ok(n @ 1..) = stderr.read(&mut chunk).await {
                let mut kept = sink.lock().await;
                kept.extend_from_slice(&chunk[..n]);
                let over = kept.len().saturating_sub(STDERR_TAIL * 4);
                kept.drain(..over);
            }
        });
        tail
    }

    async fn tail(&self) -> String {
        let bytes = self.0.lock().await.clone();
        let text = String::from_utf8_lossy(&bytes);
        let text: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
        let start = text.len().saturating_sub(STDERR_TAIL);
        let start = (start..=text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(0);
        crate::terminal::line(&text[start..]).into_owned()
    }
}

fn with_tail(message: String, tail: &str) -> String {
    if tail.is_empty() { message } else { format!("{message}: {tail}") }
}

/// A tool the model may call.
#[derive(Debug)]
pub struct Offered {
    /// As the model calls it: `server__tool`.
    pub name: String,
    /// As config.yaml names it: `server.tool`.
    pub label: String,
    server: usize,
    tool: Tool,
    validator: Option<jsonschema::Validator>,
    /// A person says yes before each call (`approve:`).
    pub approve: bool,
    /// A call a crash cut may be made again: the tool says it reads only, or may be repeated,
    /// or its binding lists it in `safe_to_repeat:`.
    pub safe_to_repeat: bool,
}

impl Offered {
    /// `tool` of server `name` as offered, if its binding allows it.
    fn of(
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
        let safe_to_repeat = config.safe_to_repeat.contains(&local)
            || hints
                .is_some_and(|h| h.read_only_hint == Some(true) || h.idempotent_hint == Some(true));
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

/// The servers of one agent call, connected, and the tools their model is offered.
pub struct ToolBox {
    /// Each server, started again when it is found gone (it died in a call).
    servers: Vec<tokio::sync::Mutex<Arc<Server>>>,
    tools: Vec<Offered>,
    set: Arc<ToolSet>,
    processes: Option<Arc<AgentProcesses>>,
    credentials: Option<Arc<dyn CredentialBackend>>,
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

impl ToolBox {
    /// The names of the tools offered, as the model calls them.
    pub fn offered(&self) -> Vec<String> {
        self.tools.iter().map(|t| t.name.clone()).collect()
    }

    /// The tools as a chat-completions request lists them.
    pub fn definitions(&self) -> Vec<Value> {
        self.tools
            .iter()
            .map(|t| {
                let mut function = json!({
                    "name": t.name,
                    "parameters": Value::Object((*t.tool.input_schema).clone()),
                });
                if let Some(description) = &t.tool.description {
                    function["description"] = json!(description);
                }
                json!({"type": "function", "function": function})
            })
            .collect()
    }

    /// The offered tool the model calls `name`.
    pub fn find(&self, name: &str) -> Option<&Offered> {
        self.tools.iter().find(|t| t.name == name)
    }

    /// Checks a call's arguments (JSON text, as the model wrote them) against its tool's input
    /// schema: the object to send, or what is wrong, for the model.
    pub fn arguments(&self, tool: &Offered, text: &str) -> Result<JsonObject, String> {
        let text = if text.trim().is_empty() { "{}" } else { text };
        let value: Value = serde_json::from_str(text)
            .map_err(|e| format!("the arguments of `{}` are not JSON: {e}", tool.name))?;
        let Value::Object(object) = value else {
            return Err(format!("the arguments of `{}` must be a JSON object", tool.name));
        };
        if let Some(validator) = &tool.validator {
            let value = Value::Object(object);
            let errors: Vec<String> = validator
                .iter_errors(&value)
                .take(3)
                .map(|e| format!("{} at `{}`", e, e.instance_path()))
                .collect();
            if !errors.is_empty() {
                return Err(format!(
                    "the arguments of `{}` do not match its input schema: {}",
                    tool.name,
                    errors.join("; ")
                ));
            }
            let Value::Object(object) = value else { unreachable!("an object") };
            return Ok(object);
        }
        Ok(object)
    }

    /// Calls `tool` with `arguments`, within its server's timeout: its result as text, cut to
    /// the binding's size, every secret in `secrets` redacted. A failure is a result too (the
    /// model is told, and may try another way).
    pub async fn call(
        &self,
        tool: &Offered,
        arguments: JsonObject,
        secrets: &Secrets,
    ) -> ToolOutcome {
        let (name, settings) = &self.set.servers[tool.server];
        let timeout = settings.timeout.map_or(DEFAULT_TOOL_TIMEOUT, |t| t.0);
        let max = settings.max_result_bytes.unwrap_or(DEFAULT_MAX_RESULT_BYTES);
        let server = {
            let mut slot = self.servers[tool.server].lock().await;
            // A server that died (in an earlier call) is started again for this one.
            if slot.client.is_transport_closed() {
                let started = self.set.start(
                    name,
                    settings,
                    self.processes.as_ref(),
                    self.credentials.as_ref(),
                );
                match tokio::time::timeout(timeout, started).await {
                    Ok(Ok(server)) => *slot = Arc::new(server),
                    Ok(Err(failure)) => {
                        return bounded(ToolOutcome::error(failure.to_string()), max, secrets);
                    }
                    Err(_) => {
                        return ToolOutcome::error(format!(
                            "tool server `{name}` was gone, and did not start again within {}",
                            humantime::format_duration(timeout)
                        ));
                    }
                }
            }
            slot.clone()
        };
        let params = CallToolRequestParams::new(tool.tool.name.clone()).with_arguments(arguments);
        let outcome = match tokio::time::timeout(timeout, server.client.call_tool(params)).await {
            Err(_) => ToolOutcome::error(format!(
                "`{}` gave no result within {} (the call was cancelled)",
                tool.name,
                humantime::format_duration(timeout)
            )),
            Ok(Err(e)) => {
                let tail = match &server.stderr {
                    Some(stderr) => stderr.tail().await,
                    None => String::new(),
                };
                ToolOutcome::error(with_tail(
                    format!("tool server `{}` failed the call: {e}", server.name),
                    &tail,
                ))
            }
            Ok(Ok(result)) => {
                let mut parts: Vec<String> = result.content.iter().map(content_text).collect();
                if parts.is_empty()
                    && let Some(structured) = &result.structured_content
                {
                    parts.push(structured.to_string());
                }
                ToolOutcome {
                    content: parts.join("\n"),
                    is_error: result.is_error == Some(true),
                    cut_from: None,
                }
            }
        };
        bounded(outcome, max, secrets)
    }

    /// Closes every connection (a server process is killed with its group as well).
    pub async fn close(self) {
        for server in self.servers {
            if let Ok(server) = Arc::try_unwrap(server.into_inner()) {
                let _ = server.client.cancel().await;
            }
        }
    }
}

/// A block of a tool result as text: its text, or a line saying what it was.
fn content_text(block: &impl serde::Serialize) -> String {
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
