//! The API's request and answer bodies, as the OpenAPI document describes them.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use crate::store::journal::Decision;

/// Every error: a code a program can test, and one line for a person.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// What went wrong.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// `unauthorized`, `read_only`, `not_found`, `invalid`, `invalid_body`, `malformed_json`,
    /// `too_large`, `unsupported_media_type`, `idempotency_key_reused`, `conflict`, …
    pub code: String,
    pub message: String,
    /// For `invalid_input`: where in the request's `data` it is wrong (a JSON Pointer into
    /// `data`, empty for `data` itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// The server answers.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    pub status: String,
    pub version: String,
}

/// A thread to start.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartThread {
    /// A registered workflow's name, or the hash of its current version.
    pub workflow: String,
    /// The thread's prompt.
    pub prompt: String,
    /// Passed to the thread as `$trigger_data`.
    #[serde(default)]
    pub data: Option<Value>,
    /// What the thread may spend on its agents: over it, it pauses (reason `budget`).
    #[serde(default)]
    pub budget: Option<BudgetBody>,
}

/// A budget: any of its limits.
#[derive(Debug, Default, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BudgetBody {
    /// Tokens in and out, over every agent call.
    pub max_tokens: Option<u64>,
    /// US dollars, as `prices:` in config.yaml price the calls.
    pub max_cost_usd: Option<f64>,
    /// Agent calls made.
    pub max_agent_calls: Option<u64>,
    /// Milliseconds since the thread started.
    pub max_duration_ms: Option<u64>,
}

impl StartThread {
    /// The start it asks for, of workflow `name` (the one `workflow` names).
    pub fn start_request(&self, name: String) -> crate::run::lifecycle::StartRequest {
        crate::run::lifecycle::StartRequest {
            name,
            prompt: self.prompt.clone(),
            trigger_data: self.data.clone(),
            request: crate::run_request::RunRequest {
                budget: self.budget.clone().map(Into::into).unwrap_or_default(),
                ..Default::default()
            },
            origin: Default::default(),
        }
    }
}

impl From<BudgetBody> for crate::store::records::Budget {
    fn from(b: BudgetBody) -> Self {
        crate::store::records::Budget {
            max_tokens: b.max_tokens,
            max_cost_usd: b.max_cost_usd,
            max_agent_calls: b.max_agent_calls,
            max_duration_ms: b.max_duration_ms,
        }
    }
}

/// A thread started (201), or the one an earlier request with the same `Idempotency-Key`
/// started (200).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Started {
    /// The thread's id.
    pub id: String,
}

/// Which threads to list.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only threads in this status (`running`, `waiting`, `paused`, `interrupted`, `queued`,
    /// `completed`, `failed`, `killed`).
    pub status: Option<String>,
    /// Only threads of this workflow.
    pub workflow: Option<String>,
    /// Only threads started within this long, e.g. `30m`, `12h`, `7d`.
    pub since: Option<String>,
    /// At most this many (1–1000) [default: 100].
    pub limit: Option<usize>,
    /// The `nextCursor` of the page before.
    pub cursor: Option<String>,
}

/// A page of threads, newest first.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ThreadList {
    pub threads: Vec<ThreadItem>,
    /// Where the next page starts (`?cursor=`); absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// A thread as a listing shows it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ThreadItem {
    pub thread_id: String,
    /// The workflow.
    pub name: String,
    /// The version (bundle hash) it runs.
    pub hash: String,
    pub status: String,
    pub steps: usize,
    /// When it started (ms since the epoch).
    pub timestamp: u64,
    /// The start of its prompt.
    pub prompt: String,
    /// When it ended (ms since the epoch).
    pub ended: Option<u64>,
    /// The role a person must answer for, when it waits for one.
    pub waiting_role: Option<String>,
    /// The schedule that started it.
    pub schedule: Option<String>,
    /// The tokens its agents reported, in and out.
    pub tokens: u64,
    /// What they cost, in US dollars, when priced.
    pub cost_usd: Option<f64>,
    /// The thread whose step started it as a child workflow, if one did.
    pub parent: Option<String>,
    /// Who asked for it from outside, if a request did: `mcp token:ci (claude-code)`,
    /// `api token:ci`.
    pub started_by: Option<String>,
    /// The provider limit it waits for its turn in, when it runs and waits for one.
    pub waiting_for: Option<String>,
}

impl From<crate::store::records::ThreadSummary> for ThreadItem {
    fn from(t: crate::store::records::ThreadSummary) -> Self {
        ThreadItem {
            thread_id: t.thread_id.to_string(),
            name: t.name,
            hash: t.hash.to_string(),
            status: t.status.as_str().to_string(),
            steps: t.steps,
            timestamp: t.timestamp,
            prompt: t.prompt,
            ended: t.ended,
            waiting_role: t.waiting_role,
            schedule: t.schedule,
            tokens: t.tokens,
            cost_usd: t.cost_usd,
            parent: t.parent.map(|p| p.to_string()),
            started_by: t.started_by,
            waiting_for: None,
        }
    }
}

/// What an action takes: `answer` its `text` (or, for a durable agent's tool call, its
/// `decision`), `fork` the steps to keep (`at`; all if absent), `resume` a raised budget
/// (`raiseBudget`).
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ActionBody {
    /// `answer`: the answer (JSON text, when the role's output has a schema); with a
    /// `decision` of `deny`, why; of `skip`, the text the model is given instead of the
    /// result.
    pub text: Option<String>,
    /// `answer` to a thread waiting on a tool call: `approve` or `deny` a call that needs
    /// approval, `redo` or `skip` a call a crash cut in the middle.
    pub decision: Option<DecisionKind>,
    /// `fork`: how many steps the fork keeps.
    pub at: Option<usize>,
    /// `resume`: raise the thread's budget first (what this sets replaces its own).
    #[serde(rename = "raiseBudget")]
    pub raise_budget: Option<BudgetBody>,
}

/// A person's decision about a durable agent's tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum DecisionKind {
    Approve,
    Deny,
    Redo,
    Skip,
}

impl DecisionKind {
    /// The decision, with `text` (why, for `deny`; the result given instead, for `skip`).
    pub fn with(self, text: Option<String>) -> Result<Decision, String> {
        let text = || text.clone().filter(|t| !t.trim().is_empty());
        Ok(match self {
            DecisionKind::Approve => Decision::Approve,
            DecisionKind::Redo => Decision::Redo,
            DecisionKind::Deny => Decision::Deny {
                reason: text().ok_or("`deny` needs a `text`: why (the model is told)")?,
            },
            DecisionKind::Skip => Decision::Skip {
                text: text().ok_or("`skip` needs a `text`: what the model is given instead")?,
            },
        })
    }
}

/// An action done: the thread it was done to, or for `fork` the new thread.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ActionDone {
    pub thread: String,
}
