//! `ScheduleBackend` and `LockHolder`: schedules, their firing logs and poll states, kept
//! under the firing lock.

use super::*;
use uncaged_workflow::store::schedules::FireLock;

contract! {
    /// Schedules: written, read back, listed; their firing log appended and read again
    /// (whole, or caught up from where it was read); their poll state kept; removed whole.
    fn a_schedule_and_its_firings_are_kept(store: &Storage) -> Result<()> {
        let schedules = store.schedules();
        let schedule = Schedule {
            name: "nightly".into(),
            workflow: "solve-issue".into(),
            trigger: Trigger::Cron { expression: "0 3 * * *".into(), timezone: None },
            prompt: "tidy up".into(),
            request: RunRequest {
                max_rounds: Some(4),
                budget: uncaged_workflow::spending::Budget {
                    max_agent_calls: Some(3),
                    ..Default::default()
                },
                ..Default::default()
            },
            paused: false,
            created: 10,
            since: 10,
            source: ScheduleSource::Cli,
        };
        let lock = schedules.lock()?;
        schedules.put(&schedule, &lock)?;
        ensure!(schedules.get("nightly")?.as_ref() == Some(&schedule));
        ensure!(schedules.list()?.len() == 1);

        let thread = ThreadId::new();
        let fired = FiringEvent::Fired {
            key: "cron:20".into(),
            thread_id: thread,
            at: 20,
            trigger_data: None,
            instant: Some(20),
            output: None,
        };
        schedules.record("nightly", &fired, &lock)?;
        let mut history = schedules.history("nightly")?;
        ensure!(history.firings.len() == 1 && history.pending().count() == 1);
        ensure!(history.last_instant == Some(20));
        schedules.record("nightly", &FiringEvent::Started { thread_id: thread, at: 21 }, &lock)?;
        schedules.catch_up("nightly", &mut history)?;
        ensure!(history.firings.len() == 1 && history.pending().count() == 0, "{history:?}");

        let state = PollState { last_check: Some(30), last_error: Some("exit 1".into()), failures: 2 };
        schedules.set_poll_state("nightly", &state)?;
        ensure!(schedules.poll_state("nightly")? == state);

        ensure!(schedules.remove("nightly", &lock)?);
        ensure!(schedules.get("nightly")?.is_none() && schedules.list()?.is_empty());
        ensure!(schedules.history("nightly")?.firings.is_empty(), "its log went with it");
        ensure!(!schedules.remove("nightly", &lock)?);
        Ok(())
    }

    /// The firing lock is held until it is let go: a database's holder says it is not lost
    /// while its connection lives; a home's is an `flock`.
    fn the_firing_lock_is_held_until_let_go(store: &Storage) -> Result<()> {
        let lock = store.schedules().lock()?;
        match &lock {
            FireLock::Database { holder, .. } => ensure!(!holder.lost()),
            FireLock::File(_) => ensure!(store.url().is_none()),
        }
        drop(lock);
        drop(store.schedules().lock()?);
        Ok(())
    }
}
