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

use serde::{Deserialize, Serialize};

use crate::error::Result;
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
    /// delivery, with the request's body as `$trigger_data`, or what `map` picks out of it.
    #[serde(rename_all = "camelCase")]
    Webhook {
        /// The environment variable of `serve` that holds the signing secret.
        secret_env: String,
        /// The thread's data, field by field: each field's value is what a JSON Pointer
        /// finds in the delivery's body (a field it finds nothing for is left out). Empty:
        /// the body itself is the data. See [`crate::data_map`].
        #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
        map: std::collections::BTreeMap<String, String>,
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

    /// Notes the log as read up to `position` (past lines that hold no event).
    pub(crate) fn skip_to(&mut self, position: u64) {
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

/// Schedule names are folder names and CLI arguments: as simple as workflow names.
pub fn validate_name(name: &str) -> Result<()> {
    crate::ids::validate_name("schedule name", name)
}
