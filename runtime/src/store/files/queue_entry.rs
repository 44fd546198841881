//! A thread's entry in a home directory's work queue (`run/queue/<ULID>.json`): its bundle, its
//! run request, the process that queued it, and whether its start was answered already. A
//! bundle's worker there takes only a thread it is handed over its socket, so an entry says
//! "queued" only while the process that wrote it is alive to hand it over; one whose writer
//! died in the middle of the hand-over is taken by nobody, and its thread is at rest
//! (interrupted, never run) for whoever finishes the start or resumes it — or, when its start
//! was answered before the hand-over (a `serve`'s), for the next `serve` of the home, which
//! hands such orphans over. The thread store and the queue both read entries through here, so
//! that every read of a thread says the same.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::clock::now_ms;
use crate::durable;
use crate::error::{Error, Result};
use crate::ids::BundleHash;
use crate::procfs::{boot_id, start_time};
use crate::run_request::RunRequest;

/// A queued thread's entry.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    pub hash: BundleHash,
    pub request: RunRequest,
    pub queued_at: u64,
    /// Who queued it (none in an entry of a release before this field: read as gone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<Writer>,
    /// Whether the start was answered once queued, before its hand-over: then it must run even
    /// if its writer dies first (none of the other entries promised anyone that).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub answered: bool,
}

/// The process that wrote an entry: its id is trusted only with the start time and the boot
/// it had then (an id is reused by later processes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Writer {
    pub pid: i32,
    pub started: u64,
    pub boot: String,
}

impl Writer {
    /// This process.
    fn this() -> Option<Writer> {
        let pid = std::process::id() as i32;
        Some(Writer { pid, started: start_time(pid)?, boot: boot_id() })
    }

    /// Whether it still runs.
    fn runs(&self) -> bool {
        self.boot == boot_id()
            && start_time(self.pid) == Some(self.started)
            && crate::procfs::runs(self.pid)
    }
}

impl Entry {
    /// An entry this process writes now.
    pub fn new(hash: BundleHash, request: &RunRequest) -> Entry {
        Entry {
            hash,
            request: request.clone(),
            queued_at: now_ms(),
            by: Writer::this(),
            answered: false,
        }
    }

    /// The entry of a start this process answers once it is written.
    pub fn answered(hash: BundleHash, request: &RunRequest) -> Entry {
        Entry { answered: true, ..Entry::new(hash, request) }
    }

    /// Whether it is a start answered before its hand-over whose writer died first: nobody
    /// hands it over unless whoever finds it does.
    pub fn is_orphaned_start(&self) -> bool {
        self.answered && !self.is_handed_over()
    }

    /// Whether the process that wrote it is alive to hand the thread over.
    pub fn is_handed_over(&self) -> bool {
        self.by.as_ref().is_some_and(Writer::runs)
    }

    /// Writes it at `path`, durably.
    pub fn write(&self, path: &Path) -> Result<()> {
        let bytes = serde_json::to_vec(self).expect("queue entries serialize");
        durable::write_atomic(path, &bytes)
    }

    /// The entry at `path`, if there is one.
    pub fn read(path: &Path) -> Result<Option<Entry>> {
        let Some(text) = durable::read_text(path, "read queued thread")? else { return Ok(None) };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| Error::Corrupt { path: path.into(), reason: e.to_string() })
    }
}

/// Whether the thread whose entry is at `path` waits in the queue: the entry is there, and
/// its writer is alive to hand it over. A damaged entry names nobody who does.
pub fn waits(path: &Path) -> bool {
    Entry::read(path).ok().flatten().is_some_and(|entry| entry.is_handed_over())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_waits_while_its_writer_lives() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("entry.json");
        assert!(!waits(&path), "no entry");
        let mut entry = Entry::new(BundleHash::of(b"x"), &RunRequest::default());
        entry.write(&path).unwrap();
        assert!(waits(&path), "written by this process");
        // A writer that has exited (its id now another process's, or nobody's).
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        let pid = gone.id() as i32;
        let started = start_time(pid).unwrap_or(1);
        gone.wait().unwrap();
        entry.by = Some(Writer { pid, started, boot: boot_id() });
        entry.write(&path).unwrap();
        assert!(!waits(&path), "its writer is gone");
        let read = Entry::read(&path).unwrap().unwrap();
        assert!(!read.is_orphaned_start(), "no start: a command's, which nobody finishes for it");
        let mut answered = Entry::answered(BundleHash::of(b"x"), &RunRequest::default());
        answered.write(&path).unwrap();
        assert!(!Entry::read(&path).unwrap().unwrap().is_orphaned_start(), "its writer lives");
        answered.by = entry.by.clone();
        answered.write(&path).unwrap();
        assert!(Entry::read(&path).unwrap().unwrap().is_orphaned_start(), "its writer is gone");
        entry.by = None;
        entry.write(&path).unwrap();
        assert!(!waits(&path), "an entry that names nobody");
        std::fs::write(&path, "{not json").unwrap();
        assert!(!waits(&path), "a damaged entry");
    }
}
