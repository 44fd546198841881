//! Agents: the execution capability behind a role — a program, a model, a person, or the
//! built-in scripted answers — bound by the host from `config.yaml` and CLI flags, never by
//! the bundle; the failure policy every call goes through; and the extractor that turns an
//! answer into a role's typed meta.

pub mod a2a;
pub mod binding;
pub mod command;
pub mod extract;
pub mod host;
pub mod human;
pub mod oauth;
pub mod openai;
pub mod planner;
pub mod processes;
pub mod retry;
pub mod scripted;
pub mod tool_calls;
pub mod tool_loop;
pub mod tools;

use std::sync::Arc;

use serde::Serialize;

use crate::store::debug_log::DebugLog;
use crate::store::pauses::ToolWait;
use crate::store::records::StepRecord;
use crate::telemetry::{self, AgentCall};

pub use binding::{AgentSet, Secrets};
pub use command::CommandAgent;
pub use host::{ToolReplay, TurnHost};
pub use openai::OpenAiAgent;
pub use processes::AgentProcesses;
pub use retry::{RetryPolicy, with_retries};
pub use scripted::ScriptedAgent;
pub use tool_loop::CallTurns;

/// What an agent is told: the thread so far, the role it answers as, and any input the bundle
/// gave this call. This is also the JSON a `command` agent reads on stdin.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentContext {
    pub thread_id: String,
    pub prompt: String,
    /// Every step persisted so far. Shared, not copied: the host's own record of the thread,
    /// handed to each of a step's calls.
    pub steps: Arc<Vec<StepRecord>>,
    pub role: RoleRef,
    /// Input for this call only (a DAG step's resolved inputs, say), shown after the thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
}

/// The role an agent answers as.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RoleRef {
    pub name: String,
    pub system_prompt: String,
}

impl AgentContext {
    /// The thread rendered for a reader (a model or a person): the task, each step so far,
    /// and whose turn it is.
    pub fn render(&self) -> String {
        let mut text = format!("# Task\n\n{}\n", self.prompt.trim());
        for (i, step) in self.steps.iter().enumerate() {
            text.push_str(&format!(
                "\n# Step {}: {}\n\n{}\n",
                i + 1,
                step.role,
                step.content.trim()
            ));
        }
        if let Some(input) = &self.input {
            text.push_str(&format!("\n# Input for this step\n\n{}\n", input.trim()));
        }
        text.push_str(&format!(
            "\n# Your turn\n\nYou are the {}. Answer as the {}.\n",
            self.role.name, self.role.name
        ));
        text
    }
}

/// An agent's answer: its text, and the structured meta if the agent gave one itself.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentAnswer {
    pub content: String,
    pub meta: Option<serde_json::Value>,
    /// The tokens it cost, if the agent said (see [`Usage`](crate::store::records::Usage)).
    pub usage: Option<crate::store::records::Usage>,
}

/// Why an agent gave no answer. All but `Waiting` become the WIT `agent-error` the bundle sees.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AgentFailure {
    /// The binding cannot be used (program missing, no key…). Not retried.
    #[error("{0}")]
    Unavailable(String),
    /// The agent ran and failed. Retried if `transient`.
    #[error("{message}")]
    Failed { message: String, transient: bool },
    /// No answer in time. Retried.
    #[error("{0}")]
    Timeout(String),
    /// The service asked to be called again later (HTTP 429 with `Retry-After`): retried
    /// after that long, not after the binding's own delay.
    #[error("{message}")]
    RateLimited { message: String, retry_after: std::time::Duration },
    /// A person must answer and nobody is at a terminal: the thread waits for `answer`.
    #[error("waiting for a human answer")]
    Waiting,
    /// A durable agent's call needs a person's decision about one of its tool calls, and
    /// nobody is at a terminal: the thread waits for `answer --approve` and the like.
    #[error("waiting for a decision about tool call `{}`", .0.tool)]
    Decide(Box<ToolWait>),
    /// Another model turn would go over the thread's budget: the thread pauses between turns.
    #[error("over budget: {0}")]
    OverBudget(String),
    /// A tool server's sign-in ran out and cannot be renewed: the thread pauses until a
    /// person signs in again (`tools login`), saying so.
    #[error("{0}")]
    SignIn(String),
    /// A pause was asked for: the thread pauses between turns.
    #[error("paused between model turns")]
    Paused,
}

impl AgentFailure {
    /// A permanent failure.
    pub fn failed(message: impl Into<String>) -> Self {
        AgentFailure::Failed { message: message.into(), transient: false }
    }

    /// The same failure with its message passed through `f`.
    pub fn map_message(self, f: impl Fn(&str) -> String) -> Self {
        match self {
            AgentFailure::Unavailable(message) => AgentFailure::Unavailable(f(&message)),
            AgentFailure::Failed { message, transient } => {
                AgentFailure::Failed { message: f(&message), transient }
            }
            AgentFailure::Timeout(message) => AgentFailure::Timeout(f(&message)),
            AgentFailure::RateLimited { message, retry_after } => {
                AgentFailure::RateLimited { message: f(&message), retry_after }
            }
            stop @ (AgentFailure::Waiting
            | AgentFailure::Decide(_)
            | AgentFailure::OverBudget(_)
            | AgentFailure::SignIn(_)
            | AgentFailure::Paused) => stop,
        }
    }

    /// Whether the call stopped for the thread's sake (a person to ask, a budget, a pause)
    /// rather than failed: it is neither retried nor answered, and goes on from its journal.
    pub fn is_stop(&self) -> bool {
        matches!(
            self,
            AgentFailure::Waiting
                | AgentFailure::Decide(_)
                | AgentFailure::OverBudget(_)
                | AgentFailure::SignIn(_)
                | AgentFailure::Paused
        )
    }

    /// One word for the kind of failure (a span's `error.type`).
    pub fn kind(&self) -> &'static str {
        match self {
            AgentFailure::Unavailable(_) => "unavailable",
            AgentFailure::Failed { .. } => "failed",
            AgentFailure::Timeout(_) => "timeout",
            AgentFailure::RateLimited { .. } => "rate_limited",
            AgentFailure::Waiting | AgentFailure::Decide(_) => "waiting",
            AgentFailure::OverBudget(_) => "over_budget",
            AgentFailure::SignIn(_) => "sign_in",
            AgentFailure::Paused => "paused",
        }
    }

    /// Is a retry worth it?
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            AgentFailure::Timeout(_)
                | AgentFailure::Failed { transient: true, .. }
                | AgentFailure::RateLimited { .. }
        )
    }
}

/// A bound agent.
#[derive(Debug)]
pub enum Agent {
    Scripted(ScriptedAgent),
    Command(CommandAgent),
    OpenAi(OpenAiAgent),
    /// Answered by a person, through the host (see [`human`]).
    Human,
    /// Another agent, over A2A (see [`a2a`]).
    A2a(a2a::A2aAgent),
}

impl Agent {
    /// Asks the agent once. A `Human` agent is answered by the host, not here.
    /// A command agent's (or a tool server's) process group is listed in `processes` while it
    /// runs, if given; a durable agent journals its turns and tool calls in `turns`, if given.
    pub async fn answer(
        &self,
        context: &AgentContext,
        processes: Option<&Arc<AgentProcesses>>,
        turns: Option<&CallTurns>,
    ) -> Result<AgentAnswer, AgentFailure> {
        match self {
            Agent::Scripted(agent) => {
                if let Some(delay) = agent.delay() {
                    tokio::time::sleep(delay).await;
                }
                agent.answer(context)
            }
            // Boxed: these futures are kilobytes (a process, an HTTP exchange), and a thread
            // waiting on a call holds its future on its fiber stack, where every size a call
            // could take is held for each of a worker's thousands of waiting threads.
            Agent::Command(agent) => Box::pin(agent.answer(context, processes)).await,
            Agent::A2a(agent) => Box::pin(agent.answer(context)).await,
            Agent::OpenAi(agent) => {
                Box::pin(tool_loop::answer(agent, context, processes, turns)).await
            }
            Agent::Human => Err(AgentFailure::Waiting),
        }
    }
}

/// An agent with the name it was bound by (for logs and progress) and its failure policy.
#[derive(Debug, Clone)]
pub struct Bound {
    pub label: String,
    pub agent: Arc<Agent>,
    pub policy: RetryPolicy,
    /// Secret values to redact from what the agent returns.
    pub secrets: Arc<Secrets>,
    /// Where the thread lists its running agent processes (see [`processes`]).
    pub processes: Option<Arc<AgentProcesses>>,
    /// What tokens cost, by model (`prices:` in config.yaml).
    pub prices: Arc<crate::store::config::Prices>,
}

impl Bound {
    /// The span of a call to this agent for `role` (see [`telemetry::agent_span`]).
    pub fn span(&self, role: &str) -> tracing::Span {
        let (operation, provider, model) = match &*self.agent {
            // A durable agent's call holds a `chat` span per turn.
            Agent::OpenAi(agent) if agent.tools().is_some() => {
                ("invoke_agent", "openai", Some(agent.model()))
            }
            Agent::OpenAi(agent) => ("chat", "openai", Some(agent.model())),
            Agent::Command(_) => ("invoke_agent", "command", None),
            Agent::Scripted(_) => ("invoke_agent", "scripted", None),
            Agent::Human => ("invoke_agent", "human", None),
            Agent::A2a(_) => ("invoke_agent", "a2a", None),
        };
        telemetry::agent_span(AgentCall { operation, provider, model, agent: &self.label, role })
    }

    /// Asks the agent under its failure policy (see [`with_retries`]). Every secret the host
    /// holds is redacted from the answer and from failure messages: an agent (or a server
    /// echoing a request) must not get a key into a thread's records.
    pub async fn answer(
        &self,
        context: &AgentContext,
        info: &DebugLog,
        turns: Option<&CallTurns>,
    ) -> Result<AgentAnswer, AgentFailure> {
        let what = format!("role `{}`: agent `{}`", context.role.name, self.label);
        let answer = with_retries(self.policy, info, &what, || {
            self.agent.answer(context, self.processes.as_ref(), turns)
        })
        .await;
        self.settle(answer)
    }

    /// What an answer of this agent becomes before anyone sees it: every secret redacted (from
    /// a failure's message too), and its tokens priced.
    pub fn settle(
        &self,
        answer: Result<AgentAnswer, AgentFailure>,
    ) -> Result<AgentAnswer, AgentFailure> {
        let redact = |text: &str| self.secrets.redact(text);
        match answer {
            Ok(AgentAnswer { content, meta, usage }) => {
                let meta = meta.map(|meta| {
                    let text = redact(&meta.to_string());
                    serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text))
                });
                let usage = usage.map(|mut usage| {
                    usage.calls = 1;
                    usage.cost_usd = usage
                        .model
                        .as_ref()
                        .and_then(|model| self.prices.get(model).map(|price| price.cost(&usage)));
                    usage
                });
                Ok(AgentAnswer { content: redact(&content), meta, usage })
            }
            Err(failure) => Err(failure.map_message(redact)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker holds, on each waiting thread's fiber stack, the future of the call it waits
    /// on: that future must not hold room for every kind of agent's exchange (a process, an
    /// HTTP request), kilobytes each, for every one of thousands of threads.
    #[test]
    fn a_calls_future_holds_no_agent_kinds_exchange_inline() {
        let context = AgentContext {
            thread_id: "t".into(),
            prompt: String::new(),
            steps: Arc::new(Vec::new()),
            role: RoleRef { name: "r".into(), system_prompt: String::new() },
            input: None,
        };
        let call = Agent::Human.answer(&context, None, None);
        let size = std::mem::size_of_val(&call);
        assert!(size <= 1024, "an agent call's future is {size} bytes");
    }
}
