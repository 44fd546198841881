//! The guest's stdout and stderr (and its `log` lines), captured into the thread's debug log
//! within the `output` limit.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use parking_lot::Mutex;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};

use crate::store::debug_log::{DebugLog, LogLevel};

/// The guest's stdout and stderr, written line by line into the debug log, up to a budget
/// shared by both streams; past it, output is dropped with one note in the log.
#[derive(Clone)]
pub(crate) struct GuestOutput {
    info: DebugLog,
    shared: Arc<Mutex<OutputBudget>>,
}

struct OutputBudget {
    remaining: usize,
    noted_overflow: bool,
    /// The last lines the guest wrote to stderr, where a panic message would be.
    stderr_tail: std::collections::VecDeque<String>,
}

impl GuestOutput {
    pub(crate) fn new(info: DebugLog, budget: usize) -> Self {
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
        let mut budget = self.shared.lock();
        let take = bytes.min(budget.remaining);
        budget.remaining -= take;
        if take < bytes && !budget.noted_overflow {
            budget.noted_overflow = true;
            self.info.write(
                LogLevel::Warn,
                TAG_GUEST_OUTPUT,
                "guest output limit reached (limits.output); further output dropped",
            );
        }
        take
    }

    /// A log line from the guest's `log` import, within the budget (which counts the line's
    /// JSON framing too, so the budget bounds the file).
    pub(crate) fn log(&self, level: LogLevel, tag: &str, message: &str) {
        let cost = message.len() + LINE_OVERHEAD;
        if self.take(cost) == cost {
            self.info.write(level, tag, message);
        }
    }

    /// What the guest said on stderr before it died: a Rust panic's message if there is one
    /// (`panicked at FILE:LINE:` and the line after it), else its last stderr line.
    pub(crate) fn last_words(&self) -> Option<String> {
        let budget = self.shared.lock();
        let lines: Vec<&String> = budget.stderr_tail.iter().collect();
        if let Some(i) = lines.iter().rposition(|l| l.contains("panicked at")) {
            let message = lines.get(i + 1).map(|l| l.trim()).unwrap_or_default();
            return Some(format!("{} {message}", lines[i].trim()).trim().to_string());
        }
        lines.last().map(|l| l.trim().to_string())
    }

    pub(crate) fn stream(&self, level: LogLevel) -> GuestStream {
        GuestStream { output: self.clone(), level, line: Arc::new(Mutex::new(Vec::new())) }
    }
}

/// One of the two streams; keeps its partial last line.
#[derive(Clone)]
pub(crate) struct GuestStream {
    output: GuestOutput,
    /// `Stdout` or `Stderr`.
    level: LogLevel,
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
        let mut line = self.line.lock();
        line.extend_from_slice(&bytes[..take]);
        while let Some(end) = line.iter().position(|&b| b == b'\n') {
            let text = String::from_utf8_lossy(&line[..end]).into_owned();
            line.drain(..=end);
            if self.level == LogLevel::Stderr && !text.trim().is_empty() {
                let mut budget = self.output.shared.lock();
                if budget.stderr_tail.len() == STDERR_TAIL_LINES {
                    budget.stderr_tail.pop_front();
                }
                budget.stderr_tail.push_back(text.clone());
            }
            self.output.info.write(self.level, TAG_GUEST_OUTPUT, &text);
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
