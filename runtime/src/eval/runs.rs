//! Running an experiment's threads: each recorded thread re-run from its prompt in a thread
//! of the eval, in this process, several at once; the recorded thread's journal answers the
//! calls that ask what it asked (see [`crate::sandbox::baseline`]). A thread's id is kept in
//! the experiment before the thread is made, and each thread journals its calls as any
//! thread does, so an eval cut short (a crash, `kill -9`) is finished by running it again:
//! the threads made go on from their journals, nothing answered is asked twice.

use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, StreamExt, TryStreamExt};

use crate::agents::Secrets;
use crate::clock::now_ms;
use crate::error::{Error, Result};
use crate::ids::ThreadId;
use crate::run::lifecycle::{self, OpenThread};
use crate::run::runner::{RunContext, Until, run_thread};
use crate::run_request::RunRequest;
use crate::sandbox::control::ThreadControl;
use crate::sandbox::engine::{LoadedBundle, Runtime};
use crate::sandbox::shared_budget::SharedBudget;
use crate::spending::Usage;
use crate::store::Storage;
use crate::store::evals::Experiment;
use crate::store::records::{EvalOf, Parameters, StartRecord, StartedBy};
use crate::store::summaries::EVAL_STARTER;

/// How many threads an eval runs at once unless told.
pub const DEFAULT_CONCURRENCY: usize = 4;

/// Runs every thread of `experiment` not ended yet on `bundle` (its version), `concurrency`
/// at once, calling `on_ended` with the recorded thread each time one of them ends or rests;
/// marks the experiment finished once all have ended. Says why it stopped short when the
/// eval's budget was spent.
pub async fn run(
    store: &Storage,
    runtime: &Runtime,
    bundle: &LoadedBundle,
    experiment: &mut Experiment,
    concurrency: usize,
    mut on_ended: impl FnMut(ThreadId),
) -> Result<Option<String>> {
    // Every thread's id is kept before any thread is made: a thread made is always found.
    if experiment.threads.iter().any(|p| p.thread.is_none()) {
        for pair in experiment.threads.iter_mut().filter(|p| p.thread.is_none()) {
            pair.thread = Some(ThreadId::new());
        }
        store.evals().put(experiment)?;
    }
    let config = match &experiment.config {
        Some(path) => crate::store::config::Config::load(path)?,
        None => store.config()?,
    };
    let secrets = Secrets::from_env(&config);
    let budget = shared_budget(store, experiment)?;
    let planned = &*experiment;
    let (secrets, config, shared) = (&secrets, &config, budget.as_ref());
    // Owned pairs: a future per pair borrows nothing of the list.
    let pairs: Vec<(ThreadId, ThreadId)> = planned
        .threads
        .iter()
        .map(|p| (p.recorded, p.thread.expect("every thread's id is kept above")))
        .collect();
    stream::iter(pairs)
        .map(|(recorded, thread)| async move {
            let binds = Binds { config, secrets, budget: shared };
            run_one(store, runtime, bundle, planned, recorded, thread, binds).await?;
            Ok::<_, Error>(recorded)
        })
        .buffer_unordered(concurrency.max(1))
        .try_for_each(|recorded| {
            on_ended(recorded);
            async { Ok(()) }
        })
        .await?;
    super::llm_judge::judge_all(store, experiment, config, secrets).await?;
    let mut ended = true;
    for pair in &experiment.threads {
        let id = pair.thread.expect("every thread's id is kept above");
        ended &= match store.threads().read(id) {
            Ok(record) => record.end.is_some(),
            // Not made: the eval's budget was spent before it.
            Err(Error::UnknownThread(_)) => false,
            Err(e) => return Err(e),
        };
    }
    if ended && experiment.finished.is_none() {
        experiment.finished = Some(now_ms());
        store.evals().put(experiment)?;
    }
    Ok(budget.filter(|_| !ended).and_then(|b| b.exceeded(1)))
}

/// The eval's budget, with what its threads have spent live so far (none if it has none).
fn shared_budget(store: &Storage, experiment: &Experiment) -> Result<Option<Arc<SharedBudget>>> {
    if experiment.budget.is_empty() {
        return Ok(None);
    }
    let mut spent = Usage::default();
    for thread in experiment.threads.iter().filter_map(|p| p.thread) {
        match store.threads().read(thread) {
            Ok(record) => spent.add(&super::compare::live_usage(store, &record)?.0),
            Err(Error::UnknownThread(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Some(SharedBudget::new(experiment.budget.clone(), experiment.created, spent)))
}

/// What an eval's threads' agents are bound by.
#[derive(Clone, Copy)]
struct Binds<'a> {
    config: &'a crate::store::config::Config,
    secrets: &'a Secrets,
    /// The eval's budget, if it has one.
    budget: Option<&'a Arc<SharedBudget>>,
}

/// Runs thread `thread` of `experiment`, re-running `recorded`: made if it is not yet, taken
/// up where it stopped if it is, left alone if it has ended.
async fn run_one(
    store: &Storage,
    runtime: &Runtime,
    bundle: &LoadedBundle,
    experiment: &Experiment,
    recorded: ThreadId,
    thread: ThreadId,
    binds: Binds<'_>,
) -> Result<()> {
    // A spent budget starts no thread, and takes none up again.
    if binds.budget.is_some_and(|b| b.exceeded(1).is_some()) {
        return Ok(());
    }
    let (mut writer, record) = match store.threads().read(thread) {
        Ok(record) if record.end.is_some() => return Ok(()),
        Ok(_) => taken_over(store, thread).await?,
        Err(Error::UnknownThread(_)) => made(store, experiment, recorded, thread)?,
        Err(e) => return Err(e),
    };
    let over = RunRequest::default();
    let agents =
        lifecycle::agents_under(store, binds.config, &record, bundle, &over, binds.secrets)?;
    let ctx = RunContext {
        runtime,
        store,
        agents,
        // The config read once for the eval, not once a thread.
        limits: crate::limits::Limits::resolve(
            &binds.config.limits,
            &record.start.parameters.options.limits,
        )?,
        control: match binds.budget {
            Some(budget) => Arc::new(ThreadControl::sharing(budget.clone())),
            None => Default::default(),
        },
        // A step that runs a child workflow fails in an eval: its child would be a thread
        // of its own, not an eval's.
        children: None,
    };
    run_thread(&ctx, bundle, &mut *writer, &record, Until::End, |_| {}).await?;
    Ok(())
}

/// How long an eval waits for a thread held by another process to be let go: a database
/// store's lease of a process that died runs out within this (15 s unless shortened).
const HELD_FOR_AT_MOST: Duration = Duration::from_secs(20);

/// Thread `thread` of an eval opened to go on: at once, or — held by an eval that was killed
/// on a database store, whose lease has not run out yet — once it has.
async fn taken_over(store: &Storage, thread: ThreadId) -> Result<OpenThread> {
    let deadline = std::time::Instant::now() + HELD_FOR_AT_MOST;
    loop {
        match lifecycle::open(store, thread) {
            Err(Error::ThreadBusy(_)) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            opened => return opened,
        }
    }
}

/// Makes thread `thread` of `experiment`, re-running recorded thread `recorded`: its prompt
/// and data, its bindings with the eval's laid over them, on the eval's version.
fn made(
    store: &Storage,
    experiment: &Experiment,
    recorded: ThreadId,
    thread: ThreadId,
) -> Result<OpenThread> {
    let original = store.threads().read(recorded)?;
    let start = &original.start;
    let eval = experiment.id.to_string();
    let started_by = StartedBy::new(EVAL_STARTER.trim_end(), &eval, None);
    debug_assert_eq!(started_by.line(), format!("{EVAL_STARTER}{eval}"));
    let record = StartRecord {
        name: experiment.workflow.clone(),
        hash: experiment.hash,
        thread_id: thread,
        parameters: Parameters {
            prompt: start.parameters.prompt.clone(),
            options: experiment.request.over(&start.parameters.options),
        },
        timestamp: now_ms(),
        forked_from: None,
        trigger_data: start.trigger_data.clone(),
        schedule: None,
        parent: None,
        started_by: Some(started_by),
        eval: Some(EvalOf {
            experiment: eval,
            baseline: recorded,
            live: experiment.live.clone(),
            tools: experiment.tools,
        }),
    };
    store.threads().create(&record, &[], &[])
}
