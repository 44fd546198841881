//! `WorkQueue`: threads handed to one worker each, requests that reach the worker holding a
//! thread, and what the workers say of themselves — on a home directory (a worker per bundle,
//! reached over its socket) and on a database (pools under leases) alike, where the two differ
//! by what [`WorkQueue::workers`] says.

use super::*;
use uncaged_workflow::store::queue::{Activity, Workers};

contract! {
    /// The queue: a thread queued is claimed once, by a worker of its scope, with its run
    /// request; kill and pause reach the worker holding it, once each; settled, it leaves
    /// the queue; handed back, it is claimed again.
    fn the_queue_hands_each_thread_to_one_worker(store: &Storage) -> Result<()> {
        let queue = store.queue();
        ensure!(queue.register(Scope::Bundle(hash(1)), 4)?);
        let id = new_thread(store, hash(1))?;
        let request = RunRequest {
            agent: Some(AgentSpec::Scripted { answers: Some("answers.yaml".into()) }),
            agent_for: BTreeMap::from([("reviewer".into(), AgentSpec::Human)]),
            cwd: Some("/work".into()),
            ..Default::default()
        };
        queue.enqueue(id, hash(1), &request)?;
        ensure!(!queue.is_taken(id)?, "queued, not taken");
        ensure!(!queue.ask(id, ControlRequest::Kill)?, "no worker holds a queued thread");
        ensure!(queue.claim(Scope::Bundle(hash(2)), 4, &[], None)?.is_empty(), "another bundle's");

        let mut claimed = queue.claim(Scope::Bundle(hash(1)), 4, &[], None)?;
        ensure!(claimed.len() == 1, "{claimed:?}");
        let first = claimed.remove(0);
        ensure!(first.id == id && first.request == request, "{first:?}");
        ensure!(queue.is_taken(id)?);
        ensure!(queue.claim(Scope::Bundle(hash(1)), 4, &[], None)?.is_empty(), "claimed twice");
        ensure!(store.threads().read(id)?.status() == ThreadStatus::Running);

        ensure!(queue.ask(id, ControlRequest::Pause)?, "its worker holds it");
        ensure!(queue.requests(&[id])? == vec![(id, ControlRequest::Pause)]);
        ensure!(queue.requests(&[id])?.is_empty(), "a request is taken once");

        queue.release(id, first.ticket, Release::HandBack)?;
        drop(first.writer);
        let mut again = vec![];
        eventually("the handed-back thread is claimed", || {
            again = queue.claim(Scope::Bundle(hash(1)), 4, &[], None)?;
            Ok(!again.is_empty())
        })?;
        ensure!(again.len() == 1 && again[0].id == id, "handed back: {again:?}");
        let again = again.into_iter().next().unwrap();
        queue.release(id, again.ticket, Release::Settle)?;
        drop(again.writer);
        ensure!(queue.claim(Scope::Bundle(hash(1)), 4, &[], None)?.is_empty(), "settled");
        ensure!(queue.is_taken(id)?, "run already");
        queue.unregister()?;
        Ok(())
    }

    /// A lease a live worker holds is no one else's business; one whose worker is gone (it
    /// left the list of workers, or stopped beating) is told to the other workers until it
    /// runs out, so that an idle on-demand worker stays to take it over. A home directory has
    /// no leases: its locks die with their process.
    fn a_dead_workers_lease_is_told_until_it_runs_out(store: &Storage) -> Result<()> {
        let (queue, other) = (store.queue(), another_handle(store)?);
        queue.register(Scope::Any, 4)?;
        let start = start_record(hash(1));
        queue.create_queued(&start, &RunRequest::default())?;
        let claimed = queue.claim(Scope::Any, 4, &[], Some(start.thread_id))?;
        ensure!(claimed.len() == 1, "{claimed:?}");
        ensure!(other.queue().orphaned_until()?.is_none(), "its worker is alive");
        // Gone from the list of workers, its lease still held.
        queue.unregister()?;
        let left = other.queue().orphaned_until()?;
        match queue.hold() {
            Some(lease) => ensure!(
                left.is_some_and(|left| left <= lease),
                "a dead worker's lease of {lease:?}: {left:?}"
            ),
            None => ensure!(left.is_none(), "no leases: {left:?}"),
        }
        ensure!(queue.orphaned_until()?.is_none(), "its own leases are not another's");
        drop(claimed);
        Ok(())
    }

    /// A thread queued and not yet taken reads as queued wherever it is read — `read`, the
    /// listing, `changes` — on every store (at 9e65bc6 a home directory's `read` and listing
    /// said `interrupted`), and so after it is handed back; it reads as running while a worker
    /// holds it. (On a home directory, while the process that queued it lives: see
    /// `store::files::queue_entry`.)
    fn a_queued_thread_reads_as_queued_everywhere(store: &Storage) -> Result<()> {
        let queue = store.queue();
        queue.register(Scope::Bundle(hash(1)), 4)?;
        let agree = |id: ThreadId, status: ThreadStatus, what: &str| -> Result<()> {
            let read = store.threads().read(id)?.status();
            let listed = store.threads().summaries()?.into_iter().find(|s| s.thread_id == id);
            let listed = listed.context("listed")?.status;
            let changes = store.threads().changes(id, -1)?.context("its changes")?;
            let queued = status == ThreadStatus::Queued;
            ensure!(
                read == status && listed == status && changes.queued == queued,
                "{what}: read {read:?}, listed {listed:?}, changes queued {} (want {status:?})",
                changes.queued
            );
            Ok(())
        };
        let created = start_record(hash(1));
        queue.create_queued(&created, &RunRequest::default())?;
        agree(created.thread_id, ThreadStatus::Queued, "created queued")?;

        let at_rest = new_thread(store, hash(1))?;
        queue.enqueue(at_rest, hash(1), &RunRequest::default())?;
        agree(at_rest, ThreadStatus::Queued, "queued after its creation")?;

        let claimed = queue.claim(Scope::Bundle(hash(1)), 4, &[], Some(at_rest))?;
        let claimed = claimed.into_iter().next().context("claimed")?;
        agree(at_rest, ThreadStatus::Running, "taken")?;
        queue.release(at_rest, claimed.ticket, Release::HandBack)?;
        drop(claimed.writer);
        eventually("the handed-back thread is let go", || {
            Ok(!store.threads().read(at_rest)?.running)
        })?;
        agree(at_rest, ThreadStatus::Queued, "handed back")?;
        queue.unregister()?;
        Ok(())
    }

    /// A start created queued is handed over by the process that queued it while it lives:
    /// no orphan, on any store, nor is a thread queued again by a command (`resume`). (One whose
    /// process died first is, on a home directory: the CLI's `a_start_whose_server_died_…`
    /// crashes a `serve` there; a database's workers claim it and report none.)
    fn a_start_queued_by_a_live_process_is_no_orphan(store: &Storage) -> Result<()> {
        let queue = store.queue();
        let start = start_record(hash(3));
        queue.create_queued(&start, &RunRequest::default())?;
        let again = new_thread(store, hash(3))?;
        queue.enqueue(again, hash(3), &RunRequest::default())?;
        let orphans = queue.orphaned_starts()?;
        ensure!(
            !orphans.iter().any(|(id, _)| *id == start.thread_id || *id == again),
            "{orphans:?}"
        );
        queue.withdraw(start.thread_id)?;
        queue.withdraw(again)?;
        Ok(())
    }

    /// A thread created queued is there whole, at rest with no steps, and queued with its
    /// request: claimed once, as a thread queued after its creation is; the same id again is
    /// refused and leaves the first as it was.
    fn a_thread_created_queued_is_claimed_once_with_its_request(store: &Storage) -> Result<()> {
        let queue = store.queue();
        queue.register(Scope::Bundle(hash(1)), 4)?;
        let start = start_record(hash(1));
        let id = start.thread_id;
        let request = RunRequest { cwd: Some("/work".into()), ..Default::default() };
        let created = queue.create_queued(&start, &request)?;
        ensure!(created.id() == id && created.steps.is_empty() && created.queued, "{created:?}");
        let read = store.threads().read(id)?;
        ensure!(read.start == start && read.steps.is_empty() && !read.running, "{read:?}");
        let changes = store.threads().changes(id, -1)?.context("its changes")?;
        ensure!(changes.queued && !changes.held && changes.lines.len() == 1, "{changes:?}");
        ensure!(!queue.is_taken(id)?, "queued, not taken");
        ensure!(queue.create_queued(&start, &request).is_err(), "created twice");
        let claimed = queue.claim(Scope::Bundle(hash(1)), 4, &[], None)?;
        ensure!(claimed.len() == 1 && claimed[0].id == id && claimed[0].request == request, "{claimed:?}");
        ensure!(queue.claim(Scope::Bundle(hash(1)), 4, &[], None)?.is_empty(), "claimed twice");
        ensure!(store.threads().read(id)?.status() == ThreadStatus::Running);
        queue.unregister()?;
        Ok(())
    }

    /// Claims are oldest first, at most as many as asked, never a thread the worker runs, and
    /// never one another process holds: held for a moment (an answer refused under the run
    /// lock), it stays queued; withdrawn by its holder (a kill), it leaves the queue.
    fn claims_are_oldest_first_and_skip_held_threads(store: &Storage) -> Result<()> {
        let queue = store.queue();
        queue.register(Scope::Bundle(hash(1)), 4)?;
        let ids: Vec<ThreadId> = (0..3).map(|_| new_thread(store, hash(1))).collect::<Result<_>>()?;
        for &id in &ids {
            queue.enqueue(id, hash(1), &RunRequest::default())?;
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let (held, _) = store.threads().open(ids[0])?;
        let claimed = queue.claim(Scope::Bundle(hash(1)), 1, &[ids[1]], None)?;
        let claimed_ids: Vec<ThreadId> = claimed.iter().map(|c| c.id).collect();
        ensure!(claimed_ids == vec![ids[2]], "{claimed_ids:?} of {ids:?}");
        drop(held);
        let only = queue.claim(Scope::Bundle(hash(1)), 4, &[], Some(ids[0]))?;
        ensure!(only.len() == 1 && only[0].id == ids[0], "still queued once let go: {only:?}");

        let (held, _) = store.threads().open(ids[1])?;
        queue.withdraw(ids[1])?;
        drop(held);
        ensure!(queue.claim(Scope::Bundle(hash(1)), 4, &[], None)?.is_empty(), "withdrawn");
        Ok(())
    }

    /// A worker says it is alive and what its threads do: a registered worker counts among
    /// the live ones until it unregisters; a pool (a database) keeps what a heartbeat
    /// publishes — read back by `activity`, listed by `live_threads` with the worker — and
    /// holds threads under a lease whose end another worker sees coming (`next_takeover`);
    /// a home's bundle workers tell theirs over their sockets, and a lock dies with its
    /// process.
    fn workers_say_they_are_alive_and_what_their_threads_do(store: &Storage) -> Result<()> {
        let queue = store.queue();
        let pool = queue.workers() == Workers::Pool;
        ensure!(pool == queue.hold().is_some(), "a pool holds under leases, a home under locks");
        ensure!(!queue.owner().is_empty());
        let before = queue.live_workers()?;
        ensure!(queue.register(Scope::Bundle(hash(15)), 4)?);
        ensure!(queue.live_workers()? == before + 1, "registered: alive");
        let id = new_thread(store, hash(15))?;
        queue.enqueue(id, hash(15), &RunRequest::default())?;
        let wake = queue.wake_ups()?;
        ensure!(pool || wake.is_none(), "a home's workers are woken over their sockets");
        let claimed = queue.claim(Scope::Bundle(hash(15)), 1, &[], None)?;
        ensure!(claimed.len() == 1, "{claimed:?}");
        let working = Activity {
            since: 5,
            role: Some("planner".into()),
            agent: Some("scripted".into()),
            working_since: Some(6),
            waiting_for: Some("openai-main".into()),
        };
        queue.heartbeat(&[(id, working.clone())])?;
        let live = queue.live_threads()?;
        match pool {
            true => {
                ensure!(queue.activity(id)? == Some(working), "{:?}", queue.activity(id)?);
                let listed = live.iter().find(|t| t.summary.thread_id == id).context("listed")?;
                ensure!(listed.worker.as_ref().is_some_and(|(_, pid)| *pid == std::process::id()));
            }
            false => ensure!(queue.activity(id)?.is_none() && live.is_empty(), "{live:?}"),
        }
        // Another process's worker: its lease on a runnable thread ends in sight of this one.
        let other = another_handle(store)?;
        ensure!(other.queue().register(Scope::Bundle(hash(16)), 4)?);
        let theirs = new_thread(store, hash(16))?;
        other.queue().enqueue(theirs, hash(16), &RunRequest::default())?;
        let taken = other.queue().claim(Scope::Bundle(hash(16)), 1, &[], None)?;
        ensure!(taken.len() == 1);
        let runs_out = queue.next_takeover(std::time::Duration::from_secs(3600))?;
        match pool {
            true => ensure!(runs_out.is_some_and(|d| d <= queue.hold().unwrap()), "{runs_out:?}"),
            false => ensure!(runs_out.is_none()),
        }
        for (handle, claimed) in [(store, claimed), (&other, taken)] {
            for c in claimed {
                handle.queue().release(c.id, c.ticket, Release::Settle)?;
            }
            handle.queue().unregister()?;
        }
        ensure!(queue.live_workers()? == before, "unregistered: gone");
        Ok(())
    }

    /// A kill or pause asked of a worker waits for it, and is taken once.
    fn a_request_waits_until_its_worker_takes_it(store: &Storage) -> Result<()> {
        let queue = store.queue();
        ensure!(queue.register(Scope::Bundle(hash(17)), 4)?);
        let id = new_thread(store, hash(17))?;
        queue.enqueue(id, hash(17), &RunRequest::default())?;
        let claimed = queue.claim(Scope::Bundle(hash(17)), 1, &[], None)?;
        ensure!(!queue.is_asked(id)?, "nothing asked yet");
        ensure!(queue.ask(id, ControlRequest::Kill)?);
        ensure!(queue.is_asked(id)?, "asked, not taken");
        ensure!(queue.requests(&[id])? == vec![(id, ControlRequest::Kill)]);
        ensure!(!queue.is_asked(id)?, "taken");
        for c in claimed {
            queue.release(c.id, c.ticket, Release::Settle)?;
        }
        queue.unregister()?;
        Ok(())
    }
}
