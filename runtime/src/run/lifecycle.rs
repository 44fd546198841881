//! A thread's life on the store: creating one (after checking all that can be checked before
//! it exists), opening one to continue it, forking one, and what it runs with — the agents
//! and limits it recorded, carried from process to process.

use std::path::Path;
use std::sync::Arc;

use crate::agents::processes::{self, AgentProcesses};
use crate::agents::{AgentSet, Secrets};
use crate::clock::now_ms;
use crate::error::{Error, Result};
use crate::ids::{BundleHash, ThreadId};
use crate::limits::Limits;
use crate::run::catalog::Catalog;
use crate::run_request::RunRequest;
use crate::sandbox::engine::LoadedBundle;
use crate::store::limiter::Caller;
use crate::store::records::{
    EndStatus, ForkedFrom, Parameters, ScheduledBy, StartRecord, ThreadRecord,
};
use crate::store::{Storage, ThreadWriter};

/// A thread held open by this process, with what it held when opened.
pub type OpenThread = (Box<dyn ThreadWriter>, ThreadRecord);

/// A new thread of a registered workflow, as the person, schedule or request that starts it
/// asks for it: parsed once where it comes in (the command line, an HTTP request, a
/// schedule's firing, a child workflow's step).
#[derive(Debug, Clone)]
pub struct StartRequest {
    /// The workflow: its current version runs.
    pub name: String,
    pub prompt: String,
    /// What a trigger passed to the thread (`--trigger-data`, a poll's item, a delivery).
    pub trigger_data: Option<serde_json::Value>,
    /// What the run is asked to do: its agents, directory, max rounds, limits, budget.
    pub request: RunRequest,
    pub origin: Origin,
}

/// Where a new thread comes from, beyond what it is.
#[derive(Debug, Clone, Default)]
pub struct Origin {
    /// The id to create it with (a schedule firing records the id before the thread exists);
    /// a new one if absent.
    pub thread_id: Option<ThreadId>,
    /// The schedule firing that starts it.
    pub schedule: Option<ScheduledBy>,
    /// The parent's step it runs for, when it is a child workflow's thread.
    pub parent: Option<crate::store::records::ParentLink>,
    /// The outside request that asks for it (an MCP client's tool call, an API caller).
    pub started_by: Option<crate::store::records::StartedBy>,
}

/// What [`check_start`] found a new thread will run.
#[derive(Debug, Clone)]
pub struct Checked {
    /// The bundle it runs.
    pub hash: BundleHash,
    /// Its run request as checked: max rounds given, the workflow's budget in config.yaml
    /// under what the request sets. This is what its start record holds.
    pub request: RunRequest,
}

/// Checks a [`StartRequest`] without creating anything — the bundle's integrity, the data
/// against the workflow's input schema, the agent bindings, the limits, max rounds against
/// the hard cap — so that a mistake is reported without leaving a thread behind. (A schedule is checked so when it is added.)
pub fn check_start(store: &Storage, start: &StartRequest) -> Result<Checked> {
    check(store, start, true)
}

/// Checks a [`StartRequest`] whose data comes later, as [`check_start`] does but for the data:
/// a poll's or a webhook's schedule, whose every firing brings its own (and is checked then).
pub fn check_start_before_data(store: &Storage, start: &StartRequest) -> Result<Checked> {
    check(store, start, false)
}

fn check(store: &Storage, start: &StartRequest, with_data: bool) -> Result<Checked> {
    let name = start.name.as_str();
    let catalog = Catalog::new(store);
    // One read of the registry serves both the name and the bundle's integrity record.
    let registry = catalog.registry().load()?;
    let entry = registry.entry(name)?;
    catalog.bundles().verify(&registry, name, entry.hash)?;
    let descriptor = catalog.bundles().descriptor(entry.hash)?;
    if with_data {
        descriptor.check_input(start.trigger_data.as_ref()).map_err(|refused| {
            Error::InvalidInput {
                workflow: name.to_string(),
                path: refused.path,
                reason: refused.reason,
            }
        })?;
    }
    let config = store.config()?;
    let request = &start.request;
    // Checked with this command's secrets: the ones its worker will be handed.
    AgentSet::resolve(&config, request, &Secrets::from_env(&config), &descriptor, None)?;
    let cap = Limits::resolve(&config.limits, &request.limits)?.max_rounds;
    let max_rounds = match request.max_rounds {
        Some(asked) if asked > cap => return Err(Error::RoundsOverCap { asked, cap }),
        Some(asked) => asked,
        None => descriptor.max_rounds.min(cap),
    };
    let defaults = config.budgets.get(name).map(|b| b.budget()).unwrap_or_default();
    let request = RunRequest {
        max_rounds: Some(max_rounds),
        budget: defaults.raised(&request.budget),
        ..request.clone()
    };
    Ok(Checked { hash: entry.hash, request })
}

/// Creates the thread `start` asks for, as [`check_start`] found it (`checked`), held by
/// nobody: it is handed to a worker next, or opened by the command that made it (`thread
/// start`). A creator that dies before either leaves a thread at rest (`interrupted`), never
/// one held by a dead process (see [`ThreadStore::create_at_rest`]).
///
/// [`ThreadStore::create_at_rest`]: crate::store::ThreadStore::create_at_rest
pub fn create(store: &Storage, start: StartRequest, checked: Checked) -> Result<ThreadRecord> {
    store.threads().create_at_rest(&start_record(start, checked), &[], &[])
}

/// The start record of the new thread `start` asks for, as [`check_start`] found it
/// (`checked`): what [`create`] creates, or [`Dispatch::start`] creates and hands over.
///
/// [`Dispatch::start`]: crate::run::dispatch::Dispatch::start
pub fn start_record(start: StartRequest, checked: Checked) -> StartRecord {
    let StartRequest { name, prompt, trigger_data, origin, .. } = start;
    let thread =
        NewThread { name, hash: checked.hash, prompt, trigger_data, request: checked.request };
    thread.start_record(origin, None)
}

/// A thread to create: what its start record holds.
struct NewThread {
    name: String,
    hash: BundleHash,
    prompt: String,
    trigger_data: Option<serde_json::Value>,
    request: RunRequest,
}

impl NewThread {
    /// Its start record, started as `origin` says (from `forked_from`'s steps).
    fn start_record(self, origin: Origin, forked_from: Option<ForkedFrom>) -> StartRecord {
        StartRecord {
            name: self.name,
            hash: self.hash,
            thread_id: origin.thread_id.unwrap_or_default(),
            parameters: Parameters { prompt: self.prompt, options: self.request },
            timestamp: now_ms(),
            forked_from,
            trigger_data: self.trigger_data,
            schedule: origin.schedule,
            parent: origin.parent,
            started_by: origin.started_by,
            eval: None,
        }
    }
}

/// Opens thread `id` to continue it: takes its run lock, refuses an ended thread, and one whose
/// recorded steps could not be handed back to its bundle (a step over the `string` limit).
pub fn open(store: &Storage, id: ThreadId) -> Result<OpenThread> {
    let (writer, record) = store.threads().open(id)?;
    check_continuable(store, &record)?;
    Ok((writer, record))
}

/// Checks that a thread just taken can go on: stops what agents its last process left on
/// this machine, refuses an ended thread, and one whose recorded steps could not be handed
/// back to its bundle (a step over the `string` limit).
pub fn check_continuable(store: &Storage, record: &ThreadRecord) -> Result<()> {
    let id = record.id();
    stop_leftover_agents(store, id)?;
    if let Some(end) = &record.end {
        return Err(Error::ended(id, end.end.status.as_str()));
    }
    let max = limits_for(store, record)?.string_bytes;
    for (index, step) in record.steps.iter().enumerate() {
        let size = step.content.len().max(step.meta.to_string().len());
        if size > max {
            return Err(Error::RecordTooLarge {
                id: id.to_string(),
                step: index + 1,
                line: record.step_lines.get(index).copied().unwrap_or(0),
                size,
                limit: max,
            });
        }
    }
    Ok(())
}

/// Where a fork starts.
#[derive(Debug, Clone)]
pub enum ForkAt {
    /// Keep the first N steps.
    Steps(usize),
    /// Keep the steps before the last occurrence of this role.
    BeforeRole(String),
    /// Keep every step.
    All,
}

/// How many of `original`'s steps a fork keeps.
pub fn fork_point(original: &ThreadRecord, at: &ForkAt) -> Result<usize> {
    let id = original.id().to_string();
    match at {
        ForkAt::All => Ok(original.steps.len()),
        ForkAt::Steps(n) if *n <= original.steps.len() => Ok(*n),
        // A step or a role the thread does not have is a bad value, not a state to wait out.
        ForkAt::Steps(n) => Err(Error::Usage(format!(
            "thread `{id}` has {} steps: there is no step {n} to fork at",
            original.steps.len()
        ))),
        ForkAt::BeforeRole(role) => {
            original.steps.iter().rposition(|s| &s.role == role).ok_or_else(|| {
                Error::Usage(format!("thread `{id}` has no step of role `{role}` to fork before"))
            })
        }
    }
}

/// Creates a fork of `original` keeping its first `keep` steps and the journal of those
/// steps, running with `over` laid over the request it recorded; the original is only read.
pub fn fork(
    store: &Storage,
    original: &ThreadRecord,
    keep: usize,
    over: &RunRequest,
) -> Result<OpenThread> {
    let start = &original.start;
    // A parallel group is one step of the bundle's generator: a fork keeps it whole or not
    // at all.
    if let Some(group) = keep.checked_sub(1).and_then(|i| original.steps.get(i)?.group)
        && keep != group.last()
    {
        return Err(Error::Usage(format!(
            "step {keep} of thread {} is inside a parallel group (steps {}-{} ran together): \
             fork at {} or {}",
            original.id(),
            group.first,
            group.last(),
            group.first - 1,
            group.last()
        )));
    }
    let mut journal = store.threads().journal(start.hash, original.id())?;
    journal.forget_retried(&original.retries);
    let calls = journal.calls_before(keep);
    let request = RunRequest {
        // The fork may spend what its original was given (as last raised).
        budget: original.budget(),
        ..over.over(&start.parameters.options)
    };
    let thread = NewThread {
        name: start.name.clone(),
        // The version its original runs now.
        hash: original.version(),
        prompt: start.parameters.prompt.clone(),
        trigger_data: start.trigger_data.clone(),
        request,
    };
    let forked_from = ForkedFrom { thread_id: start.thread_id, step: keep };
    let record = thread.start_record(Origin::default(), Some(forked_from));
    store.threads().create(&record, &original.steps[..keep], &calls)
}

/// Removes thread `id` (not while it runs), first finishing any removal a crash interrupted.
pub fn remove(store: &Storage, id: ThreadId) -> Result<()> {
    store.threads().finish_removals()?;
    store.threads().remove(id)?;
    stop_leftover_agents(store, id)
}

/// Stops the agent processes an earlier run of thread `id` left running (its worker died
/// while they worked; see [`crate::agents::processes`]). Called with the thread's run lock
/// held, so no live run of the thread owns them.
pub fn stop_leftover_agents(store: &Storage, id: ThreadId) -> Result<()> {
    let stopped = processes::stop_leftovers(&store.home().agent_processes_file(id))?;
    if stopped > 0 {
        tracing::warn!(
            "thread {id}: stopped {stopped} agent process group(s) left running by a worker that died"
        );
    }
    Ok(())
}

/// Which ended threads [`prune`] removes.
#[derive(Debug, Clone)]
pub struct PruneFilter {
    /// Ended at least this long ago.
    pub older_than: std::time::Duration,
    /// With one of these statuses (all ended: completed, failed, killed).
    pub statuses: Vec<EndStatus>,
    /// Of this workflow only.
    pub workflow: Option<String>,
}

/// A thread [`prune`] removed (or would remove).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Pruned {
    pub thread_id: ThreadId,
    pub name: String,
    pub status: EndStatus,
    pub ended: u64,
}

/// Removes the ended threads `filter` selects — never one that has not ended, so never one
/// that runs — or, with `dry_run`, only says which. Unreadable threads are left alone.
pub fn prune(store: &Storage, filter: &PruneFilter, dry_run: bool) -> Result<Vec<Pruned>> {
    if !dry_run {
        store.threads().finish_removals()?;
    }
    let cutoff = now_ms().saturating_sub(filter.older_than.as_millis() as u64);
    let mut pruned = Vec::new();
    for thread in store.threads().summaries()? {
        let (Some(ended), Some(status)) = (thread.ended, thread.status.end_status()) else {
            continue;
        };
        let selected = ended <= cutoff
            && filter.statuses.contains(&status)
            && filter.workflow.as_ref().is_none_or(|w| *w == thread.name);
        if selected {
            pruned.push(Pruned { thread_id: thread.thread_id, name: thread.name, status, ended });
        }
    }
    if !dry_run {
        let ids: Vec<ThreadId> = pruned.iter().map(|p| p.thread_id).collect();
        let removed: std::collections::HashSet<ThreadId> =
            store.threads().remove_ended(&ids)?.into_iter().collect();
        // A thread resumed since it was listed is not removed, nor reported.
        pruned.retain(|p| removed.contains(&p.thread_id));
    }
    // The keys that made retried requests start one thread (the API's Idempotency-Key, a
    // webhook's delivery id) are kept as long as threads are.
    if !dry_run {
        store.request_keys().forget_before(cutoff)?;
    }
    Ok(pruned)
}

/// The agents of a thread: what it recorded at its start, with `over` laid over it, given
/// `secrets` (those of the process that asked for the run).
pub fn agents_for(
    store: &Storage,
    record: &ThreadRecord,
    bundle: &LoadedBundle,
    over: &RunRequest,
    secrets: &Secrets,
) -> Result<AgentSet> {
    agents_under(store, &store.config()?, record, bundle, over, secrets)
}

/// [`agents_for`], bound as `config` says rather than the store's config.yaml (an eval run
/// against another config file).
pub fn agents_under(
    store: &Storage,
    config: &crate::store::config::Config,
    record: &ThreadRecord,
    bundle: &LoadedBundle,
    over: &RunRequest,
    secrets: &Secrets,
) -> Result<AgentSet> {
    let request = over.over(&record.start.parameters.options);
    let processes = store.home().agent_processes_file(record.start.thread_id);
    let caller = Caller {
        limiter: store.limiter().clone(),
        workflow: record.start.name.clone(),
        thread: record.start.thread_id.to_string(),
    };
    Ok(AgentSet::resolve(config, &request, secrets, &bundle.descriptor, Some(&caller))?
        .with_processes(Arc::new(AgentProcesses::new(processes))))
}

/// The limits of a thread: defaults, then config.yaml, then what the thread recorded.
pub fn limits_for(store: &Storage, record: &ThreadRecord) -> Result<Limits> {
    Limits::resolve(&store.config()?.limits, &record.start.parameters.options.limits)
}

/// The directory to record for a new thread: the current one.
pub fn current_dir() -> Result<std::path::PathBuf> {
    std::env::current_dir().map_err(Error::io("read the current directory", Path::new(".")))
}
