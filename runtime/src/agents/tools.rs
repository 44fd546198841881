//! A durable agent's tools: the MCP servers its binding names (`tools:` in config.yaml),
//! connected through the official Rust SDK, their tools offered to the model under names it
//! can call, and each call checked, bounded and redacted.
//!
//! A server run over stdio is started once per thread: the thread's [`ToolSet`] (bound with
//! the thread's agents) keeps it for every later agent call and turn of the thread while it
//! runs, and it stops with them — when the thread rests, ends or is killed — or is started
//! again after a crash (its process group, listed for the thread, is stopped first). Nothing
//! is shared between threads. A server reached over HTTP is connected for each call.
//!
//! The servers run with the authority of whoever configured them; what comes back from them
//! is untrusted text. So a server process gets only the variables its binding names (and
//! `PATH`), in a process group of its own that dies with its thread's run; an argument is
//! checked against the tool's input schema before the server sees it; a result is cut to its
//! binding's size and has every secret the host holds redacted before the model or the journal
//! sees it.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation, JsonObject,
};
use rmcp::service::{RoleClient, RunningService, ServiceExt};
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransport, StreamableHttpClientTransportConfig,
};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

use super::processes::{GroupGuard, Reaped, spawn_group};
use super::tool_calls::content_text;
pub use super::tool_calls::{Offered, ToolOutcome, bounded, model_name};
use super::{AgentFailure, AgentProcesses, Secrets};
use crate::store::credentials::CredentialBackend;
use crate::store::tool_servers::{DEFAULT_MAX_RESULT_BYTES, DEFAULT_TOOL_TIMEOUT, ToolServer};

/// The largest message a server may send (a result is cut to its binding's size after it
/// arrives; one past this is dropped unread by the SDK, and its call times out).
const MAX_MESSAGE_BYTES: usize = 256 << 20;

/// How much of a server's standard error a failure message quotes.
const STDERR_TAIL: usize = 400;

/// The tool servers of one binding in one thread, with the values of the variables they name,
/// and those of its servers run over stdio once started.
#[derive(Debug)]
pub struct ToolSet {
    servers: Vec<(String, ToolServer)>,
    /// The values of the variables the servers name (their env, their headers' `${NAME}`).
    values: BTreeMap<String, String>,
    /// Where a server's program runs: the directory the run was asked from.
    cwd: Option<PathBuf>,
    /// Tools a person approves before each call beside the bindings' own, as a run asked
    /// (`server.tool`, `server.*`).
    approve: Vec<String>,
    /// Each stdio server of the binding once started, kept for the thread's later calls (a
    /// slot per server; one reached over HTTP is connected per call and never kept here).
    live: Vec<Slot>,
}

/// Where a connected server is kept: started again when it is found gone (it died).
type Slot = Arc<tokio::sync::Mutex<Option<Arc<Server>>>>;

/// A copy keeps no server of the original's: a server's state belongs to one thread.
impl Clone for ToolSet {
    fn clone(&self) -> Self {
        ToolSet {
            servers: self.servers.clone(),
            values: self.values.clone(),
            cwd: self.cwd.clone(),
            approve: self.approve.clone(),
            live: self.servers.iter().map(|_| Slot::default()).collect(),
        }
    }
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
        let servers: Vec<_> = servers.iter().map(|(n, s)| (n.clone(), s.clone())).collect();
        let live = servers.iter().map(|_| Slot::default()).collect();
        Ok(ToolSet { servers, values, cwd: cwd.map(Path::to_path_buf), approve: Vec::new(), live })
    }

    /// Has a person approve each call of the tools `patterns` name too.
    pub fn approve(&mut self, patterns: &[String]) {
        self.approve.extend(patterns.iter().cloned());
    }

    /// Reaches every server (a stdio server this thread started before, unless it died, or
    /// one started now), lists their tools, and keeps those the model may be offered: the
    /// ones each binding allows, and of them, when `offered` is given (the set this call was
    /// first offered, from its journal), only those — a tool a server added since is not
    /// offered.
    pub async fn connect(
        self: &Arc<Self>,
        processes: Option<&Arc<AgentProcesses>>,
        offered: Option<&[String]>,
        credentials: Option<Arc<dyn CredentialBackend>>,
    ) -> Result<ToolBox, AgentFailure> {
        let credentials = credentials.as_ref();
        let connecting =
            self.servers.iter().enumerate().map(|(index, (name, server))| async move {
                let timeout = server.timeout.map_or(DEFAULT_TOOL_TIMEOUT, |t| t.0);
                let slot = match server.command.is_some() {
                    true => self.live[index].clone(),
                    false => Slot::default(),
                };
                let connected =
                    self.reach(&slot, index, processes, credentials).await.map_err(|failure| {
                        match failure {
                            Reached::Late => AgentFailure::Failed {
                                message: format!(
                                    "tool server `{name}` did not answer within {}",
                                    humantime::format_duration(timeout)
                                ),
                                transient: true,
                            },
                            Reached::Failed(failure) => failure,
                        }
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
                Ok::<_, AgentFailure>((slot, connected, listed))
            });
        let mut slots = Vec::new();
        let mut tools = Vec::new();
        for (index, connected) in
            futures::future::join_all(connecting).await.into_iter().enumerate()
        {
            let (slot, server, listed) = connected?;
            let config = &self.servers[index].1;
            for tool in listed {
                if let Some(offer) = Offered::of(index, &server.name, config, tool, &self.approve) {
                    tools.push(offer);
                }
            }
            slots.push(slot);
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
            slots,
            tools,
            set: self.clone(),
            processes: processes.cloned(),
            credentials: credentials.cloned(),
        })
    }

    /// The server `slot` keeps for server `index`, started (within its timeout) if it has
    /// none or the one it has is gone.
    async fn reach(
        self: &Arc<Self>,
        slot: &Slot,
        index: usize,
        processes: Option<&Arc<AgentProcesses>>,
        credentials: Option<&Arc<dyn CredentialBackend>>,
    ) -> Result<Arc<Server>, Reached> {
        let (name, server) = &self.servers[index];
        let mut kept = slot.lock().await;
        if let Some(live) = kept.as_ref().filter(|s| !s.client.is_transport_closed()) {
            return Ok(live.clone());
        }
        let timeout = server.timeout.map_or(DEFAULT_TOOL_TIMEOUT, |t| t.0);
        // On a task of its own, outside the call's span: the SDK's service keeps the span it
        // was started in for as long as the server runs, and a server kept for the thread
        // would hold the first call's span open until the thread's run ends.
        let (set, processes, credentials) =
            (self.clone(), processes.cloned(), credentials.cloned());
        let mut starting = tokio::spawn(async move {
            let (name, server) = &set.servers[index];
            set.start(name, server, processes.as_ref(), credentials.as_ref()).await
        });
        let started = match tokio::time::timeout(timeout, &mut starting).await {
            Ok(Ok(started)) => Arc::new(started.map_err(Reached::Failed)?),
            Ok(Err(panicked)) => {
                return Err(Reached::Failed(AgentFailure::Failed {
                    message: format!("tool server `{name}`: starting it failed: {panicked}"),
                    transient: true,
                }));
            }
            Err(_) => {
                starting.abort();
                return Err(Reached::Late);
            }
        };
        *kept = Some(started.clone());
        Ok(started)
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

/// A connected server (shown by name: its client and process say nothing more to a reader).
struct Server {
    name: String,
    client: RunningService<RoleClient, ClientConfig>,
    /// A server run over stdio: its process (reaped once it exits, killed when dropped), and
    /// the guard that kills its process group (what it started) and unlists it.
    _process: Option<(Reaped, Option<GroupGuard>)>,
    stderr: Option<StderrTail>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("name", &self.name).finish_non_exhaustive()
    }
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

/// Why a server could not be reached.
enum Reached {
    /// It did not start within its timeout.
    Late,
    Failed(AgentFailure),
}

/// The servers of one agent call, connected, and the tools their model is offered.
pub struct ToolBox {
    /// Where each server is kept (the thread's slot of a stdio server, this call's own of one
    /// over HTTP), started again when it is found gone (it died in a call).
    slots: Vec<Slot>,
    tools: Vec<Offered>,
    set: Arc<ToolSet>,
    processes: Option<Arc<AgentProcesses>>,
    credentials: Option<Arc<dyn CredentialBackend>>,
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
        // A server that died (in an earlier call) is started again for this one.
        let slot = &self.slots[tool.server];
        let reached =
            self.set.reach(slot, tool.server, self.processes.as_ref(), self.credentials.as_ref());
        let server = match reached.await {
            Ok(server) => server,
            Err(Reached::Failed(failure)) => {
                return bounded(ToolOutcome::error(failure.to_string()), max, secrets);
            }
            Err(Reached::Late) => {
                return ToolOutcome::error(format!(
                    "tool server `{name}` was gone, and did not start again within {}",
                    humantime::format_duration(timeout)
                ));
            }
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

    /// Closes this call's own connections (to servers over HTTP); the thread's stdio servers
    /// stay for its next call, and stop with its run.
    pub async fn close(self) {
        for (index, slot) in self.slots.into_iter().enumerate() {
            if Arc::ptr_eq(&slot, &self.set.live[index]) {
                continue;
            }
            let kept = slot.lock().await.take();
            if let Some(server) = kept.and_then(|server| Arc::try_unwrap(server).ok()) {
                let _ = server.client.cancel().await;
            }
        }
    }
}
