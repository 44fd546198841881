//! Firing schedules, exactly once: one pass fires everything due, under the home's firing
//! lock, so two processes (`serve`, `schedule tick`) never fire the same thing.
//!
//! A firing is appended to the schedule's log (and fsynced) with the id its thread will have
//! *before* the thread is created; then the thread is created with that id, handed to its
//! bundle's worker, and the firing marked started. A process killed anywhere in between leaves
//! a firing the next pass finishes — creating the thread if it does not exist, handing it over
//! if it never ran — and never a second thread: what is due is computed from the log (the last
//! cron instant fired, the poll items seen), not from the threads.

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;
use serde_json::json;

use super::poll;
use crate::clock::now_ms;
use crate::cron::CronTrigger;
use crate::error::{Error, Result};
use crate::faults::crash_point;
use crate::ids::ThreadId;
use crate::run::actions;
use crate::store::Storage;
use crate::store::records::ScheduledBy;
use crate::store::schedules::{
    DiffMode, FireLock, Firing, FiringEvent, FiringHistory, PollState, Schedule, Trigger,
};

/// The most threads one poll check starts; further new items start at the next checks.
pub const MAX_NEW_ITEMS_PER_CHECK: usize = 100;

/// A thread a pass started.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StartedThread {
    pub schedule: String,
    pub thread_id: ThreadId,
    /// What fired (`cron:…`, `item:…`, `change:…`).
    pub firing: String,
}

/// What one pass did.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Pass {
    pub started: Vec<StartedThread>,
    /// Schedules that could not fire or check, and why (one line each).
    pub errors: Vec<ScheduleError>,
    /// When something is next due, if anything is scheduled.
    pub next: Option<u64>,
}

/// A schedule that could not fire or check in a pass.
#[derive(Debug, Clone, Serialize)]
pub struct ScheduleError {
    pub schedule: String,
    /// Why, in one line.
    pub error: String,
}

impl Pass {
    fn due_at(&mut self, at: Option<u64>) {
        if let Some(at) = at {
            self.next = Some(self.next.map_or(at, |n| n.min(at)));
        }
    }
}

/// Fires schedules; keeps each schedule's log as read so far, so that a long-lived `serve`
/// reads only what was appended since its last pass, and the poll checks it has running.
#[derive(Debug)]
pub struct Firer {
    store: Storage,
    histories: Histories,
    /// Poll commands at work, each with the schedule it checks for.
    checks: tokio::task::JoinSet<(Schedule, Check)>,
    /// The schedules those are for: one check at a time per schedule.
    checking: std::collections::HashSet<String>,
    /// Checks that finished between passes, to record at the next.
    finished: Vec<CheckDone>,
}

/// A poll check's task, finished.
type CheckDone = std::result::Result<(Schedule, Check), tokio::task::JoinError>;

/// What a poll command printed, or why it failed.
type Check = std::result::Result<String, String>;

/// Schedules' firing histories as read so far, caught up with their logs at each use: a
/// long-lived process reads only what was appended since it last looked.
#[derive(Debug, Default)]
pub struct Histories {
    /// By schedule name: when it was created (a schedule removed and added again has a new
    /// log) and its history.
    read: HashMap<String, (u64, FiringHistory)>,
}

impl Histories {
    /// The history of `schedule`, caught up with its log.
    pub fn get(&mut self, store: &Storage, schedule: &Schedule) -> Result<&mut FiringHistory> {
        let entry = self.read.entry(schedule.name.clone()).or_default();
        if entry.0 != schedule.created {
            *entry = (schedule.created, FiringHistory::default());
        }
        store.schedules().catch_up(&schedule.name, &mut entry.1)?;
        Ok(&mut entry.1)
    }

    /// Forgets the schedules not in `list` (removed).
    pub fn keep_only(&mut self, list: &[Schedule]) {
        self.read.retain(|name, _| list.iter().any(|s| &s.name == name));
    }
}

impl Firer {
    pub fn new(store: Storage) -> Self {
        Firer {
            store,
            histories: Histories::default(),
            checks: tokio::task::JoinSet::new(),
            checking: Default::default(),
            finished: Vec::new(),
        }
    }

    /// Fires everything due now, once: finishes firings an earlier process left unfinished,
    /// fires due cron instants, records the poll checks that have finished and starts the
    /// ones due. Waits for the firing lock if another process holds it.
    ///
    /// Poll commands run in the background, without the lock: a slow command holds up
    /// neither the other schedules nor `schedule add`. What one printed is compared with what
    /// was seen under the lock, at a later pass, so two processes checking at once still
    /// fire an item once. [`Firer::pass_to_end`] waits for them instead.
    pub async fn pass(&mut self) -> Result<Pass> {
        let store = self.store.clone();
        let schedules = store.schedules();
        let mut pass = Pass::default();
        let lock = self.lock().await?;
        let mut finished = std::mem::take(&mut self.finished);
        while let Some(done) = self.checks.try_join_next() {
            finished.push(done);
        }
        for done in finished {
            self.record_done(done, &lock, &mut pass).await?;
        }
        let list = schedules.list()?;
        self.histories.keep_only(&list);
        for schedule in list {
            match self.fire_schedule(&schedule, &lock, &mut pass).await {
                Ok(true) if !self.checking.contains(&schedule.name) => {
                    self.checking.insert(schedule.name.clone());
                    self.checks.spawn(async move {
                        let check = run_check(&schedule).await;
                        (schedule, check)
                    });
                }
                Ok(_) => {}
                Err(e) => pass.errors.push(ScheduleError {
                    schedule: schedule.name.clone(),
                    error: crate::error::chain_line(&e),
                }),
            }
        }
        Ok(pass)
    }

    /// Resolves when a poll check at work finishes (never while none is): what it printed is
    /// for the next pass to record, which a long-lived process need not wait for.
    pub async fn check_finished(&mut self) {
        match self.checks.join_next().await {
            Some(done) => self.finished.push(done),
            None => std::future::pending().await,
        }
    }

    /// A pass, then the poll checks it started, waited for and recorded: what `schedule
    /// tick` does.
    pub async fn pass_to_end(&mut self) -> Result<Pass> {
        let mut pass = self.pass().await?;
        while let Some(done) = self.checks.join_next().await {
            let lock = self.lock().await?;
            self.record_done(done, &lock, &mut pass).await?;
        }
        Ok(pass)
    }

    /// Records a poll check that finished, unless its schedule was removed, replaced or
    /// paused while the command ran.
    async fn record_done(
        &mut self,
        done: CheckDone,
        lock: &FireLock,
        pass: &mut Pass,
    ) -> Result<()> {
        let (checked, check) =
            done.map_err(|e| Error::Host(format!("a poll check did not finish: {e}")))?;
        self.checking.remove(&checked.name);
        let Some(schedule) = self.store.schedules().get(&checked.name)? else { return Ok(()) };
        if schedule.created != checked.created || schedule.paused {
            return Ok(());
        }
        if let Err(e) = self.record_check(&schedule, check, lock, pass).await {
            pass.errors.push(ScheduleError {
                schedule: schedule.name.clone(),
                error: crate::error::chain_line(&e),
            });
        }
        Ok(())
    }

    /// Takes the firing lock (waiting in a blocking thread, not on the runtime).
    async fn lock(&self) -> Result<FireLock> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.schedules().lock())
            .await
            .map_err(|e| Error::Host(format!("the firing lock: {e}")))?
    }

    /// The history of `schedule`, caught up with its log.
    fn history(&mut self, schedule: &Schedule) -> Result<&mut FiringHistory> {
        self.histories.get(&self.store, schedule)
    }

    /// Finishes `schedule`'s pending firings and fires a due cron instant; returns whether
    /// it is a poll whose check is due.
    async fn fire_schedule(
        &mut self,
        schedule: &Schedule,
        lock: &FireLock,
        pass: &mut Pass,
    ) -> Result<bool> {
        // Firings recorded before a crash (or before a pause) are finished first.
        let pending: Vec<Firing> = self.history(schedule)?.pending().cloned().collect();
        for firing in pending {
            self.finish(schedule, &firing, lock, pass).await?;
        }
        if schedule.paused {
            return Ok(false);
        }
        let now = now_ms();
        match &schedule.trigger {
            Trigger::Cron { expression, timezone } => {
                let cron =
                    CronTrigger::parse(expression, timezone.as_deref()).map_err(Error::Usage)?;
                let after = schedule.since.max(self.history(schedule)?.last_instant.unwrap_or(0));
                if let Some(instant) = cron.due(after, now) {
                    let time = cron.format(instant);
                    let data = json!({"schedule": schedule.name, "time": time});
                    let event = fired(format!("cron:{time}"), Some(data), Some(instant), None);
                    self.fire(schedule, event, lock, pass).await?;
                }
                pass.due_at(cron.next_after(now));
                Ok(false)
            }
            Trigger::Poll { every_ms, .. } => {
                let state = self.store.schedules().poll_state(&schedule.name)?;
                let next = state.next_check(*every_ms, schedule.since);
                let due = now >= next;
                // Checked now if due: the next check is an interval (or a backoff) from now.
                let checked = PollState { last_check: Some(if due { now } else { next }), ..state };
                pass.due_at(Some(if due { checked.next_check(*every_ms, now) } else { next }));
                Ok(due)
            }
            // Fired by requests to `serve` (`serve::hooks`), never by a pass.
            Trigger::Webhook { .. } => Ok(false),
        }
    }

    /// Records a poll's check, and fires for what it shows that is new.
    async fn record_check(
        &mut self,
        schedule: &Schedule,
        check: Check,
        lock: &FireLock,
        pass: &mut Pass,
    ) -> Result<()> {
        let Trigger::Poll { diff, include_existing, .. } = &schedule.trigger else {
            return Ok(());
        };
        let outcome = match check {
            Ok(output) => {
                self.compare(schedule, *diff, *include_existing, &output, lock, pass).await
            }
            Err(e) => Err(Error::Usage(format!("poll command: {e}"))),
        };
        let failed = outcome.as_ref().err().map(|e| crate::error::chain_line(e));
        let failures = match &failed {
            Some(_) => {
                self.store.schedules().poll_state(&schedule.name)?.failures.saturating_add(1)
            }
            None => 0,
        };
        let state = PollState { last_check: Some(now_ms()), last_error: failed, failures };
        self.store.schedules().set_poll_state(&schedule.name, &state)?;
        outcome
    }

    /// Fires for what a poll's output shows that is new.
    async fn compare(
        &mut self,
        schedule: &Schedule,
        diff: DiffMode,
        include_existing: bool,
        output: &str,
        lock: &FireLock,
        pass: &mut Pass,
    ) -> Result<()> {
        let store = self.store.clone();
        let schedules = store.schedules();
        let history = self.history(schedule)?;
        let baseline = !history.checked && !include_existing;
        match diff {
            DiffMode::NewItems => {
                let items =
                    poll::items(output).map_err(|e| Error::Usage(format!("poll command: {e}")))?;
                if baseline {
                    let keys = items.into_iter().map(|(key, _)| key).collect();
                    let event = FiringEvent::Baseline { keys, output: None, at: now_ms() };
                    return schedules.record(&schedule.name, &event, lock);
                }
                let new: Vec<_> = items
                    .into_iter()
                    .filter(|(key, _)| !history.seen.contains(key))
                    .take(MAX_NEW_ITEMS_PER_CHECK)
                    .collect();
                for (key, item) in new {
                    self.fire(schedule, fired(key, Some(item), None, None), lock, pass).await?;
                }
            }
            DiffMode::AnyChange => {
                let digest = poll::digest(output);
                if baseline {
                    let event =
                        FiringEvent::Baseline { keys: vec![], output: Some(digest), at: now_ms() };
                    return schedules.record(&schedule.name, &event, lock);
                }
                if history.last_output.as_deref() != Some(digest.as_str()) {
                    let key = format!("change:{digest}@{}", now_ms());
                    let data = poll::change_data(output);
                    self.fire(schedule, fired(key, Some(data), None, Some(digest)), lock, pass)
                        .await?;
                }
            }
        }
        Ok(())
    }

    /// Records a firing, then starts its thread.
    async fn fire(
        &mut self,
        schedule: &Schedule,
        event: FiringEvent,
        lock: &FireLock,
        pass: &mut Pass,
    ) -> Result<()> {
        self.store.schedules().record(&schedule.name, &event, lock)?;
        crash_point("schedule-fired");
        let FiringEvent::Fired { thread_id, .. } = event else { unreachable!("a firing") };
        let firing = self
            .history(schedule)?
            .pending()
            .find(|f| f.thread_id == thread_id)
            .cloned()
            .expect("the firing just recorded is pending");
        self.finish(schedule, &firing, lock, pass).await
    }

    /// Makes a recorded firing's thread exist and run, once: creates it if it does not exist,
    /// hands it to a worker if it never ran, and marks the firing started (or failed, for a
    /// thread that cannot be created: the workflow was removed, an agent binding broke).
    async fn finish(
        &mut self,
        schedule: &Schedule,
        firing: &Firing,
        lock: &FireLock,
        pass: &mut Pass,
    ) -> Result<()> {
        let store = self.store.clone();
        let schedules = store.schedules();
        let id = firing.thread_id;
        let mut start = super::thread_request(schedule);
        start.trigger_data = firing.trigger_data.clone();
        start.origin.schedule =
            Some(ScheduledBy { name: schedule.name.clone(), firing: firing.key.clone() });
        // The one exactly-once start, the firing log being this ledger's keys.
        let hash = match actions::create_reserved(&self.store, start, None, id) {
            Ok(Some(hash)) => hash,
            // Handed over before the crash: it runs, or ran, on its own.
            Ok(None) => {
                let event = FiringEvent::Started { thread_id: id, at: now_ms() };
                return schedules.record(&schedule.name, &event, lock);
            }
            // The home could not be written: the firing stays pending, for the next pass.
            Err(e @ (Error::Io { .. } | Error::Host(_))) => return Err(e),
            Err(e) => {
                let error = crate::error::chain_line(&e);
                let event = FiringEvent::Failed { thread_id: id, at: now_ms(), error };
                schedules.record(&schedule.name, &event, lock)?;
                return Err(e);
            }
        };
        crash_point("schedule-created");
        // A worker that cannot be reached leaves the firing pending: the next pass hands the
        // thread over again.
        actions::hand_over_reserved(&self.store, id, hash).await?;
        let event = FiringEvent::Started { thread_id: id, at: now_ms() };
        schedules.record(&schedule.name, &event, lock)?;
        pass.started.push(StartedThread {
            schedule: schedule.name.clone(),
            thread_id: id,
            firing: firing.key.clone(),
        });
        Ok(())
    }
}

/// Runs a poll schedule's command (without the firing lock).
async fn run_check(schedule: &Schedule) -> Check {
    let Trigger::Poll { command, every_ms, .. } = &schedule.trigger else {
        return Err("not a poll".into());
    };
    // A check may take its interval, but not under 10 s, nor over a minute.
    let timeout =
        poll::DEFAULT_TIMEOUT.min(Duration::from_millis(*every_ms).max(Duration::from_secs(10)));
    poll::check(command, schedule.request.cwd.as_deref(), timeout).await
}

fn fired(
    key: String,
    trigger_data: Option<serde_json::Value>,
    instant: Option<u64>,
    output: Option<String>,
) -> FiringEvent {
    FiringEvent::Fired {
        key,
        thread_id: ThreadId::new(),
        at: now_ms(),
        trigger_data,
        instant,
        output,
    }
}
