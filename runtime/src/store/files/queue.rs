//! The work queue of a home directory, in `run/queue/`: a thread waiting for its bundle's
//! worker is a file `<ULID>.json` (its bundle and run request); a worker takes it by taking
//! the thread's run lock (the lock on its data file) and moving the file to `taken/`, and
//! drops it there when the thread comes to rest. A kill or pause asked of the worker is a file
//! `<ULID>.control`. Each bundle's worker holds `run/<HASH>.lock` while it lives.
//!
//! The commands that queue a thread hand it to the bundle's worker themselves, at once (over
//! its socket, with their secrets), and withdraw it if the worker cannot take it: a thread
//! waits here only for the moment of the hand-over. One whose command died in that moment is
//! at rest, interrupted, and `resume` queues it again. A start `serve` answered once queued
//! ([`WorkQueue::create_queued`]) is handed over just after its answer; should `serve` die
//! first, the next `serve` hands it over ([`WorkQueue::orphaned_starts`]).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::queue_entry::Entry;
use super::threads::FileThreads;
use crate::durable;
use crate::error::{Error, Result};
use crate::home::Home;
use crate::ids::{BundleHash, ThreadId};
use crate::run_request::RunRequest;
use crate::store::ThreadStore;
use crate::store::queue::{
    Activity, Claimed, ControlRequest, LiveChannel, LiveThread, Release, Scope, WorkQueue, Workers,
};
use crate::store::records::{StartRecord, ThreadRecord};

/// How long a new worker tries to take its bundle's worker lock.
const LOCK_WAIT: Duration = Duration::from_secs(1);

/// Removes `path`; one already gone is fine.
fn remove_if_present(path: &Path, what: &'static str) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(what, path)(e)),
        _ => Ok(()),
    }
}

/// The queue of a home directory.
#[derive(Debug)]
pub struct FileQueue {
    home: Home,
    threads: FileThreads,
    /// The worker lock this process holds, once registered as a bundle's worker.
    registered: Mutex<Option<File>>,
}

impl FileQueue {
    /// The queue of `home`.
    pub fn new(home: &Home) -> Self {
        FileQueue {
            home: home.clone(),
            threads: FileThreads::new(home),
            registered: Mutex::new(None),
        }
    }

    fn dir(&self) -> PathBuf {
        self.home.run_dir().join("queue")
    }

    fn entry(&self, id: ThreadId) -> PathBuf {
        self.home.queue_entry(id)
    }

    fn taken(&self, id: ThreadId) -> PathBuf {
        self.dir().join("taken").join(format!("{id}.json"))
    }

    fn control(&self, id: ThreadId) -> PathBuf {
        self.dir().join(format!("{id}.control"))
    }

    /// The queued threads, oldest first (a ULID sorts by time).
    fn queued(&self) -> Result<Vec<ThreadId>> {
        let dir = self.dir();
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io("list", &dir)(e)),
        };
        let mut ids: Vec<ThreadId> = entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_suffix(".json")?.parse().ok())
            .collect();
        ids.sort_unstable();
        Ok(ids)
    }

    /// Takes queued thread `id` for this process, if nobody holds it.
    fn take(&self, id: ThreadId, scope: Scope) -> Result<Option<Claimed>> {
        let path = self.entry(id);
        let entry = match Entry::read(&path) {
            Ok(Some(entry)) => entry,
            Ok(None) => return Ok(None),
            Err(e) => {
                // A damaged entry names no run request to trust: the thread waits for
                // `resume` instead.
                tracing::warn!("{e}; dropped from the queue");
                let _ = std::fs::remove_file(&path);
                return Ok(None);
            }
        };
        if !scope.takes(entry.hash) {
            return Ok(None);
        }
        let (writer, record) = match self.threads.hold(id) {
            Ok(open) => open,
            Err(Error::ThreadBusy(_)) => return Ok(None),
            Err(Error::UnknownThread(_)) => {
                let _ = std::fs::remove_file(&path);
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        durable::create_dir(&self.dir().join("taken"))?;
        std::fs::rename(&path, self.taken(id)).map_err(Error::io("take queued thread", &path))?;
        Ok(Some(Claimed {
            id,
            record,
            writer: Box::new(writer),
            request: entry.request,
            ticket: 0,
            taken_from: None,
        }))
    }
}

impl WorkQueue for FileQueue {
    fn workers(&self) -> Workers {
        Workers::PerBundle
    }

    /// The thread's file, then its queue entry, marked answered: a creator that dies between
    /// the two leaves a thread at rest that never ran (its start was not answered), which
    /// whoever finishes its start hands over; one that dies after both, before its hand-over,
    /// leaves an orphaned start for the next `serve`.
    fn create_queued(&self, start: &StartRecord, request: &RunRequest) -> Result<ThreadRecord> {
        let mut record = self.threads.create_at_rest(start, &[], &[])?;
        crate::faults::crash_point("start-created");
        Entry::answered(start.hash, request).write(&self.entry(start.thread_id))?;
        record.queued = true;
        Ok(record)
    }

    fn orphaned_starts(&self) -> Result<Vec<(ThreadId, BundleHash)>> {
        let mut orphans = Vec::new();
        for id in self.queued()? {
            if let Ok(Some(entry)) = Entry::read(&self.entry(id))
                && entry.is_orphaned_start()
            {
                orphans.push((id, entry.hash));
            }
        }
        Ok(orphans)
    }

    fn enqueue(&self, id: ThreadId, hash: BundleHash, request: &RunRequest) -> Result<()> {
        Entry::new(hash, request).write(&self.entry(id))
    }

    fn claim(
        &self,
        scope: Scope,
        max: usize,
        running: &[ThreadId],
        only: Option<ThreadId>,
    ) -> Result<Vec<Claimed>> {
        let candidates = match only {
            Some(id) => vec![id],
            None => self.queued()?,
        };
        let mut claimed = Vec::new();
        for id in candidates.into_iter().filter(|id| !running.contains(id)) {
            if claimed.len() >= max {
                break;
            }
            match self.take(id, scope) {
                Ok(Some(thread)) => claimed.push(thread),
                Ok(None) => {}
                // The thread asked for by name: its error is the answer.
                Err(e) if only.is_some() => return Err(e),
                Err(e) => tracing::warn!("thread {id} stays queued: {e}"),
            }
        }
        Ok(claimed)
    }

    fn release(&self, id: ThreadId, _ticket: i64, how: Release) -> Result<()> {
        let taken = self.taken(id);
        let _ = std::fs::remove_file(self.control(id));
        match how {
            Release::Settle => remove_if_present(&taken, "settle queued thread"),
            Release::HandBack => std::fs::rename(&taken, self.entry(id))
                .map_err(Error::io("hand back queued thread", &taken)),
        }
    }

    fn withdraw(&self, id: ThreadId) -> Result<()> {
        remove_if_present(&self.entry(id), "withdraw queued thread")
    }

    fn ask(&self, id: ThreadId, request: ControlRequest) -> Result<bool> {
        if !self.threads.read(id)?.running {
            return Ok(false);
        }
        durable::write_atomic(&self.control(id), request.as_str().as_bytes())?;
        Ok(true)
    }

    fn is_asked(&self, id: ThreadId) -> Result<bool> {
        Ok(self.control(id).exists())
    }

    fn requests(&self, running: &[ThreadId]) -> Result<Vec<(ThreadId, ControlRequest)>> {
        let mut requests = Vec::new();
        for &id in running {
            let path = self.control(id);
            let Some(text) = durable::read_text(&path, "read control request")? else { continue };
            let _ = std::fs::remove_file(&path);
            if let Some(request) = ControlRequest::named(&text) {
                requests.push((id, request));
            }
        }
        Ok(requests)
    }

    fn is_taken(&self, id: ThreadId) -> Result<bool> {
        Ok(!self.entry(id).exists())
    }

    fn register(&self, scope: Scope, _max_threads: usize) -> Result<bool> {
        let Scope::Bundle(hash) = scope else { return Ok(true) };
        durable::create_dir(&self.home.run_dir())?;
        let path = self.home.worker_lock(hash);
        let lock = durable::open_private(
            std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false),
            &path,
        )
        .map_err(Error::io("open worker lock", &path))?;
        let deadline = Instant::now() + LOCK_WAIT;
        while lock.try_lock().is_err() {
            if Instant::now() > deadline {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        *self.registered.lock() = Some(lock);
        Ok(true)
    }

    fn heartbeat(&self, _activities: &[(ThreadId, Activity)]) -> Result<()> {
        // A worker is alive while it holds its lock: the kernel drops it with the process.
        Ok(())
    }

    fn unregister(&self) -> Result<()> {
        self.registered.lock().take();
        Ok(())
    }

    fn live_workers(&self) -> Result<usize> {
        let dir = self.home.run_dir();
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(Error::io("list", &dir)(e)),
        };
        let mut live = 0;
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "lock")
                && File::open(&path).is_ok_and(|f| f.try_lock().is_err())
            {
                live += 1;
            }
        }
        Ok(live)
    }

    fn live_threads(&self) -> Result<Vec<LiveThread>> {
        // A thread is queued here only while its command (or `serve`) hands it to the worker,
        // which then lists it itself (over its socket).
        Ok(Vec::new())
    }

    fn activity(&self, _id: ThreadId) -> Result<Option<Activity>> {
        // A bundle's worker tells what its threads do over its socket, not through the store.
        Ok(None)
    }

    fn wake_ups(&self) -> Result<Option<tokio::sync::mpsc::UnboundedReceiver<()>>> {
        // The commands that queue a thread wake its worker over its socket.
        Ok(None)
    }

    fn hold(&self) -> Option<Duration> {
        None
    }

    fn owner(&self) -> String {
        format!("worker {}", std::process::id())
    }

    fn live(&self) -> Option<&dyn LiveChannel> {
        None
    }
}
