//! Running a thread: instantiate the bundle in a fresh sandbox, hand it the recorded steps
//! (the continuation contract), drive its `run` generator, persist every role output before
//! asking for the next, and end, pause or stop after a given number of steps.

use std::sync::Arc;
use std::time::Instant;

use wasmtime::Store;

use crate::agents::AgentSet;
use crate::clock::now_ms;
use crate::error::{Result, chain_line, exit};
use crate::faults::crash_point;
use crate::ids::ThreadId;
use crate::limits::Limits;
use crate::sandbox::control::ThreadControl;
use crate::sandbox::engine::{CacheOutcome, LoadedBundle, Runtime};
use crate::sandbox::instance::{self, GeneratorStep, ThreadInput};
use crate::sandbox::state::{HostContext, ThreadState, ThreadView, new_store, within_budget};
use crate::store::info_log::{InfoLog, LogLevel};
use crate::store::records::{
    End, EndRecord, EndStatus, PauseReason, Paused, PendingCall, StepGroup, StepRecord,
    ThreadRecord, Usage,
};
use crate::store::{Storage, ThreadWriter};

/// Log tags of this module's call sites.
const TAG_START: &str = "RN8STA2T";
const TAG_CACHE: &str = "RNC4CH3E";
const TAG_END: &str = "RN3ND0NE";
const TAG_PAUSE: &str = "RNPA5E0K";
const TAG_TORN: &str = "RNT0RN1N";

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
    /// A hand-back was requested: the thread stopped after a step with nothing recorded, for
    /// another worker to continue.
    HandedBack,
}

/// Something that happened in a running thread, for progress output.
#[derive(Debug, Clone)]
pub enum ThreadEvent {
    /// A role output was persisted (with its agent and duration); `index` is its 1-based
    /// position in the thread.
    Step { index: usize, step: StepRecord },
}

/// Everything a run needs besides the bundle.
pub struct RunContext<'a> {
    pub runtime: &'a Runtime,
    pub store: &'a Storage,
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
    writer: &mut dyn ThreadWriter,
    record: &ThreadRecord,
    until: Until,
    mut on_event: impl FnMut(ThreadEvent),
) -> Result<RunOutcome> {
    let id = record.id();
    let info = ctx.store.threads().info_log(bundle.hash, id)?;
    let resumed = if record.steps.is_empty() {
        String::new()
    } else {
        format!(" after step {}", record.steps.len())
    };
    info.write(
        LogLevel::Info,
        TAG_START,
        &format!("thread {id} of `{}` ({}) running{resumed}", bundle.name, bundle.hash),
    );
    info.write(
        LogLevel::Info,
        TAG_CACHE,
        match bundle.cache {
            CacheOutcome::Hit => "bundle loaded from the AOT cache (no compilation)",
            CacheOutcome::Miss => "bundle compiled (AOT cache miss)",
        },
    );
    if !record.skipped_lines.is_empty() {
        info.write(
            LogLevel::Warn,
            TAG_TORN,
            &format!(
                "skipped {} unreadable line(s) of the thread file (torn write?), first {:?}",
                record.skipped_lines.len(),
                &record.skipped_lines[..record.skipped_lines.len().min(10)]
            ),
        );
    }
    let journal = ctx.store.threads().journal(bundle.hash, id)?;
    ctx.control.set_steps(record.steps.len());

    let view = ThreadView {
        prompt: record.start.parameters.prompt.clone(),
        steps: Arc::new(record.steps.clone()),
        system_prompts: bundle.system_prompts.clone(),
        role_schemas: bundle.role_schemas.clone(),
        budget: record.budget(),
        started: record.start.timestamp,
    };
    let host =
        HostContext::new(id, ctx.agents.clone(), info.clone(), journal, ctx.control.clone(), view);
    let mut generator = match Generator::start(ctx, bundle, host, id, record).await {
        Ok(generator) => generator,
        Err(end) => return finish(writer, &info, end),
    };

    let mut count = record.steps.len();
    // Generator steps taken: `step` takes one, which may persist a parallel group.
    let mut taken = 0;
    loop {
        if let Until::Steps(n) = until
            && taken >= n
        {
            return Ok(RunOutcome::Stepped);
        }
        let started = Instant::now();
        let max_rounds = record.start.parameters.options.max_rounds;
        let steps = match generator.next(bundle, count, max_rounds, started).await {
            Ok(steps) => steps,
            Err(end) => return finish(writer, &info, end),
        };
        ctx.control.set_activity(None);
        taken += 1;
        writer.append_steps(&steps)?;
        crash_point("step-persisted");
        generator.persisted(&steps);
        ctx.control.set_steps(count + steps.len());
        info.flush();
        for step in steps {
            count += 1;
            ctx.control.publish_step(count, &step);
            on_event(ThreadEvent::Step { index: count, step });
        }
        if ctx.control.pause_requested() {
            writer.append_pause(Paused::by(PauseReason::Pause))?;
            info.write(LogLevel::Info, TAG_PAUSE, &format!("paused after step {count}"));
            return Ok(RunOutcome::Paused);
        }
        if ctx.control.hand_back_requested() {
            info.write(LogLevel::Info, TAG_PAUSE, &format!("handed back after step {count}"));
            return Ok(RunOutcome::HandedBack);
        }
    }
}

/// Writes the end record, or the waiting marker.
fn finish(writer: &mut dyn ThreadWriter, info: &InfoLog, stop: Stop) -> Result<RunOutcome> {
    let end = match stop {
        Stop::End(end) => end,
        Stop::Store(error) => {
            info.write(LogLevel::Error, TAG_END, &format!("stopped unended: {error}"));
            return Err(error);
        }
        Stop::Waiting { role, call } => {
            info.write(
                LogLevel::Info,
                TAG_PAUSE,
                &format!("waiting for a human answer for role `{role}`"),
            );
            writer.append_pause(Paused {
                role: Some(role.clone()),
                call: Some(call),
                ..Paused::by(PauseReason::Waiting)
            })?;
            return Ok(RunOutcome::Waiting { role });
        }
        Stop::Budget(reason) => {
            info.write(LogLevel::Info, TAG_PAUSE, &format!("paused by its budget: {reason}"));
            writer
                .append_pause(Paused { reason: Some(reason), ..Paused::by(PauseReason::Budget) })?;
            return Ok(RunOutcome::Paused);
        }
    };
    info.write(
        LogLevel::Info,
        TAG_END,
        &format!("thread ended {}: {}", end.status.as_str(), end.summary),
    );
    let record = EndRecord { end, timestamp: now_ms() };
    // The debug log is whole once the end is recorded: whoever reads the end may read it.
    info.flush();
    writer.append_end(&record)?;
    Ok(RunOutcome::Ended(record))
}

/// An instantiated bundle and its generator.
struct Generator {
    store: Store<ThreadState>,
    generator: instance::Generator,
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
        let mut store = new_store(ctx.runtime.engine(), ThreadState::new(host, &ctx.limits));
        // Instantiating runs the bundle's start code: it gets the same budget as a step.
        let clock = store.data().clock().clone();
        let instance = within_budget(&clock, bundle.pre.instantiate(&mut store))
            .await
            .map_err(|e| failed(format!("bundle failed to start: {}", chain_line(&e))))?;
        let trigger_data = record.start.trigger_data.as_ref().map(|data| data.to_string());
        let input = ThreadInput {
            thread_id: id,
            prompt: &record.start.parameters.prompt,
            steps: &record.steps,
            trigger_data: trigger_data.as_deref(),
            max_rounds: record.start.parameters.options.max_rounds,
        };
        clock.start_step();
        store.data_mut().host.journal.begin_step(record.steps.len());
        let generator = within_budget(&clock, instance.start(&mut store, input))
            .await
            .map_err(|e| stopped(&mut store, "starting the generator", &e))?;
        Ok(Generator { store, generator })
    }

    /// Asks for the step after step `count` and checks it: `Ok(steps)` to persist (one, or a
    /// parallel group), `Err(end)` when the thread is over (by the bundle's word or the
    /// host's).
    async fn next(
        &mut self,
        bundle: &LoadedBundle,
        count: usize,
        max_rounds: u32,
        started: Instant,
    ) -> Result<Vec<StepRecord>, Stop> {
        let store = &mut self.store;
        let clock = store.data().clock().clone();
        clock.start_step();
        store.data_mut().host.journal.begin_step(count);
        store.data_mut().host.answered.clear();
        let during = format!("step {}", count + 1);
        let step = within_budget(&clock, self.generator.next(&mut *store))
            .await
            .map_err(|e| stopped(store, &during, &e))?;
        let outputs = match step {
            GeneratorStep::Done { return_code, summary } => {
                store
                    .data_mut()
                    .check_string("the summary", &summary)
                    .map_err(|e| failed(e.to_string()))?;
                return Err(Stop::End(End::by_workflow(return_code, summary)));
            }
            GeneratorStep::Outputs(outputs) => outputs,
        };
        // The host's own checks: a bundle is untrusted and may not follow the contract.
        if outputs.is_empty() {
            return Err(failed(format!("the bundle yielded {during} with no role output")));
        }
        let cap = max_rounds.min(store.data().limits().max_rounds) as usize;
        if count + outputs.len() > cap {
            return Err(failed(format!(
                "the bundle yielded step {} beyond max rounds ({cap}); stopped by the host",
                cap + 1
            )));
        }
        let group =
            (outputs.len() > 1).then(|| StepGroup { first: count + 1, size: outputs.len() });
        let whole = started.elapsed();
        let mut steps = Vec::with_capacity(outputs.len());
        for (i, output) in outputs.into_iter().enumerate() {
            let during = format!("step {}", count + 1 + i);
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
            let Some(schema) = bundle.schemas.get(&output.role) else {
                let role: String = output.role.chars().take(64).collect();
                return Err(failed(format!(
                    "the bundle yielded a step for undeclared role `{role}`"
                )));
            };
            let meta = serde_json::from_str(&output.meta).map_err(|e| {
                failed(format!(
                    "the bundle yielded a `{}` step whose meta is not JSON: {e}",
                    output.role
                ))
            })?;
            if let Some(error) = crate::schema::first_error(schema, &meta) {
                return Err(failed(format!(
                    "the bundle yielded a `{}` step whose meta does not match the role's schema: {error}",
                    output.role
                )));
            }
            // The agent that answered for the step's role, and for a step of a parallel group
            // how long its own call took (the group took as long as its slowest).
            let answered = &mut store.data_mut().host.answered;
            let call =
                answered.iter().position(|a| a.role == output.role).map(|i| answered.remove(i));
            let duration = match (&call, group) {
                (Some(call), Some(_)) => call.elapsed,
                _ => whole,
            };
            // The WIT says a step's time is the host's; the host does not take the bundle's
            // word.
            let (agent, usage) = match call {
                Some(call) => (Some(call.agent), call.usage),
                None => (None, None),
            };
            steps.push(StepRecord {
                role: output.role,
                content: output.content,
                meta,
                timestamp: now_ms(),
                group,
                agent,
                duration_ms: Some(duration.as_millis() as u64),
                usage,
            });
        }
        // Calls that answered for no step of their own (a bundle may ask several agents, or
        // one twice, to yield one step) still cost: their usage is the first step's.
        let rest: Vec<_> =
            store.data().host.answered.iter().filter_map(|a| a.usage.clone()).collect();
        if let Some(rest) = Usage::sum(&rest) {
            let first = &mut steps[0];
            first.usage.get_or_insert_with(Usage::default).add(&rest);
        }
        Ok(steps)
    }

    /// Adds persisted steps to the host's record of the thread, which later agent calls
    /// are given.
    fn persisted(&mut self, steps: &[StepRecord]) {
        let view = &mut self.store.data_mut().host.thread;
        Arc::make_mut(&mut view.steps).extend_from_slice(steps);
    }
}

fn failed(summary: String) -> Stop {
    Stop::End(End::by_host(exit::SOFTWARE, summary, EndStatus::Failed))
}

/// Why the generator stopped before yielding a step.
enum Stop {
    /// The thread is over.
    End(End),
    /// A `human` agent needs an answer nobody was there to give.
    Waiting { role: String, call: PendingCall },
    /// The next agent call would go over the thread's budget: it pauses, saying why.
    Budget(String),
    /// The store could not write: the thread stops unended (interrupted), to be resumed.
    Store(crate::Error),
}

/// A trap as a stop: waiting for a human if that is what the host trapped for, else a failure
/// with the reason.
fn stopped(store: &mut Store<ThreadState>, during: &str, e: &wasmtime::Error) -> Stop {
    let host = &mut store.data_mut().host;
    if let Some(error) = host.store_failure.take() {
        return Stop::Store(error);
    }
    if let Some(reason) = host.over_budget.take() {
        return Stop::Budget(reason);
    }
    match host.waiting.take() {
        Some((role, call)) => Stop::Waiting { role, call },
        None => failed(trap_reason(store, during, e)),
    }
}

/// A trap as one line, naming the limit when one was hit.
fn trap_reason(store: &Store<ThreadState>, during: &str, e: &wasmtime::Error) -> String {
    let state = store.data();
    if let Some(limit) = state.exceeded() {
        return format!("{limit} (during {during})");
    }
    if state.clock().exhausted() {
        return format!(
            "limit exceeded: the bundle used more than {} of guest time (computing, or blocked \
             in WASI such as a sleep) during {during} (limits.cpu-per-step)",
            humantime::format_duration(state.clock().budget())
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
        None => format!("the bundle failed during {during}: {}", chain_line(e)),
    }
}

#[cfg(test)]
mod tests {
    //! The step loop's rules, stated on a real bundle (solve-issue) in a temporary home.

    use std::path::Path;

    use super::*;
    use crate::agents::AgentFlags;
    use crate::home::Home;
    use crate::run::catalog::Catalog;
    use crate::run::lifecycle::{self, NewThread, OpenThread};

    struct Fixture {
        _dir: tempfile::TempDir,
        store: Storage,
        runtime: Runtime,
        bundle: LoadedBundle,
    }

    impl Fixture {
        async fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let store = Storage::open(&Home::new(dir.path()));
            let runtime = Runtime::new(store.home()).unwrap();
            let catalog = Catalog::new(&store);
            let path = Path::new(uncaged_test_artifacts::SOLVE_ISSUE);
            let added =
                catalog.add(&runtime, "solve-issue", path, &Limits::default()).await.unwrap();
            let bundle = catalog.load(&runtime, "solve-issue", added.hash).unwrap();
            Fixture { _dir: dir, store, runtime, bundle }
        }

        /// A new thread whose every role is answered by `agent`.
        fn thread(&self, agent: Option<String>) -> OpenThread {
            let new = NewThread {
                name: "solve-issue".into(),
                hash: self.bundle.hash,
                prompt: "Fix the crash".into(),
                max_rounds: 10,
                agents: AgentFlags {
                    default: agent.map(|a| a.parse().expect("an agent spec")),
                    ..Default::default()
                },
                limits: Default::default(),
                trigger_data: None,
                budget: Default::default(),
            };
            lifecycle::create(&self.store, new).unwrap()
        }

        /// Runs `record`'s thread `until`, with the agents it recorded.
        async fn run(
            &self,
            open: &mut OpenThread,
            until: Until,
            control: Arc<ThreadControl>,
        ) -> (RunOutcome, Vec<usize>) {
            let (writer, record) = open;
            let agents =
                lifecycle::agents_for(&self.store, record, &self.bundle, &Default::default())
                    .unwrap();
            let ctx = RunContext {
                runtime: &self.runtime,
                store: &self.store,
                agents,
                limits: Limits::default(),
                control,
            };
            let mut seen = Vec::new();
            let outcome = run_thread(&ctx, &self.bundle, &mut **writer, record, until, |event| {
                let ThreadEvent::Step { index, .. } = event;
                seen.push(index);
            })
            .await
            .unwrap();
            (outcome, seen)
        }
    }

    #[tokio::test]
    async fn every_step_is_stored_before_the_next_is_asked_for() {
        let fixture = Fixture::new().await;
        let mut open = fixture.thread(None);
        let (outcome, seen) = fixture.run(&mut open, Until::End, Arc::default()).await;
        let RunOutcome::Ended(end) = outcome else { panic!("{outcome:?}") };
        let stored = fixture.store.threads().read(open.1.id()).unwrap();
        // Each event reported a step already on the store, numbered from 1.
        assert_eq!(seen, (1..=stored.steps.len()).collect::<Vec<_>>());
        assert_eq!(stored.end, Some(end));
        for step in &stored.steps {
            assert!(step.timestamp >= stored.start.timestamp, "host clock stamps steps");
        }
    }

    #[tokio::test]
    async fn a_step_budget_stops_the_loop_and_a_pause_stops_it_after_the_step() {
        let fixture = Fixture::new().await;
        let mut open = fixture.thread(None);
        let (outcome, seen) = fixture.run(&mut open, Until::Steps(2), Arc::default()).await;
        assert_eq!((outcome, seen), (RunOutcome::Stepped, vec![1, 2]));

        let id = open.1.id();
        drop(open);
        // Another test's child process, between its fork and its exec, may hold a copy of
        // the data file's descriptor, and with it the run lock, for a moment.
        let mut open = (0..100)
            .find_map(|_| match lifecycle::open(&fixture.store, id) {
                Err(crate::Error::ThreadBusy(_)) => {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    None
                }
                other => Some(other.unwrap()),
            })
            .expect("the run lock is released");
        assert_eq!(open.1.steps.len(), 2);
        let control = Arc::new(ThreadControl::default());
        control.request_pause();
        let (outcome, seen) = fixture.run(&mut open, Until::End, control).await;
        assert_eq!((outcome, seen), (RunOutcome::Paused, vec![3]));
        drop(open);
        let paused = fixture.store.threads().read(id).unwrap();
        assert_eq!(paused.paused.map(|p| p.by), Some(PauseReason::Pause));
        assert_eq!(paused.steps.len(), 3);
    }

    #[tokio::test]
    async fn a_step_run_again_is_answered_from_the_journal() {
        let fixture = Fixture::new().await;
        // A command agent that counts its calls (one step, the planner's, is enough here).
        let dir = fixture.store.home().root().to_path_buf();
        let count = dir.join("calls");
        let script = dir.join("agent.sh");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\necho x >> {}\necho '{{\"steps\": [\"do it\"]}}'\n",
                count.display()
            ),
        )
        .unwrap();
        let mut permissions = std::fs::metadata(&script).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
        std::fs::set_permissions(&script, permissions).unwrap();

        let mut open = fixture.thread(Some(format!("command:{}", script.display())));
        let (outcome, _) = fixture.run(&mut open, Until::Steps(1), Arc::default()).await;
        assert_eq!(outcome, RunOutcome::Stepped);
        let id = open.1.id();
        drop(open);
        // A crash after the answer was journaled but before the step was stored: the step is
        // gone from the thread, its call is still in the journal.
        let data = fixture.store.home().thread_data_file(fixture.bundle.hash, id);
        let text = std::fs::read_to_string(&data).unwrap();
        let first_line = text.lines().next().unwrap();
        std::fs::write(&data, format!("{first_line}\n")).unwrap();

        let mut open = lifecycle::open(&fixture.store, id).unwrap();
        assert!(open.1.steps.is_empty());
        let (outcome, seen) = fixture.run(&mut open, Until::Steps(1), Arc::default()).await;
        assert_eq!((outcome, seen), (RunOutcome::Stepped, vec![1]));
        let calls = std::fs::read_to_string(&count).unwrap();
        assert_eq!(calls.lines().count(), 1, "the agent was asked again");
    }
}
