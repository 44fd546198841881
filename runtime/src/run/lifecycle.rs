//! A thread's life on the store: creating one (after checking all that can be checked before
//! it exists), opening one to continue it, forking one, and what it runs with — the agents
//! and limits it recorded, carried from process to process.

use std::path::Path;
use std::sync::Arc;

use crate::agents::processes::{self, AgentProcesses};
use crate::agents::{AgentFlags, AgentSet, Secrets};
use crate::clock::now_ms;
use crate::error::{Error, Result};
use crate::ids::{BundleHash, ThreadId};
use crate::limits::{LimitOverrides, Limits};
use crate::run::catalog::Catalog;
use crate::sandbox::engine::LoadedBundle;
use crate::store::records::{
    Budget, EndStatus, ForkedFrom, Parameters, RunParameters, ScheduledBy, StartRecord, StepRecord,
    ThreadRecord,
};
use crate::store::{Storage, ThreadWriter};

/// A thread held open by this process, with what it held when opened.
pub type OpenThread = (Box<dyn ThreadWriter>, ThreadRecord);

/// What a new thread is.
#[derive(Debug, Clone)]
pub struct NewThread {
    pub name: String,
    pub hash: BundleHash,
    pub prompt: String,
    pub max_rounds: u32,
    /// Agent choices, already made absolute (see [`AgentFlags::absolutize`]).
    pub agents: AgentFlags,
    /// `--limit` overrides.
    pub limits: LimitOverrides,
    /// What a trigger passed to the thread (`--trigger-data`).
    pub trigger_data: Option<serde_json::Value>,
    /// What it may spend on agents.
    pub budget: Budget,
}

/// How a thread is to run, as the person, schedule or request that starts it asks: built
/// once, where it comes in (the command line, an HTTP request, a schedule's firing), with its
/// agent specs and limits parsed and checked; recorded in the thread's start record.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// The bundle's own if absent (never over `limits.max-rounds`).
    pub max_rounds: Option<u32>,
    /// Agent choices, already made absolute (see [`AgentFlags::absolutize`]).
    pub agents: AgentFlags,
    /// Limits over the configured ones.
    pub limits: LimitOverrides,
    /// What a trigger passed to the thread (`--trigger-data`, a poll's item).
    pub trigger_data: Option<serde_json::Value>,
    /// What it may spend on agents (`--max-tokens`, `--max-cost`, …).
    pub budget: Budget,
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
}

/// Creates a thread (its start record) and holds its run lock.
pub fn create(store: &Storage, new: NewThread) -> Result<OpenThread> {
    create_with(store, new, Origin::default(), &[], None, &[])
}

fn create_with(
    store: &Storage,
    new: NewThread,
    origin: Origin,
    steps: &[StepRecord],
    forked_from: Option<ForkedFrom>,
    calls: &[crate::store::journal::CallRecord],
) -> Result<OpenThread> {
    store.threads().create(&start_record(new, origin, forked_from), steps, calls)
}

/// The start record of thread `new`, started as `origin` says (from `forked_from`'s steps).
fn start_record(new: NewThread, origin: Origin, forked_from: Option<ForkedFrom>) -> StartRecord {
    StartRecord {
        name: new.name,
        hash: new.hash,
        thread_id: origin.thread_id.unwrap_or_default(),
        parameters: Parameters {
            prompt: new.prompt,
            options: RunParameters {
                max_rounds: new.max_rounds,
                agent: new.agents.default.clone(),
                agent_for: new.agents.for_roles.iter().cloned().collect(),
                cwd: new.agents.cwd.clone(),
                limits: new.limits,
                budget: new.budget,
            },
        },
        timestamp: now_ms(),
        forked_from,
        trigger_data: new.trigger_data,
        schedule: origin.schedule,
        parent: origin.parent,
    }
}

/// A thread of a workflow, by name, as a person or a schedule asks for it.
#[derive(Debug, Clone)]
pub struct StartRequest {
    /// The workflow: its current version runs.
    pub name: String,
    pub prompt: String,
    pub options: RunOptions,
    pub origin: Origin,
}

/// Creates a thread of a workflow after checking all that can be checked before a thread
/// exists — the bundle's integrity, the agent bindings, the limits, max rounds against the
/// hard cap — so that a mistake is reported without leaving a thread behind.
pub fn start_new(store: &Storage, request: StartRequest) -> Result<OpenThread> {
    let checked = check_start(store, &request)?;
    store.threads().create(&requested(request, checked), &[], &[])
}

/// What [`check_start`] found a new thread will run with.
#[derive(Debug, Clone)]
pub struct Checked {
    /// The bundle it runs.
    pub hash: BundleHash,
    pub max_rounds: u32,
    /// The workflow's budget in config.yaml, each limit the request sets in place of its own.
    pub budget: Budget,
}

/// Creates the thread `request` asks for, as [`check_start`] found it (`checked`), held by
/// nobody: for a thread handed to a worker next (see [`ThreadStore::create_at_rest`]).
///
/// [`ThreadStore::create_at_rest`]: crate::store::ThreadStore::create_at_rest
pub fn start_at_rest(
    store: &Storage,
    request: StartRequest,
    checked: Checked,
) -> Result<ThreadRecord> {
    store.threads().create_at_rest(&requested(request, checked), &[], &[])
}

/// The start record of the thread `request` asks for, as `checked`.
fn requested(request: StartRequest, checked: Checked) -> StartRecord {
    let Checked { hash, max_rounds, budget } = checked;
    let StartRequest { name, prompt, options, origin } = request;
    let RunOptions { agents, limits, trigger_data, .. } = options;
    let new = NewThread { name, hash, prompt, max_rounds, agents, limits, trigger_data, budget };
    start_record(new, origin, None)
}

/// Checks a [`StartRequest`] as [`start_new`] does, without creating anything: the bundle the
/// thread would run, its max rounds and budget. (A schedule is checked so when it is added.)
pub fn check_start(store: &Storage, request: &StartRequest) -> Result<Checked> {
    let name = request.name.as_str();
    let catalog = Catalog::new(store);
    // One read of the registry serves both the name and the bundle's integrity record.
    let registry = catalog.registry().load()?;
    let entry = registry.entry(name)?;
    catalog.bundles().load(&registry, name, entry.hash)?;
    let descriptor = catalog.bundles().descriptor(entry.hash)?;
    let config = store.config()?;
    // Checked with this command's secrets: the ones its worker will be handed.
    let options = &request.options;
    let checked = AgentFlags { secrets: Secrets::from_env(&config), ..options.agents.clone() };
    AgentSet::resolve(&config, &checked, &descriptor)?;
    let cap = Limits::resolve(&config.limits, &options.limits)?.max_rounds;
    let max_rounds = match options.max_rounds {
        Some(asked) if asked > cap => return Err(Error::RoundsOverCap { asked, cap }),
        Some(asked) => asked,
        None => descriptor.max_rounds.min(cap),
    };
    let defaults = config.budgets.get(name).map(|b| b.budget()).unwrap_or_default();
    Ok(Checked { hash: entry.hash, max_rounds, budget: defaults.raised(&options.budget) })
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
/// steps; the original is only read.
pub fn fork(
    store: &Storage,
    original: &ThreadRecord,
    keep: usize,
    agents: AgentFlags,
) -> Result<OpenThread> {
    let start = &original.start;
    let options = &start.parameters.options;
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
    create_with(
        store,
        NewThread {
            name: start.name.clone(),
            // The version its original runs now.
            hash: original.version(),
            prompt: start.parameters.prompt.clone(),
            max_rounds: options.max_rounds,
            agents: agents.over(options),
            limits: options.limits.clone(),
            trigger_data: start.trigger_data.clone(),
            // The fork may spend what its original was given (as last raised).
            budget: original.budget(),
        },
        Origin::default(),
        &original.steps[..keep],
        Some(ForkedFrom { thread_id: start.thread_id, step: keep }),
        &calls,
    )
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

/// The agents of a thread: what it recorded at its start, overridden by `flags`.
pub fn agents_for(
    store: &Storage,
    record: &ThreadRecord,
    bundle: &LoadedBundle,
    flags: &AgentFlags,
) -> Result<AgentSet> {
    let merged = flags.over(&record.start.parameters.options);
    let processes = store.home().agent_processes_file(record.start.thread_id);
    Ok(AgentSet::resolve(&store.config()?, &merged, &bundle.descriptor)?
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
