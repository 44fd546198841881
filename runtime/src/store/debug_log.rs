//! A thread's debug log: what the host did for it (agents asked, answers replayed, retries,
//! limits hit) and what its guest wrote (stdout, stderr, `log` lines), one JSON line each
//! (`{tag, level, content, timestamp}`).
//!
//! Lines are buffered and handed to the store's [`LogSink`] at flush points — before each
//! agent call, at each step, at the end — and the sink is released before the thread waits,
//! so a waiting thread holds nothing open for its log (a worker with thousands of threads
//! would otherwise run out of file descriptors). Not durable: the log is for diagnosis, and
//! losing its tail in a crash is fine.

use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::clock::now_ms;

/// How important a line is, or which guest stream it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
    /// A line the guest wrote to its stdout.
    Stdout,
    /// A line the guest wrote to its stderr.
    Stderr,
}

impl fmt::Display for LogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            LogLevel::Trace => "trace",
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
            LogLevel::Stdout => "stdout",
            LogLevel::Stderr => "stderr",
        };
        f.write_str(name)
    }
}

/// One line of the debug log.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DebugLine {
    pub tag: String,
    pub level: LogLevel,
    pub content: String,
    pub timestamp: u64,
}

/// Where a store keeps a thread's debug log.
pub trait LogSink: Send + fmt::Debug {
    /// Appends whole JSON lines (each ending in a newline).
    fn write(&mut self, lines: &[u8]) -> std::io::Result<()>;
    /// Lets go of what the sink holds open until its next write.
    fn release(&mut self) {}
    /// What the sink writes to, for the warning when it cannot.
    fn describe(&self) -> String;
}

/// A thread's debug log, shared by the host imports and the guest's stdout/stderr.
#[derive(Debug, Clone)]
pub struct DebugLog {
    /// `None`: entries go to `tracing` at debug level (instances that are not threads).
    buffer: Option<Arc<Mutex<DebugBuffer>>>,
}

#[derive(Debug)]
struct DebugBuffer {
    sink: Box<dyn LogSink>,
    pending: Vec<u8>,
}

impl DebugBuffer {
    fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        if let Err(e) = self.sink.write(&self.pending) {
            tracing::warn!("cannot write thread debug log {}: {e}", self.sink.describe());
        }
        self.pending.clear();
    }
}

impl Drop for DebugBuffer {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Buffered debug-log bytes past which a write flushes at once.
const BUFFER_LIMIT: usize = 64 << 10;

impl DebugLog {
    /// A thread's debug log, kept in `sink`.
    pub fn new(sink: Box<dyn LogSink>) -> Self {
        DebugLog { buffer: Some(Arc::new(Mutex::new(DebugBuffer { sink, pending: Vec::new() }))) }
    }

    /// A log that forwards to `tracing`.
    pub fn tracing() -> Self {
        DebugLog { buffer: None }
    }

    /// Adds one entry. Failures are reported through `tracing` only: a debug log that cannot
    /// be written must not stop the thread.
    pub fn write(&self, level: LogLevel, tag: &str, content: &str) {
        let Some(buffer) = &self.buffer else {
            tracing::debug!("[{tag}] {level}: {content}");
            return;
        };
        let line = DebugLine {
            tag: tag.to_string(),
            level,
            content: content.to_string(),
            timestamp: now_ms(),
        };
        let mut buffer = buffer.lock();
        serde_json::to_writer(&mut buffer.pending, &line).expect("info lines serialize");
        buffer.pending.push(b'\n');
        if buffer.pending.len() > BUFFER_LIMIT {
            buffer.flush();
        }
    }

    /// Hands the buffered entries to the sink.
    pub fn flush(&self) {
        if let Some(buffer) = &self.buffer {
            buffer.lock().flush();
        }
    }

    /// Flushes and releases the sink: the thread is about to wait, maybe long, and a worker's
    /// thousands of waiting threads must not hold a descriptor each for their logs.
    pub fn release(&self) {
        if let Some(buffer) = &self.buffer {
            let mut buffer = buffer.lock();
            buffer.flush();
            buffer.sink.release();
        }
    }
}
