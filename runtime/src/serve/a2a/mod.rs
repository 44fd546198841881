//! A2A v1.0, on `serve`, with the official SDK (a2aproject's `a2a-server-lf`): its JSON-RPC
//! binding at `/a2a/jsonrpc`, its HTTP+JSON binding under `/a2a/rest`, and the agent card at
//! `/.well-known/agent-card.json`, listing as skills the workflows `/mcp` offers. A task is a
//! thread: `SendMessage` starts one (once per message id), a thread that waits on a person is
//! `input-required` with its question, and the next message on the task answers it (through
//! [`crate::run::waits`], as every channel does); `CancelTask` kills it; streams tell its steps
//! and its model's live text. The same tokens as the API and `/mcp` (a bearer token; acting
//! needs one that may act).

mod push;
mod stream;
mod tasks;

use std::sync::Arc;

use a2a::{
    A2AError, AgentCapabilities, AgentCard, AgentInterface, AgentSkill, CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest, GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest, GetTaskRequest, ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse, ListTasksRequest, ListTasksResponse,
    SendMessageRequest, SendMessageResponse, StreamResponse, SubscribeToTaskRequest, Task,
    TaskPushNotificationConfig,
};
use a2a_server::{AgentCardProducer, RequestHandler, ServiceParams};
use futures::stream::BoxStream;

use super::app::App;
use crate::error::Error;
use crate::ids::ThreadId;

/// The header `serve`'s guard names the caller in (`act:NAME` or `read:NAME`), for the SDK's
/// handler, which is given headers only. A client's own is dropped before.
pub const CALLER_HEADER: &str = "x-uncaged-caller";

/// The routes: both bindings and the agent card.
pub fn routes(app: Arc<App>) -> axum::Router<Arc<App>> {
    let agent = Arc::new(Agent { app: app.clone() });
    axum::Router::new()
        .nest_service("/a2a/jsonrpc", a2a_server::jsonrpc::jsonrpc_router(agent.clone()))
        .nest_service("/a2a/rest", a2a_server::rest::rest_router(agent))
        .route_service(
            a2a_server::WELL_KNOWN_AGENT_CARD_PATH,
            a2a_server::agent_card::agent_card_router(Arc::new(Card { app })),
        )
}

/// Who calls, as the guard named them.
struct Caller {
    name: String,
    may_act: bool,
}

fn caller(params: &ServiceParams) -> Result<Caller, A2AError> {
    let named = params.get(CALLER_HEADER).and_then(|v| v.first());
    let (how, name) = named
        .and_then(|n| n.split_once(':'))
        .ok_or_else(|| A2AError::invalid_request("a token is required"))?;
    Ok(Caller { name: name.to_string(), may_act: how == "act" })
}

fn may_act(caller: &Caller) -> Result<(), A2AError> {
    if caller.may_act {
        return Ok(());
    }
    Err(A2AError::invalid_request(format!(
        "{} may read, not act (make a token without --read-only)",
        caller.name
    )))
}

/// A library error as A2A tells it: what a client got wrong as invalid params, a thread that
/// is not there as a task not found, the rest as an internal error (logged, not detailed).
fn a2a_error(e: Error) -> A2AError {
    match &e {
        Error::UnknownThread(id) => A2AError::task_not_found(id),
        Error::Usage(_)
        | Error::InvalidAnswer { .. }
        | Error::ThreadState { .. }
        | Error::KeyReused(_)
        | Error::UnknownWorkflow { .. }
        | Error::InvalidInput { .. } => A2AError::invalid_params(crate::error::chain_line(&e)),
        _ => {
            tracing::warn!("a2a: {}", crate::error::chain_line(&e));
            A2AError::internal("the server could not do it just now")
        }
    }
}

/// The thread a task id names.
fn thread_of(id: &str) -> Result<ThreadId, A2AError> {
    id.parse().map_err(|_| A2AError::task_not_found(id))
}

/// Keeps the push config a message's configuration carries, for the task it took up.
fn asked_to_push(
    store: &crate::store::Storage,
    owner: &str,
    id: ThreadId,
    req: &SendMessageRequest,
) -> Result<(), A2AError> {
    let asked = req.configuration.as_ref().and_then(|c| c.task_push_notification_config.clone());
    match asked {
        Some(config) => push::create(
            store,
            owner,
            TaskPushNotificationConfig { task_id: id.to_string(), ..config },
        )
        .map(drop),
        None => Ok(()),
    }
}

/// The SDK's handler: every method, over threads.
struct Agent {
    app: Arc<App>,
}

#[async_trait::async_trait]
impl RequestHandler for Agent {
    async fn send_message(
        &self,
        params: &ServiceParams,
        req: SendMessageRequest,
    ) -> Result<SendMessageResponse, A2AError> {
        let caller = caller(params)?;
        may_act(&caller)?;
        let store = &self.app.store;
        let (id, before) = tasks::take(store, &caller.name, &req).await?;
        asked_to_push(store, &caller.name, id, &req)?;
        let immediately = req.configuration.as_ref().and_then(|c| c.return_immediately);
        let record = match immediately {
            Some(true) => store.threads().read(id).map_err(a2a_error)?,
            _ => tasks::settled(store, id, before.as_ref(), tasks::wait_for(store)).await?,
        };
        Ok(SendMessageResponse::Task(tasks::task(&record)))
    }

    async fn send_streaming_message(
        &self,
        params: &ServiceParams,
        req: SendMessageRequest,
    ) -> Result<BoxStream<'static, Result<StreamResponse, A2AError>>, A2AError> {
        let caller = caller(params)?;
        may_act(&caller)?;
        // The steps the task has when the message takes it up (none, for a new one).
        let told_from = match req.message.task_id.as_deref().map(thread_of) {
            Some(id) => self.app.store.threads().read(id?).map_or(0, |r| r.steps.len()),
            None => 0,
        };
        let (id, before) = tasks::take(&self.app.store, &caller.name, &req).await?;
        asked_to_push(&self.app.store, &caller.name, id, &req)?;
        stream::of(&self.app, id, before, told_from)
    }

    async fn get_task(
        &self,
        params: &ServiceParams,
        req: GetTaskRequest,
    ) -> Result<Task, A2AError> {
        caller(params)?;
        let id = thread_of(&req.id)?;
        let record = self.app.store.threads().read(id).map_err(a2a_error)?;
        tasks::offered(&self.app.store, &record)?;
        Ok(tasks::task(&record))
    }

    async fn list_tasks(
        &self,
        params: &ServiceParams,
        req: ListTasksRequest,
    ) -> Result<ListTasksResponse, A2AError> {
        caller(params)?;
        tasks::list(&self.app.store, &req)
    }

    async fn cancel_task(
        &self,
        params: &ServiceParams,
        req: CancelTaskRequest,
    ) -> Result<Task, A2AError> {
        let caller = caller(params)?;
        may_act(&caller)?;
        let store = &self.app.store;
        let id = thread_of(&req.id)?;
        let record = store.threads().read(id).map_err(a2a_error)?;
        tasks::offered(store, &record)?;
        if record.end.is_some() {
            return Err(A2AError::task_not_cancelable(&req.id));
        }
        crate::run::control::kill(store, id).await.map_err(a2a_error)?;
        tracing::info!("a2a: {} canceled thread {id}", caller.name);
        let record = store.threads().read(id).map_err(a2a_error)?;
        Ok(tasks::task(&record))
    }

    async fn subscribe_to_task(
        &self,
        params: &ServiceParams,
        req: SubscribeToTaskRequest,
    ) -> Result<BoxStream<'static, Result<StreamResponse, A2AError>>, A2AError> {
        caller(params)?;
        let id = thread_of(&req.id)?;
        let record = self.app.store.threads().read(id).map_err(a2a_error)?;
        tasks::offered(&self.app.store, &record)?;
        if record.end.is_some() {
            return Err(A2AError::unsupported_operation(format!(
                "task {id} has ended; GetTask reads it"
            )));
        }
        stream::of(&self.app, id, None, record.steps.len())
    }

    async fn create_push_config(
        &self,
        params: &ServiceParams,
        req: TaskPushNotificationConfig,
    ) -> Result<TaskPushNotificationConfig, A2AError> {
        let caller = caller(params)?;
        may_act(&caller)?;
        push::create(&self.app.store, &caller.name, req)
    }

    async fn get_push_config(
        &self,
        params: &ServiceParams,
        req: GetTaskPushNotificationConfigRequest,
    ) -> Result<TaskPushNotificationConfig, A2AError> {
        caller(params)?;
        push::get(&self.app.store, &req)
    }

    async fn list_push_configs(
        &self,
        params: &ServiceParams,
        req: ListTaskPushNotificationConfigsRequest,
    ) -> Result<ListTaskPushNotificationConfigsResponse, A2AError> {
        caller(params)?;
        push::list(&self.app.store, &req)
    }

    async fn delete_push_config(
        &self,
        params: &ServiceParams,
        req: DeleteTaskPushNotificationConfigRequest,
    ) -> Result<(), A2AError> {
        let caller = caller(params)?;
        may_act(&caller)?;
        push::delete(&self.app.store, &req)
    }

    async fn get_extended_agent_card(
        &self,
        _params: &ServiceParams,
        _req: GetExtendedAgentCardRequest,
    ) -> Result<AgentCard, A2AError> {
        Err(A2AError::extended_card_not_configured())
    }
}

/// The agent card: this server as one agent whose skills are the workflows offered.
struct Card {
    app: Arc<App>,
}

impl AgentCardProducer for Card {
    fn card(&self) -> AgentCard {
        let store = &self.app.store;
        let public = store.config().ok().and_then(|c| c.serve.public_url);
        let base = public.unwrap_or_else(|| self.app.own_url.clone());
        let base = base.trim_end_matches('/');
        let skills = crate::serve::mcp::tools::offered(store)
            .unwrap_or_default()
            .into_iter()
            .map(|offered| AgentSkill {
                id: offered.name.clone(),
                name: offered.name,
                description: offered.description,
                tags: vec!["workflow".into()],
                examples: None,
                input_modes: None,
                output_modes: None,
                security_requirements: None,
            })
            .collect();
        let bearer = a2a::SecurityScheme::HttpAuth(a2a::HttpAuthSecurityScheme {
            scheme: "bearer".into(),
            description: Some(
                "A token of this server (`uncaged-workflow token create --name NAME`)".into(),
            ),
            bearer_format: None,
        });
        AgentCard {
            name: "uncaged-workflow".into(),
            description: "Runs multi-role AI agent workflows, each a sandboxed WebAssembly \
                component; a task is a thread of one. Name the workflow as the message's \
                `metadata.skill` (none needed when one is offered)."
                .into(),
            version: env!("CARGO_PKG_VERSION").into(),
            supported_interfaces: vec![
                AgentInterface::new(format!("{base}/a2a/jsonrpc"), a2a::TRANSPORT_PROTOCOL_JSONRPC),
                AgentInterface::new(format!("{base}/a2a/rest"), a2a::TRANSPORT_PROTOCOL_HTTP_JSON),
            ],
            capabilities: AgentCapabilities {
                streaming: Some(true),
                push_notifications: Some(true),
                extensions: None,
                extended_agent_card: Some(false),
            },
            default_input_modes: vec!["text/plain".into(), "application/json".into()],
            default_output_modes: vec!["text/plain".into(), "application/json".into()],
            skills,
            provider: None,
            documentation_url: None,
            icon_url: None,
            security_schemes: Some([("bearer".to_string(), bearer)].into()),
            security_requirements: Some(vec![[("bearer".to_string(), vec![])].into()]),
            signatures: None,
        }
    }
}
