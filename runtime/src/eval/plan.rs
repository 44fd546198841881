//! What an eval runs: which recorded threads, on which version, with which bindings, asking
//! which roles live; made into an experiment and kept before any of it runs, so a crash
//! leaves something `eval resume` finishes.

use std::collections::BTreeSet;
use std::path::PathBuf;

use crate::clock::now_ms;
use crate::error::{Error, Result};
use crate::ids::{BundleHash, ThreadId};
use crate::limits::Limits;
use crate::run::catalog::Catalog;
use crate::run::query::{self, ThreadQuery};
use crate::run_request::RunRequest;
use crate::sandbox::engine::{LoadedBundle, Runtime};
use crate::store::Storage;
use crate::store::evals::{Check, EvalPair, EvalSet, Experiment};
use crate::store::records::EvalTools;

/// What the recorded threads are run on.
#[derive(Debug, Clone)]
pub enum Against {
    /// A bundle or workflow file, stored for the eval, not registered.
    File(PathBuf),
    /// A stored version of the workflow.
    Version(BundleHash),
    /// The workflow's current version: an eval of bindings only.
    Current,
}

/// An eval as asked for.
#[derive(Debug, Clone)]
pub struct EvalSpec {
    pub workflow: String,
    pub against: Against,
    /// These recorded threads; none: the workflow's ended threads that `since_ms` and `last`
    /// select.
    pub threads: Vec<ThreadId>,
    pub since_ms: Option<u64>,
    pub last: Option<usize>,
    /// The threads of this saved set (`eval set save`) instead.
    pub set: Option<String>,
    /// Roles asked live whatever their request.
    pub live: Vec<String>,
    /// Bindings laid over each recorded thread's.
    pub request: RunRequest,
    /// What a tool call the recorded thread never made gets.
    pub tools: EvalTools,
    pub checks: Vec<Check>,
    /// An earlier eval of the workflow to compare with, instead of the recorded threads.
    pub baseline: Option<ThreadId>,
    /// A config file to bind the agents by, instead of the store's.
    pub config: Option<PathBuf>,
    /// What the eval may spend on the calls it asks live, over all its threads.
    pub budget: crate::spending::Budget,
    /// An LLM asked which answer of each thread is better.
    pub judge: Option<crate::store::evals::JudgeSpec>,
}

/// The experiment `spec` asks for, kept (its threads not made yet), with the bundle it runs.
pub async fn plan(
    store: &Storage,
    runtime: &Runtime,
    spec: &EvalSpec,
) -> Result<(Experiment, LoadedBundle)> {
    super::judge::validate(&spec.checks)?;
    let catalog = Catalog::new(store);
    let limits = Limits::resolve(&store.config()?.limits, &Default::default())?;
    let (bundle, against) = match &spec.against {
        Against::File(path) => {
            let bundle = catalog.store_file(runtime, &spec.workflow, path, &limits).await?;
            (bundle, path.display().to_string())
        }
        Against::Version(hash) => {
            (catalog.load(runtime, &spec.workflow, *hash)?, format!("version {hash}"))
        }
        Against::Current => {
            let hash = catalog.entry(&spec.workflow)?.hash;
            (catalog.load(runtime, &spec.workflow, hash)?, format!("version {hash} (current)"))
        }
    };
    let recorded = recorded_threads(store, spec)?;
    if let Some(id) = spec.baseline {
        let earlier = store
            .evals()
            .get(id)?
            .ok_or_else(|| Error::Usage(format!("no eval {id} to compare with")))?;
        if earlier.workflow != spec.workflow {
            return Err(Error::Usage(format!(
                "eval {id} is an eval of `{}`, not of `{}`",
                crate::terminal::line(&earlier.workflow),
                spec.workflow
            )));
        }
    }
    let (config, bindings) = match &spec.config {
        Some(path) => {
            let path =
                std::path::absolute(path).map_err(Error::io("find the config file", path))?;
            if !path.is_file() {
                return Err(Error::MissingFile { what: "the config file", path });
            }
            let bindings = crate::store::config::Config::load(&path)?;
            (Some(path), bindings)
        }
        None => (None, store.config()?),
    };
    if let Some(judge) = &spec.judge
        && !bindings.agents.contains_key(&judge.agent)
    {
        let mut names: Vec<&str> = bindings.agents.keys().map(String::as_str).collect();
        names.sort_unstable();
        return Err(Error::Usage(format!(
            "judge `{}`: no binding of that name under `agents:` in the config (its bindings: {})",
            crate::terminal::line(&judge.agent),
            if names.is_empty() { "none".to_string() } else { names.join(", ") }
        )));
    }
    let live = live_roles(spec, &bundle)?;
    let experiment = Experiment {
        id: ThreadId::new(),
        created: now_ms(),
        workflow: spec.workflow.clone(),
        hash: bundle.hash,
        against,
        live,
        tools: spec.tools,
        request: spec.request.clone(),
        checks: spec.checks.clone(),
        baseline: spec.baseline,
        config,
        budget: spec.budget.clone(),
        judge: spec.judge.clone(),
        judgements: Default::default(),
        threads: recorded.into_iter().map(|recorded| EvalPair { recorded, thread: None }).collect(),
        finished: None,
    };
    store.evals().put(&experiment)?;
    Ok((experiment, bundle))
}

/// The recorded threads `spec` selects, oldest first: ended threads of its workflow (an eval
/// compares what a thread did to the end).
fn recorded_threads(store: &Storage, spec: &EvalSpec) -> Result<Vec<ThreadId>> {
    let named = match &spec.set {
        Some(name) => {
            let set = store.evals().get_set(name)?.ok_or_else(|| {
                Error::Usage(format!("no eval set `{}`", crate::terminal::line(name)))
            })?;
            if set.workflow != spec.workflow {
                return Err(Error::Usage(format!(
                    "eval set `{name}` holds threads of `{}`, not of `{}`",
                    crate::terminal::line(&set.workflow),
                    spec.workflow
                )));
            }
            set.threads
        }
        None => spec.threads.clone(),
    };
    if !named.is_empty() {
        for &id in &named {
            let summary = store.threads().read(id)?.summary();
            if summary.name != spec.workflow {
                return Err(Error::Usage(format!(
                    "thread {id} is a thread of `{}`, not of `{}`",
                    crate::terminal::line(&summary.name),
                    spec.workflow
                )));
            }
            if summary.experiment().is_some() {
                return Err(Error::Usage(format!(
                    "thread {id} is a thread of an eval: an eval re-runs recorded threads"
                )));
            }
            if !summary.status.is_ended() {
                return Err(Error::Usage(format!(
                    "thread {id} has not ended ({}): an eval re-runs ended threads",
                    summary.status.as_str()
                )));
            }
        }
        return Ok(named);
    }
    let query = ThreadQuery {
        workflow: Some(spec.workflow.clone()),
        statuses: crate::store::records::ThreadStatus::ALL
            .iter()
            .copied()
            .filter(|s| s.is_ended())
            .collect(),
        started_after: spec.since_ms,
        limit: spec.last,
        ..ThreadQuery::default()
    };
    let mut ids: Vec<ThreadId> =
        query::threads(store, &query)?.threads.iter().map(|t| t.thread_id).collect();
    if ids.is_empty() {
        return Err(Error::Usage(format!(
            "no ended thread of `{}` to eval{}",
            spec.workflow,
            if spec.since_ms.is_some() { " started in that time" } else { "" }
        )));
    }
    ids.reverse();
    Ok(ids)
}

/// Saves the recorded threads `spec` selects (the workflow's ended threads, by id, age or
/// count) as set `name`, replacing a set of that name: an eval of the set runs these threads
/// whatever runs since.
pub fn save_set(store: &Storage, name: &str, spec: &EvalSpec) -> Result<EvalSet> {
    crate::ids::validate_name("eval set name", name)?;
    let set = EvalSet {
        name: name.to_string(),
        workflow: spec.workflow.clone(),
        threads: recorded_threads(store, spec)?,
        created: now_ms(),
    };
    store.evals().put_set(&set)?;
    Ok(set)
}

/// The roles asked live whatever their request: those named, those whose binding the eval
/// changes, and every role when it changes the default agent. Each must be a role of the
/// version run.
fn live_roles(spec: &EvalSpec, bundle: &LoadedBundle) -> Result<Vec<String>> {
    let roles: Vec<&str> = bundle.descriptor.roles.iter().map(|r| r.name.as_str()).collect();
    for role in spec.live.iter().chain(spec.request.agent_for.keys()) {
        if !roles.contains(&role.as_str()) {
            return Err(Error::Usage(format!(
                "role `{}`: `{}` ({}) has no such role; its roles: {}",
                crate::terminal::line(role),
                spec.workflow,
                bundle.hash,
                roles.join(", ")
            )));
        }
    }
    let mut live: BTreeSet<String> = spec.live.iter().cloned().collect();
    live.extend(spec.request.agent_for.keys().cloned());
    if spec.request.agent.is_some() {
        live.extend(roles.iter().map(|r| r.to_string()));
    }
    Ok(live.into_iter().collect())
}
