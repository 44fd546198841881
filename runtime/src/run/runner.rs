//! Running a thread: instantiate the bundle in a fresh sandbox, hand it the recorded steps
//! (the continuation contract), drive its `run` generator, persist every role output before
//! asking for the next, and end, pause or stop after a given number of steps.

use std::sync::Arc;
use std::time::Instant;

use tracing::Instrument;

use crate::agents::AgentSet;
use crate::clock::now_ms;
use crate::error::Result;
use crate::faults::crash_point;
use crate::limits::Limits;
use crate::sandbox::calls_out::CallsOut;
use crate::sandbox::control::ThreadControl;
use crate::sandbox::engine::{CacheOutcome, LoadedBundle, Runtime};
use crate::sandbox::generator::{Generator, Stop};
use crate::sandbox::state::{HostContext, ThreadView};
use crate::store::debug_log::{DebugLog, LogLevel};
use crate::store::records::{
    EndRecord, EndStatus, PauseReason, Paused, StepRecord, ThreadRecord, Usage,
};
use crate::store::{Storage, ThreadWriter};
use crate::telemetry::{self, ThreadEnd};

/// Log tags of this module's call sites.
const TAG_START: &str = "RN8STA2T";
const TAG_CACHE: &str = "RNC4CH3E";
const TAG_END: &str = "RN3ND0NE";
const TAG_PAUSE: &str = "RNPA5E0K";
const TAG_TORN: &str = "RNT0RN1N";
const TAG_EVICT: &str = "RNEV1CT0";

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

impl RunOutcome {
    /// One word for how the run stopped (a span's attribute).
    pub fn as_str(&self) -> &'static str {
        match self {
            RunOutcome::Ended(_) => "ended",
            RunOutcome::Paused => "paused",
            RunOutcome::Stepped => "stepped",
            RunOutcome::Waiting { .. } => "waiting",
            RunOutcome::HandedBack => "handed back",
        }
    }
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
    /// Starts and follows child workflows' threads (none where a thread runs one step).
    pub children: Option<Arc<dyn crate::sandbox::children::Children>>,
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
    let started_by = record.start.started_by.as_ref().map(|by| by.line());
    let span = telemetry::run_span(
        id,
        &bundle.name,
        bundle.hash,
        record.steps.len(),
        started_by.as_deref(),
    );
    let (mut steps, mut usage) = (record.steps.len(), record.usage());
    let outcome = run_steps(ctx, bundle, writer, record, until, |event| {
        let ThreadEvent::Step { step, .. } = &event;
        steps += 1;
        if let Some(more) = &step.usage {
            usage.get_or_insert_with(Usage::default).add(more);
        }
        on_event(event)
    })
    .instrument(span.clone())
    .await;
    span.record("uncaged.run.steps", (steps - record.steps.len()) as i64);
    let Ok(outcome) = outcome else { return outcome };
    span.record("uncaged.run.outcome", outcome.as_str());
    if let RunOutcome::Ended(end) = &outcome {
        telemetry::thread_ended(ThreadEnd {
            thread: id,
            workflow: &bundle.name,
            hash: bundle.hash,
            started_ms: record.start.timestamp,
            status: end.end.status.as_str(),
            summary: &end.end.summary,
            failed: end.end.status == EndStatus::Failed,
            steps,
            tokens: usage.as_ref().map(|u| (u.input_tokens, u.output_tokens)),
            cost_usd: usage.as_ref().and_then(|u| u.cost_usd),
        });
    }
    Ok(outcome)
}

/// [`run_thread`], inside the run's span.
async fn run_steps(
    ctx: &RunContext<'_>,
    bundle: &LoadedBundle,
    writer: &mut dyn ThreadWriter,
    record: &ThreadRecord,
    until: Until,
    mut on_event: impl FnMut(ThreadEvent),
) -> Result<RunOutcome> {
    let id = record.id();
    // Taken up again after a rest: said first, so that whoever reads the thread while this
    // process holds it knows the rest is over (and one held while it lets go of a rest is
    // known to be at rest).
    if record.resting && record.end.is_none() {
        writer.append_continued(&ctx.store.queue().owner())?;
    }
    // Its records stay where they were first stored, under the version it started on.
    let info = ctx.store.threads().debug_log(record.start.hash, id)?;
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
    let mut journal = ctx.store.threads().journal(record.start.hash, id)?;
    journal.forget_retried(&record.retries);
    ctx.control.set_steps(record.steps.len());

    let view = ThreadView {
        prompt: record.start.parameters.prompt.clone(),
        steps: Arc::new(record.steps.clone()),
        system_prompts: bundle.system_prompts.clone(),
        role_schemas: bundle.role_schemas.clone(),
        step_settings: bundle.step_settings.clone(),
        children: ctx.children.clone(),
        depth: record.start.parent.as_ref().map_or(0, |p| p.depth),
        child_request: crate::run_request::RunRequest {
            agent: record.start.parameters.options.agent.clone(),
            cwd: record.start.parameters.options.cwd.clone(),
            ..Default::default()
        },
        budget: record.budget(),
        started: record.start.timestamp,
        credentials: Some(ctx.store.credentials()),
        baseline: super::baselines::of(ctx.store, record)?,
    };
    let mut host =
        HostContext::new(id, ctx.agents.clone(), info.clone(), journal, ctx.control.clone(), view);
    // In a worker, a thread waiting on its agents gives its instance up after a while.
    let mut evicts = ctx.runtime.evict_after().map(|after| {
        let out = CallsOut::default();
        let since = out.since();
        host.calls_out = Some(out);
        (after, since)
    });
    let mut generator = match Box::pin(Generator::start(
        ctx.runtime,
        &ctx.limits,
        bundle,
        host,
        id,
        record,
    ))
    .await
    {
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
        let max_rounds = record.start.max_rounds();
        let span = telemetry::step_span(count + 1);
        let next = loop {
            // Boxed, as the starts are: a thread waiting on its agents holds this run's future
            // for as long as it waits, and unboxed it would be as large as the largest of them
            // (9 KiB a thread, most of a waiting thread's memory once its instance is gone).
            let next = Box::pin(generator.next(bundle, count, max_rounds, started))
                .instrument(span.clone());
            let Some((after, since)) = evicts.as_mut() else { break next.await };
            tokio::select! {
                next = next => break next,
                () = since.overdue(*after) => {}
            }
            generator = match Box::pin(rebuild(ctx, bundle, generator, record, &info, *after)).await
            {
                Ok(generator) => generator,
                Err(stop) => {
                    telemetry::step_stopped(&span, stop.as_str());
                    return finish(writer, &info, stop);
                }
            };
        };
        let steps = match next {
            Ok(steps) => steps,
            // A durable agent stopped between its turns for a hand-back (the worker was told to
            // stop): nothing is recorded, and the worker that takes the thread goes on from the
            // call's journal, as after a pause.
            Err(Stop::Paused)
                if ctx.control.hand_back_requested() && !ctx.control.pause_requested() =>
            {
                telemetry::step_stopped(&span, "handed back");
                info.write(LogLevel::Info, TAG_PAUSE, "handed back between an agent's turns");
                return Ok(RunOutcome::HandedBack);
            }
            Err(stop) => {
                telemetry::step_stopped(&span, stop.as_str());
                return finish(writer, &info, stop);
            }
        };
        trace_step(&span, &steps);
        ctx.control.set_activity(None);
        taken += 1;
        writer.append_steps(&steps).await?;
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

/// Gives up the instance of a thread that has waited on its agents for `after`, waits for
/// their answers holding none, and builds the instance again from the host's record: the
/// bundle is handed the steps recorded so far, and the same calls again take the answers of
/// the calls out (nobody is asked twice).
async fn rebuild(
    ctx: &RunContext<'_>,
    bundle: &LoadedBundle,
    generator: Generator,
    record: &ThreadRecord,
    info: &DebugLog,
    after: std::time::Duration,
) -> std::result::Result<Generator, Stop> {
    let mut host = generator.into_host();
    info.write(
        LogLevel::Info,
        TAG_EVICT,
        &format!(
            "instance given up after {} waiting on agents (limits.evict-after)",
            humantime::format_duration(after)
        ),
    );
    host.before_wait();
    if let Some(out) = host.calls_out.as_mut() {
        out.answered().await;
    }
    Box::pin(Generator::start(ctx.runtime, &ctx.limits, bundle, host, record.id(), record)).await
}

/// What a step was, on its span: its roles, their agents, and what it cost.
fn trace_step(span: &tracing::Span, steps: &[StepRecord]) {
    if span.is_disabled() {
        return;
    }
    let list = |field: fn(&StepRecord) -> Option<&str>| {
        steps.iter().filter_map(field).collect::<Vec<_>>().join(", ")
    };
    span.record("uncaged.step.roles", list(|s| Some(&s.role)));
    span.record("uncaged.step.agents", list(|s| s.agent.as_deref()));
    if let Some(usage) = Usage::sum(steps.iter().filter_map(|s| s.usage.as_ref())) {
        usage.trace(span);
    }
}

/// Writes the end record, or the waiting marker.
fn finish(writer: &mut dyn ThreadWriter, info: &DebugLog, stop: Stop) -> Result<RunOutcome> {
    let end = match stop {
        Stop::End(end) => end,
        Stop::Store(error) => {
            info.write(LogLevel::Error, TAG_END, &format!("stopped unended: {error}"));
            return Err(error);
        }
        // Only a replaying journal stops so; a thread's own run ends failed with the reason.
        Stop::Diverged(divergence) => crate::store::records::End::by_host(
            crate::error::exit::SOFTWARE,
            divergence.to_string(),
            EndStatus::Failed,
        ),
        Stop::Waiting { role, call } => {
            let on = match call.child {
                Some(child) => format!("its child thread {child}"),
                None => "a human answer".into(),
            };
            info.write(LogLevel::Info, TAG_PAUSE, &format!("waiting for {on} for role `{role}`"));
            writer.append_pause(Paused {
                role: Some(role.clone()),
                call: Some(call),
                ..Paused::by(PauseReason::Waiting)
            })?;
            return Ok(RunOutcome::Waiting { role });
        }
        Stop::Paused => {
            info.write(LogLevel::Info, TAG_PAUSE, "paused between an agent's turns");
            writer.append_pause(Paused::by(PauseReason::Pause))?;
            return Ok(RunOutcome::Paused);
        }
        Stop::Rest(why, reason) => {
            info.write(LogLevel::Info, TAG_PAUSE, &format!("paused: {reason}"));
            writer.append_pause(Paused { reason: Some(reason), ..Paused::by(why) })?;
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

#[cfg(test)]
mod tests {
    //! The step loop's rules, stated on a real bundle (solve-issue) in a temporary home.

    use std::path::Path;

    use super::*;
    use crate::home::Home;
    use crate::run::catalog::Catalog;
    use crate::run::lifecycle::{self, Checked, OpenThread, StartRequest};
    use crate::run_request::RunRequest;

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

        /// A new thread whose every role is answered by `agent`, opened.
        fn thread(&self, agent: Option<String>) -> OpenThread {
            let request = RunRequest {
                agent: agent.map(|a| a.parse().expect("an agent spec")),
                max_rounds: Some(10),
                ..Default::default()
            };
            let start = StartRequest {
                name: "solve-issue".into(),
                prompt: "Fix the crash".into(),
                trigger_data: None,
                request: request.clone(),
                origin: Default::default(),
            };
            let checked = Checked { hash: self.bundle.hash, request };
            let created = lifecycle::create(&self.store, start, checked).unwrap();
            self.store.threads().open(created.id()).unwrap()
        }

        /// Runs `record`'s thread `until`, with the agents it recorded.
        async fn run(
            &self,
            open: &mut OpenThread,
            until: Until,
            control: Arc<ThreadControl>,
        ) -> (RunOutcome, Vec<usize>) {
            let (writer, record) = open;
            let agents = lifecycle::agents_for(
                &self.store,
                record,
                &self.bundle,
                &Default::default(),
                &Default::default(),
            )
            .unwrap();
            let ctx = RunContext {
                runtime: &self.runtime,
                store: &self.store,
                agents,
                limits: Limits::default(),
                control,
                children: None,
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
