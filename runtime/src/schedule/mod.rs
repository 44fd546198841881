//! Schedules: threads that start themselves. A schedule is bound by the host, like an agent —
//! a cron expression or a poll command, the workflow to run and the prompt, agents and limits
//! of its threads — and is fired by `schedule tick` (once, for a system timer) or `serve`
//! (continuously), exactly once per cron instant or poll item (see [`firing`]).
//!
//! A declarative workflow's own `trigger:` is registered as a schedule named after the
//! workflow when the workflow is added, and follows its current version.

pub mod firing;
pub mod phase;
pub mod poll;
pub mod workflows;

use std::time::Duration;

use crate::agents::command::find_program;
use crate::clock::now_ms;
use crate::cron::CronTrigger;
use crate::declarative::source::TriggerSpec;
use crate::error::{Error, Result};
use crate::run::lifecycle::{self, StartRequest};
use crate::run_request::RunRequest;
use crate::store::Storage;
use crate::store::schedules::{
    DiffMode, FiringState, Schedule, ScheduleSource, Trigger, validate_name,
};

pub use firing::{Firer, Histories, Pass};

/// The shortest interval between two checks of a poll.
pub const MIN_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// What `schedule add` asks for.
#[derive(Debug, Clone)]
pub struct NewSchedule {
    /// Its name; the workflow's name (numbered if taken) if absent.
    pub name: Option<String>,
    pub workflow: String,
    pub trigger: Trigger,
    pub prompt: String,
    /// What its threads are asked to do, with paths already made absolute (its `cwd` is
    /// where the poll command runs).
    pub request: RunRequest,
}

/// Adds a schedule after checking everything a firing will need: the trigger, the poll
/// command, the workflow and the agents its threads will run with.
pub fn add(store: &Storage, new: NewSchedule) -> Result<Schedule> {
    add_from(store, new, ScheduleSource::Cli)
}

fn add_from(store: &Storage, new: NewSchedule, source: ScheduleSource) -> Result<Schedule> {
    if let Some(name) = &new.name {
        validate_name(name)?;
    }
    check_trigger(&new.trigger, new.request.cwd.as_deref())?;
    let now = now_ms();
    let mut schedule = Schedule {
        name: new.name.clone().unwrap_or_default(),
        workflow: new.workflow,
        trigger: new.trigger,
        prompt: new.prompt,
        request: new.request,
        paused: false,
        created: now,
        since: now,
        source,
    };
    // Checked as a firing will start its threads: a cron's with no data, a poll's or a
    // webhook's with the data each firing brings, checked then.
    match schedule.trigger {
        Trigger::Cron { .. } => lifecycle::check_start(store, &thread_request(&schedule))?,
        Trigger::Poll { .. } | Trigger::Webhook { .. } => {
            lifecycle::check_start_before_data(store, &thread_request(&schedule))?
        }
    };
    let schedules = store.schedules();
    let lock = schedules.lock()?;
    schedule.name = match new.name {
        Some(name) => {
            if schedules.get(&name)?.is_some() {
                return Err(Error::Usage(format!(
                    "a schedule named `{name}` exists (see `uncaged-workflow schedule list`): \
                     choose another --name, or `schedule rm {name}` first"
                )));
            }
            name
        }
        None => free_name(store, &schedule.workflow)?,
    };
    schedules.put(&schedule, &lock)?;
    Ok(schedule)
}

/// `workflow`, or `workflow-2`, `-3`… : the first name no schedule has.
fn free_name(store: &Storage, workflow: &str) -> Result<String> {
    let schedules = store.schedules();
    let mut name = workflow.to_string();
    let mut n = 1;
    while schedules.get(&name)?.is_some() {
        n += 1;
        name = format!("{workflow}-{n}");
    }
    Ok(name)
}

/// Refuses a trigger that could never fire as written.
fn check_trigger(trigger: &Trigger, cwd: Option<&std::path::Path>) -> Result<()> {
    match trigger {
        Trigger::Cron { expression, timezone } => {
            CronTrigger::parse(expression, timezone.as_deref()).map_err(Error::Usage)?;
        }
        Trigger::Poll { command, every_ms, .. } => {
            let program = command
                .first()
                .ok_or_else(|| Error::Usage("the poll command is empty".to_string()))?;
            find_program(program, cwd).map_err(|e| Error::Usage(format!("poll command: {e}")))?;
            if *every_ms < MIN_POLL_INTERVAL.as_millis() as u64 {
                return Err(Error::Usage("a poll runs at most once a second (--every 1s)".into()));
            }
        }
        Trigger::Webhook { secret_env, map } => {
            crate::env_name::check(secret_env).map_err(Error::Usage)?;
            crate::data_map::check(map).map_err(Error::Usage)?;
        }
    }
    Ok(())
}

/// The thread a firing of `schedule` starts, as a [`StartRequest`] without its origin.
pub fn thread_request(schedule: &Schedule) -> StartRequest {
    StartRequest {
        name: schedule.workflow.clone(),
        prompt: schedule.prompt.clone(),
        trigger_data: None,
        request: schedule.request.clone(),
        origin: Default::default(),
    }
}

/// Removes schedule `name` (the threads it started stay).
pub fn remove(store: &Storage, name: &str) -> Result<Schedule> {
    let schedules = store.schedules();
    let lock = schedules.lock()?;
    let schedule = schedules.get(name)?.ok_or_else(|| Error::UnknownSchedule(name.into()))?;
    schedules.remove(name, &lock)?;
    Ok(schedule)
}

/// Pauses or resumes schedule `name`. A resumed schedule does not catch up on what it missed
/// while paused: its next firing is the first one due after now.
pub fn set_paused(store: &Storage, name: &str, paused: bool) -> Result<Schedule> {
    let schedules = store.schedules();
    let lock = schedules.lock()?;
    let mut schedule = schedules.get(name)?.ok_or_else(|| Error::UnknownSchedule(name.into()))?;
    if schedule.paused != paused {
        schedule.paused = paused;
        if !paused {
            schedule.since = now_ms();
        }
        schedules.put(&schedule, &lock)?;
    }
    Ok(schedule)
}

/// A schedule as listings show it.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleStatus {
    #[serde(flatten)]
    pub schedule: Schedule,
    /// When it fires next (a cron instant, or the next check of a poll); none while paused.
    pub next: Option<u64>,
    /// When it last fired.
    pub last_fired: Option<u64>,
    /// How many threads it has started.
    pub fired: usize,
    /// Firings whose thread is not yet created or handed to a worker.
    pub pending: usize,
    /// Why its last poll check failed, or its last firing's thread could not be created.
    pub last_error: Option<String>,
}

/// Every schedule with its next firing as of `now`.
pub fn statuses(store: &Storage, now: u64) -> Result<Vec<ScheduleStatus>> {
    statuses_with(store, now, &mut Histories::default())
}

/// [`statuses`], reading the firing logs through `histories` (only what was appended since
/// they were last read).
pub fn statuses_with(
    store: &Storage,
    now: u64,
    histories: &mut Histories,
) -> Result<Vec<ScheduleStatus>> {
    let schedules = store.schedules();
    let mut out = Vec::new();
    let list = schedules.list()?;
    histories.keep_only(&list);
    for schedule in list {
        let history = histories.get(store, &schedule)?;
        let (next, last_error) = match &schedule.trigger {
            Trigger::Cron { expression, timezone } => {
                let cron = CronTrigger::parse(expression, timezone.as_deref()).ok();
                (cron.and_then(|c| c.next_after(now.max(schedule.since))), None)
            }
            Trigger::Poll { every_ms, .. } => {
                let state = schedules.poll_state(&schedule.name)?;
                (Some(state.next_check(*every_ms, schedule.since)), state.last_error)
            }
            // Fired by requests, not by the clock.
            Trigger::Webhook { .. } => (None, None),
        };
        // A poll that fails, or a firing whose thread could not be created.
        let last_error = last_error.or_else(|| match history.firings.last().map(|f| &f.state) {
            Some(FiringState::Failed(error)) => Some(error.clone()),
            _ => None,
        });
        out.push(ScheduleStatus {
            next: if schedule.paused { None } else { next },
            last_fired: history.last_fired(),
            fired: history.firings.len(),
            pending: history.pending().count(),
            last_error,
            schedule,
        });
    }
    Ok(out)
}

/// Makes the schedule a workflow's current version asks for with its `trigger:` the one
/// registered under the workflow's name: added, replaced, or removed if the version has no
/// trigger (or the workflow is gone). A schedule of that name made by `schedule add` is left
/// alone, and the error says so. Returns the registered schedule, if any.
pub fn sync_workflow_trigger(store: &Storage, workflow: &str) -> Result<Option<Schedule>> {
    let trigger = workflow_trigger(store, workflow)?;
    let schedules = store.schedules();
    let existing = schedules.get(workflow)?;
    if let Some(existing) = &existing
        && existing.source == ScheduleSource::Cli
    {
        return match trigger {
            None => Ok(None),
            Some(_) => Err(Error::Usage(format!(
                "the `trigger:` of workflow `{workflow}` is not registered: a schedule named \
                 `{workflow}` made by `schedule add` exists; `schedule rm {workflow}`, then add \
                 the workflow again"
            ))),
        };
    }
    let Some(spec) = trigger else {
        if existing.is_some() {
            let lock = schedules.lock()?;
            schedules.remove(workflow, &lock)?;
        }
        return Ok(None);
    };
    let (trigger, prompt) = match spec {
        TriggerSpec::Cron { expression, timezone, prompt } => {
            (Trigger::Cron { expression, timezone }, prompt)
        }
        TriggerSpec::Poll { command, interval_seconds, new_items, prompt } => (
            Trigger::Poll {
                command,
                every_ms: interval_seconds.saturating_mul(1000),
                diff: if new_items { DiffMode::NewItems } else { DiffMode::AnyChange },
                include_existing: false,
            },
            prompt,
        ),
        TriggerSpec::Webhook { secret_env, map, prompt } => {
            (Trigger::Webhook { secret_env, map }, prompt)
        }
    };
    // The same trigger as registered: kept as it is, with its firing log.
    if let Some(existing) = &existing
        && existing.trigger == trigger
        && existing.prompt == prompt
    {
        return Ok(Some(existing.clone()));
    }
    if existing.is_some() {
        let lock = schedules.lock()?;
        schedules.remove(workflow, &lock)?;
    }
    // The poll command runs where the workflow was added from, like its command agents.
    let cwd = lifecycle::current_dir()?;
    let new = NewSchedule {
        name: Some(workflow.to_string()),
        workflow: workflow.to_string(),
        trigger,
        prompt,
        request: RunRequest::default().absolutize(&cwd),
    };
    add_from(store, new, ScheduleSource::Workflow).map(Some)
}

/// The `trigger:` of the current version of `workflow`, if it is declarative and has one.
fn workflow_trigger(store: &Storage, workflow: &str) -> Result<Option<TriggerSpec>> {
    let registry = store.registry().load()?;
    let Some(entry) = registry.workflows.get(workflow) else { return Ok(None) };
    let bundle = store.bundles().load(&registry, workflow, entry.hash)?;
    let Some(source) = crate::declarative::source_of(&bundle.bytes) else { return Ok(None) };
    let (_, trigger) = crate::declarative::source::parse_with_trigger(&bundle.path, &source)?;
    Ok(trigger)
}
