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
use crate::store::evals::{Check, EvalPair, Experiment};
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
    /// Roles asked live whatever their request.
    pub live: Vec<String>,
    /// Bindings laid over each recorded thread's.
    pub request: RunRequest,
    /// What a tool call the recorded thread never made gets.
    pub tools: EvalTools,
    pub checks: Vec<Check>,
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
        threads: recorded.into_iter().map(|recorded| EvalPair { recorded, thread: None }).collect(),
        finished: None,
    };
    store.evals().put(&experiment)?;
    Ok((experiment, bundle))
}

/// The recorded threads `spec` selects, oldest first: ended threads of its workflow (an eval
/// compares what a thread did to the end).
fn recorded_threads(store: &Storage, spec: &EvalSpec) -> Result<Vec<ThreadId>> {
    if !spec.threads.is_empty() {
        for &id in &spec.threads {
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
        return Ok(spec.threads.clone());
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
