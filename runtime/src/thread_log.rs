//! Thread files: `<ULID>.data.jsonl` (start record, one line per role output, end record),
//! appended durably, and `<ULID>.info.jsonl`, the thread's debug log.
//!
//! Readers tolerate a torn last line (a crash mid-append): it is skipped and counted, and the
//! next append terminates it so the file stays line-structured.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::durable::{self, AppendFile};
use crate::error::{Error, Result};
use crate::home::Home;
use crate::ids::{BundleHash, ThreadId};

/// Line 1 of a data file: what the thread runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StartRecord {
    /// The workflow name it was started under.
    pub name: String,
    pub hash: BundleHash,
    pub thread_id: String,
    pub parameters: Parameters,
    pub timestamp: u64,
    /// Set when the thread is a fork of another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<ForkedFrom>,
}

/// A thread's parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Parameters {
    pub prompt: String,
    pub options: RunParameters,
}

/// Options a thread runs with. Agent bindings and the working directory are recorded so that
/// a thread resumed in another process gets the same agents.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunParameters {
    pub max_rounds: u32,
    /// `--agent`, with relative paths made absolute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// `--agent-for`, role → agent.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub agent_for: BTreeMap<String, String>,
    /// Where command agents run: the directory the thread was started from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    /// `--limit` overrides, key → value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<String, String>,
}

/// Where a fork came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ForkedFrom {
    pub thread_id: String,
    /// Number of steps taken over from the original.
    pub step: usize,
}

/// One role output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    pub role: String,
    pub content: String,
    pub meta: serde_json::Value,
    pub timestamp: u64,
}

/// The last line of a finished thread.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndRecord {
    pub end: End,
    pub timestamp: u64,
}

/// How a thread ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct End {
    pub return_code: i32,
    pub summary: String,
    pub status: EndStatus,
}

/// The host's view of how a thread ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EndStatus {
    /// The workflow returned code 0.
    Completed,
    /// The workflow returned a non-zero code, trapped, or hit a limit.
    Failed,
    /// Stopped by `kill`.
    Killed,
}

impl EndStatus {
    /// Lower-case name, as in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            EndStatus::Completed => "completed",
            EndStatus::Failed => "failed",
            EndStatus::Killed => "killed",
        }
    }
}

/// A control line: the thread stopped without ending and waits for `resume` or `step`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PauseRecord {
    pub paused: Paused,
    pub timestamp: u64,
}

/// Why a thread is paused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Paused {
    /// `pause` (asked by a user), `start` (created by `thread start`, not run yet) or
    /// `waiting` (a `human` agent must answer; see `answer`).
    pub by: String,
    /// For `waiting`: the role whose human answer is needed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// For `waiting`: the agent call to answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<crate::human::PendingCall>,
}

/// A thread as read back from its data file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThreadRecord {
    pub start: StartRecord,
    pub steps: Vec<StepRecord>,
    pub end: Option<EndRecord>,
    /// The pause the thread is in: the last control line, if no step came after it.
    pub paused: Option<Paused>,
    /// Lines that did not parse (a torn last line after a crash, or damage) and were skipped.
    #[serde(skip)]
    pub skipped_lines: Vec<usize>,
    /// The data file.
    #[serde(skip)]
    pub path: PathBuf,
}

/// Where a thread is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ThreadStatus {
    /// A process is running it now.
    Running,
    /// Stopped between steps; `resume` or `step` continues it.
    Paused,
    /// Stopped until a person answers for a `human` agent (`answer`).
    Waiting,
    /// Its process died mid-run (crash, `kill -9`); `resume` continues from the last step.
    Interrupted,
    Completed,
    Failed,
    Killed,
}

impl ThreadStatus {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            ThreadStatus::Running => "running",
            ThreadStatus::Paused => "paused",
            ThreadStatus::Waiting => "waiting",
            ThreadStatus::Interrupted => "interrupted",
            ThreadStatus::Completed => "completed",
            ThreadStatus::Failed => "failed",
            ThreadStatus::Killed => "killed",
        }
    }

    /// Has the thread ended for good?
    pub fn is_ended(self) -> bool {
        matches!(self, ThreadStatus::Completed | ThreadStatus::Failed | ThreadStatus::Killed)
    }
}

impl ThreadRecord {
    /// The thread's status. A thread being run holds a lock on its data file, so "running"
    /// is known without asking any process, and a crashed run's lock is gone with it.
    pub fn status(&self) -> ThreadStatus {
        if let Some(end) = &self.end {
            return match end.end.status {
                EndStatus::Completed => ThreadStatus::Completed,
                EndStatus::Failed => ThreadStatus::Failed,
                EndStatus::Killed => ThreadStatus::Killed,
            };
        }
        if is_locked(&self.path) {
            ThreadStatus::Running
        } else if let Some(paused) = &self.paused {
            if paused.by == "waiting" { ThreadStatus::Waiting } else { ThreadStatus::Paused }
        } else {
            ThreadStatus::Interrupted
        }
    }

    /// The thread's id.
    pub fn id(&self) -> ThreadId {
        self.start.thread_id.parse().expect("start records hold valid thread ids")
    }
}

/// Is someone holding the run lock of this data file?
pub fn is_locked(path: &Path) -> bool {
    let Ok(file) = std::fs::File::open(path) else { return false };
    match file.try_lock() {
        Ok(()) => false,
        Err(std::fs::TryLockError::WouldBlock) => true,
        Err(std::fs::TryLockError::Error(_)) => false,
    }
}

/// Appends a thread's records, holding the thread's run lock (an exclusive lock on its data
/// file) for as long as it lives: one process at a time runs a thread.
#[derive(Debug)]
pub struct ThreadWriter {
    data: AppendFile,
    path: PathBuf,
}

impl ThreadWriter {
    /// Creates the thread's data file with its start record and initial steps (a fork's
    /// prefix). Fails if the file exists.
    pub fn create(home: &Home, start: &StartRecord, steps: &[StepRecord]) -> Result<Self> {
        let id: ThreadId = start.thread_id.parse()?;
        let dir = home.thread_dir(start.hash);
        durable::create_dir(&dir)?;
        let path = home.thread_data_file(start.hash, id);
        if path.exists() {
            return Err(Error::Host(format!("thread {id} already exists at {}", path.display())));
        }
        let data = AppendFile::open(&path, true)?;
        data.lock().map_err(Error::io("lock thread", &path))?;
        let mut writer = ThreadWriter { data, path };
        writer.append(start)?;
        for step in steps {
            writer.append(step)?;
        }
        Ok(writer)
    }

    /// Opens an existing thread to continue it, taking its run lock and reading it back
    /// (after the lock, so nothing appends between the read and the continuation). A torn
    /// last line is terminated so the next record starts cleanly.
    pub fn open(path: &Path) -> Result<(Self, ThreadRecord)> {
        let data = AppendFile::open(path, true)?;
        let locked = data.try_lock();
        let record = read_thread(path)?;
        locked.map_err(|_| Error::ThreadBusy(record.start.thread_id.clone()))?;
        Ok((ThreadWriter { data, path: path.to_path_buf() }, record))
    }

    /// Appends a pause marker.
    pub fn append_pause(&mut self, paused: Paused) -> Result<()> {
        self.append(&PauseRecord { paused, timestamp: now_ms() })
    }

    /// Appends a role output; on disk when this returns.
    pub fn append_step(&mut self, step: &StepRecord) -> Result<()> {
        self.append(step)
    }

    /// Appends the end record.
    pub fn append_end(&mut self, end: &EndRecord) -> Result<()> {
        self.append(end)
    }

    fn append(&mut self, record: &impl Serialize) -> Result<()> {
        let line = serde_json::to_vec(record).expect("thread records serialize");
        self.data.append(&line).map_err(Error::io("append to thread", &self.path))
    }

    /// The data file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// One line of the debug log.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InfoLine {
    pub tag: String,
    pub level: String,
    pub content: String,
    pub timestamp: u64,
}

/// A thread's debug log (`.info.jsonl`), shared by the host imports and the guest's
/// stdout/stderr. Lines are buffered and appended at flush points — before each agent call, at
/// each step, at the end. The file stays open while the thread runs and is closed before it
/// waits (`release`), so a waiting thread holds no file open for it (a worker with thousands
/// of threads would otherwise run out of file descriptors). Not fsynced: it is for diagnosis,
/// and losing its tail in a crash is fine.
#[derive(Debug, Clone)]
pub struct InfoLog {
    /// `None`: entries go to `tracing` at debug level (instances that are not threads).
    buffer: Option<Arc<Mutex<InfoBuffer>>>,
}

#[derive(Debug)]
struct InfoBuffer {
    path: PathBuf,
    pending: Vec<u8>,
    /// Open between flushes while the thread runs; `None` while it waits.
    file: Option<std::fs::File>,
}

impl InfoBuffer {
    fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let file = match self.file.take() {
            Some(file) => Ok(file),
            None => std::fs::OpenOptions::new().create(true).append(true).open(&self.path),
        };
        match file
            .and_then(|mut file| std::io::Write::write_all(&mut file, &self.pending).map(|()| file))
        {
            Ok(file) => self.file = Some(file),
            Err(e) => tracing::warn!("cannot write thread debug log {}: {e}", self.path.display()),
        }
        self.pending.clear();
    }
}

impl Drop for InfoBuffer {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Buffered debug-log bytes past which a write flushes at once.
const INFO_BUFFER_LIMIT: usize = 64 << 10;

impl InfoLog {
    /// The debug log of a thread (the file is created at the first flush).
    pub fn open(home: &Home, hash: BundleHash, id: ThreadId) -> Result<Self> {
        durable::create_dir(&home.thread_dir(hash))?;
        let path = home.thread_info_file(hash, id);
        let buffer = InfoBuffer { path, pending: Vec::new(), file: None };
        Ok(InfoLog { buffer: Some(Arc::new(Mutex::new(buffer))) })
    }

    /// A log that forwards to `tracing`.
    pub fn tracing() -> Self {
        InfoLog { buffer: None }
    }

    /// Adds one entry. Failures are reported through `tracing` only: a debug log that cannot
    /// be written must not stop the thread.
    pub fn write(&self, level: &str, tag: &str, content: &str) {
        let Some(buffer) = &self.buffer else {
            tracing::debug!("[{tag}] {level}: {content}");
            return;
        };
        let line = InfoLine {
            tag: tag.to_string(),
            level: level.to_string(),
            content: content.to_string(),
            timestamp: now_ms(),
        };
        let mut buffer = buffer.lock().unwrap_or_else(|p| p.into_inner());
        serde_json::to_writer(&mut buffer.pending, &line).expect("info lines serialize");
        buffer.pending.push(b'\n');
        if buffer.pending.len() > INFO_BUFFER_LIMIT {
            buffer.flush();
        }
    }

    /// Appends the buffered entries to the file.
    pub fn flush(&self) {
        if let Some(buffer) = &self.buffer {
            buffer.lock().unwrap_or_else(|p| p.into_inner()).flush();
        }
    }

    /// Flushes and closes the file: the thread is about to wait, maybe long, and a worker's
    /// thousands of waiting threads must not hold a descriptor each for their logs.
    pub fn release(&self) {
        if let Some(buffer) = &self.buffer {
            let mut buffer = buffer.lock().unwrap_or_else(|p| p.into_inner());
            buffer.flush();
            buffer.file = None;
        }
    }
}

/// Reads a thread's data file.
pub fn read_thread(path: &Path) -> Result<ThreadRecord> {
    let file = std::fs::File::open(path).map_err(Error::io("read thread", path))?;
    let mut start = None;
    let mut steps = Vec::new();
    let mut end = None;
    let mut paused = None;
    let mut skipped_lines = Vec::new();
    for (index, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(Error::io("read thread", path))?;
        if line.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value = match serde_json::from_str(&line) {
            Ok(value) => value,
            Err(_) => {
                skipped_lines.push(index + 1);
                continue;
            }
        };
        let parsed = if start.is_none() {
            serde_json::from_value(value).map(|s| start = Some(s))
        } else if value.get("end").is_some() {
            serde_json::from_value(value).map(|e| end = Some(e))
        } else if value.get("paused").is_some() {
            serde_json::from_value::<PauseRecord>(value).map(|p| paused = Some(p.paused))
        } else {
            serde_json::from_value(value).map(|s| {
                steps.push(s);
                paused = None;
            })
        };
        if parsed.is_err() {
            skipped_lines.push(index + 1);
        }
    }
    let start = start.ok_or_else(|| Error::Corrupt {
        path: path.to_path_buf(),
        reason: "no start record: not a thread file".into(),
    })?;
    Ok(ThreadRecord { start, steps, end, paused, skipped_lines, path: path.to_path_buf() })
}

/// Where a thread's data file is, by id (threads are filed under their bundle's hash).
pub fn find_thread(home: &Home, id: ThreadId) -> Result<(BundleHash, PathBuf)> {
    let file_name = format!("{id}.data.jsonl");
    for (hash, dir) in bundle_log_dirs(home)? {
        let path = dir.join(&file_name);
        if path.exists() {
            return Ok((hash, path));
        }
    }
    Err(Error::UnknownThread(id.to_string()))
}

/// Every thread's data file: `(bundle hash, thread id, path)`, oldest thread first.
pub fn all_threads(home: &Home) -> Result<Vec<(BundleHash, ThreadId, PathBuf)>> {
    let mut threads = Vec::new();
    for (hash, dir) in bundle_log_dirs(home)? {
        let entries = std::fs::read_dir(&dir).map_err(Error::io("list threads in", &dir))?;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".data.jsonl")) else {
                continue;
            };
            if let Ok(id) = id.parse::<ThreadId>() {
                threads.push((hash, id, entry.path()));
            }
        }
    }
    threads.sort_by_key(|(_, id, _)| *id);
    Ok(threads)
}

fn bundle_log_dirs(home: &Home) -> Result<Vec<(BundleHash, PathBuf)>> {
    let logs = home.logs_dir();
    let entries = match std::fs::read_dir(&logs) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(Error::io("list", &logs)(e)),
    };
    Ok(entries
        .flatten()
        .filter_map(|e| {
            let hash = e.file_name().to_str()?.parse().ok()?;
            Some((hash, e.path()))
        })
        .collect())
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torn_last_line_is_skipped_and_repaired_by_the_next_append() -> Result<()> {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path());
        let id = ThreadId::new();
        let start = StartRecord {
            name: "w".into(),
            hash: BundleHash::of(b"w"),
            thread_id: id.to_string(),
            parameters: Parameters {
                prompt: "p".into(),
                options: RunParameters {
                    max_rounds: 3,
                    agent: None,
                    agent_for: BTreeMap::new(),
                    cwd: None,
                    limits: BTreeMap::new(),
                },
            },
            timestamp: 1,
            forked_from: None,
        };
        let step = StepRecord {
            role: "r".into(),
            content: "c".into(),
            meta: serde_json::json!({}),
            timestamp: 2,
        };
        let path = {
            let mut writer = ThreadWriter::create(&home, &start, &[])?;
            writer.append_step(&step)?;
            writer.path().to_path_buf()
        };
        // Simulate a crash in the middle of the next append.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(br#"{"role":"r","cont"#)
            .unwrap();
        let torn = read_thread(&path)?;
        assert_eq!(torn.steps, vec![step.clone()]);
        assert_eq!(torn.skipped_lines, vec![3]);

        let (mut writer, record) = ThreadWriter::open(&path)?;
        assert_eq!(record.steps.len(), 1);
        writer.append_step(&step)?;
        let repaired = read_thread(&path)?;
        assert_eq!(repaired.steps, vec![step.clone(), step]);
        assert_eq!(repaired.skipped_lines, vec![3]);
        Ok(())
    }

    use std::io::Write;
}
