//! Running a thread: instantiate the bundle in a fresh sandbox, drive its `run` generator,
//! persist every role output before asking for the next, and write the end record.

use std::time::{Duration, Instant};

use wasmtime::{Store, UpdateDeadline};

use crate::agent::AgentSet;
use crate::bindings::{RoleOutput, RunInput, RunOptions, Step};
use crate::catalog::LoadedBundle;
use crate::engine::{Runtime, one_line};
use crate::error::{Result, exit};
use crate::home::Home;
use crate::ids::ThreadId;
use crate::sandbox::{HostContext, Limits, ThreadState};
use crate::thread_log::{
    End, EndRecord, EndStatus, ForkedFrom, InfoLog, Parameters, RunParameters, StartRecord,
    StepRecord, ThreadWriter, now_ms,
};

/// Log tags of this module's call sites.
const TAG_START: &str = "RN8STA2T";
const TAG_CACHE: &str = "RNC4CH3E";
const TAG_END: &str = "RN3ND0NE";

/// What to run.
#[derive(Debug, Clone)]
pub struct ThreadSpec {
    pub id: ThreadId,
    pub prompt: String,
    pub max_rounds: u32,
    /// Steps the thread starts with (a fork's prefix); the generator continues after them.
    pub steps: Vec<StepRecord>,
    pub forked_from: Option<ForkedFrom>,
}

/// Something that happened in a running thread, for progress output.
#[derive(Debug)]
pub enum ThreadEvent<'a> {
    /// A role output was persisted; `index` is its 1-based position in the thread.
    Step { index: usize, step: &'a StepRecord, elapsed: Duration },
}

/// Runs `spec` on `bundle` to its end and returns the end record (also written to the file).
///
/// Every failure of the guest — a trap, an exceeded limit, a malformed step — ends the thread
/// as `failed` with the reason in its end record; what was recorded before stays. Only
/// failures to write the thread's own files are returned as errors.
pub async fn run_thread(
    runtime: &Runtime,
    home: &Home,
    bundle: &LoadedBundle,
    spec: ThreadSpec,
    agents: AgentSet,
    limits: &Limits,
    mut on_event: impl FnMut(ThreadEvent<'_>),
) -> Result<EndRecord> {
    let start = StartRecord {
        name: bundle.name.clone(),
        hash: bundle.hash,
        thread_id: spec.id.to_string(),
        parameters: Parameters {
            prompt: spec.prompt.clone(),
            options: RunParameters { max_rounds: spec.max_rounds },
        },
        timestamp: now_ms(),
        forked_from: spec.forked_from.clone(),
    };
    let mut writer = ThreadWriter::create(home, &start, &spec.steps)?;
    let info = InfoLog::open(home, bundle.hash, spec.id)?;
    info.write(
        "info",
        TAG_START,
        &format!("thread {} of `{}` ({}) starting", spec.id, bundle.name, bundle.hash),
    );
    info.write(
        "info",
        TAG_CACHE,
        match bundle.cache {
            crate::engine::CacheOutcome::Hit => "bundle loaded from the AOT cache (no compilation)",
            crate::engine::CacheOutcome::Miss => "bundle compiled (AOT cache miss)",
        },
    );

    let end =
        drive(runtime, bundle, &spec, agents, limits, info.clone(), |step, elapsed, count| {
            writer.append_step(step)?;
            on_event(ThreadEvent::Step { index: count, step, elapsed });
            Ok(())
        })
        .await?;
    info.write("info", TAG_END, &format!("thread ended {}: {}", end.status.as_str(), end.summary));
    let record = EndRecord { end, timestamp: now_ms() };
    writer.append_end(&record)?;
    Ok(record)
}

/// The generator loop. `persist` is called for each new step with the thread's step count
/// after it; its error (the thread file cannot be written) aborts the run.
async fn drive(
    runtime: &Runtime,
    bundle: &LoadedBundle,
    spec: &ThreadSpec,
    agents: AgentSet,
    limits: &Limits,
    info: InfoLog,
    mut persist: impl FnMut(&StepRecord, Duration, usize) -> Result<()>,
) -> Result<End> {
    let failed =
        |summary: String| End { return_code: exit::SOFTWARE, summary, status: EndStatus::Failed };
    let host = HostContext::new(spec.id.to_string(), agents, info);
    let mut store = Store::new(runtime.engine(), ThreadState::new(host, limits));
    store.limiter(|state| &mut state.limits);
    install_cpu_deadline(&mut store);

    let instance = match bundle.pre.instantiate_async(&mut store).await {
        Ok(instance) => instance,
        Err(e) => return Ok(failed(format!("bundle failed to start: {}", one_line(&e)))),
    };
    let generator = instance.uncaged_workflow_workflow().thread();
    let input =
        RunInput { prompt: spec.prompt.clone(), steps: spec.steps.iter().map(to_wit).collect() };
    let options = RunOptions { thread_id: spec.id.to_string(), max_rounds: spec.max_rounds };
    store.data_mut().clock.start_step();
    let thread = match generator.call_constructor(&mut store, &input, &options).await {
        Ok(thread) => thread,
        Err(e) => return Ok(failed(trap_reason(&store, "starting the generator", &e))),
    };

    let mut count = spec.steps.len();
    loop {
        let started = Instant::now();
        store.data_mut().clock.start_step();
        let step = match generator.call_next(&mut store, thread).await {
            Ok(step) => step,
            Err(e) => {
                return Ok(failed(trap_reason(&store, &format!("step {}", count + 1), &e)));
            }
        };
        let output = match step {
            Step::Done(result) => {
                let status =
                    if result.return_code == 0 { EndStatus::Completed } else { EndStatus::Failed };
                return Ok(End {
                    return_code: result.return_code,
                    summary: result.summary,
                    status,
                });
            }
            Step::Output(output) => output,
        };
        // The host's own checks: a bundle is untrusted and may not follow the contract.
        if count >= spec.max_rounds as usize {
            return Ok(failed(format!(
                "bundle yielded step {} beyond max rounds ({}); stopped by the host",
                count + 1,
                spec.max_rounds
            )));
        }
        let Some(role) = bundle.descriptor.role(&output.role) else {
            return Ok(failed(format!("bundle yielded a step for unknown role `{}`", output.role)));
        };
        let meta: serde_json::Value = match serde_json::from_str(&output.meta) {
            Ok(meta) => meta,
            Err(e) => {
                return Ok(failed(format!(
                    "bundle yielded a `{}` step whose meta is not JSON: {e}",
                    role.name
                )));
            }
        };
        let step = StepRecord {
            role: output.role,
            content: output.content,
            meta,
            timestamp: output.timestamp,
        };
        count += 1;
        persist(&step, started.elapsed(), count)?;
    }
}

/// Bounds guest CPU time per step: at every epoch tick the store checks its step clock, and
/// yields to other threads on the executor while the budget lasts.
pub(crate) fn install_cpu_deadline(store: &mut Store<ThreadState>) {
    store.epoch_deadline_callback(|ctx| {
        let clock = &ctx.data().clock;
        if clock.exhausted() {
            Err(wasmtime::Error::msg(format!(
                "CPU limit exceeded: the bundle computed for more than {:?} in one step",
                clock.budget()
            )))
        } else {
            Ok(UpdateDeadline::Yield(1))
        }
    });
    store.set_epoch_deadline(1);
}

/// A trap as one line, naming the limit when one was hit.
fn trap_reason(store: &Store<ThreadState>, during: &str, e: &wasmtime::Error) -> String {
    let clock = &store.data().clock;
    if clock.exhausted() {
        return format!(
            "CPU limit exceeded during {during}: more than {:?} of guest computation",
            clock.budget()
        );
    }
    format!("bundle trapped during {during}: {}", one_line(e))
}

fn to_wit(step: &StepRecord) -> RoleOutput {
    RoleOutput {
        role: step.role.clone(),
        content: step.content.clone(),
        meta: step.meta.to_string(),
        timestamp: step.timestamp,
    }
}
