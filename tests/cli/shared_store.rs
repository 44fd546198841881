//! The PostgreSQL store with many workers, on a real server the tests start: bad stores give
//! one line each, both stores record the same thread, a frozen worker whose lease was taken
//! over writes nothing more, and workers killed at random lose and repeat nothing.

use std::io::BufRead;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde_json::Value;

use crate::crash::{Rig, report};
use crate::{Env, pg, thread_id_of, wait_until};

/// Declares a test twice: `<name>::direct`, on a database reached directly, and
/// `<name>::pgbouncer`, on one reached through a transaction-pooling PgBouncer — the kills,
/// freezes and handovers of a shared store must hold behind the pooler most set-ups put in
/// front of the database.
macro_rules! on_both_connections {
    ($(#[$attr:meta])* fn $name:ident() -> Result<()> $body:block) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $(#[$attr])*
            fn direct() -> Result<()> $body
            $(#[$attr])*
            fn pgbouncer() -> Result<()> {
                crate::through_pgbouncer();
                $body
            }
        }
    };
}

/// The lease the workers of these tests hold threads under: short, so takeovers are quick.
const LEASE_MS: &str = "1500";

/// A `worker` process on the rig's store, up when this returns; `kill -9`ed when dropped.
struct Worker {
    child: Child,
}

impl Worker {
    fn start(rig: &Rig, log: &str) -> Result<Worker> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(rig.env.dir.path().join(log))?;
        let mut child = rig
            .command(&["-v", "worker", "--max-threads", "50"])
            .env("UNCAGED_WORKFLOW_LEASE_MS", LEASE_MS)
            // Agents take a while, so that every kill finds threads inside their calls.
            .env("UNCAGED_TEST_AGENT_SLEEP", "0.2")
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()?;
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
        ensure!(line.starts_with("ready"), "the worker did not come up: {line:?}");
        Ok(Worker { child })
    }

    fn pid(&self) -> String {
        self.child.id().to_string()
    }

    fn signal(&self, signal: &str) -> Result<()> {
        let status = std::process::Command::new("kill").args([signal, &self.pid()]).status()?;
        ensure!(status.success(), "kill {signal} {}", self.pid());
        Ok(())
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn bad_stores_and_bundles_give_one_line_each() -> Result<()> {
    let env = Env::on_postgres()?;
    let server = pg()?;
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let store = |url: String| vec!["--store".to_string(), url, "list".to_string()];
    let run = |args: Vec<String>, code: i32| -> Result<String> {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        env.fails(&args, code)
    };

    let unreachable = run(store(format!("postgres://me:hunter2@127.0.0.1:{closed}/flows")), 69)?;
    ensure!(unreachable.contains("cannot reach the server"), "{unreachable}");
    ensure!(!unreachable.contains("hunter2"), "the password is shown: {unreachable}");

    let url = env.store.clone().context("store")?;
    let stranger = url.replacen("uncaged@", "nobody@", 1);
    let refused = run(store(stranger), 77)?;
    ensure!(refused.contains("refused the credentials"), "{refused}");

    let other = server.new_empty_database()?;
    let other_name = other.rsplit('/').next().context("name")?;
    server.sql(other_name, "CREATE TABLE invoices (id integer)")?;
    let foreign = run(store(other.clone()), 78)?;
    ensure!(foreign.contains("another application"), "{foreign}");
    ensure!(
        server
            .sql(
                other_name,
                "SELECT count(*) FROM pg_namespace WHERE nspname = 'uncaged_workflow'"
            )?
            .trim()
            == "0",
        "the other database was written to"
    );

    env.ok(&["list"])?;
    let version = env.sql("SELECT value FROM meta WHERE key = 'schema_version'")?;
    env.sql("UPDATE meta SET value = '99' WHERE key = 'schema_version'")?;
    let newer = run(store(url.clone()), 78)?;
    ensure!(newer.contains("schema version 99") && newer.contains("newer"), "{newer}");
    env.sql(&format!("UPDATE meta SET value = '{}' WHERE key = 'schema_version'", version.trim()))?;

    let not_postgres = run(store("mysql://db/flows".into()), 64)?;
    ensure!(not_postgres.contains("postgres://"), "{not_postgres}");

    // A bundle whose bytes in the database no longer match its id and SHA-256 is refused,
    // and adding it again repairs it.
    env.add_solve_issue()?;
    env.sql("UPDATE bundles SET bytes = overlay(bytes PLACING '\\xff'::bytea FROM 200 FOR 1)")?;
    let tampered = env.fails(&["run", "solve-issue", "-p", "x"], 65)?;
    ensure!(tampered.contains("do not match"), "{tampered}");
    env.add_solve_issue()?;
    env.ok(&["run", "solve-issue", "-p", "x"])?;
    Ok(())
}

/// `store:` in config.yaml names the database when neither `--store` nor the variable does,
/// and every command that reads the rest of the file takes it.
#[test]
fn the_store_named_in_the_config_file_is_used() -> Result<()> {
    let url = pg()?.new_database()?;
    let env = Env::new()?;
    std::fs::create_dir_all(env.home())?;
    std::fs::write(env.home().join("config.yaml"), format!("store: {url}\nagent: scripted\n"))?;
    let mut command = env.command();
    let out = command
        .env_remove("UNCAGED_WORKFLOW_STORE")
        .args(["add", "solve-issue", crate::artifacts::SOLVE_ISSUE])
        .output()?;
    ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = env
        .command()
        .env_remove("UNCAGED_WORKFLOW_STORE")
        .args(["run", "solve-issue", "-p", "x"])
        .output()?;
    ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let db = url.rsplit('/').next().context("name")?;
    let threads = pg()?.sql(db, "SELECT count(*) FROM uncaged_workflow.threads")?;
    assert_eq!(threads.trim(), "1", "the thread is in the database named by the file");
    Ok(())
}

#[test]
fn a_removed_or_pruned_thread_leaves_no_rows_behind() -> Result<()> {
    let env = Env::on_postgres()?;
    env.add_solve_issue()?;
    let run = || thread_id_of(&env.ok(&["run", "solve-issue", "-p", "x"])?);
    let (removed, pruned) = (run()?, run()?);
    let kept = env.ok(&["thread", "start", "solve-issue", "-p", "x"])?.trim().to_string();
    // Rows of a thread, per table: records, journaled calls, debug log.
    let rows = |id: &str| -> Result<Vec<usize>> {
        ["thread_records", "thread_calls", "thread_log"]
            .iter()
            .map(|table| {
                let count =
                    env.sql(&format!("SELECT count(*) FROM {table} WHERE thread = '{id}'"))?;
                Ok(count.trim().parse()?)
            })
            .collect()
    };
    for id in [&removed, &pruned] {
        assert!(rows(id)?.iter().all(|&n| n > 0), "{id} has rows in each table: {:?}", rows(id)?);
    }
    let kept_rows = rows(&kept)?;
    env.ok(&["thread", "rm", &removed])?;
    env.ok(&["threads", "prune", "--older-than", "0s"])?;
    assert_eq!(rows(&removed)?, [0, 0, 0], "thread rm left rows");
    assert_eq!(rows(&pruned)?, [0, 0, 0], "threads prune left rows");
    assert_eq!(rows(&kept)?, kept_rows, "a thread not removed keeps its rows");
    Ok(())
}

#[test]
fn a_store_at_an_older_schema_is_migrated_forward_keeping_its_data() -> Result<()> {
    let env = Env::on_postgres()?;
    env.add_solve_issue()?;
    env.ok(&["run", "solve-issue", "-p", "x"])?;
    let before = env.json(&["threads"])?;
    // The store as the first release left it: schema version 1, without the schedules, the
    // API's tables, the firing lock's generation, the append functions and the packed
    // listing, with foreign keys from a thread's rows to it, and each thread's summary one
    // jsonb value (without the token count, cost and parent summaries came to hold later),
    // and without the time a thread is followed until, tool servers' credentials, provider
    // limits, evals, or links and notices.
    let append = "append_records(text, bigint, text[], text, bigint, integer, bigint, text, \
                  bigint, bigint, double precision, text[], text[]";
    env.sql(&format!(
        "DROP TABLE schedule_firings, schedules, api_tokens, request_keys, fire_lock, \
             tool_credentials, provider_limits, evals, eval_sets, links, notices, push_configs; \
         DROP FUNCTION {append}), {append}, bytea); \
         DROP TRIGGER threads_deleted ON threads; DROP FUNCTION threads_deleted(); \
         ALTER TABLE thread_records ADD CONSTRAINT thread_records_thread_fkey \
             FOREIGN KEY (thread) REFERENCES threads (id) ON DELETE CASCADE; \
         ALTER TABLE thread_calls ADD CONSTRAINT thread_calls_thread_fkey \
             FOREIGN KEY (thread) REFERENCES threads (id) ON DELETE CASCADE; \
         ALTER TABLE thread_log ADD CONSTRAINT thread_log_thread_fkey \
             FOREIGN KEY (thread) REFERENCES threads (id) ON DELETE CASCADE; \
         ALTER TABLE threads DROP COLUMN listing, DROP COLUMN followed_until; \
         ALTER TABLE threads ADD COLUMN removing boolean NOT NULL DEFAULT false; \
         ALTER TABLE threads ADD COLUMN summary jsonb; \
         UPDATE threads SET summary = jsonb_build_object('threadId', id, 'name', name, \
             'hash', bundle, 'status', status, 'steps', steps, 'timestamp', started_ms, \
             'prompt', prompt, 'returnCode', return_code, 'ended', ended_ms, \
             'waitingRole', waiting_role, 'pausedAt', paused_at_ms, 'schedule', schedule); \
         ALTER TABLE threads ALTER COLUMN summary SET NOT NULL, DROP COLUMN name, \
             DROP COLUMN status, DROP COLUMN steps, DROP COLUMN started_ms, DROP COLUMN prompt, \
             DROP COLUMN return_code, DROP COLUMN ended_ms, DROP COLUMN waiting_role, \
             DROP COLUMN paused_at_ms, DROP COLUMN schedule, DROP COLUMN tokens, \
             DROP COLUMN cost_usd, DROP COLUMN parent; \
         DELETE FROM migrations WHERE version > 1; \
         UPDATE meta SET value = '1' WHERE key = 'schema_version'",
    ))?;
    // Any command migrates it; what it held is still there, and schedules work.
    assert_eq!(env.json(&["threads"])?, before);
    let applied = env.sql(
        "SELECT string_agg(version::text || ':' || name, ' ' ORDER BY version) FROM migrations",
    )?;
    assert_eq!(
        applied.trim(),
        "1:store 2:schedules 3:api 4:fire lock 5:summary columns 6:append function \
         7:packed listing 8:cascade by statement 9:bundle compression 10:followed threads 11:tool credentials \
         12:provider limits 13:evals 14:reach"
    );
    let version = env.sql("SELECT value FROM meta WHERE key = 'schema_version'")?;
    assert_eq!(version.trim(), "14");
    let removing = env.sql(
        "SELECT count(*) FROM information_schema.columns \
         WHERE table_name = 'threads' AND column_name = 'removing'",
    )?;
    assert_eq!(removing.trim(), "0", "0002 drops the unused column");
    let compression = env.sql(
        "SELECT attcompression FROM pg_attribute \
         WHERE attrelid = 'bundles'::regclass AND attname = 'bytes'",
    )?;
    assert_eq!(compression.trim(), "l", "0009 stores bundle bytes with LZ4");
    // On the test's clock: a second passes without waiting for one.
    env.set_clock(1_893_456_000_500)?;
    env.ok(&["schedule", "add", "solve-issue", "--cron", "* * * * * *", "-p", "x", "--name", "c"])?;
    env.advance(std::time::Duration::from_secs(1))?;
    env.ok(&["schedule", "tick"])?;
    let fired = env.sql("SELECT count(*) FROM schedule_firings")?;
    ensure!(fired.trim() != "0", "nothing fired");
    Ok(())
}

/// A listing reads each thread's packed summary; a row without one in this binary's layout
/// (left by an older version), or with one damaged after its id, is listed from its columns.
#[test]
fn a_thread_without_a_packed_summary_of_this_layout_is_listed_from_its_columns() -> Result<()> {
    let env = Env::on_postgres()?;
    env.add_solve_issue()?;
    for prompt in ["one", "two", "three", "four"] {
        env.ok(&["run", "solve-issue", "-p", prompt])?;
    }
    let packed = env.sql("SELECT count(*) FROM threads WHERE listing IS NOT NULL")?;
    assert_eq!(packed.trim(), "4", "every thread this version wrote is packed");
    let before = env.json(&["threads"])?;
    // One row as an older version left it, one packed in a layout this binary does not know,
    // one appended to by the previous version's function (which cannot pack), and one whose
    // packed value was damaged after the id it starts with; the columns of each made to
    // differ from what the packed value said.
    env.sql(
        "UPDATE threads SET listing = NULL, steps = 7 WHERE prompt = 'one'; \
         UPDATE threads SET listing = set_byte(listing, 0, 200), steps = 8 \
             WHERE prompt = 'two'; \
         SELECT append_records(id, lease_token, ARRAY[]::text[], status, 9::bigint, \
             return_code, ended_ms, waiting_role, paused_at_ms, tokens, cost_usd, \
             ARRAY[]::text[], ARRAY[]::text[]) FROM threads WHERE prompt = 'three'; \
         UPDATE threads SET listing = substring(listing FROM 1 FOR length(listing) - 3), \
             steps = 10 WHERE prompt = 'four'",
    )?;
    let listed = env.run(&["threads", "--json"])?;
    ensure!(listed.code == 0, "{listed:?}");
    let after: Value = serde_json::from_str(&listed.stdout)?;
    let steps: Vec<&Value> =
        after.as_array().context("a list")?.iter().map(|t| &t["steps"]).collect();
    assert_eq!(steps, [7, 8, 9, 10], "each listed from its columns");
    let damaged = before[3]["threadId"].as_str().context("an id")?;
    ensure!(
        listed.stderr.contains(&format!("thread {damaged}: its packed summary")),
        "the damaged one is named: {}",
        listed.stderr
    );
    let mut expected = before;
    for (i, steps) in [7, 8, 9, 10].into_iter().enumerate() {
        expected[i]["steps"] = steps.into();
    }
    assert_eq!(after, expected);
    Ok(())
}

/// A thread's records with what differs from run to run (ids, times) taken out.
fn comparable(env: &Env, thread: &str) -> Result<Value> {
    let mut record = env.json(&["thread", thread])?;
    fn scrub(value: &mut Value) {
        match value {
            Value::Object(map) => {
                for (key, value) in map.iter_mut() {
                    if ["threadId", "timestamp", "cwd", "durationMs"].contains(&key.as_str())
                        || key.ends_with("At")
                    {
                        *value = Value::Null;
                    } else {
                        scrub(value);
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(scrub),
            _ => {}
        }
    }
    scrub(&mut record);
    Ok(record)
}

#[test]
fn both_stores_record_the_same_thread() -> Result<()> {
    let files = Env { dir: super::scratch::tempdir()?, store: None };
    let database = Env::on_postgres()?;
    let mut records = Vec::new();
    for env in [&files, &database] {
        env.add_solve_issue()?;
        let out = env.ok(&["run", "solve-issue", "-p", "the same prompt"])?;
        records.push(comparable(env, &thread_id_of(&out)?)?);
    }
    ensure!(records[0] == records[1], "files: {}\ndatabase: {}", records[0], records[1]);
    ensure!(records[1]["steps"].as_array().is_some_and(|s| !s.is_empty()), "{}", records[1]);
    Ok(())
}

on_both_connections! {
#[test]
fn a_frozen_worker_whose_lease_was_taken_over_writes_nothing_more() -> Result<()> {
    let rig = Rig::with(Env::on_postgres()?)?;
    let gate = rig.env.dir.path().join("gate");
    // The developer's answer waits for the gate, so the thread is held inside an agent call.
    let agent = rig.env.write_script(
        "gated.sh",
        format!(
            "#!/bin/sh\ninput=$(cat)\necho \"$$ start\" >> {log}\ncase \"$input\" in\n  *'\"role\":{{\"name\":\"developer\"'*) {wait}; echo '{{\"summary\": \"done\"}}' ;;\n  *'\"role\":{{\"name\":\"planner\"'*) echo '{{\"steps\": [\"one\"]}}' ;;\n  *) echo '{{\"approved\": true}}' ;;\nesac\n",
            log = rig.env.dir.path().join("gated.log").display(),
            wait = crate::sh_wait_for(&gate)
        ),
    )?;
    let agent = format!("command:{}", agent.display());
    let first = Worker::start(&rig, "first.log")?;
    let out = rig.env.ok(&["run", "solve-issue", "-p", "x", "--agent", &agent, "--detach"])?;
    let thread = out.trim().to_string();
    let calls = || -> Result<usize> {
        Ok(std::fs::read_to_string(rig.env.dir.path().join("gated.log"))
            .unwrap_or_default()
            .lines()
            .count())
    };
    wait_until("the developer is asked", || Ok(calls()? == 2))?;

    // Frozen past its lease: the second worker takes the thread over and finishes it.
    first.signal("-STOP")?;
    std::thread::sleep(Duration::from_millis(2 * LEASE_MS.parse::<u64>()?));
    let second = Worker::start(&rig, "second.log")?;
    wait_until("the second worker asks the developer again", || Ok(calls()? == 3))?;
    std::fs::write(&gate, "")?;
    wait_until("the thread completes", || Ok(crate::status(&rig.env, &thread)? == "completed"))?;
    let records = rig.env.thread_lines(&rig.hash, &thread)?;
    let journal = rig.env.calls(&rig.hash, &thread)?;

    // Thawed: its agent answered long ago; it must not write that answer, a step or an end.
    first.signal("-CONT")?;
    let first_log = rig.env.dir.path().join("first.log");
    wait_until("the first worker finds its lease gone", || {
        Ok(std::fs::read_to_string(&first_log)?.contains("lost the lease"))
    })?;
    std::thread::sleep(Duration::from_millis(500));
    ensure!(rig.env.thread_lines(&rig.hash, &thread)? == records, "records changed after the thaw");
    ensure!(rig.env.calls(&rig.hash, &thread)? == journal, "the journal changed after the thaw");
    ensure!(crate::alive(first.child.id() as u64), "the thawed worker died");
    let status = rig.env.json(&["thread", &thread])?;
    ensure!(status["end"]["status"] == "completed", "{status}");
    drop(second);
    Ok(())
}
}

/// A rig on a fresh database, with the steps of an uncrashed run to compare with, and no
/// thread or agent call recorded yet.
fn fresh_rig() -> Result<(Rig, Vec<Value>)> {
    let rig = Rig::with(Env::on_postgres()?)?;
    let reference = rig.reference()?;
    rig.env.sql("DELETE FROM threads")?;
    std::fs::write(rig.env.dir.path().join("agent.log"), "")?;
    Ok((rig, reference))
}

/// Threads in the crash test (`UNCAGED_SHARED_CRASH_THREADS`, default 200).
fn crash_threads() -> usize {
    std::env::var("UNCAGED_SHARED_CRASH_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(200)
}

on_both_connections! {
#[test]
fn three_workers_killed_at_random_lose_and_repeat_nothing() -> Result<()> {
    let (rig, reference) = fresh_rig()?;
    let mut workers: Vec<Worker> =
        (0..3).map(|i| Worker::start(&rig, &format!("worker-{i}.log"))).collect::<Result<_>>()?;
    let n = crash_threads();
    // Threads are queued while workers run and die, as they would be in production.
    let queueing = {
        let commands: Vec<_> = (0..n)
            .map(|_| {
                rig.command(&["run", "solve-issue", "-p", "c", "--agent", &rig.agent, "--detach"])
            })
            .collect();
        std::thread::spawn(move || -> Result<()> {
            for mut command in commands {
                ensure!(command.status()?.success(), "run --detach failed");
            }
            Ok(())
        })
    };
    // Kill a worker every 1-3 s (a fixed sequence), start it again, until every thread ended.
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut kills = 0;
    let mut next = 7u64;
    loop {
        let threads = rig.threads()?;
        let done = threads.iter().filter(|t| t["status"] == "completed").count();
        if done == n && queueing.is_finished() {
            break;
        }
        ensure!(Instant::now() < deadline, "only {done} of {n} threads completed in 10 minutes");
        next = next.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        std::thread::sleep(Duration::from_millis(1000 + (next >> 33) % 2000));
        if kills < 40 {
            let victim = ((next >> 40) % 3) as usize;
            workers[victim].signal("-KILL")?;
            let _ = workers[victim].child.wait();
            workers[victim] = Worker::start(&rig, &format!("worker-{victim}.log"))?;
            kills += 1;
        }
    }
    queueing.join().expect("the queueing thread does not panic")?;
    // The kills found threads mid-run: other workers took them over.
    let mut takeovers = 0;
    for i in 0..3 {
        let log = std::fs::read_to_string(rig.env.dir.path().join(format!("worker-{i}.log")))?;
        takeovers += log.matches("taken over from").count();
    }
    ensure!(takeovers > 0, "no kill found a thread to take over");
    let found = rig.check(&reference)?;
    report(&format!("3 workers, {n} threads, {kills} kills, {takeovers} takeovers"), 1, found);
    ensure!(found == (0, 0), "lost or duplicated steps, repeated calls: {found:?}");
    ensure!(rig.threads()?.len() == n, "threads were lost or added");
    Ok(())
}
}

on_both_connections! {
/// Workers killed in the middle of group commits — just before one (the batch never reaches
/// the database) or just after (every write of it durable, none acknowledged) — lose, repeat
/// and re-ask nothing: each thread's steps are those of an uncrashed run, once, and no agent
/// call journaled in a commit is made again.
#[test]
fn workers_killed_in_the_middle_of_group_commits_lose_and_repeat_nothing() -> Result<()> {
    let (rig, reference) = fresh_rig()?;
    let n = 40;
    // The worker that ran the reference thread exits when idle.
    wait_until("no worker is left", || {
        Ok(rig.env.sql("SELECT count(*) FROM workers")?.trim() == "0")
    })?;
    // Queued first, all of them, with no worker to take them: a worker row that looks alive
    // keeps `run` from starting one of its own (each then waits a few seconds for a worker to
    // take its thread, so they are queued at once).
    rig.env.sql(
        "INSERT INTO workers (id, host, pid, max_threads, heartbeat_at) \
         VALUES ('placeholder', 'test', 1, 1, now() + interval '1 hour')",
    )?;
    let queueing: Vec<Child> = (0..n)
        .map(|_| {
            rig.command(&["run", "solve-issue", "-p", "c", "--agent", &rig.agent, "--detach"])
                .spawn()
        })
        .collect::<std::io::Result<_>>()?;
    for mut run in queueing {
        ensure!(run.wait()?.success(), "run --detach failed");
    }
    rig.env.sql("DELETE FROM workers WHERE id = 'placeholder'")?;
    // Each worker dies at the k-th commit that carried several statements, k from a fixed
    // seed, on one side or the other; a takeover waits out the dead worker's lease.
    let (seed, mut random) = crate::Random::seeded();
    eprintln!("group-commit crashes: UNCAGED_TEST_SEED={seed}");
    let mut crashes = 0;
    for round in 0..6 {
        let point = if round % 2 == 0 { "group-commit" } else { "group-committed" };
        let at = format!("{point}:{}", 2 + random.below(12));
        let log = std::fs::File::create(rig.env.dir.path().join(format!("worker-{round}.log")))?;
        let status = rig
            .command(&["-v", "worker", "--max-threads", "50", "--exit-when-idle"])
            .stderr(log)
            .env("UNCAGED_WORKFLOW_LEASE_MS", "500")
            .env("UNCAGED_TEST_AGENT_SLEEP", "0.01")
            .env("UNCAGED_WORKFLOW_CRASH_AT", &at)
            .status()?;
        if !status.success() {
            crashes += 1;
        }
    }
    let log = std::fs::read_to_string(rig.env.dir.path().join("worker-0.log"))?;
    ensure!(crashes >= 3, "the workers died in group commits ({crashes} of 6 did): {log}");
    let finish = rig
        .command(&["worker", "--exit-when-idle"])
        .env("UNCAGED_WORKFLOW_LEASE_MS", "500")
        .env("UNCAGED_TEST_AGENT_SLEEP", "0.01")
        .status()?;
    ensure!(finish.success(), "the last worker failed");
    wait_until("every thread completes", || {
        Ok(rig.threads()?.iter().filter(|t| t["status"] == "completed").count() == n)
    })?;
    let found = rig.check(&reference)?;
    report(&format!("{n} threads, {crashes} workers killed in group commits"), 1, found);
    ensure!(found == (0, 0), "lost or duplicated steps, repeated calls: {found:?}");
    ensure!(rig.threads()?.len() == n, "threads were lost or added");
    Ok(())
}
}

#[test]
fn a_worker_waits_out_a_lost_database_and_its_threads_complete() -> Result<()> {
    let (rig, reference) = fresh_rig()?;
    let worker = Worker::start(&rig, "worker.log")?;
    for _ in 0..10 {
        rig.env.ok(&["run", "solve-issue", "-p", "c", "--agent", &rig.agent, "--detach"])?;
    }
    wait_until("steps are stored", || {
        Ok(rig.env.sql("SELECT count(*) FROM thread_records")?.trim().parse::<usize>()? >= 20)
    })?;

    // The database goes away for twice the lease, as in a restart: every session is cut and
    // none is admitted meanwhile.
    let url = rig.env.store.clone().context("store")?;
    let db = url.rsplit('/').next().context("database")?;
    pg()?.sql("postgres", &format!("ALTER DATABASE {db} WITH ALLOW_CONNECTIONS false"))?;
    pg()?.sql(
        "postgres",
        &format!(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = '{db}'"
        ),
    )?;
    std::thread::sleep(Duration::from_millis(2 * LEASE_MS.parse::<u64>()?));
    pg()?.sql("postgres", &format!("ALTER DATABASE {db} WITH ALLOW_CONNECTIONS true"))?;

    // The worker waited it out; the threads it was running stopped where they could not
    // store, and were taken again from their journals.
    let log = || std::fs::read_to_string(rig.env.dir.path().join("worker.log"));
    wait_until("every thread completes", || {
        let threads = rig.threads()?;
        Ok(threads.len() == 10 && threads.iter().all(|t| t["status"] == "completed"))
    })
    .with_context(|| {
        let on_demand = rig.env.home().join("run/pool-worker.log");
        format!(
            "{:?}\nworker alive: {}\n{}\non-demand worker:\n{}",
            rig.env.sql(
                "SELECT id, runnable, lease_owner, lease_until > now() FROM threads \
                 WHERE runnable OR lease_owner IS NOT NULL"
            ),
            crate::alive(worker.child.id() as u64),
            log().unwrap_or_default(),
            std::fs::read_to_string(on_demand).unwrap_or_default()
        )
    })?;
    ensure!(crate::alive(worker.child.id() as u64), "the worker died with the database");
    let log = log()?;
    ensure!(log.contains("the database is back"), "{log}");
    let found = rig.check(&reference)?;
    ensure!(found == (0, 0), "lost or duplicated steps, repeated calls: {found:?}");
    Ok(())
}

/// A certificate authority, a server certificate for 127.0.0.1 and a client certificate for
/// the user `certuser`, both signed by it, as PEM.
struct Certificates {
    ca: String,
    server: String,
    server_key: String,
    client: String,
    client_key: String,
}

fn certificates() -> Result<Certificates> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "uncaged test CA");
    let ca_pem = ca.self_signed(&ca_key)?.pem();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate()?;
    let server = CertificateParams::new(vec!["127.0.0.1".to_string()])?.signed_by(&key, &issuer)?;
    let client_key = KeyPair::generate()?;
    let mut client = CertificateParams::new(Vec::<String>::new())?;
    client.distinguished_name.push(DnType::CommonName, "certuser");
    let client = client.signed_by(&client_key, &issuer)?;
    Ok(Certificates {
        ca: ca_pem,
        server: server.pem(),
        server_key: key.serialize_pem(),
        client: client.pem(),
        client_key: client_key.serialize_pem(),
    })
}

#[test]
fn tls_is_used_as_sslmode_asks_and_an_untrusted_server_is_refused() -> Result<()> {
    let dir = super::scratch::tempdir()?;
    let certs = certificates()?;
    let other = certificates()?;
    let write = |name: &str, text: &str| -> Result<String> {
        let path = dir.path().join(name);
        std::fs::write(&path, text)?;
        Ok(path.display().to_string())
    };
    let (ca, other_ca) = (write("ca.pem", &certs.ca)?, write("other-ca.pem", &other.ca)?);
    let (cert, key) =
        (write("server.pem", &certs.server)?, write("server.key", &certs.server_key)?);
    let (client_cert, client_key) =
        (write("client.pem", &certs.client)?, write("client.key", &certs.client_key)?);
    // A server that accepts TLS connections only, and `certuser` only with its certificate.
    let hba = write(
        "pg_hba.conf",
        "local all all trust\nhostssl all certuser 127.0.0.1/32 cert\n\
         hostssl all all 127.0.0.1/32 trust\n",
    )?;
    let server_ca = write("server-ca.pem", &certs.ca)?;
    for file in [&cert, &key, &hba, &server_ca] {
        crate::postgres::give_to_server(std::path::Path::new(file))?;
    }
    crate::postgres::give_to_server(dir.path())?;
    let server = crate::postgres::PgServer::start(&[
        "ssl=on",
        &format!("ssl_cert_file={cert}"),
        &format!("ssl_key_file={key}"),
        &format!("hba_file={hba}"),
        &format!("ssl_ca_file={server_ca}"),
    ])?;
    let url = server.new_database()?;
    let env = |query: &str| -> Result<Env> {
        Ok(Env { dir: super::scratch::tempdir()?, store: Some(format!("{url}{query}")) })
    };

    // The default (`prefer`) and `require` encrypt; the server would refuse them otherwise.
    env("")?.add_solve_issue()?;
    env("?sslmode=require")?.ok(&["list"])?;
    // Checked against the CA that signed it, and its name (127.0.0.1) too.
    let verified = env(&format!("?sslmode=verify-full&sslrootcert={ca}"))?;
    verified.ok(&["run", "solve-issue", "-p", "x"])?;
    // `verify-ca` checks the chain only: `localhost` is not the certificate's name.
    let mut by_name = env(&format!("?sslmode=verify-ca&sslrootcert={ca}"))?;
    by_name.store = by_name.store.take().map(|u| u.replacen("127.0.0.1", "localhost", 1));
    by_name.ok(&["list"])?;

    // Refused, one line each: a server signed by another CA, one no public root vouches for,
    // the wrong name for `verify-full`, no TLS at all, a mode that does not exist.
    let untrusted =
        env(&format!("?sslmode=verify-full&sslrootcert={other_ca}"))?.fails(&["list"], 77)?;
    ensure!(untrusted.contains("certificate is not trusted"), "{untrusted}");
    ensure!(untrusted.lines().count() == 1, "{untrusted}");
    let public = env("?sslmode=verify-full")?.fails(&["list"], 77)?;
    ensure!(public.contains("certificate is not trusted"), "{public}");
    let mut wrong_name = env(&format!("?sslmode=verify-full&sslrootcert={ca}"))?;
    wrong_name.store = wrong_name.store.take().map(|u| u.replacen("127.0.0.1", "localhost", 1));
    let wrong_name = wrong_name.fails(&["list"], 77)?;
    ensure!(wrong_name.contains("certificate is not trusted"), "{wrong_name}");
    let plain = env("?sslmode=disable")?.fails(&["list"], 77)?;
    ensure!(plain.contains("no encryption"), "{plain}");
    let bad_mode = env("?sslmode=sometimes")?.fails(&["list"], 64)?;
    ensure!(bad_mode.contains("sslmode `sometimes`"), "{bad_mode}");
    let missing = env("?sslmode=verify-full&sslrootcert=/no/such.pem")?.fails(&["list"], 64)?;
    ensure!(missing.contains("sslrootcert /no/such.pem"), "{missing}");

    // A user the server admits only with a client certificate the CA signed for it.
    let own = server.new_database()?;
    let db = own.rsplit('/').next().context("database")?;
    server.sql("postgres", "CREATE ROLE certuser LOGIN")?;
    server.sql("postgres", &format!("ALTER DATABASE {db} OWNER TO certuser"))?;
    let as_certuser = |query: &str| -> Result<Env> {
        let store = format!("{}{query}", own.replacen("uncaged@", "certuser@", 1));
        Ok(Env { dir: super::scratch::tempdir()?, store: Some(store) })
    };
    let with_cert =
        format!("?sslmode=verify-full&sslrootcert={ca}&sslcert={client_cert}&sslkey={client_key}");
    // Refused while others may read the key, as libpq refuses it.
    std::fs::set_permissions(&client_key, std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
    let open_key = as_certuser(&with_cert)?.fails(&["list"], 64)?;
    ensure!(open_key.contains("others may read it"), "{open_key}");
    std::fs::set_permissions(&client_key, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    as_certuser(&with_cert)?.ok(&["list"])?;
    let no_cert =
        as_certuser(&format!("?sslmode=verify-full&sslrootcert={ca}"))?.fails(&["list"], 77)?;
    ensure!(no_cert.contains("certificate"), "{no_cert}");
    let no_key = as_certuser(&format!("?sslcert={client_cert}"))?.fails(&["list"], 64)?;
    ensure!(no_key.contains("both sslcert and sslkey"), "{no_key}");
    Ok(())
}

/// Liveness comes from heartbeats, never from a pid: a worker killed with `kill -9` and left
/// a zombie (its parent has not reaped it, so /proc still lists it) stops counting as alive,
/// and a thread queued right after is taken by a worker started for it.
#[test]
fn a_killed_worker_left_a_zombie_does_not_hold_up_a_new_thread() -> Result<()> {
    let (rig, _) = fresh_rig()?;
    let worker = Worker::start(&rig, "worker.log")?;
    worker.signal("-KILL")?;
    // Not reaped: the test is its parent, and waits for it only when dropping it.
    let out = rig.env.ok(&["run", "solve-issue", "-p", "z", "--agent", &rig.agent, "--detach"])?;
    let thread = out.trim().to_string();
    wait_until("the thread completes", || Ok(crate::status(&rig.env, &thread)? == "completed"))?;
    drop(worker);
    Ok(())
}

on_both_connections! {
/// A rolling restart: SIGTERM to a worker in the middle of 20 threads. It stops claiming,
/// finishes the steps at hand, hands its threads back to the queue and exits; the other
/// worker continues them with no command. Every thread completes with exact records, and no
/// journaled agent call is made again.
#[test]
fn a_worker_stopped_with_sigterm_hands_its_threads_to_another() -> Result<()> {
    let (rig, reference) = fresh_rig()?;
    // The worker the rig's reference run started on demand exits once idle first: the
    // threads must be the first worker's (a start does not wait for a worker to take them).
    wait_until("no worker is left", || Ok(rig.env.sql("SELECT count(*) FROM workers")?.trim() == "0"))?;
    let mut first = Worker::start(&rig, "first.log")?;
    let threads: Vec<String> = (0..20)
        .map(|_| {
            let out = rig.env.ok(&[
                "run",
                "solve-issue",
                "-p",
                "c",
                "--agent",
                &rig.agent,
                "--detach",
            ])?;
            Ok(out.trim().to_string())
        })
        .collect::<Result<_>>()?;
    wait_until("the first worker is in the middle of them", || {
        Ok(rig.env.sql("SELECT count(*) FROM thread_records")?.trim().parse::<usize>()? >= 40)
    })?;
    let _second = Worker::start(&rig, "second.log")?;
    first.signal("-TERM")?;
    let mut exited = None;
    wait_until("the first worker exits", || {
        exited = first.child.try_wait()?;
        Ok(exited.is_some())
    })?;
    ensure!(exited.is_some_and(|s| s.success()), "it exited {exited:?}");
    let log = std::fs::read_to_string(rig.env.dir.path().join("first.log"))?;
    ensure!(log.contains("handed back to the queue"), "{log}");
    for thread in &threads {
        wait_until("every thread completes", || {
            Ok(crate::status(&rig.env, thread)? == "completed")
        })?;
    }
    let second = std::fs::read_to_string(rig.env.dir.path().join("second.log"))?;
    ensure!(!second.contains("taken over from"), "the threads were handed back, not taken over");
    let found = rig.check(&reference)?;
    report("SIGTERM mid-run, 20 threads", 1, found);
    ensure!(found == (0, 0), "lost or duplicated steps, repeated calls: {found:?}");
    Ok(())
}
}

/// A queued thread follows as on the file store: each step printed with the agent that
/// answered and its own duration, and a thread waiting in the queue listed `queued`, as `ps`
/// lists it.
#[test]
fn a_queued_thread_shows_its_agents_durations_and_queued_status() -> Result<()> {
    let (rig, _) = fresh_rig()?;
    // The rig's agent, taking 0.3 s a call (whichever worker runs it).
    let script = std::fs::read_to_string(rig.env.dir.path().join("agent.sh"))?;
    let slow = rig
        .env
        .write_script("slow.sh", script.replace("${UNCAGED_TEST_AGENT_SLEEP:-0.03}", "0.3"))?;
    let slow = format!("command:{}", slow.display());
    let out = rig.env.run(&["run", "solve-issue", "-p", "c", "--agent", &slow])?;
    ensure!(out.code == 0, "{out:?}");
    let steps: Vec<&str> = out.stdout.lines().filter(|l| l.starts_with('[')).collect();
    ensure!(steps.len() == 5, "{}", out.stdout);
    for line in &steps {
        ensure!(line.contains(&format!(" {slow},")), "the step's agent: {line}");
        let ms: u64 = line
            .split(", ")
            .nth(1)
            .and_then(|rest| rest.split(" ms").next())
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("a duration in {line}"))?;
        ensure!(ms >= 300, "each step took its agent's 0.3 s at least: {line}");
    }
    // One worker, one thread at a time: the second thread waits in the queue. (The worker
    // `run` started on demand exits once idle first.)
    wait_until("no worker is left", || {
        Ok(rig.env.sql("SELECT count(*) FROM workers")?.trim() == "0")
    })?;
    let gate = rig.env.dir.path().join("gate");
    let gated = rig.env.write_script(
        "gated.sh",
        format!("#!/bin/sh\ncat >/dev/null\n{}\necho '{{}}'\n", crate::sh_wait_for(&gate)),
    )?;
    let gated = format!("command:{}", gated.display());
    let mut worker =
        rig.command(&["worker", "--max-threads", "1"]).stdout(Stdio::piped()).spawn()?;
    let mut ready = String::new();
    std::io::BufReader::new(worker.stdout.take().context("stdout")?).read_line(&mut ready)?;
    ensure!(ready.starts_with("ready"), "the worker did not come up: {ready:?}");
    let _worker = Worker { child: worker };
    let held = rig.env.ok(&["run", "solve-issue", "-p", "a", "--agent", &gated, "--detach"])?;
    let queued = rig.env.ok(&["run", "solve-issue", "-p", "b", "--agent", &gated, "--detach"])?;
    let (held, queued) = (held.trim().to_string(), queued.trim().to_string());
    wait_until("the first runs", || Ok(crate::status(&rig.env, &held)? == "running"))?;
    assert_eq!(crate::status(&rig.env, &queued)?, "queued");
    let listed = rig.env.json(&["threads", "--status", "queued"])?;
    assert_eq!(listed[0]["threadId"], queued.as_str(), "{listed}");
    let ps = rig.env.json(&["ps"])?;
    let in_ps = ps.as_array().and_then(|p| p.iter().find(|t| t["threadId"] == queued.as_str()));
    assert_eq!(in_ps.map(|t| t["state"].clone()), Some(Value::from("queued")), "{ps}");
    std::fs::write(&gate, "")?;
    for thread in [&held, &queued] {
        wait_until("it completes", || {
            Ok(crate::status(&rig.env, thread)? != "queued"
                && crate::status(&rig.env, thread)? != "running")
        })?;
    }
    Ok(())
}

/// The rig's agent, waiting before each answer until the file it names (the first returned;
/// not there yet) exists.
fn gated_agent(rig: &Rig) -> Result<(std::path::PathBuf, String)> {
    let gate = rig.env.dir.path().join("gate");
    let script = std::fs::read_to_string(rig.env.dir.path().join("agent.sh"))?;
    let gated =
        script.replace("sleep ${UNCAGED_TEST_AGENT_SLEEP:-0.03}", &crate::sh_wait_for(&gate));
    Ok((gate, format!("command:{}", rig.env.write_script("gated.sh", gated)?.display())))
}

/// A start answers once its thread is queued, whatever the workers are doing: with the only
/// worker alive but busy (one thread at most, held by an agent that waits), each `run
/// --detach` returns at once, its thread `queued` (at 4abdda5 each waited 4 s for the busy
/// worker to take it), and the worker takes them when it has room.
#[test]
fn a_start_does_not_wait_for_a_busy_worker_to_take_its_thread() -> Result<()> {
    let (rig, _) = fresh_rig()?;
    // The worker the rig's reference run started on demand exits once idle first.
    wait_until("no worker is left", || {
        Ok(rig.env.sql("SELECT count(*) FROM workers")?.trim() == "0")
    })?;
    let (gate, gated) = gated_agent(&rig)?;
    let mut worker =
        rig.command(&["worker", "--max-threads", "1"]).stdout(Stdio::piped()).spawn()?;
    let mut ready = String::new();
    std::io::BufReader::new(worker.stdout.take().context("stdout")?).read_line(&mut ready)?;
    ensure!(ready.starts_with("ready"), "the worker did not come up: {ready:?}");
    let _worker = Worker { child: worker };
    let busy = rig.env.ok(&["run", "solve-issue", "-p", "a", "--agent", &gated, "--detach"])?;
    let busy = busy.trim().to_string();
    wait_until("the worker is busy", || Ok(crate::status(&rig.env, &busy)? == "running"))?;
    let mut queued = Vec::new();
    for n in 0..3 {
        let started = Instant::now();
        let out = rig.env.ok(&["run", "solve-issue", "-p", "q", "--agent", &gated, "--detach"])?;
        let took = started.elapsed();
        // Not a speed figure: the bound only tells "answered" from "waited for a worker".
        ensure!(took < Duration::from_secs(3), "start {n} waited for the busy worker: {took:?}");
        let thread = out.trim().to_string();
        let status = crate::status(&rig.env, &thread)?;
        ensure!(status == "queued", "start {n} is {status}, not queued");
        queued.push(thread);
    }
    let workers = rig.env.sql("SELECT count(*) FROM workers")?;
    ensure!(workers.trim() == "1", "no worker was started beside the busy one: {workers}");
    std::fs::write(&gate, "")?;
    for thread in queued.iter().chain([&busy]) {
        wait_until("it completes", || Ok(crate::status(&rig.env, thread)? == "completed"))?;
    }
    Ok(())
}

/// With no worker service, a thread whose on-demand worker was killed is taken over by the
/// next on-demand worker, even one that has nothing else to do before the dead worker's lease
/// runs out: it stays idle until then and runs the thread to its end, with nobody running
/// `resume` (at 9e65bc6 it exited after 5 s idle, before the lease ran out, and the thread
/// stayed queued).
#[test]
fn an_idle_on_demand_worker_stays_to_take_over_a_dead_workers_thread() -> Result<()> {
    let (rig, _) = fresh_rig()?;
    // A lease longer than an on-demand worker stays idle (5 s), as the default (15 s) is.
    let lease = [("UNCAGED_WORKFLOW_LEASE_MS", "9000")];
    let (gate, thread) = its_on_demand_worker_killed_mid_call(&rig, &lease)?;
    std::fs::write(&gate, "")?;
    // A moment later another run: its new worker runs that thread, then has nothing to do.
    let other =
        rig.env.run_with(&["run", "solve-issue", "-p", "o", "--agent", &rig.agent], &lease)?;
    ensure!(other.code == 0, "{other:?}");
    completes(&rig, &thread, "the idle worker takes the thread over and ends it")
}

/// A thread started with `run --detach` and an agent that waits for the gate returned, once
/// its on-demand worker (the only one) is killed in the middle of its call.
fn its_on_demand_worker_killed_mid_call(
    rig: &Rig,
    lease: &[(&str, &str)],
) -> Result<(std::path::PathBuf, String)> {
    wait_until("no worker is left", || {
        Ok(rig.env.sql("SELECT count(*) FROM workers")?.trim() == "0")
    })?;
    let (gate, gated) = gated_agent(rig)?;
    let run = rig
        .env
        .run_with(&["run", "solve-issue", "-p", "s", "--agent", &gated, "--detach"], lease)?;
    ensure!(run.code == 0, "{run:?}");
    let thread = run.stdout.trim().to_string();
    wait_until("its worker runs it", || Ok(crate::status(&rig.env, &thread)? == "running"))?;
    rig.env.kill_the_worker()?;
    Ok((gate, thread))
}

/// Waits until `thread` completes; the on-demand workers' log is the error if it does not.
fn completes(rig: &Rig, thread: &str, what: &str) -> Result<()> {
    if wait_until(what, || Ok(crate::status(&rig.env, thread)? == "completed")).is_err() {
        let log = std::fs::read_to_string(rig.env.home().join("run/pool-worker.log"))?;
        anyhow::bail!("{what}: {}: {log}", crate::status(&rig.env, thread)?);
    }
    Ok(())
}

/// With no worker service, a thread whose on-demand worker was killed is not stranded: once
/// the lease has run out it reads `queued` with no worker alive, and `resume` (at 4abdda5:
/// "is running", exit 75) makes sure a worker takes it, which runs it to its end.
#[test]
fn a_thread_whose_on_demand_worker_died_is_resumed_by_a_new_worker() -> Result<()> {
    let (rig, _) = fresh_rig()?;
    let lease = [("UNCAGED_WORKFLOW_LEASE_MS", LEASE_MS)];
    let (gate, thread) = its_on_demand_worker_killed_mid_call(&rig, &lease)?;
    wait_until("its lease runs out", || Ok(crate::status(&rig.env, &thread)? == "queued"))?;
    std::fs::write(&gate, "")?;
    let resumed = rig.env.run_with(&["resume", &thread, "--detach"], &lease)?;
    ensure!(resumed.code == 0, "resume of a thread nobody holds: {resumed:?}");
    completes(&rig, &thread, "a new worker runs it to its end")
}
