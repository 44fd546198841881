//! The bundle's generator as the host drives it: instantiate the bundle in a thread's store,
//! hand it the recorded steps, ask for the next step and hold it to the contract (and to the
//! host's limits); and why it stopped when it yields no step, a trap read as the limit or the
//! wait that caused it. (The guest's own `thread` resource is [`instance::GuestThread`].)

use std::sync::Arc;
use std::time::Instant;

use wasmtime::Store;

use super::engine::{InstanceSlot, LoadedBundle, Runtime};
use super::instance::{self, GeneratorStep, ThreadInput};
use super::state::{HostContext, ThreadState, new_store, within_budget};
use crate::clock::now_ms;
use crate::error::{chain_line, exit};
use crate::ids::ThreadId;
use crate::limits::Limits;
use crate::store::records::{
    End, EndStatus, PendingCall, StepGroup, StepRecord, ThreadRecord, Usage,
};

/// An instantiated bundle and its generator.
pub struct Generator {
    store: Store<ThreadState>,
    guest: instance::GuestThread,
    /// The worker's live instance this is (dropped after the store).
    _slot: InstanceSlot,
}

impl Generator {
    /// Instantiates the bundle, once the runtime has room for another live instance, and
    /// constructs the generator with the steps the host has recorded (`record`'s when the
    /// thread is started; more when its instance is rebuilt).
    pub async fn start(
        runtime: &Runtime,
        limits: &Limits,
        bundle: &LoadedBundle,
        host: HostContext,
        id: ThreadId,
        record: &ThreadRecord,
    ) -> Result<Self, Stop> {
        let slot = runtime.instance_slot().await;
        let steps = host.thread.steps.clone();
        let mut store = new_store(runtime.engine(), ThreadState::new(host, limits));
        // Instantiating runs the bundle's start code: it gets the same budget as a step.
        let clock = store.data().clock().clone();
        let instance = within_budget(&clock, bundle.pre.instantiate(&mut store))
            .await
            .map_err(|e| failed(format!("bundle failed to start: {}", chain_line(&e))))?;
        let trigger_data = record.start.trigger_data.as_ref().map(|data| data.to_string());
        let input = ThreadInput {
            thread_id: id,
            prompt: &record.start.parameters.prompt,
            steps: &steps,
            trigger_data: trigger_data.as_deref(),
            max_rounds: record.start.max_rounds(),
        };
        clock.start_step();
        store.data_mut().host.journal.begin_step(steps.len());
        let generator = within_budget(&clock, instance.start(&mut store, input))
            .await
            .map_err(|e| stopped(&mut store, "starting the generator", &e))?;
        Ok(Generator { store, guest: generator, _slot: slot })
    }

    /// Drops the instance (and gives its slot back), keeping what the host knows of the
    /// thread: its record, its journal, its calls out. [`Generator::start`] rebuilds it.
    pub fn into_host(self) -> HostContext {
        // The slot is given back once the instance is gone (at the end of this call).
        let Generator { store, .. } = self;
        store.into_data().host
    }

    /// Asks for the step after step `count` and checks it: `Ok(steps)` to persist (one, or a
    /// parallel group), `Err(end)` when the thread is over (by the bundle's word or the
    /// host's).
    pub async fn next(
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
        let step = within_budget(&clock, self.guest.next(&mut *store))
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
    pub fn persisted(&mut self, steps: &[StepRecord]) {
        let view = &mut self.store.data_mut().host.thread;
        Arc::make_mut(&mut view.steps).extend_from_slice(steps);
    }
}

fn failed(summary: String) -> Stop {
    Stop::End(End::by_host(exit::SOFTWARE, summary, EndStatus::Failed))
}

/// Why the generator stopped before yielding a step.
pub enum Stop {
    /// The thread is over.
    End(End),
    /// A `human` agent needs an answer nobody was there to give.
    Waiting { role: String, call: PendingCall },
    /// The thread must rest before its next agent call — it would go over its budget, a tool
    /// server needs a person to sign in — and pauses, saying why.
    Rest(crate::store::pauses::PauseReason, String),
    /// A pause was asked for, and a durable agent's call stopped between its turns.
    Paused,
    /// The store could not write: the thread stops unended (interrupted), to be resumed.
    Store(crate::Error),
    /// Replaying a recorded thread, the bundle made a call its journal does not hold, or a
    /// different one (only where the journal only replays: see [`crate::run::replay`]).
    Diverged(crate::store::journal::Divergence),
}

impl Stop {
    /// What came instead of a step, in a word (a span's name).
    pub fn as_str(&self) -> &'static str {
        match self {
            Stop::End(_) => "end",
            Stop::Waiting { .. } => "wait for a human",
            Stop::Rest(crate::store::pauses::PauseReason::SignIn, _) => "sign in",
            Stop::Rest(..) => "over budget",
            Stop::Paused => "paused",
            Stop::Store(_) => "store failure",
            Stop::Diverged(_) => "diverged",
        }
    }
}

/// A trap as a stop: waiting for a human if that is what the host trapped for, else a failure
/// with the reason.
fn stopped(store: &mut Store<ThreadState>, during: &str, e: &wasmtime::Error) -> Stop {
    let host = &mut store.data_mut().host;
    if let Some(error) = host.store_failure.take() {
        return Stop::Store(error);
    }
    if host.journal.is_replaying() {
        let divergence = e.downcast_ref::<crate::store::journal::Divergence>().or_else(|| {
            e.chain().find_map(|c| c.downcast_ref::<crate::store::journal::Divergence>())
        });
        if let Some(divergence) = divergence {
            return Stop::Diverged(divergence.clone());
        }
    }
    if let Some((why, reason)) = host.rest.take() {
        return Stop::Rest(why, reason);
    }
    if std::mem::take(&mut host.paused) {
        return Stop::Paused;
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
