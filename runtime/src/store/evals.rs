//! Evals kept beside the recorded threads: each experiment's definition (the version and the
//! bindings it runs, the roles it asks live, its checks), the recorded threads it re-runs and
//! its own thread for each; and named sets of recorded threads. In a home: `evals/<ID>.json`
//! and `evals/sets/<NAME>.json`; in a database: the `evals` and `eval_sets` tables
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
    /// Another eval whose threads are the baseline each thread is compared with (where it has
    /// one that ended); none: the recorded threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<ThreadId>,
    /// A config file the threads' agents are bound by instead of the store's config.yaml (read
    /// again when the eval resumes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<std::path::PathBuf>,
    /// What the eval may spend on the calls it asks live, over all its threads (its duration
    /// counts from when it was made): once spent, it asks nothing more.
    #[serde(default, skip_serializing_if = "crate::spending::Budget::is_empty")]
    pub budget: crate::spending::Budget,
    /// The checks each finished thread is judged by, beside its outcome.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<Check>,
    /// An LLM asked, per thread, which answer is better: the baseline's or the eval's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge: Option<JudgeSpec>,
    /// What the LLM judge said of each thread (by its recorded thread), once asked.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub judgements: std::collections::BTreeMap<ThreadId, Judgement>,
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

/// An LLM judge, as an eval file names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JudgeSpec {
    /// A binding of config.yaml (`agents:`).
    pub agent: String,
    /// Whose answers it compares: the last step of this role (none: each thread's last step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// What makes an answer better, told to the judge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
}

/// What the LLM judge said of one thread.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Judgement {
    /// `eval`, `baseline` or `same`; `unclear` when its answer said none of them.
    pub preferred: String,
    /// Why, in its words (cut short).
    pub reason: String,
    /// Whether the eval's answer was shown first (the order is the thread's, so neither
    /// answer is always first).
    pub eval_first: bool,
    /// What asking it cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<crate::spending::Usage>,
}

/// A named set of recorded threads to eval again and again (`eval set save`): the same
/// threads each time, whatever has run since.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EvalSet {
    pub name: String,
    pub workflow: String,
    pub threads: Vec<ThreadId>,
    /// When it was saved (ms since the epoch).
    pub created: u64,
}

/// Where experiments and sets of threads are kept.
pub trait EvalBackend: Send + Sync + std::fmt::Debug {
    /// Keeps `experiment`, in place of the one of its id if there is one.
    fn put(&self, experiment: &Experiment) -> Result<()>;
    /// The experiment `id`, if there is one.
    fn get(&self, id: ThreadId) -> Result<Option<Experiment>>;
    /// Every experiment, oldest first.
    fn list(&self) -> Result<Vec<Experiment>>;
    /// Keeps `set`, in place of the one of its name if there is one.
    fn put_set(&self, set: &EvalSet) -> Result<()>;
    /// The set named `name`, if there is one.
    fn get_set(&self, name: &str) -> Result<Option<EvalSet>>;
    /// Every set, by name.
    fn list_sets(&self) -> Result<Vec<EvalSet>>;
}
