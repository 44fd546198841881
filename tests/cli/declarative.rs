//! Declarative workflows: a YAML role graph or DAG becomes one bundle that behaves as a code
//! bundle does — the same steps as the Rust solve-issue, every validation error at its place,
//! the three failure policies, retries, and a worker killed during a parallel stage.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use crate::{Env, artifacts, read_jsonl, status, wait_until};

/// A workflow file of `bundles/`.
fn example(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../bundles").join(name);
    path.canonicalize().expect("the example exists").display().to_string()
}

fn hash_of(added: &Value) -> Result<String> {
    Ok(added["hash"].as_str().context("hash")?.to_string())
}

/// The step lines of a thread.
fn steps(env: &Env, hash: &str, thread: &str) -> Result<Vec<Value>> {
    Ok(env.thread_lines(hash, thread)?.into_iter().filter(|l| l.get("role").is_some()).collect())
}

/// The thread's end record.
fn end_of(env: &Env, hash: &str, thread: &str) -> Result<Value> {
    env.thread_lines(hash, thread)?
        .into_iter()
        .find_map(|l| l.get("end").cloned())
        .context("the thread has no end")
}

fn newest_thread(env: &Env) -> Result<String> {
    let threads = env.json(&["threads"])?;
    let last = threads.as_array().and_then(|t| t.last()).context("no thread")?;
    Ok(last["threadId"].as_str().context("threadId")?.to_string())
}

/// A command agent for triage: logs `start|done STEP` to `agents.log` and each call's input to
/// `inputs.jsonl`, and behaves per step as `behaviour.json` says: `fail` (always), `fail-once`,
/// or `gate` (wait for the file `gate`).
fn triage_agent(env: &Env, behaviour: Value) -> Result<String> {
    env.write("behaviour.json", behaviour.to_string())?;
    let dir = env.dir.path().display().to_string();
    let script = env.write_script(
        "triage-agent.py",
        format!(
            r#"#!/usr/bin/env python3
import json, os, sys, time
ctx = json.load(sys.stdin)
step = ctx["role"]["name"]
dir = "{dir}"
def log(event):
    with open(os.path.join(dir, "agents.log"), "a") as f:
        f.write(f"{{event}} {{step}}\n")
log("start")
with open(os.path.join(dir, "inputs.jsonl"), "a") as f:
    f.write(json.dumps({{"step": step, "input": ctx.get("input")}}) + "\n")
how = json.load(open(os.path.join(dir, "behaviour.json"))).get(step)
if how == "fail":
    sys.exit(1)
if how == "fail-once":
    marker = os.path.join(dir, step + ".failed")
    if not os.path.exists(marker):
        open(marker, "w").close()
        sys.exit(1)
if how == "gate":
    while not os.path.exists(os.path.join(dir, "gate")):
        if not os.path.isdir(dir):
            sys.exit(1)  # the test is over: do not wait for ever
        time.sleep(0.05)
answers = {{
    "fetch": {{"title": "Crash on empty file", "component": "parser"}},
    "summary": {{"priority": "P2", "reason": "contained"}},
}}
print(json.dumps(answers.get(step, {{"severity": "low", "finding": step + " looked"}})))
log("done")
"#
        ),
    )?;
    Ok(format!("command:{}", script.display()))
}

/// triage.yaml with another failure policy.
fn triage_with(env: &Env, policy: &str, retries: u32) -> Result<String> {
    let text = std::fs::read_to_string(example("triage.yaml"))?
        .replace("on_step_failure: skip_dependents", &format!("on_step_failure: {policy}"))
        .replace("max_retries: 1", &format!("max_retries: {retries}"))
        .replace("retry_delay_ms: 500", "retry_delay_ms: 50");
    Ok(env.write(&format!("triage-{policy}.yaml"), text)?.display().to_string())
}

/// The inputs each step's agent got (its last call's), by step, from `inputs.jsonl`.
fn inputs_by_step(env: &Env) -> Result<HashMap<String, Value>> {
    Ok(read_jsonl(&env.dir.path().join("inputs.jsonl"))?
        .into_iter()
        .map(|l| {
            let input: Value = serde_json::from_str(l["input"].as_str().unwrap_or("null")).unwrap();
            (l["step"].as_str().unwrap().to_string(), input["inputs"].clone())
        })
        .collect())
}

fn agent_log(env: &Env) -> Vec<String> {
    std::fs::read_to_string(env.dir.path().join("agents.log"))
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

/// (role, status, step) of each step line: the status of a `$status` record, else succeeded.
fn statuses(steps: &[Value]) -> Vec<(String, String)> {
    steps
        .iter()
        .map(|s| match s["role"].as_str() {
            Some("$status") => (
                s["meta"]["step"].as_str().unwrap_or_default().to_string(),
                s["meta"]["status"].as_str().unwrap_or_default().to_string(),
            ),
            Some("$user") => {
                ("$user".into(), s["meta"]["decision"].as_str().unwrap_or_default().into())
            }
            role => (role.unwrap_or_default().to_string(), "succeeded".into()),
        })
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

#[test]
fn kill_9_during_a_parallel_stage_then_resume_loses_and_repeats_nothing() -> Result<()> {
    let env = Env::new()?;
    let hash = hash_of(&env.json(&["add", "triage", &example("triage.yaml")])?)?;
    let agent = triage_agent(&env, json!({"docs": "gate"}))?;
    let thread =
        env.ok(&["run", "triage", "-p", "x", "--agent", &agent, "--detach"])?.trim().to_string();
    // Two analyses answered and were journaled; `docs` has started and waits at its gate.
    wait_until("docs is at work", || Ok(agent_log(&env).iter().any(|l| l == "start docs")))?;
    env.kill_once_journaled(&hash, &thread, 1, 2)?;
    assert_eq!(steps(&env, &hash, &thread)?.len(), 1, "no part of the stage is recorded");
    std::fs::write(env.dir.path().join("gate"), "")?;
    let out = env.ok(&["resume", &thread])?;
    assert!(out.contains("completed (0): all 5 steps succeeded"), "{out}");
    let steps = steps(&env, &hash, &thread)?;
    let ids: Vec<&str> = steps.iter().map(|s| s["role"].as_str().unwrap()).collect();
    assert_eq!(ids, ["fetch", "security", "performance", "docs", "summary"], "each step once");
    let log = agent_log(&env);
    let count = |line: &str| log.iter().filter(|l| *l == line).count();
    for step in ["fetch", "security", "performance", "summary"] {
        assert_eq!(count(&format!("start {step}")), 1, "{step} asked once: {log:?}");
    }
    assert_eq!(count("start docs"), 2, "the unanswered call, asked again: {log:?}");
    assert_eq!(count("done docs"), 1, "{log:?}");
    Ok(())
}

// Through the CLI only: each of these runs twice, on a home directory (`…::files`) and on a
// fresh PostgreSQL database (`…::postgres`). A test added here covers both stores.
on_both_stores! {
#[test]
fn a_damaged_function_cache_is_only_a_miss() -> Result<()> {
    let env = Env::new()?;
    env.own_cache()?;
    env.ok(&["add", "one", &example("plan-develop-review.yaml")])?;
    // Every compiled function garbled, or cut to nothing: the next compile redoes them.
    let mut damaged = 0;
    let mut dirs = vec![env.home().join("cache/functions")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let garbage: &[u8] = if damaged % 2 == 0 { b"garbage" } else { b"" };
                std::fs::write(&path, garbage)?;
                damaged += 1;
            }
        }
    }
    ensure!(damaged > 100, "the function cache holds the interpreter's functions ({damaged})");
    env.ok(&["add", "two", &example("solve-issue.yaml")])?;
    let out = env.ok(&["run", "two", "-p", "x"])?;
    assert!(out.contains("completed (0)"), "{out}");
    Ok(())
}

/// The middle stage's `security` fails (every attempt): each policy's statuses and return code.
#[test]
fn a_failing_middle_step_under_stop_and_skip_dependents() -> Result<()> {
    let env = Env::new()?;
    let agent = triage_agent(&env, json!({"security": "fail"}))?;
    for (policy, code, expected) in [
        (
            "stop",
            1,
            vec![
                ("fetch", "succeeded"),
                ("security", "failed"),
                ("performance", "succeeded"),
                ("docs", "succeeded"),
            ],
        ),
        (
            "skip_dependents",
            3,
            vec![
                ("fetch", "succeeded"),
                ("security", "failed"),
                ("performance", "succeeded"),
                ("docs", "succeeded"),
                ("summary", "skipped"),
            ],
        ),
    ] {
        let file = triage_with(&env, policy, 1)?;
        let hash = hash_of(&env.json(&["add", policy, &file])?)?;
        let run = env.run(&["run", policy, "-p", "x", "--agent", &agent])?;
        assert_eq!(run.code, code, "{policy}: {}{}", run.stdout, run.stderr);
        let thread = newest_thread(&env)?;
        assert_eq!(statuses(&steps(&env, &hash, &thread)?), pairs(&expected), "{policy}");
        let failed = &steps(&env, &hash, &thread)?[1];
        assert_eq!(
            failed["meta"]["error"],
            "agent failed: `triage-agent.py` failed with exit status 1 (after 2 attempts)".replace(
                "`triage-agent.py`",
                &format!("`{}`", env.dir.path().join("triage-agent.py").display())
            ),
            "{policy}: retried once"
        );
    }
    let log = agent_log(&env);
    assert_eq!(
        log.iter().filter(|l| *l == "start security").count(),
        4,
        "2 attempts × 2 threads: {log:?}"
    );
    Ok(())
}

/// A FIFO (or a directory) given as the workflow file is refused at once, not read: opening
/// a FIFO would wait for a writer forever.
#[test]
fn a_fifo_as_the_workflow_file_is_refused_not_waited_on() -> Result<()> {
    let env = Env::new()?;
    let fifo = env.dir.path().join("flow.yaml");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status()?;
    ensure!(made.success(), "mkfifo failed");
    let fifo = fifo.to_str().context("path")?;
    for args in [vec!["add", "f", fifo], vec!["build", fifo]] {
        let mut child = env
            .command()
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while child.try_wait()?.is_none() {
            if std::time::Instant::now() > deadline {
                child.kill()?;
                anyhow::bail!("`{}` hangs on a FIFO", args.join(" "));
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let out = child.wait_with_output()?;
        let stderr = String::from_utf8(out.stderr)?;
        assert_eq!(out.status.code(), Some(65), "{stderr}");
        assert!(stderr.contains("not a regular file"), "{stderr}");
    }
    Ok(())
}

/// `condition: null` is the fallback transition of the format's source documents: taken when
/// no condition before it holds. (A quoted `"null"` stays an expression, which never holds.)
#[test]
fn a_null_condition_is_the_fallback_transition() -> Result<()> {
    let env = Env::new()?;
    let flow = env.write(
        "fallback.yaml",
        "description: fallback\nroles:\n  a: {}\n  b: {}\n  c: {}\ngraph:\n  - from: $START\n    \
         transitions:\n      - {to: a}\n  - from: a\n    transitions:\n      \
         - {to: b, condition: \"$steps[-1].meta.go = true\"}\n      - {to: c, condition: null}\n  \
         - from: b\n    transitions:\n      - {to: $END}\n  - from: c\n    transitions:\n      \
         - {to: $END, condition: ~}\n",
    )?;
    let hash = hash_of(&env.json(&["add", "fallback", flow.to_str().context("path")?])?)?;
    let answers = env.write("answers.yaml", "a:\n  - {go: false}\n")?;
    let out = env.ok(&[
        "run",
        "fallback",
        "-p",
        "go?",
        "--agent",
        &format!("scripted:{}", answers.display()),
    ])?;
    assert!(out.contains("completed (0)"), "{out}");
    let roles: Vec<Value> =
        steps(&env, &hash, &newest_thread(&env)?)?.iter().map(|s| s["role"].clone()).collect();
    assert_eq!(roles, ["a", "c"], "the null condition was taken when the other did not hold");
    Ok(())
}

/// A file of several YAML documents is refused at the line where the second starts, instead
/// of losing every document after the first.
#[test]
fn a_second_yaml_document_is_refused_at_its_line() -> Result<()> {
    let env = Env::new()?;
    let flow = env.write(
        "two.yaml",
        "---\ndescription: one\nroles:\n  a: {}\ngraph:\n  - from: $START\n    transitions:\n      \
         - {to: a}\n  - from: a\n    transitions:\n      - {to: $END}\n---\ndescription: two\n",
    )?;
    let flow = flow.to_str().context("path")?;
    for args in [vec!["add", "two", flow], vec!["build", flow]] {
        let err = env.fails(&args, 65)?;
        assert!(err.contains("two.yaml:12:1: a second YAML document starts here"), "{err}");
    }
    ensure!(env.json(&["list"])?.as_array().is_some_and(|l| l.is_empty()), "nothing added");
    // One document with an explicit start and end marker is one document.
    env.write(
        "one.yaml",
        "---\ndescription: one\nroles:\n  a: {}\ngraph:\n  - from: $START\n    transitions:\n      \
         - {to: a}\n  - from: a\n    transitions:\n      - {to: $END}\n...\n",
    )?;
    env.ok(&["build", "one.yaml"])?;
    Ok(())
}

/// A `$status` record has no agent: its line shows its duration alone, with no stray comma.
#[test]
fn a_status_record_prints_without_an_agent() -> Result<()> {
    let env = Env::new()?;
    let agent = triage_agent(&env, json!({"security": "fail"}))?;
    env.json(&["add", "triage", &triage_with(&env, "stop", 0)?])?;
    let run = env.run(&["run", "triage", "-p", "x", "--agent", &agent])?;
    let status: Vec<&str> = run.stdout.lines().filter(|l| l.contains("] $status")).collect();
    ensure!(!status.is_empty(), "no $status line: {}", run.stdout);
    for line in status {
        let after_role = line.split("$status").nth(1).context("role")?.trim_start();
        ensure!(!after_role.starts_with(','), "stray comma: {line}");
        ensure!(after_role.split_whitespace().nth(1) == Some("ms"), "its duration: {line}");
    }
    Ok(())
}

#[test]
fn ask_user_waits_for_retry_skip_or_abort() -> Result<()> {
    let env = Env::new()?;
    let file = triage_with(&env, "ask_user", 0)?;
    let hash = hash_of(&env.json(&["add", "ask", &file])?)?;

    // retry: the step fails once, the person says retry, it succeeds, the DAG finishes.
    let agent = triage_agent(&env, json!({"security": "fail-once"}))?;
    let thread =
        env.ok(&["run", "ask", "-p", "x", "--agent", &agent, "--detach"])?.trim().to_string();
    wait_until("the thread waits", || Ok(status(&env, &thread)? == "waiting"))?;
    let shown = env.ok(&["thread", &thread])?;
    assert!(shown.contains("waiting"), "{shown}");
    env.ok(&["answer", &thread, "retry"])?;
    wait_until("the thread ends", || Ok(status(&env, &thread)? == "completed"))?;
    assert_eq!(end_of(&env, &hash, &thread)?["returnCode"], 0);
    let expected = [
        ("fetch", "succeeded"),
        ("security", "failed"),
        ("performance", "succeeded"),
        ("docs", "succeeded"),
        ("$user", "retry"),
        ("security", "succeeded"),
        ("summary", "succeeded"),
    ];
    assert_eq!(statuses(&steps(&env, &hash, &thread)?), pairs(&expected));

    // skip: the step and its dependents are skipped; abort: the thread fails.
    let agent = triage_agent(&env, json!({"security": "fail"}))?;
    for (answer, code, last) in
        [("skip", 3, ("summary", "skipped")), ("abort", 1, ("$user", "abort"))]
    {
        let thread =
            env.ok(&["run", "ask", "-p", "x", "--agent", &agent, "--detach"])?.trim().to_string();
        wait_until("the thread waits", || Ok(status(&env, &thread)? == "waiting"))?;
        let run = env.run(&["answer", &thread, answer])?;
        assert_eq!(run.code, code, "{answer}: {}{}", run.stdout, run.stderr);
        let statuses = statuses(&steps(&env, &hash, &thread)?);
        assert_eq!(statuses.last(), Some(&(last.0.to_string(), last.1.to_string())), "{answer}");
        assert_eq!(end_of(&env, &hash, &thread)?["returnCode"], code);
    }
    Ok(())
}

#[test]
fn build_gives_the_same_bytes_as_add_and_show_prints_the_yaml_and_its_graph() -> Result<()> {
    let env = Env::new()?;
    let yaml = example("triage.yaml");
    let one = env.dir.path().join("one.wasm");
    let two = env.dir.path().join("two.wasm");
    let built = env.json(&["build", &yaml, "-o", one.to_str().unwrap()])?;
    env.ok(&["build", &yaml, "-o", two.to_str().unwrap()])?;
    assert_eq!(std::fs::read(&one)?, std::fs::read(&two)?, "the same YAML, the same bytes");
    let from_yaml = hash_of(&env.json(&["add", "triage", &yaml])?)?;
    let from_wasm = hash_of(&env.json(&["add", "triage-built", one.to_str().unwrap()])?)?;
    assert_eq!((hash_of(&built)?, &from_yaml), (from_wasm.clone(), &from_wasm));

    let shown = env.ok(&["show", "triage-built"])?;
    assert!(shown.contains("declarative: the YAML below"), "{shown}");
    assert!(shown.contains(&std::fs::read_to_string(&yaml)?.trim().to_string()), "{shown}");
    let graph = env.ok(&["show", "triage", "--graph"])?;
    assert!(graph.starts_with("flowchart LR\n"), "{graph}");
    for edge in ["n0 --> n1", "n0 --> n2", "n0 --> n3", "n1 --> n4", "n2 --> n4", "n3 --> n4"] {
        assert!(graph.contains(edge), "{edge} in {graph}");
    }
    env.ok(&["add", "solve", &example("solve-issue.yaml")])?;
    let graph = env.ok(&["show", "solve", "--graph"])?;
    assert!(graph.contains(r#"n3 -->|"meta.approved = true"| n4"#), "{graph}");
    env.ok(&["add", "code", artifacts::SOLVE_ISSUE])?;
    let err = env.fails(&["show", "code", "--graph"], 64)?;
    assert!(err.contains("is code, not a declarative workflow"), "{err}");
    Ok(())
}

/// `build flow.yaml` in the file's own directory writes `flow.wasm` there, with the
/// permissions the umask gives (it is an artifact to share), not 0600.
#[test]
fn build_in_the_current_directory_honours_the_umask() -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new()?;
    std::fs::copy(example("solve-issue.yaml"), env.dir.path().join("flow.yaml"))?;
    let bin = env!("CARGO_BIN_EXE_uncaged-workflow");
    let out = env
        .command_of("sh")
        .args(["-c", "umask 027 && exec \"$0\" build flow.yaml", bin])
        .output()?;
    ensure!(out.status.success(), "build failed: {}", String::from_utf8_lossy(&out.stderr));
    let mode = std::fs::metadata(env.dir.path().join("flow.wasm"))?.permissions().mode() & 0o777;
    assert_eq!(mode, 0o640, "mode {mode:o}");
    Ok(())
}

/// Every validation error, with its exact message; none leaves anything in the home.
#[test]
fn each_validation_error_names_its_file_line_and_column() -> Result<()> {
    let env = Env::new()?;
    let graph =
        |roles: &str, graph: &str| format!("description: d\nroles:\n{roles}graph:\n{graph}");
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "syntax",
            "description: d\nroles: [a\n".into(),
            "3:1: YAML syntax: while parsing a flow sequence, expected ',' or ']'",
        ),
        (
            "unknown-key",
            graph("  a:\n    descripton: A\n", "  - from: $START\n    transitions:\n      - to: a\n"),
            "4:5: unknown key `descripton` (did you mean `description`?)",
        ),
        (
            "undeclared-role",
            graph("  planner: {}\n", "  - from: $START\n    transitions:\n      - to: planer\n"),
            "7:13: a transition to undeclared role `planer` (did you mean `planner`?)",
        ),
        (
            "unreachable-role",
            graph(
                "  a: {}\n  b: {}\n",
                "  - from: $START\n    transitions:\n      - to: a\n  - from: a\n    transitions:\n      - to: $END\n  - from: b\n    transitions:\n      - to: $END\n",
            ),
            "4:3: role `b` is not reached from $START",
        ),
        (
            "no-end",
            graph(
                "  a: {}\n",
                "  - from: $START\n    transitions:\n      - to: a\n  - from: a\n    transitions:\n      - to: a\n",
            ),
            "5:3: the graph has no path from $START to $END",
        ),
        (
            "cycle",
            "description: d\nsteps:\n  - id: a\n    description: A\n    depends_on: [c]\n  - id: b\n    description: B\n    depends_on: [a]\n  - id: c\n    description: C\n    depends_on: [b]\n".into(),
            "8:18: the steps form a dependency cycle: a → c → b → a",
        ),
        (
            "not-upstream",
            "description: d\nsteps:\n  - id: a\n    description: A\n  - id: b\n    description: B\n    inputs:\n      x: $steps.a.output\n".into(),
            "8:10: `$steps.a.output`: step `a` is not in the `depends_on` of `b` (add it there)",
        ),
        (
            // The DAG protocol's rule: a step reads only the steps it lists, not theirs.
            "transitive",
            "description: d\nsteps:\n  - id: a\n    description: A\n  - id: b\n    description: B\n    depends_on: [a]\n  - id: c\n    description: C\n    depends_on: [b]\n    inputs:\n      x: \"Fix ${steps.a.output.title}\"\n".into(),
            "12:10: `Fix ${steps.a.output.title}`: step `a` is not in the `depends_on` of `c` (add it there)",
        ),
        (
            "template",
            "description: d\nsteps:\n  - id: a\n    description: A\n    inputs:\n      x: \"see ${steps.a} now\"\n".into(),
            "6:10: `see ${steps.a} now`: `steps.a` is not a reference: expected `steps.<id>.output`",
        ),
        (
            "when-not-a-dependency",
            "description: d\nsteps:\n  - id: a\n    description: A\n  - id: b\n    description: B\n    when: $steps.a.output.x = 1\n".into(),
            "7:18: `when`: step `a` is not in the `depends_on` of `b` (add it there)",
        ),
        (
            "when-syntax",
            "description: d\nsteps:\n  - id: a\n    description: A\n    when: \"$count($trigger_data) >\"\n".into(),
            "5:34: `when: $count($trigger_data) >`: does not parse: The symbol `(end)` cannot be used as a unary operator",
        ),
        (
            "continue-for-the-workflow",
            "description: d\nsteps:\n  - id: a\n    description: A\nfailure_policy:\n  on_step_failure: continue\n".into(),
            "6:20: `on_step_failure` is one of `stop`, `skip_dependents`, `ask_user`, not `continue` (`continue` is a step's own `on_failure`)",
        ),
        (
            "retry-delay",
            "description: d\nsteps:\n  - id: a\n    description: A\n    retry: {max: 2, delay: 500}\n".into(),
            "5:28: `retry.delay`: `500` is not a duration (write `500ms`, `2s`, `1m`)",
        ),
        (
            "item-outside-a-fan-out",
            "description: d\nsteps:\n  - id: a\n    description: A\n    inputs:\n      x: $item.name\n".into(),
            "6:10: `$item.name`: `$item` and `$index` are the item at hand of a `for_each` step, and `a` has none",
        ),
        (
            "max-parallel-alone",
            "description: d\nsteps:\n  - id: a\n    description: A\n    max_parallel: 4\n".into(),
            "5:19: `max_parallel` applies to a `for_each` step",
        ),
        (
            "timeout",
            "description: d\nsteps:\n  - id: a\n    description: A\n    timeout: 0s\n".into(),
            "5:14: `timeout`: `0s` is not a duration from 1ms to 24h (write `30s`, `10m`)",
        ),
        (
            "reference-limit-in-a-graph",
            format!("{}reference_limit: 10\n", graph("  a: {}\n", "  - from: $START\n    transitions:\n      - to: a\n  - from: a\n    transitions:\n      - to: $END\n")),
            "11:18: `reference_limit` applies to `steps`, not to a `graph`",
        ),
        (
            "no-such-step",
            "description: d\nsteps:\n  - id: a\n    description: A\n    inputs:\n      x: $steps.zz.output.title\n".into(),
            "6:10: `$steps.zz.output.title`: there is no step `zz`",
        ),
        (
            "expression",
            graph(
                "  a: {}\n",
                "  - from: $START\n    transitions:\n      - to: a\n        condition: meta.approved =\n  - from: a\n    transitions:\n      - to: $END\n",
            ),
            "8:35: condition `meta.approved =`: does not parse: The symbol `(end)` cannot be used as a unary operator",
        ),
        (
            "function",
            graph(
                "  a: {}\n",
                "  - from: $START\n    transitions:\n      - to: a\n        condition: $frobnicate(meta)\n  - from: a\n    transitions:\n      - to: $END\n",
            ),
            "8:20: condition `$frobnicate(meta)`: unsupported JSONata function `$frobnicate` (see the reference for the supported list)",
        ),
        (
            "schema",
            graph(
                "  a:\n    schema:\n      type: objekt\n",
                "  - from: $START\n    transitions:\n      - to: a\n  - from: a\n    transitions:\n      - to: $END\n",
            ),
            "5:11: role `a`: not a valid JSON Schema: \"objekt\" is not valid under any of the schemas listed in the 'anyOf' keyword",
        ),
    ];
    for (name, yaml, expected) in &cases {
        let file = env.write(&format!("{name}.yaml"), yaml)?;
        for command in [vec!["add", "x"], vec!["build"]] {
            let mut args = command.clone();
            let file = file.display().to_string();
            args.push(&file);
            let err = env.fails(&args, 65)?;
            assert_eq!(err.trim(), format!("uncaged-workflow: {file}:{expected}"), "case {name}");
        }
    }
    assert_eq!(env.written()?, Vec::<std::path::PathBuf>::new(), "a failed add wrote to the home");
    Ok(())
}

#[test]
fn pause_and_kill_stop_a_declarative_thread_as_they_stop_any() -> Result<()> {
    let env = Env::new()?;
    let hash = hash_of(&env.json(&["add", "triage", &example("triage.yaml")])?)?;
    let agent = triage_agent(&env, json!({"docs": "gate"}))?;
    let gate = env.dir.path().join("gate");

    // A pause asked during the parallel stage lands after the whole stage.
    let thread =
        env.ok(&["run", "triage", "-p", "x", "--agent", &agent, "--detach"])?.trim().to_string();
    wait_until("the stage is at work", || Ok(agent_log(&env).iter().any(|l| l == "start docs")))?;
    env.ok(&["pause", &thread])?;
    std::fs::write(&gate, "")?;
    wait_until("the thread pauses", || Ok(status(&env, &thread)? == "paused"))?;
    assert_eq!(steps(&env, &hash, &thread)?.len(), 4, "fetch and the whole stage, no summary");
    let out = env.ok(&["resume", &thread])?;
    assert!(out.contains("completed (0): all 5 steps succeeded"), "{out}");

    // A kill during the stage ends the thread `killed`, the stage unrecorded.
    std::fs::remove_file(&gate)?;
    let thread =
        env.ok(&["run", "triage", "-p", "x", "--agent", &agent, "--detach"])?.trim().to_string();
    wait_until("the stage is at work", || {
        Ok(agent_log(&env).iter().filter(|l| *l == "start docs").count() == 2)
    })?;
    env.ok(&["kill", &thread])?;
    wait_until("the thread is killed", || Ok(status(&env, &thread)? == "killed"))?;
    assert_eq!(steps(&env, &hash, &thread)?.len(), 1, "only fetch");
    Ok(())
}

#[test]
fn the_002_graph_stops_when_the_planner_needs_clarification() -> Result<()> {
    let env = Env::new()?;
    let hash = hash_of(&env.json(&["add", "pdr", &example("plan-develop-review.yaml")])?)?;
    let unclear = env.write("unclear.yaml", "planner:\n  - {needsClarification: Which page?}\n")?;
    let out = env.ok(&[
        "run",
        "pdr",
        "-p",
        "fix login",
        "--agent",
        &format!("scripted:{}", unclear.display()),
    ])?;
    assert!(out.contains("completed (0): reached $END after `planner` (1 step)"), "{out}");
    let answers =
        env.write("answers.yaml", "reviewer:\n  - {approved: false}\n  - {approved: true}\n")?;
    env.ok(&[
        "run",
        "pdr",
        "-p",
        "fix login",
        "--agent",
        &format!("scripted:{}", answers.display()),
    ])?;
    let roles: Vec<Value> =
        steps(&env, &hash, &newest_thread(&env)?)?.iter().map(|s| s["role"].clone()).collect();
    assert_eq!(roles, ["planner", "developer", "reviewer", "developer", "reviewer"]);
    Ok(())
}

#[test]
fn thread_start_step_and_fork_work_on_a_declarative_bundle() -> Result<()> {
    let env = Env::new()?;
    let hash = hash_of(&env.json(&["add", "triage", &example("triage.yaml")])?)?;
    let thread = env.ok(&["thread", "start", "triage", "-p", "x"])?.trim().to_string();
    env.ok(&["step", &thread])?;
    env.ok(&["step", &thread])?;
    assert_eq!(steps(&env, &hash, &thread)?.len(), 4, "fetch, then the stage of three");
    let forked = env.ok(&["fork", &thread, "--at", "1"])?;
    ensure!(forked.contains("completed (0): all 5 steps succeeded"), "{forked}");
    Ok(())
}

#[test]
fn triage_runs_three_analyses_at_once_on_the_fetched_issue() -> Result<()> {
    let env = Env::new()?;
    let hash = hash_of(&env.json(&["add", "triage", &example("triage.yaml")])?)?;
    let agent = triage_agent(&env, json!({}))?;
    let out = env.ok(&["run", "triage", "-p", "It crashes", "--agent", &agent])?;
    assert!(out.contains("completed (0): all 5 steps succeeded"), "{out}");
    let thread = newest_thread(&env)?;
    let steps = steps(&env, &hash, &thread)?;
    let groups: Vec<Value> = steps.iter().map(|s| s["group"].clone()).collect();
    let group = json!({"first": 2, "size": 3});
    assert_eq!(groups, [Value::Null, group.clone(), group.clone(), group, Value::Null]);
    // Inputs reach each agent resolved: the prompt, an upstream meta, a field of one.
    let inputs = inputs_by_step(&env)?;
    assert_eq!(inputs["fetch"], json!({"issue": "It crashes"}));
    assert_eq!(
        inputs["security"],
        json!({"issue": {"title": "Crash on empty file", "component": "parser"}})
    );
    assert_eq!(inputs["docs"], json!({"component": "parser"}));
    assert_eq!(inputs["summary"]["docs"], json!({"severity": "low", "finding": "docs looked"}));
    Ok(())
}

/// A step whose `when` does not hold is skipped, saying why, and so is the step that needs it;
/// the run still succeeds. Strings embed references (`${…}`, `$${` for the text), and an
/// output over the workflow's `reference_limit` reaches the next step cut and marked.
#[test]
fn a_false_when_skips_its_step_and_references_embed_and_truncate() -> Result<()> {
    let env = Env::new()?;
    let text = std::fs::read_to_string(example("triage.yaml"))?
        .replace(
            "    description: Security impact.\n",
            "    description: Security impact.\n    when: $steps.fetch.output.component = 'auth'\n",
        )
        .replace(
            "      component: $steps.fetch.output.component\n",
            "      component: $steps.fetch.output.component\n      \
             note: \"Look at ${steps.fetch.output.component} (for ${prompt}), not $${HOME}\"\n",
        )
        .replace("failure_policy:", "reference_limit: 30\nfailure_policy:");
    let file = env.write("triage-when.yaml", text)?;
    let hash = hash_of(&env.json(&["add", "triage", &file.display().to_string()])?)?;
    let agent = triage_agent(&env, json!({}))?;
    let run = env.run(&["run", "triage", "-p", "It crashes", "--agent", &agent])?;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("3 of 5 steps succeeded; skipped: security, summary"), "{run:?}");
    let thread = newest_thread(&env)?;
    let steps = steps(&env, &hash, &thread)?;
    let skipped: Vec<(&str, &str)> = steps
        .iter()
        .filter(|s| s["meta"]["status"] == "skipped")
        .map(|s| (s["meta"]["step"].as_str().unwrap(), s["meta"]["reason"].as_str().unwrap()))
        .collect();
    assert_eq!(
        skipped,
        [
            ("security", "its condition `$steps.fetch.output.component = 'auth'` is false"),
            ("summary", "it depends on `security`, which was skipped"),
        ]
    );
    assert!(!agent_log(&env).iter().any(|l| l.ends_with("security")), "never asked");
    // The condition shows on the graph, on the edge into the step.
    let graph = env.ok(&["show", "triage", "--graph"])?;
    assert!(graph.contains("-->|\"when $steps.fetch.output.component = 'auth'\"|"), "{graph}");
    let inputs = inputs_by_step(&env)?;
    assert_eq!(inputs["docs"]["note"], json!("Look at parser (for It crashes), not ${HOME}"));
    let cut = inputs["performance"]["issue"].as_str().context("a cut output is text")?;
    assert!(cut.ends_with("[truncated]") && cut.len() == 30 + "[truncated]".len(), "{cut}");
    Ok(())
}

/// A step's own `retry` and `on_failure` override the workflow's policy: under `stop` with no
/// retries, a step that continues on failure (after its own retries) lets the steps after it
/// run on its null output, and a step retried once succeeds at its second attempt.
#[test]
fn a_steps_own_retry_and_on_failure_override_the_workflows() -> Result<()> {
    let env = Env::new()?;
    let text = triage_with(&env, "stop", 0)?;
    let text = std::fs::read_to_string(&text)?
        .replace(
            "    description: Security impact.\n",
            "    description: Security impact.\n    on_failure: continue\n    \
             retry: {max: 2, delay: 10ms, backoff: 1.5, max_delay: 1s}\n",
        )
        .replace(
            "    description: Documentation impact.\n",
            "    description: Documentation impact.\n    retry: {max: 1, delay: 10ms}\n",
        );
    let file = env.write("triage-own.yaml", text)?;
    let hash = hash_of(&env.json(&["add", "triage", &file.display().to_string()])?)?;
    let agent = triage_agent(&env, json!({"security": "fail", "docs": "fail-once"}))?;
    let run = env.run(&["run", "triage", "-p", "It crashes", "--agent", &agent])?;
    assert_eq!(run.code, 3, "{run:?}");
    assert!(run.stdout.contains("4 of 5 steps succeeded; failed: security"), "{run:?}");
    let log = agent_log(&env);
    let count = |what: &str| log.iter().filter(|l| l.as_str() == what).count();
    assert_eq!((count("start security"), count("start docs"), count("done docs")), (3, 2, 1));
    assert_eq!(count("done summary"), 1, "the summary ran on the failed step's null: {log:?}");
    let thread = newest_thread(&env)?;
    let failed = steps(&env, &hash, &thread)?
        .into_iter()
        .find(|s| s["meta"]["status"] == "failed")
        .context("security's failure is recorded")?;
    assert_eq!(failed["meta"]["step"], "security");
    assert!(failed["meta"]["error"].as_str().unwrap().ends_with("(after 3 attempts)"), "{failed}");
    assert_eq!(inputs_by_step(&env)?["summary"]["security"], Value::Null);
    Ok(())
}

/// A plan as the DAG protocol's planner gives it (`PlannerOutput`, JSON, with its `name`,
/// `schema_version`, and each step's `agent` and `position`) is added as it is, and runs.
#[test]
fn a_dag_protocol_plan_in_json_is_added_as_it_is() -> Result<()> {
    let env = Env::new()?;
    let plan = json!({
        "name": "Weekly report",
        "schema_version": "1.0",
        "description": "Gather the week's issues and write a report",
        "trigger": {"type": "manual"},
        "steps": [
            {"id": "gather", "description": "Gather the week's issues",
             "expected_output": "A list of issues", "agent": "claude", "inputs": {},
             "depends_on": [], "position": {"x": 0, "y": 0}},
            {"id": "write-report", "description": "Write the report",
             "agent": "claude", "inputs": {"issues": "$steps.gather.output", "for": "$trigger_data"},
             "depends_on": ["gather"], "position": {"x": 200, "y": 0}}
        ],
        "failure_policy": {"on_step_failure": "stop", "max_retries": 0, "retry_delay_ms": 5000}
    });
    let file = env.write("plan.json", serde_json::to_string_pretty(&plan)?)?;
    env.json(&["add", "report", &file.display().to_string()])?;
    let run = env.run(&["run", "report", "-p", "this week"])?;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("all 2 steps succeeded"), "{run:?}");
    // A version this does not read is refused at its line.
    let newer = serde_json::to_string_pretty(&json!({"schema_version": "2.0", "description": "d",
        "steps": [{"id": "a", "description": "A"}]}))?;
    let file = env.write("newer.json", newer)?;
    let e = env.fails(&["add", "newer", &file.display().to_string()], 65)?;
    assert!(e.contains("newer.json:3:21: `schema_version` `2.0` is not one this reads (1.0)"), "{e}");
    Ok(())
}

/// A step's `timeout`: past it the agent call is cancelled — its process killed — and the step
/// fails as timed out, under its policy (here: its dependents are skipped).
#[test]
fn a_step_past_its_timeout_is_cancelled_and_fails_under_its_policy() -> Result<()> {
    let env = Env::new()?;
    let text = std::fs::read_to_string(triage_with(&env, "skip_dependents", 0)?)?.replace(
        "    description: Documentation impact.\n",
        "    description: Documentation impact.\n    timeout: 300ms\n",
    );
    let file = env.write("triage-timeout.yaml", text)?;
    let hash = hash_of(&env.json(&["add", "triage", &file.display().to_string()])?)?;
    // `docs` waits at a gate nobody opens.
    let agent = triage_agent(&env, json!({"docs": "gate"}))?;
    let run = env.run(&["run", "triage", "-p", "It crashes", "--agent", &agent])?;
    assert_eq!(run.code, 3, "{run:?}");
    let thread = newest_thread(&env)?;
    let failed = steps(&env, &hash, &thread)?
        .into_iter()
        .find(|s| s["meta"]["status"] == "failed")
        .context("docs' failure is recorded")?;
    assert_eq!(failed["meta"]["step"], "docs");
    let error = failed["meta"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("timed out: the step's timeout of 300ms passed"), "{error}");
    // The agent was stopped, not left waiting at its gate.
    let script = env.dir.path().join("triage-agent.py").display().to_string();
    wait_until("the timed-out agent is gone", || {
        let alive = crate::processes_where("cmdline", |c| {
            String::from_utf8_lossy(c).contains(&script)
        });
        Ok(alive.is_empty())
    })?;
    assert!(!agent_log(&env).contains(&"done docs".to_string()));
    Ok(())
}

#[test]
fn yaml_and_rust_solve_issue_give_the_same_steps_and_return_codes() -> Result<()> {
    let env = Env::new()?;
    let rust = hash_of(&env.json(&["add", "rust", artifacts::SOLVE_ISSUE])?)?;
    let yaml = hash_of(&env.json(&["add", "yaml", &example("solve-issue.yaml")])?)?;
    let demo = format!("scripted:{}", example("solve-issue/demo-answers.yaml"));
    // A reviewer who never approves runs both into their max rounds.
    let never = env.write("never.yaml", "reviewer:\n  - {approved: false, comments: [again]}\n")?;
    let never = format!("scripted:{}", never.display());
    for (agent, code) in [(demo.as_str(), 0), (never.as_str(), 2)] {
        let mut seen = Vec::new();
        for (name, hash) in [("rust", &rust), ("yaml", &yaml)] {
            let run =
                env.run(&["run", name, "-p", "Fix the empty-file crash", "--agent", agent])?;
            ensure!(run.code == code, "{name} with {agent} exited {}: {}", run.code, run.stderr);
            let thread = newest_thread(&env)?;
            let steps: Vec<Value> = steps(&env, hash, &thread)?
                .into_iter()
                .map(|s| json!([s["role"], s["content"], s["meta"]]))
                .collect();
            seen.push((steps, end_of(&env, hash, &thread)?["returnCode"].clone()));
        }
        assert_eq!(seen[0], seen[1], "the same steps and return code with {agent}");
        assert_eq!(seen[0].1, json!(code));
    }
    Ok(())
}
}

on_both_stores! {
/// `${…}` in a step's `description` and `expected_output` is resolved for each call, as in its
/// `inputs`, and checked at `add` by the same rule (at 4abdda5 the agent got the text with
/// `${steps.list.output}` in it, and a reference outside `depends_on` was accepted): the agent
/// is given the resolved instructions in its input, its prompt says so, and the unresolved
/// text reaches it nowhere.
#[test]
fn references_in_a_description_are_resolved_for_each_call() -> Result<()> {
    let env = Env::new()?;
    let flow = |sum: &str| {
        format!(
            "description: Sum up\nsteps:\n  - id: list\n    description: List the files.\n  \
             - id: sum\n{sum}    depends_on: [list]\n"
        )
    };
    let good = env.write(
        "sum.yaml",
        flow("    description: \"Summarise ${steps.list.output.files} for ${prompt}.\"\n    \
              expected_output: \"A verdict on ${steps.list.output.title}\"\n"),
    )?;
    env.ok(&["add", "sum", good.to_str().context("path")?])?;
    let log = env.dir.path().join("contexts.jsonl");
    let agent = env.write_script(
        "agent.py",
        format!(
            r#"#!/usr/bin/env python3
import json, sys
ctx = json.load(sys.stdin)
with open("{}", "a") as f:
    f.write(json.dumps(ctx) + "\n")
if ctx["role"]["name"] == "list":
    print(json.dumps({{"files": ["a.rs", "b.rs"], "title": "Crash"}}))
else:
    print(json.dumps({{"verdict": "fine"}}))
"#,
            log.display()
        ),
    )?;
    let run = env.run(&["run", "sum", "-p", "the release", "--agent", &format!("command:{}", agent.display())])?;
    ensure!(run.code == 0, "{run:?}");
    let contexts = read_jsonl(&log)?;
    let sum = contexts.iter().find(|c| c["role"]["name"] == "sum").context("the sum step's call")?;
    let input: Value = serde_json::from_str(sum["input"].as_str().context("an input")?)?;
    assert_eq!(input["instructions"], "Summarise [\"a.rs\",\"b.rs\"] for the release.", "{input}");
    assert_eq!(input["expected_output"], "A verdict on Crash", "{input}");
    let prompt = sum["role"]["systemPrompt"].as_str().context("a system prompt")?;
    ensure!(prompt.contains("`instructions`") && prompt.contains("`expected_output`"), "{prompt}");
    ensure!(!sum.to_string().contains("${"), "unresolved text reached the agent: {sum}");

    // Checked at `add`: a step the description reads must be one it depends on.
    let outside = env.write(
        "outside.yaml",
        "description: d\nsteps:\n  - id: list\n    description: List.\n  - id: sum\n    \
         description: \"Summarise ${steps.list.output}\"\n",
    )?;
    let e = env.fails(&["add", "outside", outside.to_str().context("path")?], 65)?;
    ensure!(e.contains("outside.yaml:6:18") && e.contains("is not in the `depends_on` of `sum`"), "{e}");
    Ok(())
}
}
