//! Schedules as a store keeps them: each schedule's definition, the log of its firings (the
//! record that makes firing exactly-once), a poll schedule's last check, and the lock that
//! lets one process fire at a time — in the home directory ([`FileSchedules`]) or in the
//! database ([`PgSchedules`](crate::store::postgres::schedules::PgSchedules)), behind
//! [`ScheduleBackend`].
//!
//! In a home, `schedules/<NAME>/schedule.json` is replaced atomically and
//! `schedules/<NAME>/firings.jsonl` is append-only and fsynced; it is the truth about what
//! fired: a firing is appended before its thread is created, and the thread is created with
//! the id the firing names, so a process killed anywhere in between leaves a firing that the
//! next pass finishes, never a second thread.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::durable::{self, AppendFile};
use crate::error::{Error, Result};
use crate::home::Home;
use crate::ids::ThreadId;
use crate::run_request::RunRequest;

/// A schedule: when to start a thread of which workflow, and with what.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Schedule {
    pub name: String,
    /// The workflow (by name: each firing runs its current version).
    pub workflow: String,
    pub trigger: Trigger,
    /// The prompt of each thread it starts.
    pub prompt: String,
    /// What each thread it starts is asked to do (its directory is also where the poll
    /// command runs: where the schedule was added from).
    #[serde(flatten)]
    pub request: RunRequest,
    #[serde(default)]
    pub paused: bool,
    /// When it was added.
    pub created: u64,
    /// Nothing before this instant fires: when it was added, or last resumed (a paused
    /// schedule does not catch up on resume).
    pub since: u64,
    /// Who made it.
    pub source: ScheduleSource,
}

/// What fires a schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum Trigger {
    /// At each instant a cron expression names, in a time zone.
    Cron {
        expression: String,
        /// An IANA zone (`Europe/Paris`); UTC if absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timezone: Option<String>,
    },
    /// When a command's output shows something new.
    #[serde(rename_all = "camelCase")]
    Poll {
        /// The program and its arguments (never run through a shell).
        command: Vec<String>,
        /// How often it runs, in milliseconds.
        every_ms: u64,
        diff: DiffMode,
        /// Fire for what the first check finds too (by default it is the baseline).
        #[serde(default)]
        include_existing: bool,
    },
    /// When a signed request reaches `POST /hooks/<workflow>` on `serve`: one thread per
    /// delivery, with the request's body as `$trigger_data`.
    #[serde(rename_all = "camelCase")]
    Webhook {
        /// The environment variable of `serve` that holds the signing secret.
        secret_env: String,
    },
}

/// How a poll's output is compared with what was seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DiffMode {
    /// The output is a JSON array; each item not seen before starts a thread.
    NewItems,
    /// Any output different from the last starts a thread.
    AnyChange,
}

impl DiffMode {
    pub fn as_str(self) -> &'static str {
        match self {
            DiffMode::NewItems => "new-items",
            DiffMode::AnyChange => "any-change",
        }
    }
}

/// Who made a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScheduleSource {
    /// `schedule add`.
    Cli,
    /// The `trigger:` of a declarative workflow, registered by `add`.
    Workflow,
}

/// One line of a schedule's firing log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FiringEvent {
    /// A thread is to start: recorded (and fsynced) before the thread is created.
    #[serde(rename_all = "camelCase")]
    Fired {
        /// What fired, unique in the schedule: `cron:<instant>`, `item:<key>`,
        /// `change:<digest>@<time>`.
        key: String,
        thread_id: ThreadId,
        at: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        trigger_data: Option<serde_json::Value>,
        /// For a cron firing: the instant, in ms since the epoch.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        instant: Option<u64>,
        /// For an `any-change` poll: the digest of the output that fired.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<String>,
    },
    /// The fired thread was created and handed to a worker.
    #[serde(rename_all = "camelCase")]
    Started { thread_id: ThreadId, at: u64 },
    /// The fired thread could not be created (the workflow was removed, a binding broke);
    /// it is not tried again.
    #[serde(rename_all = "camelCase")]
    Failed { thread_id: ThreadId, at: u64, error: String },
    /// What a poll's first check saw, taken as already seen.
    #[serde(rename_all = "camelCase")]
    Baseline {
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        keys: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<String>,
        at: u64,
    },
}

/// A firing as the log tells it.
#[derive(Debug, Clone, PartialEq)]
pub struct Firing {
    pub key: String,
    pub thread_id: ThreadId,
    pub at: u64,
    pub trigger_data: Option<serde_json::Value>,
    pub state: FiringState,
}

/// Where a firing is.
#[derive(Debug, Clone, PartialEq)]
pub enum FiringState {
    /// Recorded; its thread may not exist yet, or not have been handed to a worker.
    Pending,
    Started,
    Failed(String),
}

/// A schedule's firing log, read: what has fired, what is unfinished, and the marks the
/// next firing is computed from.
#[derive(Debug, Clone, Default)]
pub struct FiringHistory {
    /// Every firing, oldest first.
    pub firings: Vec<Firing>,
    /// Keys that fired or are in a baseline: a poll item with one of these is not new.
    pub seen: BTreeSet<String>,
    /// The last cron instant fired.
    pub last_instant: Option<u64>,
    /// The digest of the output last fired on or taken as baseline (`any-change`).
    pub last_output: Option<String>,
    /// Whether a poll's first check has happened (a baseline or a firing).
    pub checked: bool,
    /// How far the log was read (bytes of a file, the last row of a table): a later read
    /// continues from here.
    read_to: u64,
    index: BTreeMap<ThreadId, usize>,
}

impl FiringHistory {
    /// Firings whose threads are not known to be started.
    pub fn pending(&self) -> impl Iterator<Item = &Firing> {
        self.firings.iter().filter(|f| f.state == FiringState::Pending)
    }

    /// The time of the last firing.
    pub fn last_fired(&self) -> Option<u64> {
        self.firings.last().map(|f| f.at)
    }

    /// How far the log was read.
    pub(crate) fn position(&self) -> u64 {
        self.read_to
    }

    /// Applies the event found at `position` of the log.
    pub(crate) fn apply_at(&mut self, event: FiringEvent, position: u64) {
        self.apply(event);
        self.read_to = position;
    }

    fn apply(&mut self, event: FiringEvent) {
        match event {
            FiringEvent::Fired { key, thread_id, at, trigger_data, instant, output } => {
                self.seen.insert(key.clone());
                if let Some(instant) = instant {
                    self.last_instant = Some(self.last_instant.map_or(instant, |l| l.max(instant)));
                }
                if output.is_some() {
                    self.last_output = output;
                }
                self.checked = true;
                self.index.insert(thread_id, self.firings.len());
                self.firings.push(Firing {
                    key,
                    thread_id,
                    at,
                    trigger_data,
                    state: FiringState::Pending,
                });
            }
            FiringEvent::Started { thread_id, .. } => self.set(thread_id, FiringState::Started),
            FiringEvent::Failed { thread_id, error, .. } => {
                self.set(thread_id, FiringState::Failed(error))
            }
            FiringEvent::Baseline { keys, output, .. } => {
                self.seen.extend(keys);
                if output.is_some() {
                    self.last_output = output;
                }
                self.checked = true;
            }
        }
    }

    fn set(&mut self, thread_id: ThreadId, state: FiringState) {
        if let Some(&i) = self.index.get(&thread_id) {
            self.firings[i].state = state;
        }
    }

    /// Reads what was appended to the log file at `path` since the last read (all of it the
    /// first time). A torn last line (a crash mid-append) is left for the next read, which
    /// finds it terminated by the next append and skips it.
    fn catch_up_file(&mut self, path: &Path) -> Result<()> {
        let mut file = match File::open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::io("open the firing log", path)(e)),
        };
        let len = file.metadata().map_err(Error::io("read the firing log", path))?.len();
        if len < self.read_to {
            // The log was replaced (the schedule removed and added again): start over.
            *self = FiringHistory::default();
        }
        if len == self.read_to {
            return Ok(());
        }
        file.seek(SeekFrom::Start(self.read_to)).map_err(Error::io("read the firing log", path))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(Error::io("read the firing log", path))?;
        let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        for line in bytes[..complete].split(|&b| b == b'\n') {
            if line.is_empty() {
                continue;
            }
            match serde_json::from_slice::<FiringEvent>(line) {
                Ok(event) => self.apply(event),
                // A torn line, terminated by a later append: nothing was promised for it.
                Err(e) => tracing::warn!("{}: skipped a damaged line: {e}", path.display()),
            }
        }
        self.read_to += complete as u64;
        Ok(())
    }
}

/// A poll schedule's last check: when it ran, and how it failed if it did. Not part of the
/// exactly-once record (a crash that loses it only makes the next check come sooner).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PollState {
    pub last_check: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Checks that failed in a row since the last that worked: each doubles the wait before
    /// the next (see [`PollState::next_check`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failures: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The longest a failing poll waits between checks (unless its own interval is longer).
const MAX_BACKOFF_MS: u64 = 60 * 60 * 1000;

impl PollState {
    /// When the next check of a poll checked every `every_ms` is due: an interval after the
    /// last check, the interval doubled for each failure in a row (up to an hour, or the
    /// interval if longer), so that a broken command is not run, and reported, without end.
    /// A poll never checked is due at `since` (when the schedule began). The instant stays
    /// put while a check runs or is overdue: it is a time, not "now".
    pub fn next_check(&self, every_ms: u64, since: u64) -> u64 {
        let Some(last) = self.last_check else { return since };
        let backoff = every_ms.saturating_mul(1 << self.failures.min(16));
        last.saturating_add(backoff.min(MAX_BACKOFF_MS.max(every_ms)))
    }
}

/// Where schedules are kept: the home directory, or the database.
pub trait ScheduleBackend: Send + Sync + fmt::Debug {
    /// Takes the lock that one process at a time (on any machine sharing the store) holds to
    /// fire or change schedules, waiting for it.
    fn lock(&self) -> Result<FireLock>;
    /// Every schedule, by name. One that cannot be read is reported and left out.
    fn list(&self) -> Result<Vec<Schedule>>;
    /// The schedule `name`, if there is one.
    fn get(&self, name: &str) -> Result<Option<Schedule>>;
    /// Writes `schedule` (new or changed), under `lock`.
    fn put(&self, schedule: &Schedule, lock: &FireLock) -> Result<()>;
    /// Deletes schedule `name` with its firing log and poll state, under `lock`.
    fn remove(&self, name: &str, lock: &FireLock) -> Result<bool>;
    /// Appends `event` to the firing log of `name`, durably, under `lock`.
    fn record(&self, name: &str, event: &FiringEvent, lock: &FireLock) -> Result<()>;
    /// Applies what was appended to the firing log of `name` since `history` last read it.
    fn catch_up(&self, name: &str, history: &mut FiringHistory) -> Result<()>;
    /// The firing history of `name`, read whole.
    fn history(&self, name: &str) -> Result<FiringHistory> {
        let mut history = FiringHistory::default();
        self.catch_up(name, &mut history)?;
        Ok(history)
    }
    /// The last check of poll schedule `name`.
    fn poll_state(&self, name: &str) -> Result<PollState>;
    /// Records the last check of poll schedule `name`.
    fn set_poll_state(&self, name: &str, state: &PollState) -> Result<()>;
}

/// The lock held while firing or changing schedules; released when dropped (or when its
/// process dies).
#[derive(Debug)]
pub enum FireLock {
    /// An `flock` on `schedules/fire.lock` in the home.
    File(File),
    /// A transaction-scoped advisory lock, held by an open transaction on a connection of
    /// its own (`holder`, rolled back when dropped), and the generation every write under it
    /// is fenced by.
    Database { holder: Box<dyn LockHolder>, generation: i64 },
}

/// What holds a database's firing lock; dropping it releases the lock.
pub trait LockHolder: Send + Sync + fmt::Debug {
    /// Whether the lock was lost with the connection that held it.
    fn lost(&self) -> bool;
}

/// The schedules of a store, whichever keeps them.
pub type Schedules = Arc<dyn ScheduleBackend>;

/// The schedules of `home`.
pub fn in_home(home: &Home) -> Schedules {
    Arc::new(FileSchedules { dir: home.schedules_dir() })
}

/// Schedules in a home: `schedules/<NAME>/{schedule.json, firings.jsonl, poll.json}`.
#[derive(Debug)]
struct FileSchedules {
    dir: PathBuf,
}

impl FileSchedules {
    fn schedule_dir(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn definition_file(&self, name: &str) -> PathBuf {
        self.schedule_dir(name).join("schedule.json")
    }

    fn firings_file(&self, name: &str) -> PathBuf {
        self.schedule_dir(name).join("firings.jsonl")
    }

    fn poll_file(&self, name: &str) -> PathBuf {
        self.schedule_dir(name).join("poll.json")
    }
}

impl ScheduleBackend for FileSchedules {
    /// An `flock`: a process that dies holding it releases it.
    fn lock(&self) -> Result<FireLock> {
        durable::create_dir(&self.dir)?;
        let path = self.dir.join("fire.lock");
        let file = durable::open_private(
            std::fs::OpenOptions::new().create(true).truncate(false).write(true),
            &path,
        )
        .map_err(Error::io("open", &path))?;
        file.lock().map_err(Error::io("lock", &path))?;
        Ok(FireLock::File(file))
    }

    fn list(&self) -> Result<Vec<Schedule>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(Error::io("list", &self.dir)(e)),
        };
        let mut names: Vec<String> = entries
            .flatten()
            .filter(|e| e.path().is_dir())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        let mut schedules = Vec::new();
        for name in names {
            match self.get(&name) {
                Ok(Some(schedule)) => schedules.push(schedule),
                Ok(None) => {}
                Err(e) => tracing::warn!("schedule `{name}` left out: {e}"),
            }
        }
        Ok(schedules)
    }

    fn get(&self, name: &str) -> Result<Option<Schedule>> {
        let path = self.definition_file(name);
        let Some(text) = durable::read_text(&path, "read")? else { return Ok(None) };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| Error::Corrupt { path, reason: e.to_string() })
    }

    fn put(&self, schedule: &Schedule, _lock: &FireLock) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(schedule).expect("schedules serialize");
        durable::write_atomic(&self.definition_file(&schedule.name), &bytes)
    }

    fn remove(&self, name: &str, _lock: &FireLock) -> Result<bool> {
        let dir = self.schedule_dir(name);
        if !self.definition_file(name).exists() {
            return Ok(false);
        }
        // The definition goes first: a crash after it leaves a folder no listing shows, and
        // adding the name again starts a new log.
        std::fs::remove_file(self.definition_file(name))
            .map_err(Error::io("remove", self.definition_file(name)))?;
        std::fs::remove_dir_all(&dir).map_err(Error::io("remove", &dir))?;
        Ok(true)
    }

    fn record(&self, name: &str, event: &FiringEvent, _lock: &FireLock) -> Result<()> {
        let path = self.firings_file(name);
        let mut file = AppendFile::open(&path, true)?;
        let line = serde_json::to_vec(event).expect("firing events serialize");
        file.append(&line).map_err(Error::io("append to", &path))
    }

    fn catch_up(&self, name: &str, history: &mut FiringHistory) -> Result<()> {
        history.catch_up_file(&self.firings_file(name))
    }

    fn poll_state(&self, name: &str) -> Result<PollState> {
        let path = self.poll_file(name);
        match durable::read_text(&path, "read")? {
            None => Ok(PollState::default()),
            // Damaged: as if never checked (the firing log, not this, says what was seen).
            Some(text) => Ok(serde_json::from_str(&text).unwrap_or_default()),
        }
    }

    fn set_poll_state(&self, name: &str, state: &PollState) -> Result<()> {
        let bytes = serde_json::to_vec(state).expect("poll states serialize");
        durable::write_atomic(&self.poll_file(name), &bytes)
    }
}

/// Schedule names are folder names and CLI arguments: as simple as workflow names.
pub fn validate_name(name: &str) -> Result<()> {
    crate::ids::validate_name("schedule name", name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_is_read_incrementally_and_a_torn_line_waits() -> Result<()> {
        let dir = tempfile::tempdir().unwrap();
        let schedules = in_home(&Home::new(dir.path()));
        let lock = schedules.lock()?;
        std::fs::create_dir(dir.path().join("schedules/s")).unwrap();
        let id = ThreadId::new();
        let fired = FiringEvent::Fired {
            key: "cron:1000".into(),
            thread_id: id,
            at: 5,
            trigger_data: None,
            instant: Some(1000),
            output: None,
        };
        schedules.record("s", &fired, &lock)?;
        let mut history = FiringHistory::default();
        schedules.catch_up("s", &mut history)?;
        assert_eq!(history.pending().count(), 1);
        assert_eq!(history.last_instant, Some(1000));
        // A torn append: not read, and the next append terminates it.
        let path = dir.path().join("schedules/s/firings.jsonl");
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, b"{\"started\":{\"thr"))
            .unwrap();
        schedules.catch_up("s", &mut history)?;
        assert_eq!(history.pending().count(), 1);
        schedules.record("s", &FiringEvent::Started { thread_id: id, at: 6 }, &lock)?;
        schedules.catch_up("s", &mut history)?;
        assert_eq!(history.pending().count(), 0);
        assert_eq!(history.firings[0].state, FiringState::Started);
        // The same as reading it whole.
        let whole = schedules.history("s")?;
        assert_eq!(whole.firings, history.firings);
        Ok(())
    }
}
