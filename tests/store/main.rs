//! The store contract: what every store promises the layers above it, tested through the
//! store's traits alone, and run on both stores — a home directory, and a fresh database on a
//! real PostgreSQL server the tests start themselves (`../support/postgres.rs`). Each test is
//! written once, in [`contract!`]; a store that keeps the contract passes them all.
//!
//! What goes through a worker (dispatch: run, resume, answer, fork, kill, pause, ps) is
//! tested through the CLI on both stores too, in `tests/cli` (its `on_both_stores!` blocks).

// Shared with the CLI tests, which use all of it.
#[allow(dead_code)]
#[path = "../support/postgres.rs"]
mod postgres;
#[allow(dead_code)]
#[path = "../support/scratch.rs"]
mod scratch;

use std::collections::BTreeMap;

use anyhow::{Context, Result, ensure};
use uncaged_workflow::Error;
use uncaged_workflow::agent_spec::AgentSpec;
use uncaged_workflow::home::Home;
use uncaged_workflow::ids::{BundleHash, ThreadId};
use uncaged_workflow::limits::LimitOverrides;
use uncaged_workflow::run_request::RunRequest;
use uncaged_workflow::store::journal::{CallKind, CallRecord, CallResponse};
use uncaged_workflow::store::queue::{ControlRequest, Release, Scope};
use uncaged_workflow::store::records::{
    End, EndRecord, EndStatus, Parameters, ParentLink, PauseReason, Paused, PendingCall,
    ScheduledBy, StartRecord, StepRecord, ThreadStatus,
};
use uncaged_workflow::store::schedules::{
    FiringEvent, PollState, Schedule, ScheduleSource, Trigger,
};
use uncaged_workflow::store::{Storage, ThreadWriter};

/// The PostgreSQL server of this test process, started at first use.
fn pg() -> Result<&'static postgres::PgServer> {
    static SERVER: std::sync::OnceLock<std::result::Result<postgres::PgServer, String>> =
        std::sync::OnceLock::new();
    SERVER
        .get_or_init(|| {
            let server = postgres::PgServer::start(&["fsync=off", "synchronous_commit=off"])
                .map_err(|e| format!("{e:#}"))?;
            // Every test's database starts as a copy of one the store migrated.
            server
                .prepare_template(|url| {
                    let dir = scratch::tempdir()?;
                    Storage::connect(&Home::new(dir.path().join("home")), Some(url))?;
                    Ok(())
                })
                .map_err(|e| format!("migrating the template database: {e:#}"))?;
            Ok(server)
        })
        .as_ref()
        .map_err(|e| anyhow::anyhow!("starting PostgreSQL: {e}"))
}

/// The PgBouncer (transaction pooling) in front of [`pg`], started at first use.
fn bouncer() -> Result<&'static postgres::PgBouncer> {
    postgres::PgBouncer::shared(pg)
}

/// A fresh store of one kind, and the directory that holds its home.
struct Fixture {
    store: Storage,
    _dir: tempfile::TempDir,
}

impl Fixture {
    fn files() -> Result<Self> {
        let dir = scratch::tempdir()?;
        let store = Storage::open(&Home::new(dir.path().join("home")));
        Ok(Fixture { store, _dir: dir })
    }

    fn postgres() -> Result<Self> {
        Fixture::database(pg()?.new_database()?)
    }

    /// A fresh database reached through a transaction-pooling PgBouncer.
    fn pgbouncer() -> Result<Self> {
        Fixture::database(bouncer()?.url(&pg()?.new_database()?)?)
    }

    fn database(url: String) -> Result<Self> {
        let dir = scratch::tempdir()?;
        let store = Storage::connect(&Home::new(dir.path().join("home")), Some(&url))?;
        Ok(Fixture { store, _dir: dir })
    }
}

/// Declares each contract test for both stores: `<name>::files`, `<name>::postgres`, and
/// `<name>::pgbouncer` (the same database store behind a transaction-pooling PgBouncer).
macro_rules! contract {
    ($( $(#[$attr:meta])* fn $name:ident($store:ident: &Storage) -> Result<()> $body:block )*) => {
        $(
            $(#[$attr])*
            fn $name($store: &Storage) -> Result<()> $body

            mod $name {
                #[test]
                fn files() -> anyhow::Result<()> {
                    super::$name(&super::Fixture::files()?.store)
                }

                #[test]
                fn postgres() -> anyhow::Result<()> {
                    let fixture = super::Fixture::postgres()?;
                    super::$name(&fixture.store)
                }

                #[test]
                fn pgbouncer() -> anyhow::Result<()> {
                    let fixture = super::Fixture::pgbouncer()?;
                    super::$name(&fixture.store)
                }
            }
        )*
    };
}

/// Waits (5 s at most) until `check` holds. A file lock let go can linger for a moment: a
/// process another test starts at that instant (`psql`, say) holds a copy of every open file
/// until it runs its program, as any fork does.
fn eventually(what: &str, mut check: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !check()? {
        ensure!(std::time::Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Ok(())
}

/// A bundle hash no stored bundle has (threads keep the hash they were started with).
fn hash(n: u8) -> BundleHash {
    BundleHash::of(&[n])
}

fn start_record(hash: BundleHash) -> StartRecord {
    StartRecord {
        name: "contract".into(),
        hash,
        thread_id: ThreadId::new(),
        parameters: Parameters {
            prompt: "keep the contract".into(),
            options: RunRequest {
                max_rounds: Some(7),
                agent: Some("command:./review.sh --strict 'two words'".parse().unwrap()),
                agent_for: BTreeMap::new(),
                cwd: None,
                limits: LimitOverrides::from_pairs([("memory", "64MiB")]).unwrap(),
                budget: uncaged_workflow::store::records::Budget {
                    max_tokens: Some(1000),
                    max_cost_usd: Some(0.25),
                    ..Default::default()
                },
            },
        },
        timestamp: 1,
        forked_from: None,
        trigger_data: Some(serde_json::json!({"item": "<b>&"})),
        schedule: None,
        parent: None,
    }
}

fn step(role: &str, content: &str) -> StepRecord {
    StepRecord {
        role: role.into(),
        content: content.into(),
        meta: serde_json::json!({"ok": true}),
        timestamp: 2,
        group: None,
        agent: Some("scripted".into()),
        duration_ms: Some(3),
        usage: Some(uncaged_workflow::store::records::Usage {
            input_tokens: 120,
            output_tokens: 30,
            cached_tokens: 20,
            calls: 1,
            model: Some("m".into()),
            cost_usd: Some(0.5),
        }),
    }
}

fn call(step: usize, value: &str) -> CallRecord {
    CallRecord {
        step,
        seq: 0,
        kind: CallKind::Agent,
        role: "planner".into(),
        digest: "d1g3st".into(),
        response: CallResponse::Ok { value: value.into(), meta: None, usage: None },
        timestamp: 4,
    }
}

/// Thread `id` opened again just after its writer was dropped: a file lock let go may linger
/// a moment (see [`eventually`]).
fn reopen(store: &Storage, id: ThreadId) -> Result<Box<dyn ThreadWriter>> {
    let mut writer = None;
    eventually("the thread opens", || {
        writer = store.threads().open(id).ok().map(|(writer, _)| writer);
        Ok(writer.is_some())
    })?;
    writer.context("opened")
}

/// A new thread, at rest (its writer dropped).
fn new_thread(store: &Storage, hash: BundleHash) -> Result<ThreadId> {
    let (writer, record) = store.threads().create(&start_record(hash), &[], &[])?;
    drop(writer);
    Ok(record.id())
}

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
    /// schedule that started it — when created, waiting and ended.
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

    /// A thread's debug log shows while it waits long on an agent (a store may hold lines
    /// back for its next record, but not for the whole of a long wait), and keeps its order
    /// with what it logs after.
    fn the_debug_log_shows_during_a_long_wait_and_keeps_its_order(store: &Storage) -> Result<()> {
        use uncaged_workflow::store::debug_log::LogLevel;
        let threads = store.threads();
        let (mut writer, record) = threads.create(&start_record(hash(1)), &[], &[])?;
        let id = record.id();
        let log = threads.debug_log(hash(1), id)?;
        log.write(LogLevel::Info, "host", "asking the planner");
        log.release();
        let tail = || -> Result<Vec<String>> {
            Ok(threads.debug_tail(hash(1), id, 10)?.into_iter().map(|l| l.content).collect())
        };
        eventually("the line logged before the wait shows", || {
            Ok(tail()? == ["asking the planner"])
        })?;
        log.write(LogLevel::Info, "host", "the planner answered");
        log.flush();
        futures::executor::block_on(writer.append_steps(&[step("planner", "plan")]))?;
        let lines = tail()?;
        ensure!(lines == ["asking the planner", "the planner answered"], "{lines:?}");
        Ok(())
    }

    /// A fork's prefix keeps the calls its steps made: the journal hands them back.
    fn the_journal_keeps_the_calls_a_thread_was_created_with(store: &Storage) -> Result<()> {
        let calls = [call(0, "first answer")];
        let (writer, record) =
            store.threads().create(&start_record(hash(1)), &[step("planner", "p")], &calls)?;
        drop(writer);
        let journal = store.threads().journal(hash(1), record.id())?;
        ensure!(journal.calls_before(1) == calls, "{:?}", journal.calls_before(1));
        ensure!(journal.calls_before(0).is_empty());
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

    /// The registry: a name registered points at its bundle, its earlier versions kept newest
    /// first.
    fn the_registry_keeps_each_names_versions(store: &Storage) -> Result<()> {
        let registry = store.registry();
        registry.update(|file| {
            file.register("flow", hash(1), 100);
            Ok(())
        })?;
        registry.update(|file| {
            file.register("flow", hash(2), 200);
            Ok(())
        })?;
        let entry = registry.get("flow")?;
        ensure!(entry.hash == hash(2) && entry.timestamp == 200, "{entry:?}");
        ensure!(entry.history.len() == 1 && entry.history[0].hash == hash(1), "{entry:?}");
        ensure!(matches!(registry.get("flows"), Err(Error::UnknownWorkflow { .. })));
        Ok(())
    }

    /// API tokens: kept as hashes, found by the token, refused twice under one name, gone
    /// once revoked.
    fn tokens_are_kept_as_hashes_and_revoked(store: &Storage) -> Result<()> {
        use uncaged_workflow::store::tokens;
        let ci = tokens::issue(store.tokens(), "ci", false)?;
        let viewer = tokens::issue(store.tokens(), "viewer", true)?;
        ensure!(ci.token.hash != ci.secret && !ci.token.hash.contains(&ci.secret[4..]));
        let found = tokens::authenticate(store.tokens(), &viewer.secret)?;
        ensure!(found.as_ref().is_some_and(|t| t.name == "viewer" && t.read_only), "{found:?}");
        ensure!(tokens::authenticate(store.tokens(), "uwt_nothing")?.is_none());
        ensure!(matches!(tokens::issue(store.tokens(), "ci", true), Err(Error::Usage(_))));
        let names: Vec<String> = store.tokens().list()?.into_iter().map(|t| t.name).collect();
        ensure!(names == ["ci", "viewer"], "{names:?}");
        ensure!(store.tokens().revoke("ci")? && !store.tokens().revoke("ci")?);
        ensure!(tokens::authenticate(store.tokens(), &ci.secret)?.is_none());
        Ok(())
    }

    /// Request keys: the first claim wins, a second gets what the first claimed, and scopes
    /// keep clients apart.
    fn a_request_key_is_claimed_once(store: &Storage) -> Result<()> {
        use uncaged_workflow::store::request_keys::{Claim, RequestKey};
        let key = |scope: &str, fingerprint: &str| RequestKey {
            scope: scope.into(),
            key: "retry-me".into(),
            fingerprint: fingerprint.into(),
            thread: ThreadId::new(),
            created: 5,
        };
        let first = key("token:ci", "a");
        ensure!(store.request_keys().claim(&first)? == Claim::New);
        match store.request_keys().claim(&key("token:ci", "b"))? {
            Claim::Taken(taken) => ensure!(taken == first, "{taken:?}"),
            Claim::New => anyhow::bail!("claimed twice"),
        }
        ensure!(store.request_keys().claim(&key("token:other", "a"))? == Claim::New);
        // Forgotten once old enough: the key may then be claimed again.
        ensure!(store.request_keys().forget_before(5)? == 0);
        ensure!(store.request_keys().forget_before(6)? == 2);
        ensure!(store.request_keys().claim(&key("token:ci", "c"))? == Claim::New);
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
}
