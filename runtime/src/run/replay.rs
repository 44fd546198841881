//! Replaying a recorded thread through a bundle, the thread's call journal answering every
//! call and no agent asked: does the bundle do what the thread did? It must make the calls
//! the journal holds, with the same requests, and yield the same steps (role, content, meta),
//! step after step; past the last recorded step, the calls the thread had begun (a parallel
//! group cut short, the question it waits on) must be the same requests too. It may differ in
//! anything else. `replay` checks a new version against recorded threads before it ships;
//! `upgrade` checks a thread before it moves it.

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use crate::agents::{AgentSet, Secrets};
use crate::error::Result;
use crate::limits::Limits;
use crate::run_request::RunRequest;
use crate::sandbox::control::ThreadControl;
use crate::sandbox::engine::{LoadedBundle, Runtime};
use crate::sandbox::generator::{Generator, Stop};
use crate::sandbox::state::{HostContext, ThreadView};
use crate::store::config::Config;
use crate::store::debug_log::DebugLog;
use crate::store::journal::{Journal, JournalLine};
use crate::store::records::{StepRecord, ThreadRecord};

/// How much of a recorded or replayed value a difference shows.
const SHOWN: usize = 160;

/// What a replay found.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "verdict", rename_all = "camelCase")]
pub enum Verdict {
    /// The bundle does what the thread did, through its `steps` recorded steps.
    Compatible { steps: usize },
    /// It does not, from step `step` (1-based) on.
    Diverges(Divergence),
}

/// The first place a bundle does not do what the thread did.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Divergence {
    /// The step (1-based) where it differs.
    pub step: usize,
    /// What differs, in a line.
    pub reason: String,
    /// The thread's record there, and the bundle's, cut short, when they are steps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replayed: Option<String>,
}

impl Divergence {
    fn at(step: usize, reason: impl Into<String>) -> Verdict {
        Verdict::Diverges(Divergence {
            step,
            reason: reason.into(),
            recorded: None,
            replayed: None,
        })
    }
}

/// Replays thread `record`, whose journal holds `calls`, through `bundle`.
pub async fn replay(
    runtime: &Runtime,
    limits: &Limits,
    bundle: &LoadedBundle,
    record: &ThreadRecord,
    calls: Vec<JournalLine>,
) -> Result<Verdict> {
    let mut generator = match start_at(runtime, limits, bundle, record, &calls, 0).await {
        Ok(generator) => generator,
        Err(stop) => return stopped(0, stop, record),
    };
    let max_rounds = record.start.max_rounds();
    let mut count = 0;
    while count < record.steps.len() {
        // Steps a retry recorded (a DAG's "run it again") were not the bundle's: it met them
        // as a resumed thread does, started again with them in its history.
        if let Some(carried) = record
            .retries
            .iter()
            .find(|r| r.retry.from_step == count && !r.retry.steps.is_empty())
            .map(|r| r.retry.steps.len())
        {
            count = (count + carried).min(record.steps.len());
            generator = match start_at(runtime, limits, bundle, record, &calls, count).await {
                Ok(generator) => generator,
                Err(stop) => return stopped(count, stop, record),
            };
            continue;
        }
        let steps = match generator.next(bundle, count, max_rounds, Instant::now()).await {
            Ok(steps) => steps,
            Err(stop) => return stopped(count, stop, record),
        };
        let end = (count + steps.len()).min(record.steps.len());
        let recorded = &record.steps[count..end];
        if let Some(divergence) = compare(count, recorded, &steps) {
            return Ok(Verdict::Diverges(divergence));
        }
        // The bundle goes on from the thread's own records, as a resumed thread does.
        generator.persisted(recorded);
        count = end;
    }
    // An ended thread began no step after its last (a retry makes its failed step again).
    if record.end.is_some() {
        return Ok(Verdict::Compatible { steps: count });
    }
    // The step after the last: what the thread began of it must be asked the same way.
    match generator.next(bundle, count, max_rounds, Instant::now()).await {
        Err(Stop::Diverged(d)) if !d.missing => Ok(Divergence::at(count + 1, differs(&d))),
        Err(Stop::Diverged(d)) => match record.paused.as_ref().and_then(|p| p.call.as_ref()) {
            // The call the thread waits on (a person's answer, a child's end) is not in the
            // journal yet: the bundle must make that very call.
            Some(call) if call.step == d.step && call.seq == d.seq && call.digest != d.digest => {
                Ok(Divergence::at(
                    count + 1,
                    format!(
                        "call {} of step {} ({:?}{}) is not the call the thread waits on",
                        d.seq,
                        d.step + 1,
                        d.kind,
                        d.role
                    ),
                ))
            }
            _ => Ok(Verdict::Compatible { steps: count }),
        },
        Err(Stop::Store(e)) => Err(e),
        _ => Ok(Verdict::Compatible { steps: count }),
    }
}

/// The bundle started for thread `record` as a thread resumed after its first `count` steps
/// is, its calls answered from `calls` only.
async fn start_at(
    runtime: &Runtime,
    limits: &Limits,
    bundle: &LoadedBundle,
    record: &ThreadRecord,
    calls: &[JournalLine],
    count: usize,
) -> std::result::Result<Generator, Stop> {
    let id = record.id();
    // No agent is asked: the journal answers every call, or the replay stops there.
    let agents = AgentSet::resolve(
        &Config::default(),
        &RunRequest::default(),
        &Secrets::default(),
        &bundle.descriptor,
        None,
    )
    .map_err(Stop::Store)?;
    let mut so_far = record.clone();
    so_far.steps.truncate(count);
    let view = ThreadView {
        prompt: record.start.parameters.prompt.clone(),
        steps: Arc::new(so_far.steps.clone()),
        system_prompts: bundle.system_prompts.clone(),
        role_schemas: bundle.role_schemas.clone(),
        step_settings: bundle.step_settings.clone(),
        started: record.start.timestamp,
        ..ThreadView::default()
    };
    let journal = Journal::replaying(calls.to_vec());
    let control = Arc::new(ThreadControl::default());
    let host = HostContext::new(id, agents, DebugLog::tracing(), journal, control, view);
    Generator::start(runtime, limits, bundle, host, id, &so_far).await
}

/// Why the bundle yielded no step `count + 1` where the thread has one.
fn stopped(count: usize, stop: Stop, record: &ThreadRecord) -> Result<Verdict> {
    let step = count + 1;
    let recorded = record.steps.get(count).map(shown);
    let reason = match stop {
        Stop::Diverged(d) => differs(&d),
        Stop::End(end) => format!(
            "it ends ({}: {}) where the thread has step {step}",
            end.return_code,
            cut(&end.summary)
        ),
        Stop::Waiting { role, .. } => format!("it waits for role `{role}` at step {step}"),
        Stop::Rest(_, reason) => format!("it stops: {reason}"),
        Stop::Paused => format!("it pauses at step {step}"),
        Stop::Store(e) => return Err(e),
    };
    Ok(Verdict::Diverges(Divergence { step, reason, recorded, replayed: None }))
}

/// A call that is not the one the thread recorded, in a line.
fn differs(d: &crate::store::journal::Divergence) -> String {
    let call = format!("call {} of step {} ({:?}{})", d.seq, d.step + 1, d.kind, d.role);
    match d.missing {
        true => format!("it makes a call the thread never made: {call}"),
        false => format!("{call} is another request than the one the thread recorded"),
    }
}

/// The first difference between the steps the thread recorded from `count` on and those the
/// bundle yielded there.
fn compare(count: usize, recorded: &[StepRecord], replayed: &[StepRecord]) -> Option<Divergence> {
    let recorded_size = recorded.first().and_then(|s| s.group).map_or(1, |g| g.size);
    for (i, step) in replayed.iter().enumerate() {
        let Some(was) = recorded.get(i) else {
            return Some(Divergence {
                step: count + i + 1,
                reason: format!(
                    "it yields {} steps at once where the thread recorded {recorded_size}",
                    replayed.len()
                ),
                recorded: None,
                replayed: Some(shown(step)),
            });
        };
        let what = if was.role != step.role {
            "role"
        } else if was.meta != step.meta {
            "meta"
        } else if was.content != step.content {
            "content"
        } else {
            continue;
        };
        return Some(Divergence {
            step: count + i + 1,
            reason: format!("it yields a different step (its {what} differs)"),
            recorded: Some(shown(was)),
            replayed: Some(shown(step)),
        });
    }
    (replayed.len() < recorded_size).then(|| Divergence {
        step: count + replayed.len() + 1,
        reason: format!(
            "it yields {} step(s) at once where the thread recorded {recorded_size}",
            replayed.len()
        ),
        recorded: recorded.get(replayed.len()).map(shown),
        replayed: None,
    })
}

/// A step in a line: its role, meta and the start of its content.
fn shown(step: &StepRecord) -> String {
    cut(&format!("{} {} {}", step.role, step.meta, step.content.replace('\n', " ")))
}

fn cut(text: &str) -> String {
    let mut out: String = text.chars().take(SHOWN).collect();
    if out.len() < text.len() {
        out.push('…');
    }
    out
}

/// Replays stored thread `id` through `bundle` (see [`replay`]): nothing of it changes.
pub async fn replay_thread(
    store: &crate::store::Storage,
    runtime: &Runtime,
    limits: &Limits,
    bundle: &LoadedBundle,
    id: crate::ids::ThreadId,
) -> Result<Verdict> {
    let record = store.threads().read(id)?;
    let calls = recorded_calls(store, &record)?;
    replay(runtime, limits, bundle, &record, calls).await
}

/// The calls thread `record` made that its journal answers with: all it holds but those a
/// retry undid.
pub fn recorded_calls(
    store: &crate::store::Storage,
    record: &ThreadRecord,
) -> Result<Vec<JournalLine>> {
    let mut journal = store.threads().journal(record.start.hash, record.id())?;
    journal.forget_retried(&record.retries);
    Ok(journal.calls_before(usize::MAX))
}
