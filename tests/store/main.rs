//! The store contract: what every store promises the layers above it, tested through the
//! store's traits alone, and run on every backend — a home directory, and a fresh database on
//! a real PostgreSQL server the tests start themselves (`../support/postgres.rs`), reached
//! directly and through a transaction-pooling PgBouncer. Each test is written once, in
//! [`contract!`]; a store that keeps the contract passes them all.
//!
//! One file per store trait (as Temporal keeps one per persistence interface): `threads.rs`
//! (`ThreadStore`, `ThreadWriter`), `journal.rs` (`CallLog`), `debug_log.rs` (`LogSink`),
//! `queue.rs` (`WorkQueue`), `registry.rs` (`RegistryBackend`), `bundles.rs`
//! (`BundleBackend`), `schedules.rs` (`ScheduleBackend`, `LockHolder`), `tokens.rs`
//! (`TokenBackend`), `request_keys.rs` (`RequestKeys`), `links.rs` (`LinkBackend`),
//! `notices.rs` (`NoticeBackend`), `push_configs.rs` (`PushConfigBackend`). `coverage.rs` reads the traits and
//! fails on any method its file calls nowhere.
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
use uncaged_workflow::store::journal::{
    CallKind, CallRecord, CallResponse, Decision, JournalLine, LoopEntry, LoopRecord, ToolCall,
};
use uncaged_workflow::store::queue::{ControlRequest, Live, LiveText, Release, Scope};
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
            // As many connections as the CLI tests' server: the contract's tests run at once,
            // and those that race (uses, claims) hold a connection each while they do.
            let server = postgres::PgServer::start(&[
                "fsync=off",
                "synchronous_commit=off",
                "max_connections=400",
            ])
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
                    super::$name(&crate::Fixture::files()?.store)
                }

                #[test]
                fn postgres() -> anyhow::Result<()> {
                    let fixture = crate::Fixture::postgres()?;
                    super::$name(&fixture.store)
                }

                #[test]
                fn pgbouncer() -> anyhow::Result<()> {
                    let fixture = crate::Fixture::pgbouncer()?;
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
                approve: vec!["fs.write_file".into()],
            },
        },
        timestamp: 1,
        forked_from: None,
        trigger_data: Some(serde_json::json!({"item": "<b>&"})),
        schedule: None,
        parent: None,
        started_by: Some(uncaged_workflow::store::records::StartedBy::new(
            "mcp",
            "token:ci",
            Some("claude-code"),
        )),
        eval: Some(uncaged_workflow::store::records::EvalOf {
            experiment: "01KEVAL".into(),
            baseline: ThreadId::new(),
            live: vec!["reviewer".into()],
            tools: uncaged_workflow::store::records::EvalTools::Deny,
        }),
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
        request: Some("r3qu3st".into()),
        recorded_in: Some(ThreadId::new()),
        decided_by: Some(by()),
    }
}

/// A person who decided, as a link sent by mail names them.
fn by() -> uncaged_workflow::store::pauses::DecidedBy {
    uncaged_workflow::store::pauses::DecidedBy::new("ada@example.com", "link:mail")
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

/// A second handle on the same store, as another process would have: its own connection (and
/// lease owner) on a database; the same home directory otherwise.
fn another_handle(store: &Storage) -> Result<Storage> {
    Ok(Storage::connect(store.home(), store.url())?)
}

mod bundles;
mod capacity;
mod coverage;
mod credentials;
mod debug_log;
mod evals;
mod journal;
mod links;
mod live;
mod notices;
mod push_configs;
mod queue;
mod registry;
mod request_keys;
mod schedules;
mod threads;
mod tokens;
