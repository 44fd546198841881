//! A thread's sandbox: the wasmtime store data (a WASI context that grants nothing, resource
//! limits, CPU accounting) and the capture of the guest's stdout/stderr into its debug log.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::agent::AgentSet;
use crate::extract::Extractor;
use crate::human::PendingCall;
use crate::journal::Journal;
use crate::limits::{Limits, Size};
use crate::runner::ThreadControl;
use crate::thread_log::InfoLog;

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
    pub thread_id: String,
    /// `None` while the host reads a descriptor: no agent may be asked then.
    pub agents: Option<AgentSet>,
    pub extractor: Extractor,
    pub info: InfoLog,
    /// The meta an agent supplied with its last answer, offered to the next `extract` of the
    /// same content.
    pub agent_meta: Option<(String, serde_json::Value)>,
    /// Every call recorded before its answer reaches the guest.
    pub journal: Journal,
    /// Where the thread's controller sees the role being worked on.
    pub control: Arc<ThreadControl>,
    /// Set when a `human` agent had nobody to ask: the role and the call to answer.
    pub waiting: Option<(String, PendingCall)>,
}

impl HostContext {
    /// Called before the thread waits, maybe long (an agent, the LLM extractor): what led here
    /// is on disk, and the thread holds no log or journal file open while it waits, so a
    /// worker's thousands of waiting threads keep one descriptor each (their data file).
    pub fn before_wait(&mut self) {
        self.info.release();
        self.journal.release();
    }

    /// A thread's host context.
    pub fn new(
        thread_id: String,
        agents: AgentSet,
        info: InfoLog,
        journal: Journal,
        control: Arc<ThreadControl>,
    ) -> Self {
        HostContext {
            thread_id,
            agents: Some(agents),
            extractor: Extractor,
            info,
            agent_meta: None,
            journal,
            control,
            waiting: None,
        }
    }

    /// For instances that are not threads (reading a descriptor): no agents, and the debug
    /// log goes to `tracing`.
    pub fn detached() -> Self {
        HostContext {
            thread_id: String::new(),
            agents: None,
            extractor: Extractor,
            info: InfoLog::tracing(),
            agent_meta: None,
            journal: Journal::disabled(),
            control: Arc::default(),
            waiting: None,
        }
    }
}

/// Guest CPU time of the current step: wall time since the step began minus time spent in
/// host calls (agents may take minutes; that is not the guest spinning).
#[derive(Debug)]
pub struct StepClock {
    started: Instant,
    in_host: Duration,
    budget: Duration,
}

impl StepClock {
    fn new(budget: Duration) -> Self {
        StepClock { started: Instant::now(), in_host: Duration::ZERO, budget }
    }

    /// Starts the budget of a new step.
    pub fn start_step(&mut self) {
        self.started = Instant::now();
        self.in_host = Duration::ZERO;
    }

    /// Records time spent in a host call.
    pub fn add_host_time(&mut self, spent: Duration) {
        self.in_host += spent;
    }

    /// Has the guest used up its budget?
    pub fn exhausted(&self) -> bool {
        self.started.elapsed().saturating_sub(self.in_host) > self.budget
    }

    /// The budget.
    pub fn budget(&self) -> Duration {
        self.budget
    }
}

impl ThreadState {
    /// A store state that grants the guest nothing: no files, no environment, no arguments,
    /// no sockets, no stdin; stdout and stderr go to the thread's debug log.
    pub fn new(host: HostContext, limits: &Limits) -> Self {
        let output = GuestOutput::new(host.info.clone(), limits.output_bytes);
        let wasi = WasiCtx::builder()
            .stdout(output.stream("stdout"))
            .stderr(output.stream("stderr"))
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
        self.clock.in_host
    }

    /// Starts timing a new step (CPU budget and host time).
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

/// The guest's stdout and stderr, written line by line into the debug log, up to a budget
/// shared by both streams; past it, output is dropped with one note in the log.
#[derive(Clone)]
pub(crate) struct GuestOutput {
    info: InfoLog,
    shared: Arc<Mutex<OutputBudget>>,
}

struct OutputBudget {
    remaining: usize,
    noted_overflow: bool,
    /// The last lines the guest wrote to stderr, where a panic message would be.
    stderr_tail: std::collections::VecDeque<String>,
}

impl GuestOutput {
    fn new(info: InfoLog, budget: usize) -> Self {
        GuestOutput {
            info,
            shared: Arc::new(Mutex::new(OutputBudget {
                remaining: budget,
                noted_overflow: false,
                stderr_tail: Default::default(),
            })),
        }
    }

    /// Takes `bytes` from the budget; how many may be kept.
    fn take(&self, bytes: usize) -> usize {
        let mut budget = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        let take = bytes.min(budget.remaining);
        budget.remaining -= take;
        if take < bytes && !budget.noted_overflow {
            budget.noted_overflow = true;
            self.info.write(
                "warn",
                TAG_GUEST_OUTPUT,
                "guest output limit reached (limits.output); further output dropped",
            );
        }
        take
    }

    /// A log line from the guest's `log` import, within the budget (which counts the line's
    /// JSON framing too, so the budget bounds the file).
    pub(crate) fn log(&self, level: &str, tag: &str, message: &str) {
        let cost = message.len() + LINE_OVERHEAD;
        if self.take(cost) == cost {
            self.info.write(level, tag, message);
        }
    }

    /// What the guest said on stderr before it died: a Rust panic's message if there is one
    /// (`panicked at FILE:LINE:` and the line after it), else its last stderr line.
    pub(crate) fn last_words(&self) -> Option<String> {
        let budget = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        let lines: Vec<&String> = budget.stderr_tail.iter().collect();
        if let Some(i) = lines.iter().rposition(|l| l.contains("panicked at")) {
            let message = lines.get(i + 1).map(|l| l.trim()).unwrap_or_default();
            return Some(format!("{} {message}", lines[i].trim()).trim().to_string());
        }
        lines.last().map(|l| l.trim().to_string())
    }

    fn stream(&self, name: &'static str) -> GuestStream {
        GuestStream { output: self.clone(), name, line: Arc::new(Mutex::new(Vec::new())) }
    }
}

/// One of the two streams; keeps its partial last line.
#[derive(Clone)]
struct GuestStream {
    output: GuestOutput,
    name: &'static str,
    line: Arc<Mutex<Vec<u8>>>,
}

/// Bytes of JSON around each debug log line (tag, level, timestamp, quotes).
const LINE_OVERHEAD: usize = 80;

/// Stderr lines kept to explain a crash.
const STDERR_TAIL_LINES: usize = 8;

/// Log tag of guest stdout/stderr lines.
const TAG_GUEST_OUTPUT: &str = "G5TD0VT1";

impl GuestStream {
    fn write(&self, bytes: &[u8]) {
        let take = self.output.take(bytes.len());
        let newlines = bytes[..take].iter().filter(|&&b| b == b'\n').count();
        // Charge the JSON framing of each line too, so the budget bounds the file.
        self.output.take(newlines * LINE_OVERHEAD);
        let mut line = self.line.lock().unwrap_or_else(|p| p.into_inner());
        line.extend_from_slice(&bytes[..take]);
        while let Some(end) = line.iter().position(|&b| b == b'\n') {
            let text = String::from_utf8_lossy(&line[..end]).into_owned();
            line.drain(..=end);
            if self.name == "stderr" && !text.trim().is_empty() {
                let mut budget = self.output.shared.lock().unwrap_or_else(|p| p.into_inner());
                if budget.stderr_tail.len() == STDERR_TAIL_LINES {
                    budget.stderr_tail.pop_front();
                }
                budget.stderr_tail.push_back(text.clone());
            }
            self.output.info.write(self.name, TAG_GUEST_OUTPUT, &text);
        }
    }
}

impl IsTerminal for GuestStream {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestStream {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl tokio::io::AsyncWrite for GuestStream {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.write(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
