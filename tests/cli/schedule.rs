//! Schedules: cron and poll triggers fired by `schedule tick` and `serve`, exactly once per
//! cron instant and poll item, through crashes and concurrent firing processes.
//!
//! Time here is the test's own clock ([`Env::set_clock`]): it starts at [`T0`] and moves only
//! when a test moves it, so no test waits for time to pass, and the instants fired are known
//! exactly.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use super::{Env, Serve, read_jsonl, wait_until};

/// Where each test's clock starts: half a second past 2030-01-01T00:00:00Z.
const T0: u64 = 1_893_456_000_500;

/// The whole second `n` seconds after 2030-01-01T00:00:00Z, in ms: the `n`th instant a
/// schedule firing every second, added at [`T0`], fires.
fn second(n: u64) -> u64 {
    T0 - 500 + n * 1000
}

const SECOND: Duration = Duration::from_secs(1);

/// A fresh environment with its clock at [`T0`], and solve-issue added.
fn scheduling() -> Result<Env> {
    let env = Env::new()?;
    env.set_clock(T0)?;
    env.add_solve_issue()?;
    Ok(env)
}

/// The events of a schedule's firing log.
fn firings(env: &Env, name: &str) -> Result<Vec<Value>> {
    if env.store.is_some() {
        return env.rows(&format!(
            "SELECT event FROM schedule_firings WHERE schedule = '{name}' ORDER BY id"
        ));
    }
    let path = env.home().join("schedules").join(name).join("firings.jsonl");
    if !path.exists() {
        return Ok(vec![]);
    }
    read_jsonl(&path)
}

/// Whether poll schedule `name` has a recorded check.
fn poll_checked(env: &Env, name: &str) -> Result<bool> {
    if env.store.is_some() {
        let state = env.sql(&format!("SELECT poll_state FROM schedules WHERE name = '{name}'"))?;
        return Ok(!state.trim().is_empty());
    }
    Ok(env.home().join("schedules").join(name).join("poll.json").exists())
}

/// Keys of the `fired` events, in order.
fn fired_keys(env: &Env, name: &str) -> Result<Vec<String>> {
    Ok(firings(env, name)?
        .iter()
        .filter_map(|e| e.get("fired"))
        .map(|f| f["key"].as_str().unwrap_or_default().to_string())
        .collect())
}

/// Threads started by schedule `name`, as `threads --json` lists them.
fn scheduled_threads(env: &Env, name: &str) -> Result<Vec<Value>> {
    let list = env.json(&["threads"])?;
    Ok(list
        .as_array()
        .context("a list")?
        .iter()
        .filter(|t| t["schedule"] == name)
        .cloned()
        .collect())
}

/// Every firing has exactly one thread, no key fired twice, and every thread ran to its end.
fn exactly_once(env: &Env, name: &str) -> Result<usize> {
    let keys = fired_keys(env, name)?;
    let distinct: BTreeSet<&String> = keys.iter().collect();
    ensure!(distinct.len() == keys.len(), "a key fired twice: {keys:?}");
    // Watched in the store itself (a command per look would take the CPU the threads need),
    // then checked once as `threads` lists them.
    wait_until("the scheduled threads end", || {
        Ok(scheduled_statuses(env, name)?.iter().all(|status| status == "completed"))
    })
    // What was left, and who had it: the rare run that ends here is then one to read.
    .with_context(|| {
        let ps = env.run(&["ps"]).map(|run| run.stdout + &run.stderr);
        let queue = env.store.as_ref().map(|_| {
            env.sql(&format!(
                "SELECT id, status, steps, runnable, lease_owner, lease_until, now(), lease_token \
                 FROM threads WHERE schedule = '{name}'; SELECT * FROM workers"
            ))
        });
        format!("statuses {:?}; ps: {ps:?}; queue: {queue:?}", scheduled_statuses(env, name))
    })?;
    let threads = scheduled_threads(env, name)?;
    ensure!(threads.iter().all(|t| t["status"] == "completed"), "not all completed: {threads:#?}");
    ensure!(
        threads.len() == keys.len(),
        "{} threads for {} firings: {threads:#?} {keys:?}",
        threads.len(),
        keys.len()
    );
    // Each thread records the firing that started it, and no firing started two.
    let mut by_firing = BTreeSet::new();
    for start in start_records(env, &threads)? {
        let firing = start["schedule"]["firing"].as_str().context("firing")?.to_string();
        ensure!(by_firing.insert(firing.clone()), "two threads for firing {firing}");
    }
    ensure!(by_firing == distinct.into_iter().cloned().collect(), "threads and firings differ");
    Ok(keys.len())
}

/// The status of each thread schedule `name` started (`completed`, …, or `running` while it
/// has no end record), read from the store directly (rows, or the records' files).
fn scheduled_statuses(env: &Env, name: &str) -> Result<Vec<String>> {
    if env.store.is_some() {
        let statuses = env.sql(&format!("SELECT status FROM threads WHERE schedule = '{name}'"))?;
        return Ok(statuses.lines().map(str::to_string).collect());
    }
    let mut statuses = Vec::new();
    let Ok(bundles) = std::fs::read_dir(env.home().join("logs")) else { return Ok(statuses) };
    for bundle in bundles {
        let bundle = bundle?.path();
        // `logs/` holds the threads' index beside a folder per bundle.
        if !bundle.is_dir() {
            continue;
        }
        for file in std::fs::read_dir(bundle)? {
            let path = file?.path();
            if !path.to_string_lossy().ends_with(".data.jsonl") {
                continue;
            }
            // A worker may be writing the last line: one that does not parse is not an end.
            let text = std::fs::read_to_string(&path)?;
            let parse = |line: Option<&str>| -> Option<Value> { serde_json::from_str(line?).ok() };
            let start = parse(text.lines().next());
            if start.is_some_and(|start| start["schedule"]["name"] == name) {
                let last = parse(text.lines().last());
                let end = last.as_ref().and_then(|last| last["end"]["status"].as_str());
                statuses.push(end.unwrap_or("running").to_string());
            }
        }
    }
    Ok(statuses)
}

/// The start records of `threads` (as `threads --json` lists them), read from the store in
/// one go rather than by a command each.
fn start_records(env: &Env, threads: &[Value]) -> Result<Vec<Value>> {
    let ids: Vec<&str> = threads.iter().filter_map(|t| t["threadId"].as_str()).collect();
    ensure!(ids.len() == threads.len(), "a listed thread without an id: {threads:?}");
    if env.store.is_some() {
        if ids.is_empty() {
            return Ok(vec![]);
        }
        return env.rows(&format!(
            "SELECT line FROM thread_records WHERE seq = 0 AND thread IN ('{}')",
            ids.join("', '")
        ));
    }
    threads
        .iter()
        .map(|t| {
            let lines = env.thread_lines(
                t["hash"].as_str().context("hash")?,
                t["threadId"].as_str().context("id")?,
            )?;
            lines.into_iter().next().context("a thread without a start record")
        })
        .collect()
}

/// The cron instant a key names, in ms.
fn instant(key: &str) -> Result<u64> {
    let time = key.strip_prefix("cron:").context("a cron key")?;
    let parsed = chrono_like_seconds(time)?;
    Ok(parsed * 1000)
}

/// Seconds since the epoch of an RFC 3339 UTC time `YYYY-MM-DDTHH:MM:SSZ`.
fn chrono_like_seconds(time: &str) -> Result<u64> {
    let out = std::process::Command::new("date").args(["-u", "-d", time, "+%s"]).output()?;
    Ok(String::from_utf8(out.stdout)?.trim().parse()?)
}

/// `schedule add solve-issue --poll SCRIPT --every 1s --diff DIFF --name NAME EXTRA…`.
fn add_poll(env: &Env, script: &str, diff: &str, name: &str, extra: &[&str]) -> Result<String> {
    let mut args = vec!["schedule", "add", "solve-issue", "--poll", script, "--every", "1s"];
    args.extend(["--diff", diff, "--name", name]);
    args.extend(extra);
    env.ok(&args)
}

/// A poll command whose output grows by one item each run (the run count kept in a file).
fn growing_poll(env: &Env) -> Result<String> {
    let count = env.dir.path().join("runs");
    let script = env.write_script(
        "items.sh",
        format!(
            r#"#!/bin/sh
n=$(cat {count} 2>/dev/null || echo 0); n=$((n + 1)); echo $n > {count}
printf '['
i=1; while [ $i -le $n ]; do
  [ $i -gt 1 ] && printf ','
  printf '{{"id": "issue-%s", "title": "Issue %s <b>"}}' $i $i
  i=$((i + 1))
done
printf ']\n'
"#,
            count = count.display()
        ),
    )?;
    Ok(script.display().to_string())
}

// Through the CLI only: each of these runs twice, on a home directory (`…::files`) and on a
// fresh PostgreSQL database (`…::postgres`). A test added here covers both stores.
on_both_stores! {
#[test]
fn a_firing_process_killed_at_any_point_starts_no_duplicate() -> Result<()> {
    // One home for both crash points: each tick is a process of its own, so `point:1` crashes
    // the first time that tick reaches it, whatever earlier ticks did.
    let env = scheduling()?;
    let script = growing_poll(&env)?;
    add_poll(&env, &script, "new-items", "p", &[])?;
    env.ok(&["schedule", "tick"])?; // baseline: issue-1
    let mut fired: Vec<String> = Vec::new();
    // Each crashing tick's poll run shows one new item (issue-2, then issue-4).
    for (point, item) in [("schedule-fired", 2), ("schedule-created", 4)] {
        env.advance(SECOND)?;
        let crash = format!("{point}:1");
        let run = env.run_with(&["schedule", "tick"], &[("UNCAGED_WORKFLOW_CRASH_AT", &crash)])?;
        ensure!(run.code != 0 && run.stderr.contains("crashing at"), "{point}: {run:?}");
        fired.push(format!("item:issue-{item}"));
        assert_eq!(fired_keys(&env, "p")?, fired, "{point}: the firing was recorded first");
        // The next tick finishes that firing (and fires the item the new run shows).
        env.advance(SECOND)?;
        env.ok(&["schedule", "tick"])?;
        fired.push(format!("item:issue-{}", item + 1));
        assert_eq!(fired_keys(&env, "p")?, fired, "{point}");
        assert_eq!(exactly_once(&env, "p")?, fired.len(), "{point}");
    }
    Ok(())
}

#[test]
fn a_poll_starts_one_thread_per_new_item_with_the_item() -> Result<()> {
    let env = scheduling()?;
    let script = growing_poll(&env)?;
    add_poll(&env, &script, "new-items", "issues", &[])?;
    // The first check is the baseline: issue-1 was there before the schedule.
    let pass = env.json(&["schedule", "tick"])?;
    ensure!(pass["started"].as_array().unwrap().is_empty(), "{pass}");
    // Not due again within its interval: the command does not run.
    env.json(&["schedule", "tick"])?;
    assert_eq!(std::fs::read_to_string(env.dir.path().join("runs"))?.trim(), "1");
    for n in 2..=4 {
        env.advance(SECOND)?;
        let pass = env.json(&["schedule", "tick"])?;
        let started = pass["started"].as_array().unwrap();
        ensure!(started.len() == 1, "one new item at run {n}: {pass}");
        assert_eq!(started[0]["firing"], format!("item:issue-{n}"));
        let record = env.json(&["thread", started[0]["threadId"].as_str().unwrap()])?;
        assert_eq!(
            record["start"]["triggerData"],
            json!({"id": format!("issue-{n}"), "title": format!("Issue {n} <b>")})
        );
    }
    assert_eq!(exactly_once(&env, "issues")?, 3);

    // --include-existing fires for what the first check finds.
    std::fs::remove_file(env.dir.path().join("runs"))?;
    add_poll(&env, &script, "new-items", "all", &["--include-existing"])?;
    let pass = env.json(&["schedule", "tick"])?;
    let started: Vec<&str> = pass["started"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["schedule"] == "all")
        .map(|s| s["firing"].as_str().unwrap())
        .collect();
    assert_eq!(started, ["item:issue-1"]);
    Ok(())
}

#[test]
fn a_slow_poll_command_does_not_hold_up_the_other_schedules_or_schedule_add() -> Result<()> {
    let env = scheduling()?;
    let (started, gate) = (env.dir.path().join("started"), env.dir.path().join("gate"));
    let script = env.write_script(
        "slow.sh",
        format!(
            "#!/bin/sh\ntouch {}\n{}\necho '[]'\n",
            started.display(),
            crate::sh_wait_for(&gate)
        ),
    )?;
    let script = script.display().to_string();
    add_poll(&env, &script, "new-items", "slow", &[])?;
    env.ok(&[
        "schedule",
        "add",
        "solve-issue",
        "--cron",
        "* * * * * *",
        "-p",
        "x",
        "--name",
        "fast",
    ])?;
    let serve = Serve::start(&env, &[], &[])?;
    wait_until("the poll command runs", || Ok(started.exists()))?;
    // While it runs (it waits for the gate): schedules change, and the cron fires on.
    env.ok(&[
        "schedule",
        "add",
        "solve-issue",
        "--cron",
        "0 0 * * *",
        "-p",
        "x",
        "--name",
        "other",
    ])?;
    env.ok(&["schedule", "pause", "other"])?;
    for n in 1..=2 {
        env.advance(SECOND)?;
        wait_until("the cron fires during the check", || Ok(fired_keys(&env, "fast")?.len() == n))?;
    }
    // …and the check is still the first one, at work (not timed out, nothing recorded).
    ensure!(!poll_checked(&env, "slow")? && firings(&env, "slow")?.is_empty(), "the check ended");
    std::fs::write(&gate, "")?;
    wait_until("the check is recorded", || Ok(!firings(&env, "slow")?.is_empty()))?;
    assert_eq!(firings(&env, "slow")?[0]["baseline"]["keys"], json!(null), "an empty baseline");
    serve.stop()?;
    exactly_once(&env, "fast")?;
    Ok(())
}

/// A workflow's phase: `active` while its triggers fire, `paused` when they are all paused
/// (`schedule pause --workflow`), `active` again on resume; without triggers, `ready` until
/// run, then where its last thread is.
#[test]
fn a_workflow_is_active_or_paused_as_a_whole_and_a_manual_one_ends_with_its_run() -> Result<()> {
    let env = scheduling()?;
    let flow = env.write(
        "nightly.yaml",
        "description: Nightly\ntrigger:\n  type: cron\n  expression: \"0 3 * * *\"\nsteps:\n  - id: a\n    description: A\n",
    )?;
    env.ok(&["add", "nightly", flow.to_str().unwrap()])?;
    let phase = |name: &str| -> Result<Value> {
        let list = env.json(&["list"])?;
        let entry = list.as_array().context("a list")?.iter().find(|w| w["name"] == name).cloned();
        Ok(entry.context("listed")?["phase"].clone())
    };
    assert_eq!(phase("nightly")?, "active");
    assert_eq!(phase("solve-issue")?, "ready");
    let out = env.ok(&["schedule", "pause", "--workflow", "nightly"])?;
    assert_eq!(out.trim(), "paused schedule nightly");
    assert_eq!(phase("nightly")?, "paused");
    ensure!(env.ok(&["list"])?.contains("paused"), "the table shows the phase");
    env.ok(&["schedule", "resume", "--workflow", "nightly"])?;
    assert_eq!(phase("nightly")?, "active");
    let e = env.fails(&["schedule", "pause", "--workflow", "solve-issue"], 64)?;
    assert!(e.contains("workflow `solve-issue` has no trigger or schedule to pause"), "{e}");
    env.ok(&["run", "solve-issue", "-p", "x"])?;
    assert_eq!(phase("solve-issue")?, "completed");
    Ok(())
}

/// `pause --workflow`: the DAG protocol's `executing → paused` — the workflow's triggers stop
/// and its running threads pause after their current step.
#[test]
fn pausing_a_workflow_pauses_its_triggers_and_its_running_threads() -> Result<()> {
    let env = scheduling()?;
    let flow = env.write(
        "nightly.yaml",
        "description: Nightly\ntrigger:\n  type: cron\n  expression: \"0 3 * * *\"\nsteps:\n  - id: a\n    description: A\n  - id: b\n    description: B\n    depends_on: [a]\n",
    )?;
    env.ok(&["add", "nightly", flow.to_str().unwrap()])?;
    let (gate, agent) = env.gate_agent()?;
    for _ in 0..2 {
        env.ok(&["run", "nightly", "-p", "x", "--agent", &agent, "--detach"])?;
    }
    let statuses = || -> Result<Vec<String>> {
        let all = env.json(&["threads", "nightly"])?;
        Ok(all.as_array().context("threads")?.iter().map(|t| t["status"].to_string()).collect())
    };
    crate::wait_until("both threads run", || Ok(statuses()? == ["\"running\""; 2]))?;
    let out = env.ok(&["pause", "--workflow", "nightly"])?;
    assert!(out.contains("paused schedule nightly"), "{out}");
    assert_eq!(out.matches("pauses after its current step").count(), 2, "{out}");
    std::fs::remove_file(&gate)?;
    crate::wait_until("both threads pause", || Ok(statuses()? == ["\"paused\""; 2]))?;
    let list = env.json(&["list"])?;
    let nightly = list.as_array().context("list")?.iter().find(|w| w["name"] == "nightly");
    assert_eq!(nightly.context("listed")?["phase"], "paused");
    let e = env.fails(&["pause", "--workflow", "nowhere"], 66)?;
    assert!(e.contains("nowhere"), "{e}");
    Ok(())
}

#[test]
fn a_workflow_trigger_registers_its_schedule_and_follows_its_versions() -> Result<()> {
    let env = Env::new()?;
    let flow = |trigger: &str| {
        format!(
            "description: Nightly triage\n{trigger}roles:\n  a:\n    description: A\nsteps:\n  - id: a\n    role: a\n"
        )
    };
    let with = env.write(
        "nightly.yaml",
        flow("trigger:\n  type: cron\n  expression: \"0 3 * * *\"\n  timezone: Europe/Paris\n"),
    )?;
    let out = env.ok(&["add", "nightly", with.to_str().unwrap()])?;
    assert!(
        out.contains("its trigger is schedule nightly (cron 0 3 * * * (Europe/Paris))"),
        "{out}"
    );
    let list = env.json(&["schedule", "list"])?;
    assert_eq!(list[0]["name"], "nightly");
    assert_eq!(list[0]["source"], "workflow");
    assert_eq!(list[0]["prompt"], "Nightly triage");
    ensure!(list[0]["next"].as_u64().is_some(), "{list}");
    // A version without a trigger removes it; `manual` is no trigger.
    let without = env.write("manual.yaml", flow("trigger:\n  type: manual\n"))?;
    env.ok(&["add", "nightly", without.to_str().unwrap()])?;
    assert_eq!(env.json(&["schedule", "list"])?, json!([]));
    // Rolling back brings the trigger back.
    env.ok(&["rollback", "nightly"])?;
    assert_eq!(env.json(&["schedule", "list"])?[0]["name"], "nightly");
    env.ok(&["remove", "nightly"])?;
    assert_eq!(env.json(&["schedule", "list"])?, json!([]));

    // Mistakes are located in the file.
    let bad =
        env.write("bad.yaml", flow("trigger:\n  type: cron\n  expression: \"61 * * * *\"\n"))?;
    let e = env.fails(&["add", "bad", bad.to_str().unwrap()], 65)?;
    assert!(
        e.contains("bad.yaml:4:15: cron expression `61 * * * *`: the minute field `61`: 61 is outside its range 0-59"),
        "{e}"
    );
    let bad = env.write(
        "bad2.yaml",
        flow("trigger:\n  type: poll\n  interval_seconds: 60\n  check_script: ./x.sh\n  diff_mode: some\n"),
    )?;
    let e = env.fails(&["add", "bad", bad.to_str().unwrap()], 65)?;
    assert!(
        e.contains("bad2.yaml:6:14: `diff_mode` is `new_items` or `any_change`, not `some`"),
        "{e}"
    );
    Ok(())
}

#[test]
fn any_change_fires_on_a_changed_output_and_failures_are_reported() -> Result<()> {
    let env = scheduling()?;
    // JSON objects, which solve-issue's declared input takes (its output is the data).
    let state = env.write("state.txt", r#"{"v": 1}"#)?;
    let script = env.write_script(
        "check.sh",
        format!(
            "#!/bin/sh\ncat {}\ngrep -q fail {0} && {{ echo broken >&2; exit 3; }}\nexit 0\n",
            state.display()
        ),
    )?;
    let script = script.display().to_string();
    add_poll(&env, &script, "any-change", "solve-issue", &[])?;
    env.json(&["schedule", "tick"])?; // the baseline
    env.advance(SECOND)?;
    let pass = env.json(&["schedule", "tick"])?;
    ensure!(pass["started"].as_array().unwrap().is_empty(), "unchanged output: {pass}");
    std::fs::write(&state, r#"{"v": 2}"#)?;
    env.advance(SECOND)?;
    let pass = env.json(&["schedule", "tick"])?;
    let started = pass["started"].as_array().unwrap();
    ensure!(started.len() == 1, "changed output: {pass}");
    let record = env.json(&["thread", started[0]["threadId"].as_str().unwrap()])?;
    assert_eq!(record["start"]["triggerData"], json!({"v": 2}));
    // A failing command: the tick says which schedule and why (the stderr's tail), exits 70.
    std::fs::write(&state, "fail")?;
    env.advance(SECOND)?;
    let run = env.run(&["schedule", "tick"])?;
    assert_eq!(run.code, 70, "{run:?}");
    assert!(
        run.stderr.contains("schedule solve-issue: poll command: `")
            && run.stderr.contains("failed with exit status 3: broken"),
        "{}",
        run.stderr
    );
    // With --json: one JSON document on one line, the failure in it, nothing on stderr. (A
    // failed check waits twice its interval before the next.)
    env.advance(SECOND)?;
    let pass = env.json(&["schedule", "tick"])?;
    ensure!(pass["errors"].as_array().is_none_or(|e| e.is_empty()), "backed off: {pass}");
    env.advance(SECOND)?;
    let run = env.run(&["schedule", "tick", "--json"])?;
    assert_eq!((run.code, run.stderr.as_str()), (70, ""), "{run:?}");
    assert_eq!(run.stdout.trim().lines().count(), 1, "{}", run.stdout);
    let pass: serde_json::Value = serde_json::from_str(&run.stdout)?;
    assert_eq!(pass["errors"][0]["schedule"], "solve-issue", "{pass}");
    assert!(pass["errors"][0]["error"].as_str().is_some_and(|e| e.contains("broken")), "{pass}");
    let list = env.ok(&["schedule", "list"])?;
    assert!(list.contains("failing: poll command"), "{list}");
    Ok(())
}

#[test]
fn repeated_ticks_fire_exactly_the_due_cron_instants() -> Result<()> {
    let env = scheduling()?;
    env.ok(&["schedule", "add", "solve-issue", "--cron", "* * * * * *", "-p", "Every second"])?;
    // Nothing is due before the first instant after the schedule was added.
    let pass = env.json(&["schedule", "tick"])?;
    ensure!(pass["started"].as_array().unwrap().is_empty(), "{pass}");
    for n in 1..=4 {
        env.advance(SECOND)?;
        let pass = env.json(&["schedule", "tick"])?;
        let started = pass["started"].as_array().context("started")?;
        ensure!(started.len() == 1, "one instant is due at each tick: {pass}");
        assert_eq!(instant(started[0]["firing"].as_str().unwrap())?, second(n));
    }
    // Off for three seconds: one firing (the latest instant), not three.
    env.advance(3 * SECOND)?;
    let pass = env.json(&["schedule", "tick"])?;
    let started = pass["started"].as_array().unwrap();
    ensure!(started.len() == 1, "missed instants fire once: {pass}");
    assert_eq!(instant(started[0]["firing"].as_str().unwrap())?, second(7));
    assert_eq!(exactly_once(&env, "solve-issue")?, 5);
    // The scheduled threads show their schedule; each has its instant as trigger data.
    let listing = env.ok(&["threads"])?;
    assert!(listing.lines().next().unwrap().contains("SCHEDULE"), "{listing}");
    let thread = &scheduled_threads(&env, "solve-issue")?[0];
    let record = env.json(&["thread", thread["threadId"].as_str().unwrap()])?;
    assert_eq!(record["start"]["triggerData"]["schedule"], "solve-issue");
    assert_eq!(record["start"]["parameters"]["prompt"], "Every second");
    let shown = env.ok(&["thread", thread["threadId"].as_str().unwrap()])?;
    assert!(shown.contains("started by schedule solve-issue (cron:"), "{shown}");
    Ok(())
}

#[test]
fn schedule_mistakes_are_one_clear_line() -> Result<()> {
    let env = scheduling()?;
    let e = env.fails(&["schedule", "add", "nope", "--cron", "* * * * *", "-p", "x"], 66)?;
    assert!(e.contains("no workflow named `nope`"), "{e}");
    let e = env.fails(&["schedule", "add", "solve-issue", "--cron", "* * *", "-p", "x"], 64)?;
    assert!(e.contains("cron expression `* * *`: it has 3 field(s); it needs 5"), "{e}");
    let e = env.fails(
        &["schedule", "add", "solve-issue", "--cron", "* * * * *", "--tz", "Mars/X", "-p", "x"],
        64,
    )?;
    assert!(e.contains("unknown time zone `Mars/X`"), "{e}");
    let e = env.fails(
        &[
            "schedule",
            "add",
            "solve-issue",
            "--poll",
            "./missing.sh",
            "--every",
            "1m",
            "--diff",
            "new-items",
        ],
        64,
    )?;
    assert!(e.contains("poll command: program `./missing.sh` does not exist"), "{e}");
    let e = env.fails(
        &["schedule", "add", "solve-issue", "--cron", "* * * * *", "--agent", "command:/no/such"],
        64,
    )?;
    assert!(e.contains("/no/such"), "{e}");
    env.ok(&["schedule", "add", "solve-issue", "--cron", "* * * * *", "--name", "n"])?;
    let e =
        env.fails(&["schedule", "add", "solve-issue", "--cron", "* * * * *", "--name", "n"], 64)?;
    assert!(e.contains("a schedule named `n` exists"), "{e}");
    let e = env.fails(&["schedule", "rm", "other"], 66)?;
    assert!(e.contains("no schedule named `other`"), "{e}");
    // Paused: listed so, and not fired; resumed: fires from then on.
    env.ok(&["schedule", "pause", "n"])?;
    assert_eq!(env.json(&["schedule", "list"])?[0]["paused"], true);
    env.ok(&["schedule", "resume", "n"])?;
    env.ok(&["schedule", "rm", "n"])?;
    // A schedule whose workflow was removed: its firing fails, is said so, and is not retried.
    env.ok(&["schedule", "add", "solve-issue", "--cron", "* * * * * *", "--name", "gone"])?;
    env.ok(&["remove", "solve-issue"])?;
    env.advance(SECOND)?;
    let run = env.run(&["schedule", "tick"])?;
    assert_eq!(run.code, 70, "{run:?}");
    assert!(
        run.stderr.contains("schedule gone: no workflow named `solve-issue`"),
        "{}",
        run.stderr
    );
    let list = env.json(&["schedule", "list"])?;
    assert!(list[0]["lastError"].as_str().unwrap().contains("no workflow named"), "{list}");
    let failed = firings(&env, "gone")?.iter().filter(|e| e.get("failed").is_some()).count();
    assert_eq!(failed, 1);
    env.ok(&["schedule", "rm", "gone"])?;
    // A workflow whose trigger cannot be registered is added, and the error says both.
    let flow = env.write(
        "polled.yaml",
        "description: d\ntrigger:\n  type: poll\n  interval_seconds: 60\n  check_script: ./absent.sh\n  diff_mode: new_items\nroles:\n  a:\n    description: A\nsteps:\n  - id: a\n    role: a\n",
    )?;
    let e = env.fails(&["add", "polled", flow.to_str().unwrap()], 64)?;
    assert!(
        e.contains("workflow `polled` was added (") && e.contains("but its `trigger:` was not registered: poll command: program `./absent.sh` does not exist"),
        "{e}"
    );
    // serve refuses a non-loopback address without a token.
    let e = env.fails(&["serve", "--listen", "0.0.0.0:0"], 64)?;
    assert!(e.contains("refusing to listen on 0.0.0.0:0 without a token"), "{e}");
    Ok(())
}

#[test]
fn serve_fires_a_cron_once_per_second() -> Result<()> {
    let env = scheduling()?;
    let serve = Serve::start(&env, &[], &[])?;
    env.ok(&["schedule", "add", "solve-issue", "--cron", "* * * * * *", "-p", "x", "--name", "s"])?;
    // Each second that passes fires its instant, once.
    for n in 1..=5 {
        env.advance(SECOND)?;
        wait_until("the second fires", || Ok(fired_keys(&env, "s")?.len() as u64 == n))?;
    }
    serve.stop()?;
    let keys = fired_keys(&env, "s")?;
    let instants: Vec<u64> = keys.iter().map(|k| instant(k)).collect::<Result<_>>()?;
    assert_eq!(instants, (1..=5).map(second).collect::<Vec<_>>());
    exactly_once(&env, "s")?;
    Ok(())
}

#[test]
fn serve_killed_mid_firing_and_restarted_starts_no_duplicate() -> Result<()> {
    let env = scheduling()?;
    env.ok(&["schedule", "add", "solve-issue", "--cron", "* * * * * *", "-p", "x", "--name", "c"])?;
    // `serve` dies like `kill -9` between recording its third firing and creating the thread.
    let mut serve = Serve::start(&env, &[], &[("UNCAGED_WORKFLOW_CRASH_AT", "schedule-fired:3")])?;
    for n in 1..=2 {
        env.advance(SECOND)?;
        wait_until("the second fires", || Ok(fired_keys(&env, "c")?.len() == n))?;
    }
    env.advance(SECOND)?;
    let status = serve.child.wait()?;
    ensure!(!status.success(), "serve crashed as told");
    let keys = fired_keys(&env, "c")?;
    assert_eq!(keys.len(), 3);
    // And killed with SIGKILL while it fires: just after it recorded a firing.
    let serve = Serve::start(&env, &[], &[])?;
    env.advance(SECOND)?;
    wait_until("the fourth second fires", || Ok(fired_keys(&env, "c")?.len() == 4))?;
    std::process::Command::new("kill").args(["-9", &serve.child.id().to_string()]).status()?;
    drop(serve);
    let serve = Serve::start(&env, &[], &[])?;
    env.advance(SECOND)?;
    wait_until("the fifth second fires", || Ok(fired_keys(&env, "c")?.len() == 5))?;
    serve.stop()?;
    assert_eq!(exactly_once(&env, "c")?, 5, "the restarted processes finished every firing");
    Ok(())
}

#[test]
fn two_firing_processes_never_double_fire() -> Result<()> {
    let env = scheduling()?;
    env.ok(&["schedule", "add", "solve-issue", "--cron", "* * * * * *", "-p", "x", "--name", "c"])?;
    let serve = Serve::start(&env, &[], &[])?;
    for _ in 0..3 {
        env.advance(SECOND)?;
        let ticks: Vec<_> = (0..2)
            .map(|_| {
                env.command().args(["schedule", "tick"]).stdout(std::process::Stdio::null()).spawn()
            })
            .collect::<std::io::Result<_>>()?;
        for mut tick in ticks {
            tick.wait()?;
        }
    }
    serve.stop()?;
    // Each second fired once, by whichever process came first.
    assert_eq!(exactly_once(&env, "c")?, 3);
    Ok(())
}
}
