//! Running a thread: instantiate the bundle in a fresh sandbox, hand it the recorded steps
//! (the continuation contract), drive its `run` generator, persist every role output before
//! asking for the next, and end, pause or stop after a given number of steps.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use std::time::{Duration, Instant};
use tokio::sync::broadcast;

use wasmtime::{Store, UpdateDeadline};

use crate::agent::AgentSet;
use crate::bindings::{RoleOutput, RunInput, RunOptions, Step};
use crate::catalog::LoadedBundle;
use crate::engine::{CacheOutcome, Runtime, one_line};
use crate::error::{Result, exit};
use crate::faults::crash_point;
use crate::home::Home;
use crate::human::{HumanPort, PendingCall};
use crate::ids::ThreadId;
use crate::journal::Journal;
use crate::limits::Limits;
use crate::sandbox::{HostContext, ThreadState};
use crate::thread_log::{
    End, EndRecord, EndStatus, InfoLog, Paused, StepRecord, ThreadRecord, ThreadWriter, now_ms,
};

/// Log tags of this module's call sites.
const TAG_START: &str = "RN8STA2T";
const TAG_CACHE: &str = "RNC4CH3E";
const TAG_END: &str = "RN3ND0NE";
const TAG_PAUSE: &str = "RNPA5E0K";
const TAG_TORN: &str = "RNT0RN1N";

/// Shared between a running thread and whoever controls it (the worker, `ps`, followers).
#[derive(Debug)]
pub struct ThreadControl {
    pause: AtomicBool,
    /// What the thread does now (for `ps`)…
    activity: Mutex<Option<Activity>>,
    /// …and each change of it, in order (for followers).
    activity_events: broadcast::Sender<Activity>,
    steps: AtomicUsize,
    /// Where `human` agents put their questions.
    pub human: HumanPort,
}

/// What a thread is doing: which role is at work, with which agent.
#[derive(Debug, Clone, PartialEq)]
pub struct Activity {
    pub role: String,
    pub agent: String,
}

impl Default for ThreadControl {
    fn default() -> Self {
        ThreadControl {
            pause: AtomicBool::new(false),
            activity: Mutex::new(None),
            activity_events: broadcast::channel(64).0,
            steps: AtomicUsize::new(0),
            human: HumanPort::default(),
        }
    }
}

impl ThreadControl {
    /// Asks the thread to stop after its current step is persisted.
    pub fn request_pause(&self) {
        self.pause.store(true, Ordering::SeqCst);
    }

    /// The role being worked on, if an agent is at work.
    pub fn current_role(&self) -> Option<String> {
        self.activity.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|a| a.role.clone())
    }

    /// Records what the thread is doing.
    pub fn set_activity(&self, activity: Option<Activity>) {
        if let Some(activity) = &activity {
            let _ = self.activity_events.send(activity.clone());
        }
        *self.activity.lock().unwrap_or_else(|p| p.into_inner()) = activity;
    }

    /// Follows what the thread starts doing from now on.
    pub fn watch(&self) -> broadcast::Receiver<Activity> {
        self.activity_events.subscribe()
    }

    /// Steps recorded so far.
    pub fn steps(&self) -> usize {
        self.steps.load(Ordering::SeqCst)
    }
}

/// How far to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// To the end (or a pause).
    End,
    /// At most this many new steps (`step` runs one).
    Steps(usize),
}

/// How a run stopped.
#[derive(Debug, Clone, PartialEq)]
pub enum RunOutcome {
    /// The thread ended; the end record was written.
    Ended(EndRecord),
    /// A pause was requested; the pause marker was written.
    Paused,
    /// The requested number of steps was taken; the thread goes on later.
    Stepped,
    /// A `human` agent needs an answer; the thread waits for `answer`.
    Waiting { role: String },
}

/// Something that happened in a running thread, for progress output.
#[derive(Debug, Clone)]
pub enum ThreadEvent {
    /// A role output was persisted; `index` is its 1-based position in the thread.
    Step { index: usize, step: StepRecord, agent: String, elapsed: Duration },
}

/// Everything a run needs besides the bundle.
pub struct RunContext<'a> {
    pub runtime: &'a Runtime,
    pub home: &'a Home,
    pub agents: AgentSet,
    pub limits: Limits,
    pub control: Arc<ThreadControl>,
}

/// Runs the thread held by `writer` (whose recorded state is `record`) until it ends, is
/// paused, or has taken the steps `until` allows.
///
/// Every failure of the guest — a trap, an exceeded limit, a malformed step, a call that
/// diverges from the journal — ends the thread as `failed` with the reason in its end record;
/// what was recorded before stays. Only failures to write the thread's files are errors.
pub async fn run_thread(
    ctx: &RunContext<'_>,
    bundle: &LoadedBundle,
    writer: &mut ThreadWriter,
    record: &ThreadRecord,
    until: Until,
    mut on_event: impl FnMut(ThreadEvent),
) -> Result<RunOutcome> {
    let id = record.id();
    let info = InfoLog::open(ctx.home, bundle.hash, id)?;
    let resumed = if record.steps.is_empty() {
        String::new()
    } else {
        format!(" after step {}", record.steps.len())
    };
    info.write(
        "info",
        TAG_START,
        &format!("thread {id} of `{}` ({}) running{resumed}", bundle.name, bundle.hash),
    );
    info.write(
        "info",
        TAG_CACHE,
        match bundle.cache {
            CacheOutcome::Hit => "bundle loaded from the AOT cache (no compilation)",
            CacheOutcome::Miss => "bundle compiled (AOT cache miss)",
        },
    );
    if !record.skipped_lines.is_empty() {
        info.write(
            "warn",
            TAG_TORN,
            &format!(
                "skipped unreadable lines {:?} of the thread file (torn write?)",
                record.skipped_lines
            ),
        );
    }
    let journal = Journal::open(&ctx.home.thread_calls_file(bundle.hash, id))?;
    ctx.control.steps.store(record.steps.len(), Ordering::SeqCst);

    let host = HostContext::new(
        id.to_string(),
        ctx.agents.clone(),
        info.clone(),
        journal,
        ctx.control.clone(),
    );
    let mut generator = match Generator::start(ctx, bundle, host, id, record).await {
        Ok(generator) => generator,
        Err(end) => return finish(writer, &info, end),
    };

    let mut count = record.steps.len();
    let mut taken = 0;
    loop {
        if let Until::Steps(n) = until
            && taken >= n
        {
            return Ok(RunOutcome::Stepped);
        }
        let started = Instant::now();
        let step =
            match generator.next(bundle, count, record.start.parameters.options.max_rounds).await {
                Ok(step) => step,
                Err(end) => return finish(writer, &info, end),
            };
        ctx.control.set_activity(None);
        count += 1;
        taken += 1;
        writer.append_step(&step)?;
        crash_point("step-persisted");
        ctx.control.steps.store(count, Ordering::SeqCst);
        info.flush();
        let agent = ctx.agents.for_role(&step.role).label.clone();
        on_event(ThreadEvent::Step { index: count, step, agent, elapsed: started.elapsed() });
        if ctx.control.pause.load(Ordering::SeqCst) {
            writer.append_pause(Paused { by: "pause".into(), role: None, call: None })?;
            info.write("info", TAG_PAUSE, &format!("paused after step {count}"));
            return Ok(RunOutcome::Paused);
        }
    }
}

/// Writes the end record, or the waiting marker.
fn finish(writer: &mut ThreadWriter, info: &InfoLog, stop: Stop) -> Result<RunOutcome> {
    let end = match stop {
        Stop::End(end) => end,
        Stop::Waiting { role, call } => {
            info.write("info", TAG_PAUSE, &format!("waiting for a human answer for role `{role}`"));
            writer.append_pause(Paused {
                by: "waiting".into(),
                role: Some(role.clone()),
                call: Some(call),
            })?;
            return Ok(RunOutcome::Waiting { role });
        }
    };
    info.write("info", TAG_END, &format!("thread ended {}: {}", end.status.as_str(), end.summary));
    let record = EndRecord { end, timestamp: now_ms() };
    writer.append_end(&record)?;
    Ok(RunOutcome::Ended(record))
}

/// An instantiated bundle and its generator resource.
struct Generator {
    store: Store<ThreadState>,
    instance: crate::bindings::Bundle,
    thread: wasmtime::component::ResourceAny,
}

impl Generator {
    /// Instantiates the bundle and constructs the generator with the recorded steps.
    async fn start(
        ctx: &RunContext<'_>,
        bundle: &LoadedBundle,
        host: HostContext,
        id: ThreadId,
        record: &ThreadRecord,
    ) -> Result<Self, Stop> {
        let mut store = Store::new(ctx.runtime.engine(), ThreadState::new(host, &ctx.limits));
        store.limiter(|state| &mut state.limiter);
        install_cpu_deadline(&mut store);
        let instance = bundle
            .pre
            .instantiate_async(&mut store)
            .await
            .map_err(|e| failed(format!("bundle failed to start: {}", one_line(&e))))?;
        let input = RunInput {
            prompt: record.start.parameters.prompt.clone(),
            steps: record.steps.iter().map(to_wit).collect(),
        };
        let options = RunOptions {
            thread_id: id.to_string(),
            max_rounds: record.start.parameters.options.max_rounds,
        };
        store.data_mut().clock.start_step();
        store.data_mut().host.journal.begin_step(record.steps.len());
        let thread = instance
            .uncaged_workflow_workflow()
            .thread()
            .call_constructor(&mut store, &input, &options)
            .await
            .map_err(|e| stopped(&mut store, "starting the generator", &e))?;
        Ok(Generator { store, instance, thread })
    }

    /// Asks for step `count + 1` and checks it: `Ok(step)` to persist, `Err(end)` when the
    /// thread is over (by the bundle's word or the host's).
    async fn next(
        &mut self,
        bundle: &LoadedBundle,
        count: usize,
        max_rounds: u32,
    ) -> Result<StepRecord, Stop> {
        let store = &mut self.store;
        store.data_mut().clock.start_step();
        store.data_mut().host.journal.begin_step(count);
        let step = self
            .instance
            .uncaged_workflow_workflow()
            .thread()
            .call_next(&mut *store, self.thread)
            .await
            .map_err(|e| stopped(store, &format!("step {}", count + 1), &e))?;
        let output = match step {
            Step::Done(result) => {
                store
                    .data_mut()
                    .check_string("the summary", &result.summary)
                    .map_err(|e| failed(e.to_string()))?;
                let status =
                    if result.return_code == 0 { EndStatus::Completed } else { EndStatus::Failed };
                return Err(Stop::End(End {
                    return_code: result.return_code,
                    summary: result.summary,
                    status,
                }));
            }
            Step::Output(output) => output,
        };
        // The host's own checks: a bundle is untrusted and may not follow the contract.
        let cap = store.data().limits().max_rounds;
        if count >= max_rounds.min(cap) as usize {
            return Err(failed(format!(
                "the bundle yielded step {} beyond max rounds ({}); stopped by the host",
                count + 1,
                max_rounds.min(cap)
            )));
        }
        let during = format!("step {}", count + 1);
        let state = store.data_mut();
        for (what, text) in [
            ("the content", &output.content),
            ("the meta", &output.meta),
            ("the role name", &output.role),
        ] {
            state
                .check_string(&format!("{what} of {during}"), text)
                .map_err(|e| failed(e.to_string()))?;
        }
        if bundle.descriptor.role(&output.role).is_none() {
            return Err(failed(format!(
                "bundle yielded a step for unknown role `{}`",
                output.role
            )));
        }
        let meta = serde_json::from_str(&output.meta).map_err(|e| {
            failed(format!("bundle yielded a `{}` step whose meta is not JSON: {e}", output.role))
        })?;
        Ok(StepRecord {
            role: output.role,
            content: output.content,
            meta,
            timestamp: output.timestamp,
        })
    }
}

fn failed(summary: String) -> Stop {
    Stop::End(End { return_code: exit::SOFTWARE, summary, status: EndStatus::Failed })
}

/// Why the generator stopped before yielding a step.
enum Stop {
    /// The thread is over.
    End(End),
    /// A `human` agent needs an answer nobody was there to give.
    Waiting { role: String, call: PendingCall },
}

/// A trap as a stop: waiting for a human if that is what the host trapped for, else a failure
/// with the reason.
fn stopped(store: &mut Store<ThreadState>, during: &str, e: &wasmtime::Error) -> Stop {
    match store.data_mut().host.waiting.take() {
        Some((role, call)) => Stop::Waiting { role, call },
        None => failed(trap_reason(store, during, e)),
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
    let state = store.data();
    if let Some(limit) = state.exceeded() {
        return format!("{limit} (during {during})");
    }
    if state.clock.exhausted() {
        return format!(
            "limit exceeded: the bundle computed for more than {} during {during} (limits.cpu-per-step)",
            humantime::format_duration(state.clock.budget())
        );
    }
    match e.downcast_ref::<wasmtime::Trap>() {
        Some(wasmtime::Trap::StackOverflow) => {
            format!("the bundle overflowed its stack (runaway recursion?) during {during}")
        }
        Some(wasmtime::Trap::UnreachableCodeReached) => match state.output.last_words() {
            Some(line) => format!("the bundle aborted during {during}: {}", line.trim()),
            None => {
                format!("the bundle aborted during {during} (it reached `unreachable`: a panic?)")
            }
        },
        Some(trap) => format!("the bundle trapped during {during}: {trap}"),
        None => format!("the bundle failed during {during}: {}", one_line(e)),
    }
}

fn to_wit(step: &StepRecord) -> RoleOutput {
    RoleOutput {
        role: step.role.clone(),
        content: step.content.clone(),
        meta: step.meta.to_string(),
        timestamp: step.timestamp,
    }
}
