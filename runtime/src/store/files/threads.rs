//! Threads in the home directory: `logs/<HASH>/<ULID>.data.jsonl` (start record, one line per
//! role output, pause markers, end record), appended durably; `<ULID>.calls.jsonl`, the call
//! journal; `<ULID>.info.jsonl`, the debug log.
//!
//! A thread being run holds an exclusive lock on its data file, so "running" is visible
//! without asking any process. Readers tolerate a torn last line (a crash mid-append): it is
//! skipped and counted, and the next append terminates it so the file stays line-structured.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::debug_log::FileLog;
use super::journal::FileCalls;
use super::{listing, queue_entry};
use crate::clock::now_ms;
use crate::durable::{self, AppendFile};
use crate::error::{Error, Result};
use crate::home::Home;
use crate::ids::{BundleHash, ThreadId};
use crate::limits::Size;
use crate::store::debug_log::{DebugLine, LogSink};
use crate::store::journal::{CallLog, JournalLine};
use crate::store::records::{
    ContinueRecord, EndRecord, PauseRecord, Paused, StartRecord, StepRecord, ThreadLines,
    ThreadRecord, ThreadSummary,
};
use crate::store::{Changes, ThreadStore, ThreadWriter};

/// The threads of a home directory.
#[derive(Debug, Clone)]
pub struct FileThreads {
    home: Home,
}

impl FileThreads {
    /// The threads under `home`.
    pub fn new(home: &Home) -> Self {
        FileThreads { home: home.clone() }
    }

    /// The thread whose data file is at `path`, queued while a live process hands it to its
    /// bundle's worker (see [`queue_entry`]), as [`ThreadStore::changes`] tells it.
    fn read_at(&self, path: &Path) -> Result<ThreadRecord> {
        let mut record = read_thread(path)?;
        record.queued = !record.running && queue_entry::waits(&self.home.queue_entry(record.id()));
        Ok(record)
    }

    /// Where a thread's data file is, by id (threads are filed under their bundle's hash).
    fn find(&self, id: ThreadId) -> Result<(BundleHash, PathBuf)> {
        let file_name = format!("{id}.data.jsonl");
        for (hash, dir) in bundle_log_dirs(&self.home)? {
            let path = dir.join(&file_name);
            if path.exists() {
                return Ok((hash, path));
            }
        }
        Err(Error::UnknownThread(id.to_string()))
    }
}

impl FileThreads {
    /// Takes thread `id`'s run lock and reads it.
    pub(crate) fn hold(&self, id: ThreadId) -> Result<(FileWriter, ThreadRecord)> {
        let (_, path) = self.find(id)?;
        FileWriter::open(&path, self.home.thread_reopen_log())
    }
}

impl ThreadStore for FileThreads {
    fn create(
        &self,
        start: &StartRecord,
        steps: &[StepRecord],
        calls: &[JournalLine],
    ) -> Result<(Box<dyn ThreadWriter>, ThreadRecord)> {
        let (hash, id) = (start.hash, start.thread_id);
        let dir = self.home.thread_dir(hash);
        durable::create_dir(&dir)?;
        let path = self.home.thread_data_file(hash, id);
        // A thread appears whole or not at all: its records are written to a temporary file,
        // synced, locked and renamed to the thread's name. A crash before the rename leaves
        // only a temporary file, which no listing reads.
        let mut lines = jsonl(std::slice::from_ref(start));
        lines.extend(jsonl(steps));
        let file = durable::create_atomic(&path, &lines, |file| {
            crate::faults::crash_point("thread-create");
            file.lock()
        })?;
        let data = AppendFile::from_file(file, true).map_err(Error::io("read", &path))?;
        let writer =
            FileWriter { data, path, ended: false, reopen_log: self.home.thread_reopen_log() };
        // A fork's copy of the calls its kept steps made: history only (the fork continues
        // after those steps, so none is replayed), put in place atomically once the thread is.
        if !calls.is_empty() {
            durable::write_atomic(&self.home.thread_calls_file(hash, id), &jsonl(calls))?;
        }
        let record = ThreadRecord::created(start, steps);
        Ok((Box::new(writer), record))
    }

    fn open(&self, id: ThreadId) -> Result<(Box<dyn ThreadWriter>, ThreadRecord)> {
        let (writer, record) = self.hold(id)?;
        Ok((Box::new(writer), record))
    }

    fn read(&self, id: ThreadId) -> Result<ThreadRecord> {
        self.read_at(&self.find(id)?.1)
    }

    /// The lines after line `after` (0-based), read from the file (its lines are numbered
    /// by position; a torn last line is left for the next call).
    fn changes(&self, id: ThreadId, after: i64) -> Result<Option<Changes>> {
        let path = match self.find(id) {
            Ok((_, path)) => path,
            Err(Error::UnknownThread(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        let bytes = std::fs::read(&path).map_err(Error::io("read thread", &path))?;
        let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |end| end + 1);
        let lines = bytes[..complete]
            .split(|&b| b == b'\n')
            .enumerate()
            .skip(usize::try_from(after + 1).unwrap_or(0))
            .filter(|(_, line)| !line.is_empty())
            .map(|(i, line)| (i as i64, String::from_utf8_lossy(line).into_owned()))
            .collect();
        let queued = queue_entry::waits(&self.home.queue_entry(id));
        Ok(Some(Changes { held: is_locked(&path), queued, lines }))
    }

    fn list(&self) -> Result<Vec<ThreadId>> {
        let mut ids = Vec::new();
        for (_, dir) in bundle_log_dirs(&self.home)? {
            ids.extend(listing::thread_ids(&dir)?);
        }
        ids.sort_unstable();
        Ok(ids)
    }

    /// Summaries come from the listing index ([`listing`]): only the threads that have
    /// not ended are read.
    fn summaries(&self) -> Result<Vec<ThreadSummary>> {
        let index = self.home.thread_index_file();
        let reopened = self.home.thread_reopen_log();
        listing::summaries(&index, &reopened, bundle_log_dirs(&self.home)?, |path| {
            self.read_at(path)
                .map(|thread| listing::Listed { summary: thread.summary(), held: thread.running })
        })
    }

    /// A removal a crash cannot leave half-done: under the run lock (the file is not read, so
    /// a damaged thread can be removed too), the data file is renamed to a `.removing-` name —
    /// from then on the thread is gone — then its journal and log are deleted, then the renamed
    /// file. A removal a crash interrupted is finished by the next one
    /// ([`ThreadStore::finish_removals`]).
    fn remove(&self, id: ThreadId) -> Result<()> {
        let (hash, data) = self.find(id)?;
        let lock = std::fs::File::open(&data).map_err(Error::io("open thread", &data))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(Error::ThreadBusy(id.to_string()));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(Error::io("lock thread", &data)(e)),
        }
        let dir = self.home.thread_dir(hash);
        let removing = dir.join(format!("{REMOVING}{id}.data.jsonl"));
        std::fs::rename(&data, &removing).map_err(Error::io("delete thread", &data))?;
        durable::sync_dir(&dir)?;
        crate::faults::crash_point("thread-removing");
        self.delete_rest(hash, id, &removing)
    }

    fn finish_removals(&self) -> Result<()> {
        for (hash, dir) in bundle_log_dirs(&self.home)? {
            let entries = std::fs::read_dir(&dir).map_err(Error::io("list threads in", &dir))?;
            for entry in entries.flatten() {
                let name = entry.file_name();
                let id = name
                    .to_str()
                    .and_then(|n| n.strip_prefix(REMOVING)?.strip_suffix(".data.jsonl"))
                    .and_then(|id| id.parse::<ThreadId>().ok());
                if let Some(id) = id {
                    self.delete_rest(hash, id, &entry.path())?;
                }
            }
        }
        Ok(())
    }

    fn call_log(&self, hash: BundleHash, id: ThreadId) -> Result<Box<dyn CallLog>> {
        Ok(Box::new(FileCalls::open(&self.home.thread_calls_file(hash, id))?))
    }

    fn debug_sink(&self, hash: BundleHash, id: ThreadId) -> Result<Box<dyn LogSink>> {
        durable::create_dir(&self.home.thread_dir(hash))?;
        let path = self.home.thread_info_file(hash, id);
        Ok(Box::new(FileLog { path, file: None }))
    }

    fn debug_tail(&self, hash: BundleHash, id: ThreadId, max: usize) -> Result<Vec<DebugLine>> {
        use std::io::{Read, Seek, SeekFrom};
        // Only the end of a long log is read: at most 1 MiB.
        const TAIL: u64 = 1 << 20;
        let path = self.home.thread_info_file(hash, id);
        let mut file = match std::fs::File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(Error::io("open", &path)(e)),
        };
        let len = file.metadata().map_err(Error::io("read", &path))?.len();
        let from = len.saturating_sub(TAIL);
        file.seek(SeekFrom::Start(from)).map_err(Error::io("read", &path))?;
        let mut bytes = Vec::new();
        file.take(TAIL).read_to_end(&mut bytes).map_err(Error::io("read", &path))?;
        let mut lines: Vec<DebugLine> = bytes
            .split(|&b| b == b'\n')
            .filter_map(|line| serde_json::from_slice(line).ok())
            .collect();
        let skip = lines.len().saturating_sub(max);
        lines.drain(..skip);
        Ok(lines)
    }
}

/// The prefix of a data file being removed.
const REMOVING: &str = ".removing-";

impl FileThreads {
    /// Deletes a removed thread's journal and log, then its (renamed) data file.
    fn delete_rest(&self, hash: BundleHash, id: ThreadId, data: &Path) -> Result<()> {
        let files = [self.home.thread_info_file(hash, id), self.home.thread_calls_file(hash, id)];
        for file in files.iter().map(PathBuf::as_path).chain([data]) {
            if let Err(e) = std::fs::remove_file(file)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                return Err(Error::io("delete thread file", file)(e));
            }
        }
        Ok(())
    }
}

/// A thread's data file, open for appending under its run lock (an exclusive lock on the
/// file, held for as long as this lives: one process at a time runs a thread).
#[derive(Debug)]
pub struct FileWriter {
    data: AppendFile,
    path: PathBuf,
    /// Whether the thread has an end record: a record after it reopens the thread, which the
    /// listing index must hear of (see [`listing`]).
    ended: bool,
    /// `logs/threads.reopened`, where a reopening is noted.
    reopen_log: PathBuf,
}

impl FileWriter {
    /// Opens an existing thread to continue it, taking its run lock and reading it back
    /// (after the lock, so nothing appends between the read and the continuation). A torn
    /// last line is terminated so the next record starts cleanly.
    ///
    /// A parallel group a crash cut short is undone here: its steps were never reported
    /// stored, their calls are in the journal, and the group is made again whole.
    pub fn open(path: &Path, reopen_log: PathBuf) -> Result<(Self, ThreadRecord)> {
        let mut data = AppendFile::open(path, true)?;
        let locked = data.try_lock();
        let (mut record, cut_group) = read_thread_lines(path)?;
        locked.map_err(|_| Error::ThreadBusy(record.start.thread_id.to_string()))?;
        if let Some(line) = cut_group {
            let offset = line_offset(path, line)?;
            data.cut_to(offset).map_err(Error::io("undo a cut-short group in", path))?;
        }
        record.running = true;
        let ended = record.end.is_some();
        Ok((FileWriter { data, path: path.to_path_buf(), ended, reopen_log }, record))
    }

    fn append(&mut self, record: &impl Serialize) -> Result<()> {
        let line = serde_json::to_vec(record).expect("thread records serialize");
        self.data.append(&line).map_err(Error::io("append to thread", &self.path))
    }

    /// Appends a record that follows the end of an ended thread (a retry, a move to another
    /// version), noting the reopening first, under the run lock, where listings look for it.
    fn append_reopening(&mut self, record: &impl Serialize) -> Result<()> {
        if self.ended {
            let id = self.path.file_name().and_then(|n| n.to_str()).and_then(|n| n.get(..26));
            listing::note_reopened(&self.reopen_log, id.unwrap_or_default())?;
        }
        self.append(record)
    }
}

impl ThreadWriter for FileWriter {
    /// Written and fsynced before the future is returned: a file append is one short
    /// system call the caller would only wait on anyway.
    fn append_steps<'a>(
        &'a mut self,
        steps: &'a [StepRecord],
    ) -> futures::future::BoxFuture<'a, Result<()>> {
        // One write: lines joined, the last newline added by `append`.
        let mut lines = Vec::new();
        for (i, step) in steps.iter().enumerate() {
            if i > 0 {
                lines.push(b'\n');
            }
            serde_json::to_writer(&mut lines, step).expect("thread records serialize");
        }
        let appended = self.data.append(&lines).map_err(Error::io("append to thread", &self.path));
        Box::pin(std::future::ready(appended))
    }

    fn append_pause(&mut self, paused: Paused) -> Result<()> {
        self.append(&PauseRecord { paused, timestamp: now_ms() })
    }

    fn append_continued(&mut self, by: &str) -> Result<()> {
        self.append(&ContinueRecord::by(by))
    }

    fn append_end(&mut self, end: &EndRecord) -> Result<()> {
        self.append(end)?;
        self.ended = true;
        Ok(())
    }

    fn append_upgrade(&mut self, upgrade: &crate::store::upgrades::UpgradeRecord) -> Result<()> {
        self.append_reopening(upgrade)
    }

    fn append_retry(&mut self, retry: &crate::store::upgrades::RetryRecord) -> Result<()> {
        self.append_reopening(retry)?;
        self.ended = false;
        Ok(())
    }
}

/// Records as JSON lines.
fn jsonl<T: Serialize>(records: &[T]) -> Vec<u8> {
    let mut text = Vec::new();
    for record in records {
        serde_json::to_writer(&mut text, record).expect("records serialize");
        text.push(b'\n');
    }
    text
}

/// Is someone holding the run lock of this data file?
fn is_locked(path: &Path) -> bool {
    let Ok(file) = std::fs::File::open(path) else { return false };
    match file.try_lock() {
        Ok(()) => false,
        Err(std::fs::TryLockError::WouldBlock) => true,
        Err(std::fs::TryLockError::Error(_)) => false,
    }
}

/// The longest line a thread file may have: far above any record the host writes with sane
/// limits, and a bound on what reading a damaged or hostile file can cost.
pub const MAX_LINE_BYTES: usize = 256 << 20;

/// Reads a thread's data file.
pub fn read_thread(path: &Path) -> Result<ThreadRecord> {
    read_thread_lines(path).map(|(record, _)| record)
}

/// Where line `line` (1-based, after the start record) of the file at `path` starts.
fn line_offset(path: &Path, line: usize) -> Result<u64> {
    let bytes = std::fs::read(path).map_err(Error::io("read thread", path))?;
    let newline = bytes
        .iter()
        .enumerate()
        .filter(|&(_, &b)| b == b'\n')
        .nth(line.saturating_sub(2))
        .filter(|_| line >= 2)
        .ok_or_else(|| Error::Corrupt {
            path: path.to_path_buf(),
            reason: format!("line {line} changed while the thread was being opened"),
        })?;
    Ok(newline.0 as u64 + 1)
}

/// Reads a thread's data file; and the line where a parallel group cut short by a crash
/// starts, if the file ends with one (its steps are not in the record).
fn read_thread_lines(path: &Path) -> Result<(ThreadRecord, Option<usize>)> {
    let file = std::fs::File::open(path).map_err(Error::io("read thread", path))?;
    let mut reader = std::io::BufReader::new(file);
    let mut lines = ThreadLines::default();
    let mut bytes = Vec::new();
    for index in 0.. {
        bytes.clear();
        let read = std::io::Read::take(&mut reader, MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut bytes)
            .map_err(Error::io("read thread", path))?;
        if read == 0 {
            break;
        }
        if bytes.len() > MAX_LINE_BYTES {
            return Err(Error::Corrupt {
                path: path.to_path_buf(),
                reason: format!(
                    "line {} is over {} (no record the host writes is that large)",
                    index + 1,
                    Size(MAX_LINE_BYTES)
                ),
            });
        }
        lines.push(index + 1, &bytes);
    }
    lines.finish(is_locked(path)).ok_or_else(|| Error::Corrupt {
        path: path.to_path_buf(),
        reason: "no start record: not a thread file".into(),
    })
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

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::run_request::RunRequest;
    use crate::store::records::{Parameters, StepGroup};

    /// A thread's start record, for thread `id`.
    fn start(id: ThreadId) -> StartRecord {
        StartRecord {
            name: "w".into(),
            hash: BundleHash::of(b"w"),
            thread_id: id,
            parameters: Parameters {
                prompt: "p".into(),
                options: RunRequest { max_rounds: Some(3), ..Default::default() },
            },
            timestamp: 1,
            parent: None,
            forked_from: None,
            trigger_data: None,
            schedule: None,
            started_by: None,
            eval: None,
        }
    }

    #[test]
    fn a_group_cut_short_is_left_out_and_undone_when_the_thread_continues() -> Result<()> {
        let dir = tempfile::tempdir().unwrap();
        let threads = FileThreads::new(&Home::new(dir.path()));
        let id = ThreadId::new();
        let step = |role: &str, group: Option<StepGroup>| StepRecord {
            role: role.into(),
            content: "c".into(),
            meta: serde_json::json!({}),
            timestamp: 2,
            group,
            agent: None,
            duration_ms: None,
            usage: None,
        };
        let group = Some(StepGroup { first: 2, size: 3 });
        let whole = [step("a", group), step("b", group), step("c", group)];
        {
            let (mut writer, _) = threads.create(&start(id), &[], &[])?;
            futures::executor::block_on(writer.append_steps(&[step("dev", None)]))?;
        }
        let (_, path) = threads.find(id)?;
        let before = std::fs::metadata(&path).unwrap().len();
        // A crash after two of the group's three lines reached the file.
        let mut cut = Vec::new();
        for s in &whole[..2] {
            serde_json::to_writer(&mut cut, s).unwrap();
            cut.push(b'\n');
        }
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(&cut).unwrap();
        let read = threads.read(id)?;
        assert_eq!(read.steps, vec![step("dev", None)], "no part of a group");
        assert_eq!(read.skipped_lines, vec![3, 4]);

        let (mut writer, record) = threads.open(id)?;
        assert_eq!(record.steps.len(), 1);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), before, "the cut group is undone");
        futures::executor::block_on(writer.append_steps(&whole))?;
        drop(writer);
        let read = threads.read(id)?;
        assert_eq!(read.steps.len(), 4);
        assert_eq!(read.steps[1..], whole);
        assert!(read.skipped_lines.is_empty());
        Ok(())
    }

    #[test]
    fn torn_last_line_is_skipped_and_repaired_by_the_next_append() -> Result<()> {
        let dir = tempfile::tempdir().unwrap();
        let threads = FileThreads::new(&Home::new(dir.path()));
        let id = ThreadId::new();
        let start = start(id);
        let step = StepRecord {
            role: "r".into(),
            content: "c".into(),
            meta: serde_json::json!({}),
            timestamp: 2,
            group: None,
            agent: None,
            duration_ms: None,
            usage: None,
        };
        {
            let (mut writer, _) = threads.create(&start, &[], &[])?;
            futures::executor::block_on(writer.append_steps(std::slice::from_ref(&step)))?;
        }
        let (_, path) = threads.find(id)?;
        // Simulate a crash in the middle of the next append.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(br#"{"role":"r","cont"#)
            .unwrap();
        let torn = threads.read(id)?;
        assert_eq!(torn.steps, vec![step.clone()]);
        assert_eq!(torn.skipped_lines, vec![3]);

        let (mut writer, record) = threads.open(id)?;
        assert_eq!(record.steps.len(), 1);
        futures::executor::block_on(writer.append_steps(std::slice::from_ref(&step)))?;
        drop(writer);
        let repaired = threads.read(id)?;
        assert_eq!(repaired.steps, vec![step.clone(), step]);
        assert_eq!(repaired.skipped_lines, vec![3]);
        Ok(())
    }
}
