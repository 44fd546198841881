//! `kind: a2a`: another agent answers a role, over A2A v1.0 with the official SDK's client
//! (`a2a-client-lf`). The agent card at the binding's `url` says how to reach it; the role's
//! instructions and the thread so far go as one message (its id made from the thread, the step
//! and the role, so that a call made again after a crash is the same message to an agent that
//! keeps message ids); the task is followed until it ends, within the binding's timeout. The
//! answer is the task's artifacts (their text, and a data part as the step's meta), journaled
//! as any agent's. A task that asks for input fails the call with its question: a remote agent
//! that needs a person is asked by its own channels.

use std::sync::Arc;
use std::time::Duration;

use a2a::{
    AgentCard, GetTaskRequest, Message, Part, PartContent, Role, SendMessageConfiguration,
    SendMessageRequest, SendMessageResponse, Task, TaskState,
};
use a2a_client::jsonrpc::JsonRpcTransportFactory;
use a2a_client::rest::RestTransportFactory;
use a2a_client::{A2AClientFactory, auth::AuthInterceptor};

use super::{AgentAnswer, AgentContext, AgentFailure};

/// An A2A agent binding.
#[derive(Debug, Clone)]
pub struct A2aAgent {
    /// The agent's base URL: its card is at `/.well-known/agent-card.json` under it.
    pub url: String,
    /// The environment variable holding its bearer token, if it needs one.
    pub token_env: Option<String>,
    /// The skill to ask for (sent as the message's `metadata.skill`).
    pub skill: Option<String>,
    /// How long a call may take, the task followed included.
    pub timeout: Duration,
}

/// How long a call may take unless the binding's `timeout` says: a remote agent's task may be
/// long work.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// How often a task that has not ended is read again.
const POLL: Duration = Duration::from_millis(200);

/// The longest answer taken from a remote agent.
const MAX_ANSWER: usize = 1 << 20;

impl A2aAgent {
    /// Asks the agent once.
    pub async fn answer(&self, context: &AgentContext) -> Result<AgentAnswer, AgentFailure> {
        let http = crate::http::shared_client(self.timeout)
            .map_err(|e| AgentFailure::Unavailable(format!("no HTTP client: {e}")))?;
        let card = self.card(&http).await?;
        let mut factory = A2AClientFactory::builder()
            .no_defaults()
            .register(Arc::new(JsonRpcTransportFactory::new(Some(http.clone()))))
            .register(Arc::new(RestTransportFactory::new(Some(http))));
        if let Some(var) = &self.token_env {
            let token = std::env::var(var).ok().filter(|t| !t.is_empty()).ok_or_else(|| {
                AgentFailure::Unavailable(format!("${var} (the A2A agent's token) is not set"))
            })?;
            factory = factory.with_interceptor(Arc::new(AuthInterceptor::bearer(token)));
        }
        let client = factory
            .build()
            .create_from_card(&card)
            .await
            .map_err(|e| AgentFailure::Unavailable(format!("A2A agent {}: {e}", self.url)))?;
        let message = self.message(context);
        let request = SendMessageRequest {
            message,
            configuration: Some(SendMessageConfiguration {
                accepted_output_modes: Some(vec!["text/plain".into(), "application/json".into()]),
                task_push_notification_config: None,
                history_length: None,
                return_immediately: None,
            }),
            metadata: None,
            tenant: None,
        };
        let deadline = tokio::time::Instant::now() + self.timeout;
        let sent = client.send_message(&request).await.map_err(|e| failed(&self.url, &e))?;
        let mut task = match sent {
            SendMessageResponse::Message(message) => return Ok(answer_of(&message.parts)),
            SendMessageResponse::Task(task) => task,
        };
        loop {
            match task.status.state {
                TaskState::Completed => return Ok(result_of(&task)),
                TaskState::InputRequired | TaskState::AuthRequired => {
                    return Err(AgentFailure::Failed {
                        message: format!(
                            "A2A agent {} asks for input: {}",
                            self.url,
                            status_text(&task)
                        ),
                        transient: false,
                    });
                }
                TaskState::Failed | TaskState::Canceled | TaskState::Rejected => {
                    return Err(AgentFailure::Failed {
                        message: format!(
                            "A2A agent {}: task {} {:?}: {}",
                            self.url,
                            task.id,
                            task.status.state,
                            status_text(&task)
                        ),
                        transient: false,
                    });
                }
                _ => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(AgentFailure::Timeout(format!(
                    "A2A agent {}: task {} did not end in {:?}",
                    self.url, task.id, self.timeout
                )));
            }
            tokio::time::sleep(POLL).await;
            let get = GetTaskRequest { id: task.id.clone(), history_length: None, tenant: None };
            task = client.get_task(&get).await.map_err(|e| failed(&self.url, &e))?;
        }
    }

    /// The agent's card.
    async fn card(&self, http: &reqwest::Client) -> Result<AgentCard, AgentFailure> {
        let url = format!("{}{}", self.url.trim_end_matches('/'), "/.well-known/agent-card.json");
        let response = http.get(&url).send().await.map_err(|e| AgentFailure::Failed {
            message: format!("A2A agent card {url}: {}", e.without_url()),
            transient: true,
        })?;
        if !response.status().is_success() {
            return Err(AgentFailure::Unavailable(format!(
                "A2A agent card {url}: HTTP {}",
                response.status().as_u16()
            )));
        }
        response.json::<AgentCard>().await.map_err(|e| {
            AgentFailure::Unavailable(format!("A2A agent card {url} does not read: {e}"))
        })
    }

    /// The role's instructions and the thread, as one message.
    fn message(&self, context: &AgentContext) -> Message {
        let text = format!("{}\n\n{}", context.role.system_prompt.trim(), context.render());
        let mut message = Message::new(Role::User, vec![Part::text(text)]);
        message.message_id = format!(
            "{}-{}-{}",
            context.thread_id,
            context.steps.len(),
            crate::store::bundles::sha256_hex(context.role.name.as_bytes())[..12].to_owned()
        );
        if let Some(skill) = &self.skill {
            message.metadata = Some([("skill".to_string(), serde_json::json!(skill))].into());
        }
        message
    }
}

fn failed(url: &str, e: &a2a::A2AError) -> AgentFailure {
    // A server's own failure may pass; what it refused will not.
    let transient = e.code == a2a::error_code::INTERNAL_ERROR;
    AgentFailure::Failed { message: format!("A2A agent {url}: {}", e.message), transient }
}

/// What a task's status message says.
fn status_text(task: &Task) -> String {
    let parts = task.status.message.as_ref().map(|m| m.parts.as_slice()).unwrap_or_default();
    answer_of(parts).content
}

/// A completed task's answer: its artifacts' parts (or, without any, its status message's).
fn result_of(task: &Task) -> AgentAnswer {
    let parts: Vec<Part> =
        task.artifacts.iter().flatten().flat_map(|a| a.parts.iter().cloned()).collect();
    if parts.is_empty() {
        return AgentAnswer { content: status_text(task), meta: None, usage: None };
    }
    answer_of(&parts)
}

/// Text parts joined as the content; the first data part that is an object as the meta.
fn answer_of(parts: &[Part]) -> AgentAnswer {
    let mut content = String::new();
    let mut meta = None;
    for part in parts {
        match &part.content {
            PartContent::Text(text) => {
                if !content.is_empty() {
                    content.push('\n');
                }
                content.push_str(text);
            }
            PartContent::Data(value) if meta.is_none() && value.is_object() => {
                meta = Some(value.clone());
            }
            _ => {}
        }
    }
    if content.len() > MAX_ANSWER {
        let mut cut = MAX_ANSWER;
        while !content.is_char_boundary(cut) {
            cut -= 1;
        }
        content.truncate(cut);
    }
    AgentAnswer { content, meta, usage: None }
}
