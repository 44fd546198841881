//! Evals kept beside the recorded threads: each experiment's definition (the version and the
//! bindings it runs, the roles it asks live, its checks), the recorded threads it re-runs and
//! its own thread for each. In a home: `evals/<ID>.json`; in a database: the `evals` table
//! ([`EvalBackend`]). What an eval found is judged from its threads when it is read, so it is
//! never out of step with them.

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::ids::{BundleHash, ThreadId};
use crate::run_request::RunRequest;

/// One eval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Experiment {
    /// Its id (a ULID: experiments list in the order they were made).
    pub id: ThreadId,
    /// When it was made (ms since the epoch).
    pub created: u64,
    /// The workflow whose threads it re-runs.
    pub workflow: String,
    /// The version it runs them on (stored, not necessarily registered).
    pub hash: BundleHash,
    /// What it was given to run, as the user named it: a file, or `version HASH`.
    pub against: String,
    /// The roles asked live whatever their request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub live: Vec<String>,
    /// What a durable agent's tool call the recorded thread never made gets.
    #[serde(default)]
    pub tools: crate::store::records::EvalTools,
    /// What is laid over each recorded thread's request (its agents' bindings).
    #[serde(default, skip_serializing_if = "RunRequest::is_empty")]
    pub request: RunRequest,
    /// The checks each finished thread is judged by, beside its outcome.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<Check>,
    /// The recorded threads, in the order they are run, each with its eval thread once made.
    pub threads: Vec<EvalPair>,
    /// When every thread had run (ms since the epoch); none while it runs or was cut short.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished: Option<u64>,
}

/// A recorded thread and the eval's thread that re-runs it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EvalPair {
    pub recorded: ThreadId,
    /// None until it is made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread: Option<ThreadId>,
}

/// A check over a finished thread: a JSONata expression whose truth is a pass.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Check {
    pub name: String,
    #[serde(rename = "expr")]
    pub expression: String,
}

/// Where experiments are kept.
pub trait EvalBackend: Send + Sync + std::fmt::Debug {
    /// Keeps `experiment`, in place of the one of its id if there is one.
    fn put(&self, experiment: &Experiment) -> Result<()>;
    /// The experiment `id`, if there is one.
    fn get(&self, id: ThreadId) -> Result<Option<Experiment>>;
    /// Every experiment, oldest first.
    fn list(&self) -> Result<Vec<Experiment>>;
}
