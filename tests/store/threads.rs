//! `ThreadStore` and `ThreadWriter`: a thread's records written and read back, held by one
//! process at a time, listed, followed, reopened, moved to another version, removed.

use super::*;

contract! {
    /// A thread is stored as written: its start, steps (one at a time or a group), pause and
    /// end, read back the same; it is listed, named by a prefix, and its status follows.
    fn a_thread_reads_back_as_it_was_written(store: &Storage) -> Result<()> {
        let threads = store.threads();
        let start = start_record(hash(1));
        let (mut writer, record) = threads.create(&start, &[step("planner", "plan")], &[])?;
        let id = record.id();
        ensure!(record.start == start, "{:?}", record.start);
        ensure!(threads.read(id)?.status() == ThreadStatus::Running, "held: running");
        futures::executor::block_on(writer.append_steps(&[step("developer", "code ✓ <&>")]))?;
        writer.append_pause(Paused::by(PauseReason::Pause))?;
        drop(writer);
        let read = threads.read(id)?;
        ensure!(read.steps.len() == 2 && read.steps[1].content == "code ✓ <&>", "{read:?}");
        ensure!(read.steps[1].agent.as_deref() == Some("scripted"));
        ensure!(read.steps[1].duration_ms == Some(3));
        ensure!(read.status() == ThreadStatus::Paused, "{:?}", read.status());

        let (mut writer, reopened) = threads.open(id)?;
        ensure!(reopened.steps.len() == 2);
        let end = End::by_host(0, "done".into(), EndStatus::Completed);
        writer.append_end(&EndRecord { end, timestamp: 5 })?;
        drop(writer);
        let ended = threads.read(id)?;
        ensure!(ended.status() == ThreadStatus::Completed, "{:?}", ended.status());

        ensure!(threads.list()? == vec![id]);
        let text = id.to_string();
        ensure!(threads.resolve(&text[..8])? == id);
        let summaries = threads.summaries()?;
        ensure!(summaries.len() == 1 && summaries[0].steps == 2, "{summaries:?}");
        Ok(())
    }

    /// A listing shows each thread as its records say — every field of its summary: name,
    /// prompt, steps, tokens and cost, the role it waits on and since when, how it ended, the
    /// schedule that started it, who asked for it — when created, waiting and ended.
    fn a_listing_shows_each_thread_as_its_records_say(store: &Storage) -> Result<()> {
        let threads = store.threads();
        let mut start = start_record(hash(4));
        start.schedule = Some(ScheduledBy { name: "nightly".into(), firing: "k1".into() });
        let (writer, record) = threads.create(&start, &[step("planner", "plan")], &[])?;
        drop(writer);
        let id = record.id();
        let agrees = |stage: &str| -> Result<()> {
            let listed = threads.summaries()?.into_iter().find(|s| s.thread_id == id);
            let read = threads.read(id)?;
            let mut expected = read.summary();
            expected.status = read.status();
            ensure!(listed.as_ref() == Some(&expected), "{stage}: {listed:?}, not {expected:?}");
            Ok(())
        };
        agrees("created")?;
        let mut writer = reopen(store, id)?;
        futures::executor::block_on(writer.append_steps(&[step("developer", "code")]))?;
        let waiting = Paused { role: Some("review".into()), ..Paused::by(PauseReason::Waiting) };
        writer.append_pause(waiting)?;
        drop(writer);
        agrees("waiting")?;
        let mut writer = reopen(store, id)?;
        let end = End::by_host(3, "gave up".into(), EndStatus::Failed);
        writer.append_end(&EndRecord { end, timestamp: 9 })?;
        drop(writer);
        agrees("ended")?;
        let listed = threads.summaries()?;
        let summary = listed.iter().find(|s| s.thread_id == id).context("listed")?;
        ensure!(summary.tokens > 0 && summary.cost_usd.is_some() && summary.return_code == Some(3));
        ensure!(summary.schedule.as_deref() == Some("nightly"), "{summary:?}");
        ensure!(summary.started_by.as_deref() == Some("mcp token:ci (claude-code)"), "{summary:?}");
        Ok(())
    }

    /// A child workflow's thread keeps its parent link, the listing names its parent, and a
    /// parent's wait on it (the call, the child) reads back as it was written.
    fn a_child_keeps_its_parent_and_a_parent_its_wait(store: &Storage) -> Result<()> {
        let threads = store.threads();
        let (writer, parent) = threads.create(&start_record(hash(1)), &[], &[])?;
        drop(writer);
        let mut start = start_record(hash(2));
        start.parent = Some(ParentLink { thread_id: parent.id(), role: "review".into(), depth: 1 });
        let (writer, child) = threads.create(&start, &[], &[])?;
        drop(writer);
        ensure!(threads.read(child.id())?.start.parent == start.parent);
        let mut writer = reopen(store, parent.id())?;
        let call = PendingCall {
            step: 0,
            seq: 2,
            digest: "D1".into(),
            system_prompt: None,
            input: Some("{}".into()),
            child: Some(child.id()),
            tool: None,
        };
        writer.append_pause(Paused {
            role: Some("review".into()),
            call: Some(call.clone()),
            ..Paused::by(PauseReason::Waiting)
        })?;
        drop(writer);
        let waiting = threads.read(parent.id())?;
        ensure!(waiting.waited_child() == Some((child.id(), "review", &call)), "{waiting:?}");
        let summaries = threads.summaries()?;
        let of = |id| summaries.iter().find(|s| s.thread_id == id).map(|s| s.parent);
        ensure!(of(child.id()) == Some(Some(parent.id())), "{summaries:?}");
        ensure!(of(parent.id()) == Some(None), "{summaries:?}");
        Ok(())
    }

    /// One process at a time holds a thread: a second `open` is refused while the first
    /// holds it, and succeeds once it is let go.
    fn a_held_thread_is_refused_to_a_second_holder(store: &Storage) -> Result<()> {
        let id = new_thread(store, hash(1))?;
        let mut first = None;
        eventually("the new thread opens", || {
            first = store.threads().open(id).ok();
            Ok(first.is_some())
        })?;
        match store.threads().open(id) {
            Err(Error::ThreadBusy(busy)) => ensure!(busy == id.to_string()),
            other => anyhow::bail!("a second holder got {other:?}"),
        }
        drop(first);
        eventually("open once let go", || Ok(store.threads().open(id).is_ok()))?;
        Ok(())
    }

    /// A thread created at rest is held by nobody, at once: it reads as interrupted (what a
    /// thread whose creator died before handing it over is), and queued, a worker claims it
    /// without waiting for anyone to let it go.
    fn a_thread_created_at_rest_is_held_by_nobody(store: &Storage) -> Result<()> {
        let record = store.threads().create_at_rest(&start_record(hash(3)), &[], &[])?;
        let id = record.id();
        ensure!(!record.running, "{record:?}");
        let status = store.threads().read(id)?.status();
        ensure!(status == ThreadStatus::Interrupted, "{status:?}");
        let queue = store.queue();
        ensure!(queue.register(Scope::Bundle(hash(3)), 4)?);
        queue.enqueue(id, hash(3), &RunRequest::default())?;
        let claimed = queue.claim(Scope::Bundle(hash(3)), 4, &[], None)?;
        ensure!(claimed.len() == 1 && claimed[0].id == id, "{claimed:?}");
        let claimed = claimed.into_iter().next().unwrap();
        queue.release(id, claimed.ticket, Release::Settle)?;
        drop(claimed.writer);
        queue.unregister()?;
        Ok(())
    }

    /// Every store lists threads oldest first (by id, which orders by creation): listings,
    /// pages and cursors take the order as it comes.
    fn summaries_come_oldest_first(store: &Storage) -> Result<()> {
        // Created newest first, so that a store listing them as stored would list them wrong.
        let mut ids: Vec<ThreadId> = (0..6).map(|_| ThreadId::new()).collect();
        ids.sort_unstable_by(|a, b| b.cmp(a));
        for &id in &ids {
            let start = StartRecord { thread_id: id, ..start_record(hash(5)) };
            store.threads().create_at_rest(&start, &[], &[])?;
        }
        let listed: Vec<ThreadId> =
            store.threads().summaries()?.iter().map(|s| s.thread_id).collect();
        ids.reverse();
        ensure!(listed == ids, "{listed:?} against {ids:?}");
        Ok(())
    }

    /// What a follower reads: only the records after the last it saw, and whether the thread
    /// is held.
    fn changes_hold_only_what_came_after(store: &Storage) -> Result<()> {
        let threads = store.threads();
        let (mut writer, record) = threads.create(&start_record(hash(1)), &[], &[])?;
        let id = record.id();
        let all = threads.changes(id, -1)?.context("the thread")?;
        ensure!(all.held && all.lines.len() == 1, "{all:?}");
        let last = all.lines[0].0;
        futures::executor::block_on(writer.append_steps(&[step("planner", "plan")]))?;
        let after = threads.changes(id, last)?.context("the thread")?;
        ensure!(after.lines.len() == 1 && after.lines[0].1.contains("plan"), "{after:?}");
        let none = threads.changes(id, after.lines[0].0)?.context("the thread")?;
        ensure!(none.lines.is_empty(), "{none:?}");
        drop(writer);
        ensure!(!threads.changes(id, -1)?.context("the thread")?.held);
        ensure!(threads.changes(ThreadId::new(), -1)?.is_none());
        Ok(())
    }

    /// A removed thread is gone: not read, not listed, not resolved.
    fn a_removed_thread_is_gone(store: &Storage) -> Result<()> {
        let id = new_thread(store, hash(1))?;
        let kept = new_thread(store, hash(1))?;
        store.threads().remove(id)?;
        ensure!(matches!(store.threads().read(id), Err(Error::UnknownThread(_))));
        ensure!(store.threads().list()? == vec![kept]);
        ensure!(store.threads().resolve(&id.to_string()).is_ok(), "a whole id parses");
        store.threads().finish_removals()?;
        Ok(())
    }

    /// Pruning removes the threads it is given with all they hold, in one call, except one a
    /// process holds (it was taken up since it was listed) and one already gone.
    fn threads_are_removed_together_except_one_held(store: &Storage) -> Result<()> {
        let threads = store.threads();
        let ended: Vec<ThreadId> = (0..3).map(|_| new_thread(store, hash(1))).collect::<Result<_>>()?;
        let (held_writer, held) = threads.create(&start_record(hash(1)), &[step("planner", "p")], &[])?;
        let gone = new_thread(store, hash(1))?;
        threads.remove(gone)?;
        let mut asked = ended.clone();
        asked.extend([held.id(), gone]);
        // As sets: ids made in the same millisecond need not sort in the order they were made.
        let mut removed = threads.remove_ended(&asked)?;
        removed.sort();
        let mut expected = ended.clone();
        expected.sort();
        ensure!(removed == expected, "{removed:?} vs {expected:?}");
        ensure!(threads.list()? == vec![held.id()]);
        for id in &ended {
            ensure!(matches!(threads.read(*id), Err(Error::UnknownThread(_))));
        }
        drop(held_writer);
        Ok(())
    }

    /// A listing follows a thread reopened after its end (a retry): read before and after,
    /// it says what `read` says. (A home directory keeps ended threads' summaries in an
    /// index; at 4abdda5 it kept the failed one.)
    fn a_reopened_thread_is_listed_as_it_is_now(store: &Storage) -> Result<()> {
        use uncaged_workflow::store::upgrades::{Retry, RetryRecord};
        let threads = store.threads();
        let (mut writer, record) = threads.create(&start_record(hash(9)), &[], &[])?;
        let id = record.id();
        futures::executor::block_on(writer.append_steps(&[step("planner", "plan")]))?;
        let end = End::by_workflow(1, "failed".into());
        writer.append_end(&EndRecord { end: End { status: EndStatus::Failed, ..end }, timestamp: 5 })?;
        drop(writer);
        let listed = |store: &Storage| -> Result<(ThreadStatus, usize)> {
            let all = store.threads().summaries()?;
            let one = all.iter().find(|s| s.thread_id == id).context("listed")?;
            Ok((one.status, one.steps))
        };
        ensure!(listed(store)? == (ThreadStatus::Failed, 1));
        ensure!(listed(store)? == (ThreadStatus::Failed, 1), "as the listing keeps it");
        let mut writer = reopen(store, id)?;
        let retry = Retry { from_step: 1, reason: "failed".into(), steps: vec![] };
        writer.append_retry(&RetryRecord { retry, timestamp: 6 })?;
        futures::executor::block_on(writer.append_steps(&[step("developer", "again")]))?;
        drop(writer);
        eventually("let go", || Ok(!threads.read(id)?.running))?;
        ensure!(threads.read(id)?.status() == ThreadStatus::Interrupted);
        ensure!(listed(store)? == (ThreadStatus::Interrupted, 2), "{:?}", listed(store)?);
        let mut writer = reopen(store, id)?;
        let end = End::by_workflow(0, "done".into());
        writer.append_end(&EndRecord { end, timestamp: 7 })?;
        drop(writer);
        eventually("let go", || Ok(!threads.read(id)?.running))?;
        ensure!(listed(store)? == (ThreadStatus::Completed, 2));
        ensure!(listed(store)? == (ThreadStatus::Completed, 2), "as the listing keeps it");
        Ok(())
    }

    /// A follower hears each rest of a thread in the order of its records: a thread that
    /// waits, is answered and waits again between two looks is heard waiting twice (at
    /// 4abdda5, once: its status was the same at both looks), and a budget raised at rest is
    /// no rest.
    fn events_follow_the_records_not_samples_of_the_status(store: &Storage) -> Result<()> {
        use uncaged_workflow::run::events::Event;
        use uncaged_workflow::run::watch::ThreadEvents;
        let names = |events: Vec<Event>| -> Vec<String> {
            events
                .iter()
                .map(|e| match e {
                    Event::Step { index, .. } => format!("step {index}"),
                    Event::Waiting { role, .. } => format!("waiting {role}"),
                    Event::Paused { steps, .. } => format!("paused {steps}"),
                    Event::Ended { .. } => "ended".into(),
                    other => format!("{other:?}"),
                })
                .collect()
        };
        let waiting = || Paused { role: Some("reviewer".into()), ..Paused::by(PauseReason::Waiting) };
        let (mut writer, record) = store.threads().create(&start_record(hash(10)), &[], &[])?;
        let id = record.id();
        let mut events = ThreadEvents::new(store, id);
        futures::executor::block_on(writer.append_steps(&[step("planner", "p"), step("developer", "d")]))?;
        writer.append_pause(waiting())?;
        drop(writer);
        eventually("let go", || Ok(!store.threads().read(id)?.running))?;
        ensure!(names(events.poll()?) == ["step 1", "step 2", "waiting reviewer"]);
        // Answered, two steps, and waiting again, all between two looks.
        let mut writer = reopen(store, id)?;
        futures::executor::block_on(writer.append_steps(&[step("reviewer", "changes")]))?;
        futures::executor::block_on(writer.append_steps(&[step("developer", "again")]))?;
        writer.append_pause(waiting())?;
        drop(writer);
        eventually("let go", || Ok(!store.threads().read(id)?.running))?;
        let heard = names(events.poll()?);
        ensure!(heard == ["step 3", "step 4", "waiting reviewer"], "{heard:?}");
        ensure!(events.poll()?.is_empty(), "told once");
        // Paused, resumed and paused again between two looks; a budget raised at rest.
        let mut writer = reopen(store, id)?;
        writer.append_pause(Paused::by(PauseReason::Pause))?;
        futures::executor::block_on(writer.append_steps(&[step("reviewer", "ok")]))?;
        writer.append_pause(Paused::by(PauseReason::Pause))?;
        let raised = uncaged_workflow::store::records::Budget { max_tokens: Some(9), ..Default::default() };
        writer.append_pause(Paused { budget: Some(raised), ..Paused::by(PauseReason::Pause) })?;
        let heard = names(events.poll()?);
        ensure!(heard == ["paused 4", "step 5", "paused 5"], "{heard:?}");
        writer.append_end(&EndRecord { end: End::by_workflow(0, "done".into()), timestamp: 8 })?;
        drop(writer);
        ensure!(names(events.poll()?) == ["ended"]);
        // A follower that comes later hears the steps and the rest the thread is in.
        let late = names(ThreadEvents::new(store, id).poll()?);
        ensure!(late == ["step 1", "step 2", "step 3", "step 4", "step 5", "ended"], "{late:?}");
        Ok(())
    }

    /// A follower whose first look comes while the thread's worker still holds it after its
    /// rest was recorded (letting it go: a lease, a lock) hears that rest — at 9e65bc6 it read
    /// `running`, counted the rest as told and never told it; once a worker has taken the
    /// thread up again (its continuation marker), a new follower hears no rest that is over.
    fn a_rest_recorded_while_still_held_is_told_to_a_new_follower(store: &Storage) -> Result<()> {
        use uncaged_workflow::run::events::Event;
        use uncaged_workflow::run::watch::ThreadEvents;
        let rests = |events: Vec<Event>| -> Vec<String> {
            events
                .iter()
                .filter_map(|e| match e {
                    Event::Waiting { role, .. } => Some(format!("waiting {role}")),
                    Event::Paused { steps, .. } => Some(format!("paused {steps}")),
                    Event::Ended { .. } => Some("ended".into()),
                    _ => None,
                })
                .collect()
        };
        let waiting = Paused { role: Some("reviewer".into()), ..Paused::by(PauseReason::Waiting) };
        let (mut writer, record) = store.threads().create(&start_record(hash(13)), &[], &[])?;
        let id = record.id();
        futures::executor::block_on(writer.append_steps(&[step("planner", "p")]))?;
        writer.append_pause(waiting.clone())?;
        ensure!(store.threads().read(id)?.running, "still held by its writer");
        let first = rests(ThreadEvents::new(store, id).poll()?);
        ensure!(first == ["waiting reviewer"], "held at rest: {first:?}");
        drop(writer);
        eventually("let go", || Ok(!store.threads().read(id)?.running))?;

        // Taken up again: held, the rest over.
        let mut writer = reopen(store, id)?;
        writer.append_continued("worker 1")?;
        let record = store.threads().read(id)?;
        ensure!(record.running && !record.resting, "{record:?}");
        let mut after = ThreadEvents::new(store, id);
        let heard = rests(after.poll()?);
        ensure!(heard.is_empty(), "taken up again: {heard:?}");
        futures::executor::block_on(writer.append_steps(&[step("reviewer", "r")]))?;
        writer.append_pause(Paused::by(PauseReason::Pause))?;
        let heard = rests(after.poll()?);
        ensure!(heard == ["paused 2"], "the next rest, still held: {heard:?}");
        drop(writer);
        let late = rests(ThreadEvents::new(store, id).poll()?);
        ensure!(late == ["paused 2"], "{late:?}");
        Ok(())
    }

    /// A move to another version of the workflow is a record: the thread runs that version
    /// from then on, and keeps the one it started on (under which its records are kept).
    fn a_move_to_another_version_is_recorded(store: &Storage) -> Result<()> {
        use uncaged_workflow::store::upgrades::{Upgrade, UpgradeRecord};
        let threads = store.threads();
        let (mut writer, record) =
            threads.create(&start_record(hash(11)), &[step("planner", "p")], &[])?;
        let id = record.id();
        let upgrade = Upgrade { from: hash(11), to: hash(12), at_step: 1 };
        writer.append_upgrade(&UpgradeRecord { upgrade: upgrade.clone(), timestamp: 3 })?;
        drop(writer);
        let moved = threads.read(id)?;
        ensure!(moved.version() == hash(12) && moved.start.hash == hash(11), "{moved:?}");
        ensure!(moved.upgrades == vec![upgrade], "{:?}", moved.upgrades);
        ensure!(moved.steps.len() == 1);
        Ok(())
    }
}
