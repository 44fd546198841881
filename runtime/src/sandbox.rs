//! A thread's sandbox: the wasmtime store data (a WASI context that grants nothing, resource
//! limits, CPU accounting) and the capture of the guest's stdout/stderr into its debug log.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use wasmtime::component::ResourceTable;
use wasmtime::{StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::agent::AgentSet;
use crate::extract::Extractor;
use crate::journal::Journal;
use crate::runner::ThreadControl;
use crate::thread_log::InfoLog;

/// Per-thread limits.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Guest CPU time allowed for one generator step (time spent in agents does not count).
    pub cpu_per_step: Duration,
    /// Linear memory a thread's instance may grow to, in bytes.
    pub memory_bytes: usize,
    /// Table elements a thread's instance may grow to.
    pub table_elements: usize,
    /// Bytes of guest stdout plus stderr kept in the debug log per thread.
    pub output_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            cpu_per_step: Duration::from_secs(30),
            memory_bytes: 512 << 20,
            table_elements: 100_000,
            output_bytes: 1 << 20,
        }
    }
}

/// The data of one thread's wasmtime store.
pub struct ThreadState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) limits: StoreLimits,
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
}

impl HostContext {
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
            extractor: Extractor::default(),
            info,
            agent_meta: None,
            journal,
            control,
        }
    }

    /// For instances that are not threads (reading a descriptor): no agents, and the debug
    /// log goes to `tracing`.
    pub fn detached() -> Self {
        HostContext {
            thread_id: String::new(),
            agents: None,
            extractor: Extractor::default(),
            info: InfoLog::tracing(),
            agent_meta: None,
            journal: Journal::disabled(),
            control: Arc::default(),
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
            limits: StoreLimitsBuilder::new()
                .memory_size(limits.memory_bytes)
                .table_elements(limits.table_elements)
                .trap_on_grow_failure(true)
                .build(),
            host,
            clock: StepClock::new(limits.cpu_per_step),
        }
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
struct GuestOutput {
    info: InfoLog,
    shared: Arc<Mutex<OutputBudget>>,
}

struct OutputBudget {
    remaining: usize,
    noted_overflow: bool,
}

impl GuestOutput {
    fn new(info: InfoLog, budget: usize) -> Self {
        GuestOutput {
            info,
            shared: Arc::new(Mutex::new(OutputBudget { remaining: budget, noted_overflow: false })),
        }
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

/// Log tag of guest stdout/stderr lines.
const TAG_GUEST_OUTPUT: &str = "G5TD0VT1";

impl GuestStream {
    fn write(&self, bytes: &[u8]) {
        let mut budget = self.output.shared.lock().unwrap_or_else(|p| p.into_inner());
        let take = bytes.len().min(budget.remaining);
        budget.remaining -= take;
        if take < bytes.len() && !budget.noted_overflow {
            budget.noted_overflow = true;
            self.output.info.write(
                "warn",
                TAG_GUEST_OUTPUT,
                "guest output limit reached; further output dropped",
            );
        }
        drop(budget);
        let mut line = self.line.lock().unwrap_or_else(|p| p.into_inner());
        line.extend_from_slice(&bytes[..take]);
        while let Some(end) = line.iter().position(|&b| b == b'\n') {
            let text = String::from_utf8_lossy(&line[..end]).into_owned();
            line.drain(..=end);
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
