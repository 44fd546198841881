//! A thread's sandbox: the wasmtime store data (a WASI context that grants nothing, resource
//! limits, CPU accounting) and what the host imports work with.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::component::ResourceTable;
use wasmtime::{Engine, ResourceLimiter, Store, UpdateDeadline};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::control::ThreadControl;
use super::output::GuestOutput;
use crate::agents::AgentSet;
use crate::agents::extract::Extractor;
use crate::ids::ThreadId;
use crate::limits::{Limits, Size};
use crate::store::debug_log::{DebugLog, LogLevel};
use crate::store::journal::Journal;
use crate::store::records::{PendingCall, StepRecord};

/// The data of one thread's wasmtime store.
pub struct ThreadState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) limiter: Limiter,
    /// Guest output (stdout, stderr, log lines) into the debug log, within its budget.
    pub(crate) output: GuestOutput,
    /// What the host imports work with.
    pub host: HostContext,
    /// CPU accounting for the current generator step.
    pub(crate) clock: StepClock,
}

/// What the host imports (`agent`, `extract`, `log`) need.
#[derive(Debug)]
pub struct HostContext {
    /// `None` while the host reads a descriptor.
    pub thread_id: Option<ThreadId>,
    /// `None` while the host reads a descriptor: no agent may be asked then.
    pub agents: Option<AgentSet>,
    pub extractor: Extractor,
    pub info: DebugLog,
    /// The thread as the host recorded it, for agents' contexts.
    pub thread: ThreadView,
    /// The meta agents supplied with their last answers (content, meta), each offered to the
    /// `extract` of the same content.
    pub agent_meta: Vec<(String, serde_json::Value)>,
    /// Every call recorded before its answer reaches the guest.
    pub journal: Journal,
    /// Where the thread's controller sees the role being worked on.
    pub control: Arc<ThreadControl>,
    /// Set when a `human` agent had nobody to ask: the role and the call to answer.
    pub waiting: Option<(String, PendingCall)>,
    /// Set when the store could not record what the thread did (a full disk, say): the thread
    /// stops where it is, unended, and `resume` continues it once the store can write again.
    pub store_failure: Option<crate::Error>,
    /// The agent calls answered during the current generator step, in the order they
    /// answered: which agent a step's role had, and how long its call took.
    pub answered: Vec<AnsweredCall>,
    /// Set when the thread must rest before its next agent calls — they would go over its
    /// budget, a tool server needs a person to sign in — and why. It pauses before making
    /// them, saying so.
    pub rest: Option<(crate::store::pauses::PauseReason, String)>,
    /// Set when a durable agent's call stopped between its turns for a pause: the thread
    /// pauses, and the call goes on from its journal when resumed.
    pub paused: bool,
    /// In a worker: the agent calls out, which outlive the instance that made them (the
    /// thread may give its instance up while it waits on them). `None`: calls are made on the
    /// instance's own stack.
    pub calls_out: Option<super::calls_out::CallsOut>,
    /// The digests of agents' whole requests, carried from call to call.
    pub(crate) context_digests: super::call_digests::ContextDigests,
}

/// An agent call answered during a generator step.
#[derive(Debug, Clone)]
pub struct AnsweredCall {
    pub role: String,
    /// The binding's label.
    pub agent: String,
    /// How long the agent took (nothing, for an answer replayed from the journal).
    pub elapsed: Duration,
    /// What the call cost, as its service said (kept in the journal, so a replay tells it too).
    pub usage: Option<crate::store::records::Usage>,
}

impl HostContext {
    /// Records that the store failed to write for this thread, and makes the trap that stops
    /// the guest: what it did since the last record is not lost, only not yet kept.
    pub fn store_failed(&mut self, error: crate::Error) -> wasmtime::Error {
        let message = error.to_string();
        self.store_failure = Some(error);
        wasmtime::Error::msg(message)
    }

    /// Called before the thread waits, maybe long (an agent, the LLM extractor): what led here
    /// is on disk, and the thread holds no log or journal file open while it waits, so a
    /// worker's thousands of waiting threads keep one descriptor each (their data file).
    pub fn before_wait(&mut self) {
        self.info.release();
        self.journal.release();
    }

    /// A thread's host context.
    pub fn new(
        thread_id: ThreadId,
        agents: AgentSet,
        info: DebugLog,
        journal: Journal,
        control: Arc<ThreadControl>,
        thread: ThreadView,
    ) -> Self {
        HostContext {
            thread_id: Some(thread_id),
            agents: Some(agents),
            extractor: Extractor,
            info,
            thread,
            agent_meta: Vec::new(),
            journal,
            control,
            waiting: None,
            store_failure: None,
            answered: Vec::new(),
            rest: None,
            paused: false,
            calls_out: None,
            context_digests: Default::default(),
        }
    }

    /// For instances that are not threads (reading a descriptor): no agents, and the debug
    /// log goes to `tracing`.
    pub fn detached() -> Self {
        HostContext {
            thread_id: None,
            agents: None,
            extractor: Extractor,
            info: DebugLog::tracing(),
            thread: ThreadView::default(),
            agent_meta: Vec::new(),
            journal: Journal::disabled(),
            control: Arc::default(),
            waiting: None,
            store_failure: None,
            answered: Vec::new(),
            rest: None,
            paused: false,
            calls_out: None,
            context_digests: Default::default(),
        }
    }
}

/// The thread as the host has recorded it: what each agent call's context is built from, so
/// that a bundle never ships the thread back to the host.
#[derive(Debug, Clone, Default)]
pub struct ThreadView {
    pub prompt: String,
    /// Every step persisted so far (the runner adds each as it persists it).
    pub steps: Arc<Vec<StepRecord>>,
    /// Each role's system prompt, from the bundle's descriptor.
    pub system_prompts: Arc<HashMap<String, String>>,
    /// Each role's schema, from the descriptor: what a person's answer must hold.
    pub role_schemas: Arc<HashMap<String, serde_json::Value>>,
    /// A declarative DAG's steps' timeouts and child workflows, by role.
    pub step_settings: Arc<crate::declarative::StepSettings>,
    /// Starts and follows the thread's child workflows (none: a step that runs one fails).
    pub children: Option<Arc<dyn super::children::Children>>,
    /// How deep in a chain of child workflows the thread is (0: nobody started it).
    pub depth: u32,
    /// What the thread's children are started with: its default agent and directory.
    pub child_request: crate::run_request::RunRequest,
    /// What the thread may spend on agents.
    pub budget: crate::store::records::Budget,
    /// When the thread started (ms since the epoch).
    pub started: u64,
    /// The store's OAuth credentials of tool servers, which its durable agents sign in with
    /// (none where a call runs outside a thread).
    pub credentials: Option<Arc<dyn crate::store::credentials::CredentialBackend>>,
    /// For a thread of an eval: the recorded thread whose journal answers its calls that ask
    /// what it asked.
    pub baseline: Option<Arc<super::baseline::Baseline>>,
}

/// How often the epoch advances: the granularity of the guest-time budget (the engine's
/// ticker advances it; the budget's watchdog wakes no more often).
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Guest time of the current step: wall time since the step began minus time spent in the
/// host's imports (agents may take minutes; that is not the guest's doing). Time the guest
/// spends computing *or blocked in WASI* (a sleep, a poll) counts: both hold the thread's slot.
///
/// Shared (`Clone`): the epoch callback checks it while the guest computes, and the runner's
/// watchdog ([`StepClock::expired`]) while it is blocked, when no epoch check runs.
#[derive(Debug, Clone)]
pub struct StepClock {
    state: Arc<parking_lot::Mutex<ClockState>>,
    budget: Duration,
}

#[derive(Debug)]
struct ClockState {
    started: Instant,
    in_host: Duration,
    /// Since when the guest is in a host import, if it is.
    host_call: Option<Instant>,
}

impl StepClock {
    fn new(budget: Duration) -> Self {
        let state =
            ClockState { started: Instant::now(), in_host: Duration::ZERO, host_call: None };
        StepClock { state: Arc::new(parking_lot::Mutex::new(state)), budget }
    }

    /// Starts the budget of a new step.
    pub fn start_step(&self) {
        let mut state = self.state.lock();
        state.started = Instant::now();
        state.in_host = Duration::ZERO;
        state.host_call = None;
    }

    /// Marks the guest as inside a host import until the guard is dropped: that time is not
    /// the guest's.
    pub fn host_call(&self) -> HostCall {
        self.state.lock().host_call = Some(Instant::now());
        HostCall(self.state.clone())
    }

    /// Time the current step has spent in host imports.
    pub fn in_host(&self) -> Duration {
        let state = self.state.lock();
        state.in_host + state.host_call.map_or(Duration::ZERO, |since| since.elapsed())
    }

    /// The guest's time in the current step.
    pub fn guest_time(&self) -> Duration {
        let elapsed = self.state.lock().started.elapsed();
        elapsed.saturating_sub(self.in_host())
    }

    /// Has the guest used up its budget?
    pub fn exhausted(&self) -> bool {
        self.guest_time() > self.budget
    }

    /// Resolves once the guest has used up its budget: the watchdog for a guest blocked in
    /// WASI, where epoch checks do not run.
    pub async fn expired(&self) {
        loop {
            let left = self.budget.saturating_sub(self.guest_time());
            if left.is_zero() && self.exhausted() {
                return;
            }
            tokio::time::sleep(left.max(EPOCH_TICK)).await;
        }
    }

    /// The budget.
    pub fn budget(&self) -> Duration {
        self.budget
    }
}

/// Runs a call into the guest until it returns or the guest's time in this step runs out while
/// it is blocked (asleep in WASI): epoch checks stop a guest that computes, this one that
/// waits. Dropping the call is safe; the instance is not used again.
pub async fn within_budget<T>(
    clock: &StepClock,
    call: impl std::future::Future<Output = wasmtime::Result<T>>,
) -> wasmtime::Result<T> {
    tokio::select! {
        result = call => result,
        () = clock.expired() => Err(wasmtime::Error::msg(format!(
            "the bundle used more than {} of guest time in one step",
            humantime::format_duration(clock.budget())
        ))),
    }
}

/// A host import in progress (see [`StepClock::host_call`]).
#[derive(Debug)]
pub struct HostCall(Arc<parking_lot::Mutex<ClockState>>);

impl Drop for HostCall {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        if let Some(since) = state.host_call.take() {
            state.in_host += since.elapsed();
        }
    }
}

impl ThreadState {
    /// A store state that grants the guest nothing: no files, no environment, no arguments,
    /// no sockets, no stdin; stdout and stderr go to the thread's debug log.
    pub fn new(host: HostContext, limits: &Limits) -> Self {
        let output = GuestOutput::new(host.info.clone(), limits.output_bytes);
        let wasi = WasiCtx::builder()
            .stdout(output.stream(LogLevel::Stdout))
            .stderr(output.stream(LogLevel::Stderr))
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        ThreadState {
            wasi,
            table: ResourceTable::new(),
            limiter: Limiter { limits: limits.clone(), exceeded: None },
            output,
            host,
            clock: StepClock::new(limits.cpu_per_step),
        }
    }

    /// Time the current step has spent in host calls (agents, extraction, logging).
    pub fn step_host_time(&self) -> Duration {
        self.clock.in_host()
    }

    /// The guest-time clock of the current step.
    pub fn clock(&self) -> &StepClock {
        &self.clock
    }

    /// Starts timing a new step (CPU budget and host time); the runner does this itself, this
    /// is for embedders that drive the generator directly (the micro-benchmarks).
    pub fn start_step(&mut self) {
        self.clock.start_step();
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limiter.limits
    }

    /// Why the last trap happened, if it was a limit: one line naming the limit and its value.
    pub fn exceeded(&self) -> Option<&str> {
        self.limiter.exceeded.as_deref()
    }

    /// Traps the guest because it exceeded a limit; the reason goes to the end record.
    pub fn exceed(&mut self, reason: String) -> wasmtime::Error {
        self.limiter.refuse(reason)
    }

    /// Checks a string crossing the boundary against the `string` limit.
    pub fn check_string(&mut self, what: &str, text: &str) -> wasmtime::Result<()> {
        let max = self.limiter.limits.string_bytes;
        if text.len() > max {
            return Err(self.exceed(format!(
                "limit exceeded: {what} is {}, over the string limit ({}; limits.string)",
                Size(text.len()),
                Size(max)
            )));
        }
        Ok(())
    }
}

/// Enforces the memory and table limits, remembering which one a trap came from.
pub struct Limiter {
    limits: Limits,
    exceeded: Option<String>,
}

impl Limiter {
    /// Remembers `reason` as the limit hit, for the end record, and makes the trap of it.
    fn refuse(&mut self, reason: String) -> wasmtime::Error {
        self.exceeded = Some(reason.clone());
        wasmtime::Error::msg(reason)
    }
}

impl ResourceLimiter for Limiter {
    /// The pooling allocator refused growth within the limit (its slot is smaller): trap
    /// with the reason rather than let the guest see an allocation failure and abort.
    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        let reason =
            format!("limit exceeded: the bundle's memory could not grow: {error} (limits.memory)");
        Err(self.refuse(reason))
    }

    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.limits.memory_bytes {
            let reason = format!(
                "limit exceeded: the bundle tried to grow its memory to {}, over the memory limit ({}; limits.memory)",
                Size(desired),
                Size(self.limits.memory_bytes)
            );
            return Err(self.refuse(reason));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.limits.table_elements {
            let reason = format!(
                "limit exceeded: the bundle tried to grow a table to {desired} elements, over the limit ({}; limits.table-elements)",
                self.limits.table_elements
            );
            return Err(self.refuse(reason));
        }
        Ok(true)
    }
}

impl WasiView for ThreadState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

/// A store for `state` with its limits enforced: memory and tables through the limiter, guest
/// CPU time per step through epoch checks (at every tick the store checks its step clock, and
/// yields to other threads on the executor while the budget lasts).
pub fn new_store(engine: &Engine, state: ThreadState) -> Store<ThreadState> {
    let mut store = Store::new(engine, state);
    store.limiter(|state| &mut state.limiter);
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
    store
}
