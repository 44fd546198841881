//! The MCP server: every registered workflow a tool for AI assistants (Claude, Cursor, VS Code,
//! other agents), each call a durable thread — it runs whatever happens to the connection, can
//! wait for a person, and can be cancelled. One handler ([`McpServer`]) behind two transports:
//! Streamable HTTP at `serve`'s `/mcp` (guarded as the API is, see [`super::http`]) and stdio
//! for `uncaged-workflow mcp`.
//!
//! - [`tools`]: what is offered — the workflows, and `list_threads`, `get_thread`,
//!   `answer_thread`, `kill_thread` — and the operations' calls.
//! - [`calls`]: a workflow's call: a thread started once per call, followed with progress
//!   notifications until it ends, asks a person, or the wait is over.
//! - [`answers`]: what the thread answers the call with: its end, a person's question (and
//!   the answer read back), or how to follow it.
//! - [`tasks`]: the tasks extension: a call's thread as a task to poll, answer and cancel.
//! - [`core_tasks`]: the tasks of protocol 2025-11-25, which the SDK does not know, for the
//!   clients on that version; [`stdio`]: the stdio transport that routes them.
//!
//! The rules are the library's: a start is [`crate::run::actions::start_once`] (the API's
//! idempotency path), an answer [`crate::run::actions::answer`], a kill
//! [`crate::run::control::kill`]; this module only speaks the protocol.

pub mod answers;
pub mod calls;
pub mod core_tasks;
pub mod http;
pub mod stdio;
pub mod tasks;
pub mod tools;

use std::collections::HashMap;
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, CancelledNotificationParam,
    CustomRequest, CustomResult, GetTaskParams, GetTaskResult, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, SubscriptionFilter, UpdateTaskParams,
};
use rmcp::service::{NotificationContext, RequestContext, RoleServer, SubscriptionContext};
use rmcp::{ErrorData as McpError, ServerHandler};

use super::api::Caller;
use crate::ids::ThreadId;
use crate::store::Storage;

/// The `_meta` key of a `tools/call` that makes a call sent again start no second thread.
pub const IDEMPOTENCY_KEY: &str = "uncaged-workflow/idempotency-key";

/// The `_meta` key of a result or task naming the thread a call started.
pub const THREAD_KEY: &str = "uncaged-workflow/thread";

/// How often the offered workflows are looked at for `notifications/tools/list_changed` (by
/// one task a process), and a session's connection for whether it is gone.
const LIST_CHANGED_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// What every connection's handler shares.
#[derive(Debug)]
pub struct Shared {
    pub store: Storage,
    /// Calls in progress, by the connection and request id they came with: a
    /// `notifications/cancelled` for one kills its thread.
    in_flight: parking_lot::Mutex<HashMap<(String, String), Following>>,
    /// The offered workflows' names, as this process's one watcher of them last read them.
    offered: std::sync::OnceLock<tokio::sync::watch::Receiver<Option<Vec<String>>>>,
}

impl Shared {
    pub fn new(store: Storage) -> Arc<Shared> {
        Arc::new(Shared { store, in_flight: Default::default(), offered: Default::default() })
    }

    /// The offered workflows' names and each change of them. One task a process reads them
    /// (every [`LIST_CHANGED_EVERY`], and only while a connection watches), however many
    /// connections are told.
    fn offered(&self) -> tokio::sync::watch::Receiver<Option<Vec<String>>> {
        let watched = self.offered.get_or_init(|| {
            let (sender, receiver) =
                tokio::sync::watch::channel(tools::offered_names(&self.store).ok());
            let store = self.store.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(LIST_CHANGED_EVERY).await;
                    // One receiver is this map's own: past it, a connection watches.
                    if sender.receiver_count() <= 1 {
                        continue;
                    }
                    let Ok(now) = tools::offered_names(&store) else { continue };
                    sender.send_if_modified(|seen| {
                        let changed = seen.as_ref() != Some(&now);
                        *seen = Some(now);
                        changed
                    });
                }
            });
            receiver
        });
        let mut receiver = watched.clone();
        receiver.mark_unchanged();
        receiver
    }
}

/// A call's thread, and since when the call no longer waits on it (cut short).
#[derive(Debug, Clone, Copy)]
struct Following {
    thread: ThreadId,
    cut: Option<std::time::Instant>,
}

/// How long a cut call is remembered: the SDK cuts a call at once when its cancellation comes,
/// and tells the handler after, which must still find the call's thread.
const REMEMBER_CUT: std::time::Duration = std::time::Duration::from_secs(60);

/// The handler of one connection (a stdio process, an HTTP session, or one stateless HTTP
/// request).
#[derive(Debug, Clone)]
pub struct McpServer {
    shared: Arc<Shared>,
    /// Who calls, when the transport says it once for all (stdio: the local user); over HTTP
    /// each request carries its own, put there by `serve`'s guard.
    caller: Option<Caller>,
    /// Names this connection, for request ids (unique only within a connection) and
    /// cancellations: a random id for stdio.
    connection: Option<String>,
}

impl McpServer {
    /// The handler of the stdio connection of `uncaged-workflow mcp`: the local user's, who
    /// may do anything the home allows.
    pub fn stdio(shared: Arc<Shared>) -> McpServer {
        McpServer {
            shared,
            caller: Some(Caller { name: "stdio".into(), may_act: true }),
            connection: Some(format!("stdio:{}", crate::ids::random_hex(8))),
        }
    }

    /// The handler of an HTTP session (or a stateless request); its callers come with each
    /// request.
    pub fn http(shared: Arc<Shared>) -> McpServer {
        McpServer { shared, caller: None, connection: None }
    }

    pub fn store(&self) -> &Storage {
        &self.shared.store
    }

    /// Who sends this request: the transport's caller, or the one `serve`'s guard found for
    /// the HTTP request.
    pub fn caller(&self, context: &RequestContext<RoleServer>) -> Result<Caller, McpError> {
        self.caller_in(&context.extensions)
            .ok_or_else(|| McpError::invalid_request("no caller: a token is required", None))
    }

    /// Who sends a message whose transport put `extensions` with it.
    fn caller_in(&self, extensions: &rmcp::model::Extensions) -> Option<Caller> {
        if let Some(caller) = &self.caller {
            return Some(caller.clone());
        }
        let parts = extensions.get::<axum::http::request::Parts>()?;
        parts.extensions.get::<Caller>().cloned()
    }

    /// The connection a request came on, when there is one to name it by: the stdio process,
    /// or an HTTP session (`Mcp-Session-Id`). Stateless HTTP requests have none.
    pub fn connection(&self, context: &RequestContext<RoleServer>) -> Option<String> {
        self.connection_in(&context.extensions)
    }

    /// The connection of a message whose transport put `extensions` with it.
    fn connection_in(&self, extensions: &rmcp::model::Extensions) -> Option<String> {
        if let Some(connection) = &self.connection {
            return Some(connection.clone());
        }
        let parts = extensions.get::<axum::http::request::Parts>()?;
        let session = parts.headers.get("mcp-session-id")?.to_str().ok()?;
        Some(format!("session:{session}"))
    }

    /// The key a request's cancellation finds its call by.
    fn in_flight_key(
        connection: Option<&str>,
        caller: &str,
        id: &impl ToString,
    ) -> (String, String) {
        (connection.unwrap_or(caller).to_string(), id.to_string())
    }

    /// Notes that request `id` follows thread `thread`, until the guard returned is dropped.
    pub fn in_flight(
        &self,
        context: &RequestContext<RoleServer>,
        caller: &Caller,
        thread: ThreadId,
    ) -> InFlight {
        let key =
            Self::in_flight_key(self.connection(context).as_deref(), &caller.name, &context.id);
        let mut in_flight = self.shared.in_flight.lock();
        in_flight.retain(|_, f| f.cut.is_none_or(|at| at.elapsed() < REMEMBER_CUT));
        in_flight.insert(key.clone(), Following { thread, cut: None });
        InFlight { shared: self.shared.clone(), key, answered: false }
    }
}

/// A call in progress: gone from the map when it is answered; when it is cut short (its
/// request cancelled, or its connection gone), remembered a while for the cancellation.
pub struct InFlight {
    shared: Arc<Shared>,
    key: (String, String),
    answered: bool,
}

impl InFlight {
    /// The call is answered: nothing can cancel it now.
    pub fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut in_flight = self.shared.in_flight.lock();
        if self.answered {
            in_flight.remove(&self.key);
        } else if let Some(following) = in_flight.get_mut(&self.key) {
            following.cut = Some(std::time::Instant::now());
        }
    }
}

/// A library error as the protocol's: a bad request is the client's (invalid params), the rest
/// the server's; one line either way.
pub fn protocol_error(e: crate::error::Error) -> McpError {
    use crate::error::exit;
    let message = crate::error::chain_line(&e);
    match e.exit_code() {
        exit::USAGE | exit::DATA | exit::NOT_FOUND | exit::STATE => {
            McpError::invalid_params(message, None)
        }
        _ => McpError::internal_error(message, None),
    }
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        let capabilities =
            ServerCapabilities::builder().enable_tools().enable_tool_list_changed().enable_tasks();
        ServerConfig::new(capabilities.build())
            .with_server_info(
                Implementation::new("uncaged-workflow", env!("CARGO_PKG_VERSION"))
                    .with_title("uncaged-workflow"),
            )
            .with_instructions(
                "Each workflow tool starts a durable thread of that workflow and answers with its \
                 result. A thread that waits for a person asks through the client where it can, \
                 or answers with its id: continue it with answer_thread, follow it with \
                 get_thread, stop it with kill_thread.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let caller = self.caller(&context)?;
        let tools = tools::list(self.store(), caller.may_act).map_err(protocol_error)?;
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let caller = self.caller(&context)?;
        if let Some(operation) = tools::Operation::named(&request.name) {
            return tools::operate(self.store(), operation, &caller, request.arguments)
                .await
                .map(CallToolResponse::Complete);
        }
        calls::call(self, &caller, request, context).await
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        self.caller(&context)?;
        tasks::get(self.store(), &request.task_id).await.map(GetTaskResult::new)
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        tools::may_act(&self.caller(&context)?)?;
        tasks::update(self.store(), &request.task_id, &request.input_responses).await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        tools::may_act(&self.caller(&context)?)?;
        tasks::cancel(self.store(), &request.task_id).await
    }

    /// The task messages of a 2025-11-25 client, which its transport routed here (see
    /// [`core_tasks`]).
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        match core_tasks::handle(self, &request, context).await {
            Some(answer) => answer,
            None => Err(McpError::new(
                rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                crate::terminal::line(&request.method).into_owned(),
                None,
            )),
        }
    }

    /// A client that cancels a call it waits on kills the call's thread (a dropped connection
    /// does not: the thread runs on, and its result is read after).
    async fn on_cancelled(
        &self,
        notification: CancelledNotificationParam,
        context: NotificationContext<RoleServer>,
    ) {
        let Some(caller) = self.caller_in(&context.extensions).filter(|c| c.may_act) else {
            return;
        };
        let connection = self.connection_in(&context.extensions);
        let Some(request) = &notification.request_id else { return };
        let key = Self::in_flight_key(connection.as_deref(), &caller.name, request);
        let thread = self.shared.in_flight.lock().remove(&key).map(|f| f.thread);
        if let Some(thread) = thread {
            tracing::info!("mcp: the call of thread {thread} was cancelled by its client");
            if let Err(e) = crate::run::control::kill(self.store(), thread).await {
                tracing::warn!("mcp: cancelling thread {thread}: {}", crate::error::chain_line(&e));
            }
        }
    }

    /// A client that keeps a session (stdio, an HTTP session) is told when the offered tools
    /// change, while it is connected.
    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        let mut offered = self.shared.offered();
        let peer = context.peer.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    changed = offered.changed() => if changed.is_err() { return },
                    // A connection gone is let go of, changes or not.
                    _ = tokio::time::sleep(LIST_CHANGED_EVERY) => {
                        if peer.is_transport_closed() {
                            return;
                        }
                        continue;
                    }
                }
                if peer.notify_tool_list_changed().await.is_err() {
                    return;
                }
            }
        });
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        requested
            .tools_list_changed
            .is_some_and(|asked| asked)
            .then(|| SubscriptionFilter::builder().tools_list_changed().build())
    }

    /// `subscriptions/listen` (2026-07-28): the same news of the offered tools, on the
    /// listening request's stream.
    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        let mut offered = self.shared.offered();
        loop {
            tokio::select! {
                _ = context.cancelled() => return Ok(()),
                changed = offered.changed() => if changed.is_err() { return Ok(()) },
            }
            if context.sink().notify_tool_list_changed().await.is_err() {
                return Ok(());
            }
        }
    }
}

/// Serves MCP on this process's stdin and stdout until the client closes them.
pub async fn serve_stdio(store: Storage) -> crate::error::Result<()> {
    use rmcp::ServiceExt;
    let server = McpServer::stdio(Shared::new(store));
    let running = server
        .serve(stdio::transport())
        .await
        .map_err(|e| crate::error::Error::Host(format!("mcp over stdio: {e}")))?;
    running
        .waiting()
        .await
        .map_err(|e| crate::error::Error::Host(format!("mcp over stdio: {e}")))?;
    Ok(())
}
