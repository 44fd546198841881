//! The listing index of a home's threads (`logs/threads.index`), so that `threads` and `ps` over
//! 100,000 threads read neither 100,000 files nor a directory of 300,000 names.
//!
//! Two facts make it safe. An ended thread changes again only when it is reopened (a retry,
//! a move to another version), and a reopening is noted first in `logs/threads.reopened`
//! (see [`note_reopened`]): so the summary of an ended thread can be kept until the log names
//! it. And a directory's modification time changes whenever a name in it is added, removed or
//! renamed (a thread created, forked, removed or pruned), so a bundle's directory whose time
//! has not moved since the index was written still holds exactly the threads the index lists.
//! Only the threads that had not ended are then read again. Everything else is found by
//! listing the directory, as without an index.
//!
//! The reopening is noted under the thread's run lock, before the record that reopens it is
//! appended; the index keeps how much of the log it has read. A listing that read the log
//! before the note kept the old summary but not the note, which the next listing reads; one
//! that read the note reads the thread, and a thread read while a process holds it is not kept
//! as ended, whatever it says (its reopening may not be written yet).
//!
//! A directory time is trusted only once it lies [`SETTLE`] behind the clock when it was read:
//! file systems stamp with a coarse clock, and a change in the same tick as the listing would
//! otherwise keep the time the index recorded (the "racy git" problem). The index is a cache:
//! missing, damaged or of another version, it is rebuilt from the files.
//!
//! It is binary (postcard, with a magic, a version and an XXH64 of the rest): reading 100,000
//! JSON summaries alone took longer than the whole listing may.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::durable;
use crate::error::{Error, Result};
use crate::ids::{BundleHash, ThreadId};
use crate::store::records::ThreadSummary;

/// What an index file starts with, then [`VERSION`] (4 bytes, little-endian), then the XXH64
/// of the rest (8 bytes), then the [`Index`].
const MAGIC: &[u8; 8] = b"UWTHIDX\n";

/// The layout this code writes; an index of another is rebuilt.
const VERSION: u32 = 8;

/// How far behind the clock a directory time must be to be trusted.
const SETTLE: Duration = Duration::from_secs(2);

/// The index: what it knows of each bundle's directory.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Index {
    dirs: Vec<DirEntry>,
    /// How much of the reopening log (its length in bytes) it has taken into account.
    reopened: u64,
}

/// A thread as read for a listing: its summary, and whether a process held it then.
#[derive(Debug)]
pub struct Listed {
    pub summary: ThreadSummary,
    pub held: bool,
}

/// Notes that thread `id` (its ULID) is being reopened, in the log at `path`: durably, before
/// the record that reopens it is appended (see the module).
pub fn note_reopened(path: &Path, id: &str) -> Result<()> {
    durable::AppendFile::open(path, true)?
        .append(id.as_bytes())
        .map_err(Error::io("note a reopened thread in", path))
}

/// The threads the reopening log at `path` names after its first `from` bytes, and its length
/// up to its last whole line. A log shorter than `from` (replaced) is read from its start.
fn reopened_since(path: &Path, from: u64) -> Result<(std::collections::HashSet<ThreadId>, u64)> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Default::default()),
        Err(e) => return Err(Error::io("read", path)(e)),
    };
    let whole = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |at| at + 1);
    let from = if from as usize > whole { 0 } else { from as usize };
    let ids = bytes[from..whole]
        .split(|&b| b == b'\n')
        .filter_map(|line| std::str::from_utf8(line).ok()?.trim().parse().ok())
        .collect();
    Ok((ids, whole as u64))
}

/// What the index knows of one bundle's directory.
#[derive(Debug, Serialize, Deserialize)]
struct DirEntry {
    hash: BundleHash,
    /// The directory's identity and time when it was listed; none if that time had not settled.
    stamp: Option<DirStamp>,
    /// Threads of the directory whose file must be read each time (not ended, or unreadable).
    live: Vec<ThreadId>,
    /// The summaries of its ended threads.
    ended: Vec<ThreadSummary>,
}

/// A directory's inode and modification time (nanoseconds since the epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct DirStamp {
    ino: u64,
    mtime_ns: i128,
}

impl DirStamp {
    /// The stamp of `dir` now, if its time lies far enough behind `now` to be trusted later.
    fn settled(dir: &Path, now: SystemTime) -> Result<Option<DirStamp>> {
        let meta = std::fs::metadata(dir).map_err(Error::io("read the time of", dir))?;
        let mtime_ns = i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec());
        let now_ns = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i128);
        let settled = mtime_ns < now_ns - SETTLE.as_nanos() as i128;
        Ok(settled.then_some(DirStamp { ino: meta.ino(), mtime_ns }))
    }
}

/// Reads the index at `path`, by bundle, and how much of the reopening log it read; `None`
/// when it is missing, damaged or of another version.
fn load(path: &Path) -> Option<(HashMap<BundleHash, DirEntry>, u64)> {
    let file = std::fs::File::open(path).ok()?;
    // Mapped, not read: read whole, the index of 100,000 threads is 16 MB of fresh memory
    // whose page faults and copy cost a seventh of the listing; mapped, its pages are the
    // page cache's own. Safe because the index is only ever replaced by a rename
    // (`durable::write_atomic`), never written in place or truncated: the mapped file stays
    // whole and unchanged until it is unmapped, whatever a concurrent listing writes.
    #[allow(unsafe_code)]
    let bytes = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let rest = bytes.strip_prefix(MAGIC)?;
    let (version, rest) = rest.split_first_chunk::<4>()?;
    let (checksum, body) = rest.split_first_chunk::<8>()?;
    if u32::from_le_bytes(*version) != VERSION
        || u64::from_le_bytes(*checksum) != twox_hash::XxHash64::oneshot(0, body)
    {
        return None;
    }
    let (index, trailing): (Index, _) = postcard::take_from_bytes(body).ok()?;
    if !trailing.is_empty() {
        return None;
    }
    let consistent =
        |dir: &DirEntry| dir.ended.iter().all(|s| s.status.is_ended() && s.hash == dir.hash);
    let reopened = index.reopened;
    index
        .dirs
        .iter()
        .all(consistent)
        .then(|| (index.dirs.into_iter().map(|d| (d.hash, d)).collect(), reopened))
}

/// Writes the index: `dirs` with their live threads, the summaries of the other ended threads,
/// and how much of the reopening log it took into account.
fn store(
    path: &Path,
    mut dirs: Vec<DirEntry>,
    summaries: &[ThreadSummary],
    reopened: u64,
) -> Result<()> {
    let live: std::collections::HashSet<ThreadId> =
        dirs.iter().flat_map(|d| d.live.iter().copied()).collect();
    let mut by_dir: HashMap<BundleHash, Vec<ThreadSummary>> = HashMap::new();
    for summary in summaries.iter().filter(|s| s.status.is_ended() && !live.contains(&s.thread_id))
    {
        by_dir.entry(summary.hash).or_default().push(summary.clone());
    }
    for dir in &mut dirs {
        dir.ended = by_dir.remove(&dir.hash).unwrap_or_default();
    }
    let body = postcard::to_stdvec(&Index { dirs, reopened }).expect("the index serializes");
    let mut bytes = Vec::with_capacity(body.len() + 20);
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&VERSION.to_le_bytes());
    bytes.extend_from_slice(&twox_hash::XxHash64::oneshot(0, &body).to_le_bytes());
    bytes.extend_from_slice(&body);
    durable::write_atomic(path, &bytes)?;
    // The JSON index of earlier versions, now stale: it only takes room.
    if let Some(dir) = path.parent() {
        let _ = std::fs::remove_file(dir.join("index.jsonl"));
    }
    Ok(())
}

/// The summaries of every thread in `dirs` (each bundle's hash and directory), ordered by id,
/// using and refreshing the index at `index_path`, and the reopening log at `reopen_log`.
/// `read` reads one thread file; a thread it cannot read is skipped with a warning.
pub fn summaries(
    index_path: &Path,
    reopen_log: &Path,
    dirs: Vec<(BundleHash, PathBuf)>,
    read: impl Fn(&Path) -> Result<Listed>,
) -> Result<Vec<ThreadSummary>> {
    let loaded = load(index_path);
    let mut dirty = loaded.is_none();
    let (mut index_dirs, log_read) = loaded.unwrap_or_default();
    // Read before any summary is trusted: a reopening noted after this is read next time.
    let (reopened, log_len) = reopened_since(reopen_log, log_read)?;
    dirty |= log_len != log_read;
    let mut entries = Vec::with_capacity(dirs.len());
    let mut summaries = Vec::new();
    for (hash, dir) in dirs {
        // The stamp is taken before the listing: a change after it moves the time past it.
        let stamp = DirStamp::settled(&dir, SystemTime::now())?;
        let indexed = index_dirs.remove(&hash);
        let (mut ended, mut to_read) = match indexed {
            Some(known) if known.stamp.is_some() && known.stamp == stamp => {
                (known.ended, known.live)
            }
            known => {
                let (mut old_live, old_ended) =
                    known.map(|k| (k.live, k.ended)).unwrap_or_default();
                let old_count = old_ended.len();
                let (ended, to_read) = split_listing(&dir, old_ended)?;
                // Rewritten only if that pays: the time can now be trusted, or threads came or
                // went. (A directory that keeps changing — threads being created — would
                // otherwise have 100,000 summaries rewritten at every listing.)
                let mut new_live = to_read.clone();
                new_live.sort_unstable();
                old_live.sort_unstable();
                dirty |= stamp.is_some() || ended.len() != old_count || new_live != old_live;
                (ended, to_read)
            }
        };
        if !reopened.is_empty() {
            // Reopened since it was kept: read again.
            ended.retain(|summary| match reopened.contains(&summary.thread_id) {
                true => {
                    to_read.push(summary.thread_id);
                    false
                }
                false => true,
            });
        }
        if summaries.is_empty() {
            // Moved, not copied: with one bundle, that is 100,000 summaries.
            summaries = ended;
        } else {
            summaries.extend(ended);
        }
        let mut live = Vec::new();
        for id in to_read {
            let path = dir.join(format!("{id}.data.jsonl"));
            match read(&path) {
                Ok(Listed { summary, held }) => {
                    if summary.status.is_ended() && !held {
                        dirty = true;
                    } else {
                        live.push(id);
                    }
                    summaries.push(summary);
                }
                Err(Error::Io { cause, .. }) if cause.kind() == std::io::ErrorKind::NotFound => {
                    // Gone between the listing and now: the next listing sees the new time.
                    dirty = true;
                }
                Err(e) => {
                    tracing::warn!("skipping thread {id}: {e}");
                    live.push(id);
                }
            }
        }
        entries.push(DirEntry { hash, stamp, live, ended: Vec::new() });
    }
    // What is left of the index are bundles whose directory is gone.
    dirty |= !index_dirs.is_empty();
    summaries.sort_unstable_by_key(|s| s.thread_id);
    if dirty {
        // The index only saves time: failing to write it must not fail a listing.
        // A home that cannot be written to (read-only, another user's) is read as it is;
        // the listing says nothing of a cache it could not keep.
        if let Err(e) = store(index_path, entries, &summaries, log_len) {
            match &e {
                crate::Error::Io { cause, .. }
                    if matches!(
                        cause.kind(),
                        std::io::ErrorKind::ReadOnlyFilesystem
                            | std::io::ErrorKind::PermissionDenied
                    ) =>
                {
                    tracing::debug!("cannot write the thread index: {e}")
                }
                _ => tracing::warn!("cannot write the thread index: {e}"),
            }
        }
    }
    Ok(summaries)
}

/// Lists `dir`: the ended threads the index already summarised (from `known`), and the ids of
/// every other thread file, to be read.
fn split_listing(
    dir: &Path,
    known: Vec<ThreadSummary>,
) -> Result<(Vec<ThreadSummary>, Vec<ThreadId>)> {
    let mut known: HashMap<ThreadId, ThreadSummary> =
        known.into_iter().map(|s| (s.thread_id, s)).collect();
    let mut ended = Vec::new();
    let mut to_read = Vec::new();
    for id in thread_ids(dir)? {
        match known.remove(&id) {
            Some(summary) => ended.push(summary),
            None => to_read.push(id),
        }
    }
    Ok((ended, to_read))
}

/// The ids of the thread files in `dir` (`<ULID>.data.jsonl`), in no particular order.
pub fn thread_ids(dir: &Path) -> Result<Vec<ThreadId>> {
    let entries = std::fs::read_dir(dir).map_err(Error::io("list threads in", dir))?;
    let mut ids = Vec::new();
    for entry in entries {
        let entry = entry.map_err(Error::io("list threads in", dir))?;
        let name = entry.file_name();
        let id = name.to_str().and_then(|n| n.strip_suffix(".data.jsonl"));
        if let Some(Ok(id)) = id.map(str::parse::<ThreadId>) {
            ids.push(id);
        }
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::records::ThreadStatus;

    fn summary(id: ThreadId, hash: BundleHash, status: ThreadStatus) -> ThreadSummary {
        ThreadSummary {
            thread_id: id,
            name: "w".into(),
            hash,
            status,
            steps: 1,
            timestamp: 1,
            prompt: "p".into(),
            return_code: None,
            ended: None,
            waiting_role: None,
            paused_at: None,
            schedule: None,
            tokens: 0,
            cost_usd: None,
            parent: None,
            started_by: None,
        }
    }

    /// A home with one bundle's directory holding empty thread files for `ids`, its time
    /// settled; and the index's path.
    fn bundle_dir(ids: &[ThreadId]) -> (tempfile::TempDir, BundleHash, PathBuf, PathBuf) {
        let home = tempfile::tempdir().unwrap();
        let hash: BundleHash = "0000000000000".parse().unwrap();
        let dir = home.path().join(hash.to_string());
        std::fs::create_dir(&dir).unwrap();
        for id in ids {
            std::fs::write(dir.join(format!("{id}.data.jsonl")), "").unwrap();
        }
        age(&dir);
        let index = home.path().join("threads.index");
        (home, hash, dir, index)
    }

    /// Sets a directory's time to one fixed instant long ago, as if it had settled.
    fn age(dir: &Path) {
        let old = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        std::fs::File::open(dir).unwrap().set_modified(old).unwrap();
    }

    #[test]
    fn an_unchanged_directory_is_not_listed_and_a_changed_one_is() -> Result<()> {
        let (a, b) = (ThreadId::new(), ThreadId::new());
        let (_home, hash, dir, index) = bundle_dir(&[a, b]);
        let reads = std::cell::RefCell::new(Vec::new());
        let read = |path: &Path| {
            let id: ThreadId = path.file_name().unwrap().to_str().unwrap()[..26].parse().unwrap();
            reads.borrow_mut().push(id);
            let status = if id == a { ThreadStatus::Completed } else { ThreadStatus::Paused };
            Ok(Listed { summary: summary(id, hash, status), held: false })
        };
        let dirs = || vec![(hash, dir.clone())];
        let first = summaries(&index, &index.with_extension("reopened"), dirs(), read)?;
        assert_eq!(first.len(), 2);
        assert_eq!(reads.take().len(), 2, "no index yet: every file is read");

        // A file the listing would find, put there without moving the directory's time: only
        // an index that does not list the directory again misses it.
        let hidden = ThreadId::new();
        std::fs::write(dir.join(format!("{hidden}.data.jsonl")), "").unwrap();
        age(&dir);
        let second = summaries(&index, &index.with_extension("reopened"), dirs(), read)?;
        let listed: Vec<ThreadId> = second.iter().map(|s| s.thread_id).collect();
        assert_eq!(listed, vec![a.min(b), a.max(b)], "the index alone, ordered by id");
        assert_eq!(reads.take(), vec![b], "only the thread that had not ended is read again");

        // A real change moves the directory's time: the listing finds the new thread.
        std::fs::write(dir.join("other"), "").unwrap();
        let third = summaries(&index, &index.with_extension("reopened"), dirs(), read)?;
        assert_eq!(third.len(), 3);
        assert_eq!(reads.take().len(), 2, "the paused thread and the new one");
        Ok(())
    }

    /// An ended thread's kept summary is read again once the log names it, and a thread read
    /// while a process holds it is not kept as ended (its reopening may be half-written).
    #[test]
    fn a_reopened_thread_is_read_again() -> Result<()> {
        let (a, b) = (ThreadId::new(), ThreadId::new());
        let (_home, hash, dir, index) = bundle_dir(&[a, b]);
        let log = index.with_extension("reopened");
        let states = std::cell::RefCell::new(HashMap::from([
            (a, (ThreadStatus::Failed, false)),
            (b, (ThreadStatus::Completed, false)),
        ]));
        let reads = std::cell::RefCell::new(Vec::new());
        let read = |path: &Path| {
            let id: ThreadId = path.file_name().unwrap().to_str().unwrap()[..26].parse().unwrap();
            reads.borrow_mut().push(id);
            let (status, held) = states.borrow()[&id];
            Ok(Listed { summary: summary(id, hash, status), held })
        };
        let status_of = |listed: &[ThreadSummary], id| {
            listed.iter().find(|s| s.thread_id == id).map(|s| s.status)
        };
        summaries(&index, &log, vec![(hash, dir.clone())], read)?;
        reads.take();
        // Reopened, its record not written yet: still failed, and held.
        note_reopened(&log, &a.to_string())?;
        states.borrow_mut().insert(a, (ThreadStatus::Failed, true));
        let listed = summaries(&index, &log, vec![(hash, dir.clone())], read)?;
        assert_eq!(reads.take(), vec![a], "the reopened thread alone is read again");
        assert_eq!(status_of(&listed, a), Some(ThreadStatus::Failed));
        states.borrow_mut().insert(a, (ThreadStatus::Paused, false));
        let listed = summaries(&index, &log, vec![(hash, dir.clone())], read)?;
        assert_eq!(reads.take(), vec![a], "a thread held when read is read again");
        assert_eq!(status_of(&listed, a), Some(ThreadStatus::Paused));
        states.borrow_mut().insert(a, (ThreadStatus::Completed, false));
        summaries(&index, &log, vec![(hash, dir.clone())], read)?;
        reads.take();
        let listed = summaries(&index, &log, vec![(hash, dir)], read)?;
        assert_eq!(reads.take(), vec![], "ended again, it is kept again");
        assert_eq!(status_of(&listed, a), Some(ThreadStatus::Completed));
        Ok(())
    }

    #[test]
    fn a_damaged_or_cut_index_is_rebuilt() -> Result<()> {
        let ids: Vec<ThreadId> = (0..3).map(|_| ThreadId::new()).collect();
        let (_home, hash, dir, index) = bundle_dir(&ids);
        let read = |path: &Path| {
            let id = path.file_name().unwrap().to_str().unwrap()[..26].parse().unwrap();
            Ok(Listed { summary: summary(id, hash, ThreadStatus::Completed), held: false })
        };
        summaries(&index, &index.with_extension("reopened"), vec![(hash, dir.clone())], read)?;
        let bytes = std::fs::read(&index).unwrap();
        assert!(load(&index).is_some());
        std::fs::write(&index, &bytes[..bytes.len() - 1]).unwrap();
        assert!(load(&index).is_none(), "an index cut short is not trusted");
        let mut flipped = bytes.clone();
        *flipped.last_mut().unwrap() ^= 1;
        std::fs::write(&index, &flipped).unwrap();
        assert!(load(&index).is_none(), "nor one with a changed byte");
        assert_eq!(
            summaries(&index, &index.with_extension("reopened"), vec![(hash, dir.clone())], read)?
                .len(),
            3
        );
        std::fs::write(&index, "not json\n").unwrap();
        assert_eq!(
            summaries(&index, &index.with_extension("reopened"), vec![(hash, dir)], read)?.len(),
            3
        );
        Ok(())
    }
}
