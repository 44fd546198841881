//! Child workflows: a DAG step with `workflow:` runs another registered workflow as a thread of
//! its own, its inputs the child's trigger data and its description the child's prompt; the
//! child's result is the step's output. The parent waits with no worker busy, kill and pause
//! reach its children, the links show, and a crash on either side starts no second child and
//! re-asks no answered call.

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use crate::{Env, status, wait_until};

/// The child: reads the change it is given, and gives a verdict on it.
const REVIEW_FILE: &str = r#"description: Review one file
steps:
  - id: read
    description: Read the file.
    inputs: {change: $trigger_data}
  - id: verdict
    description: Give a verdict.
    depends_on: [read]
    inputs: {read: $steps.read.output}
"#;

/// The parent: lists the files, runs the child for each, and sums the verdicts up.
const REVIEW_ALL: &str = r#"description: Review every changed file
steps:
  - id: list
    description: List the changed files.
    inputs: {change: $prompt}
  - id: review
    description: Review one file.
    workflow: review-file
    depends_on: [list]
    for_each: $steps.list.output.files
    max_parallel: 2
    inputs: {file: $item}
  - id: sum
    description: Sum the verdicts up.
    depends_on: [review]
    inputs: {verdicts: $steps.review.output}
"#;

const FILES: [&str; 3] = ["a.rs", "b.rs", "c.rs"];

/// A command agent for both workflows: logs `THREAD ROLE FILE` for each call to `calls.log`,
/// waits in a child's steps while `gate` exists (for the tests that stop threads mid-step),
/// and answers by role.
fn agent(env: &Env) -> Result<String> {
    let dir = env.dir.path().display().to_string();
    let script = env.write_script(
        "agent.py",
        format!(
            r#"#!/usr/bin/env python3
import json, os, sys, time
ctx = json.load(sys.stdin)
role = ctx["role"]["name"]
given = (json.loads(ctx.get("input") or "null") or {{}}).get("inputs", {{}})
def field(value, key):
    return value.get(key) if isinstance(value, dict) else None
file = field(given.get("change"), "file") or field(given.get("read"), "file") or "-"
while role in ("read", "verdict") and os.path.exists(os.path.join("{dir}", "gate")):
    time.sleep(0.02)
with open(os.path.join("{dir}", "calls.log"), "a") as f:
    f.write(f"{{sys.argv[-1]}} {{role}} {{file}}\n")
answers = {{
    "list": {{"files": {files}}},
    "read": {{"file": file}},
    "verdict": {{"file": file, "verdict": "fine"}},
    "sum": {{"verdict": "all fine"}},
    "wait": {{"waited": True}},
}}
print(json.dumps(answers[role]))
"#,
            files = serde_json::to_string(&FILES)?
        ),
    )?;
    Ok(format!("command:{}", script.display()))
}

/// The calls the agent answered: (thread, role, file).
fn calls(env: &Env) -> Vec<(String, String, String)> {
    std::fs::read_to_string(env.dir.path().join("calls.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split(' ').collect();
            Some((w.first()?.to_string(), w.get(1)?.to_string(), w.get(2)?.to_string()))
        })
        .collect()
}

fn add_both(env: &Env) -> Result<()> {
    add_both_with(env, REVIEW_ALL)
}

fn add_both_with(env: &Env, parent: &str) -> Result<()> {
    let child = env.write("review-file.yaml", REVIEW_FILE)?;
    env.ok(&["add", "review-file", &child.display().to_string()])?;
    let parent = env.write("review-all.yaml", parent)?;
    env.ok(&["add", "review-all", &parent.display().to_string()])?;
    Ok(())
}

/// The threads of `workflow`, oldest first.
fn threads_of(env: &Env, workflow: &str) -> Result<Vec<Value>> {
    let mut list: Vec<Value> =
        env.json(&["threads", workflow])?.as_array().context("threads")?.clone();
    list.sort_by_key(|t| t["threadId"].as_str().unwrap_or_default().to_string());
    Ok(list)
}

/// Checks a finished `review-all` thread: completed, one completed child per file with the
/// file as its trigger data, the children's results as the fan-out's output in order, and
/// every agent call asked exactly once.
fn check_finished(env: &Env, parent: &str) -> Result<()> {
    let record = env.json(&["thread", parent])?;
    // Why it ended otherwise, when it did: its end record and its children.
    ensure!(
        record["status"] == "completed",
        "parent {parent} is {}: end {}; children {}",
        record["status"],
        record["end"],
        record["children"]
    );
    let children = threads_of(env, "review-file")?;
    ensure!(children.len() == FILES.len(), "one child per file: {children:?}");
    let mut files = Vec::new();
    for child in &children {
        ensure!(child["parent"] == parent, "{child}");
        ensure!(child["status"] == "completed", "{child}");
        let record = env.json(&["thread", child["threadId"].as_str().context("id")?])?;
        assert_eq!(record["start"]["parameters"]["prompt"], "Review one file.");
        assert_eq!(record["start"]["parent"]["role"], "review");
        files.push(record["start"]["triggerData"]["file"].as_str().context("file")?.to_string());
    }
    files.sort();
    assert_eq!(files, FILES);
    let record = env.json(&["thread", parent])?;
    let review = &record["steps"][1];
    assert_eq!(review["role"], "review");
    assert_eq!(review["agent"], "workflow:review-file");
    let verdicts: Vec<Value> =
        FILES.iter().map(|f| json!({"file": f, "verdict": "fine"})).collect();
    assert_eq!(review["meta"], json!(verdicts), "the children's results, in the items' order");
    assert_eq!(record["children"].as_array().map(Vec::len), Some(FILES.len()), "{record}");
    // Each call asked once: the parent's two, and each child's two.
    let mut asked = calls(env);
    asked.sort();
    let before = asked.len();
    asked.dedup();
    ensure!(asked.len() == before, "a call was asked twice: {:?}", calls(env));
    ensure!(asked.len() == 2 + 2 * FILES.len(), "{asked:?}");
    Ok(())
}

on_both_stores! {
/// A step runs a child per item; `run` follows the parent through its wait to its end, and
/// the listings link parent and children.
#[test]
fn a_step_runs_a_child_workflow_per_item_and_gets_their_results() -> Result<()> {
    let env = Env::new()?;
    add_both(&env)?;
    let agent = agent(&env)?;
    let run = env.run(&["run", "review-all", "-p", "the change", "--agent", &agent])?;
    assert_eq!(run.code, 0, "{run:?}");
    // A local worker says when the parent starts waiting; a queued thread is followed through
    // the store, where a wait on a child reads as work in progress.
    ensure!(env.store.is_some() || run.stdout.contains("runs child thread"), "{}", run.stdout);
    assert!(run.stdout.contains("completed (0): all 3 steps succeeded"), "{}", run.stdout);
    let parent = threads_of(&env, "review-all")?[0]["threadId"].as_str().context("id")?.to_string();
    check_finished(&env, &parent)?;
    let listing = env.ok(&["threads"])?;
    assert!(listing.lines().next().unwrap_or_default().contains("PARENT"), "{listing}");
    let shown = env.ok(&["thread", &parent])?;
    assert_eq!(shown.matches("child thread ").count(), FILES.len(), "{shown}");
    let child = threads_of(&env, "review-file")?[0]["threadId"].as_str().context("id")?.to_string();
    let shown = env.ok(&["thread", &child])?;
    assert!(shown.contains(&format!("child of thread {parent} (its step `review`)")), "{shown}");
    Ok(())
}

/// A child workflow that is not registered fails the step (and, under `stop`, the thread);
/// a workflow that runs itself stops at the depth limit instead of filling the disk.
#[test]
fn a_missing_child_fails_its_step_and_children_nest_only_so_deep() -> Result<()> {
    let env = Env::new()?;
    let flow = env.write(
        "orphan.yaml",
        "description: Runs a child nobody added\nsteps:\n  - id: review\n    description: Review.\n    workflow: nowhere\n",
    )?;
    env.ok(&["add", "orphan", &flow.display().to_string()])?;
    let run = env.run(&["run", "orphan", "-p", "x"])?;
    assert_ne!(run.code, 0, "{run:?}");
    let thread = threads_of(&env, "orphan")?[0]["threadId"].as_str().context("id")?.to_string();
    let shown = env.ok(&["thread", &thread])?;
    assert!(shown.contains("child workflow `nowhere`: no workflow named `nowhere`"), "{shown}");
    let flow = env.write(
        "again.yaml",
        "description: Runs itself\nsteps:\n  - id: deeper\n    description: Go deeper.\n    workflow: again\n",
    )?;
    env.ok(&["add", "again", &flow.display().to_string()])?;
    let run = env.run(&["run", "again", "-p", "x"])?;
    assert_ne!(run.code, 0, "{run:?}");
    let all = threads_of(&env, "again")?;
    assert_eq!(all.len(), 9, "the thread and 8 nested children: {all:?}");
    ensure!(all.iter().all(|t| t["status"] == "failed"), "{all:?}");
    let deepest = all[8]["threadId"].as_str().context("id")?.to_string();
    let shown = env.ok(&["thread", &deepest])?;
    assert!(shown.contains("child workflows nest deeper than 8"), "{shown}");
    Ok(())
}
}

/// `kill` of a parent kills the child it waits on; `pause` pauses the child after its step,
/// and `resume` of the parent resumes the child, whose end continues the parent.
#[test]
fn kill_and_pause_of_a_parent_reach_its_child() -> Result<()> {
    for action in ["kill", "pause"] {
        let env = Env::new()?;
        add_both(&env)?;
        let agent = agent(&env)?;
        // The children stop at their first call, held by the gate.
        let gate = env.dir.path().join("gate");
        std::fs::write(&gate, "")?;
        env.ok(&["run", "review-all", "-p", "x", "--agent", &agent, "--detach"])?;
        wait_until("the parent waits on its two running children", || {
            let children = threads_of(&env, "review-file")?;
            Ok(children.len() == 2
                && children.iter().all(|t| t["status"] == "running")
                && threads_of(&env, "review-all")?[0]["status"] == "waiting")
        })?;
        let parent =
            threads_of(&env, "review-all")?[0]["threadId"].as_str().context("id")?.to_string();
        env.ok(&[action, &parent])?;
        if action == "kill" {
            std::fs::remove_file(&gate)?;
            assert_eq!(status(&env, &parent)?, "killed");
            wait_until("the children are killed", || {
                Ok(threads_of(&env, "review-file")?.iter().all(|t| t["status"] == "killed"))
            })?;
            // A killed parent starts no further child.
            std::thread::sleep(std::time::Duration::from_millis(300));
            assert_eq!(threads_of(&env, "review-file")?.len(), 2);
            continue;
        }
        std::fs::remove_file(&gate)?;
        wait_until("the children pause after their step", || {
            Ok(threads_of(&env, "review-file")?.iter().all(|t| t["status"] == "paused"))
        })?;
        assert_eq!(status(&env, &parent)?, "waiting");
        let resumed = env.run(&["resume", &parent])?;
        assert_eq!(resumed.code, 0, "{resumed:?}");
        check_finished(&env, &parent)?;
    }
    Ok(())
}

/// The worker is killed (`abort`, as `kill -9`) at points of the parent's and the children's
/// lives picked at random, then the threads left interrupted are resumed: one child per item,
/// every call asked once, the parent completed with every result.
#[test]
fn a_crash_on_either_side_starts_no_second_child_and_re_asks_nothing() -> Result<()> {
    let (seed, mut random) = crate::Random::seeded();
    // The child-specific points, each once; then random passes of the others.
    let mut points: Vec<(String, u64)> = ["child-started", "thread-rested", "child-delivered"]
        .iter()
        .map(|p| (p.to_string(), 1 + random.below(2)))
        .collect();
    for _ in 0..4 {
        let point = ["agent-call", "agent-recorded", "step-persisted"][random.below(3) as usize];
        points.push((point.to_string(), 1 + random.below(4)));
    }
    for (point, n) in points {
        crashed_at(&point, n).with_context(|| format!("crashing at {point}:{n} (seed {seed})"))?;
    }
    Ok(())
}

fn crashed_at(point: &str, n: u64) -> Result<()> {
    let env = Env::new()?;
    // One child at a time: a crash then never cuts short a call of another thread in the same
    // process (a call in flight, not journaled, is rightly asked again).
    add_both_with(&env, &REVIEW_ALL.replace("max_parallel: 2", "max_parallel: 1"))?;
    let agent = agent(&env)?;
    let crash = format!("{point}:{n}");
    let run = env.run_with(
        &["run", "review-all", "-p", "x", "--agent", &agent, "--detach"],
        &[("UNCAGED_WORKFLOW_CRASH_AT", &crash)],
    )?;
    let parent = run.stdout.trim().to_string();
    ensure!(!parent.is_empty(), "{run:?}");
    // Until the parent completes: wait for every thread to come to rest, then resume the ones
    // a crash left interrupted, and a parent whose child ended while its result was in flight.
    for _ in 0..20 {
        wait_until("every thread comes to rest", || {
            let all = env.json(&["threads"])?;
            Ok(all.as_array().context("threads")?.iter().all(|t| t["status"] != "running"))
        })?;
        if status(&env, &parent)? == "completed" {
            break;
        }
        for thread in env.json(&["threads"])?.as_array().context("threads")? {
            let id = thread["threadId"].as_str().context("id")?;
            let waits_on_ended_child = thread["status"] == "waiting"
                && env.json(&["thread", id])?["children"]
                    .as_array()
                    .is_some_and(|c| c.iter().any(|c| c["status"] == "completed"));
            if thread["status"] == "interrupted" || waits_on_ended_child {
                // Another resume (or a child's end) may have moved it on meanwhile.
                let _ = env.run(&["resume", id, "--agent", &agent, "--detach"])?;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    check_finished(&env, &parent)
}

/// `workflow:` is checked where it is written, and shows on the graph.
#[test]
fn a_child_step_is_checked_at_add_and_drawn_on_the_graph() -> Result<()> {
    let env = Env::new()?;
    let bad = env.write(
        "bad.yaml",
        "description: Bad\nsteps:\n  - id: a\n    description: A.\n    workflow: ../etc\n",
    )?;
    let e = env.fails(&["add", "bad", &bad.display().to_string()], 65)?;
    assert!(e.contains("bad.yaml:5:15: `workflow`:"), "{e}");
    let timed = env.write(
        "timed.yaml",
        "description: Timed\nsteps:\n  - id: a\n    description: A.\n    workflow: other\n    timeout: 10s\n",
    )?;
    let e = env.fails(&["add", "timed", &timed.display().to_string()], 65)?;
    assert!(e.contains("timed.yaml:6:14: `timeout` bounds an agent call"), "{e}");
    add_both(&env)?;
    let graph = env.ok(&["show", "review-all", "--graph"])?;
    assert!(graph.contains("runs workflow review-file"), "{graph}");
    Ok(())
}

/// A child's worker that dies while the parent's worker hands it a new child thread (frozen,
/// then killed with `kill -9`) fails nothing: the hand-over is made again to a worker started
/// for it, the parent completes, and each item has one child (at 4abdda5 the parent's step
/// failed for good with "lost the worker", its children left interrupted). A home directory's
/// workers: a database's pool has no hand-over to lose.
#[test]
fn a_child_worker_lost_in_the_hand_over_fails_nothing_and_starts_no_second_child() -> Result<()> {
    let env = Env::new()?;
    if env.store.is_some() {
        return Ok(());
    }
    add_both(&env)?;
    let agent = agent(&env)?;
    // A thread of the child workflow keeps its worker up, waiting at the gate; frozen, the
    // worker still accepts connections but answers none.
    std::fs::write(env.dir.path().join("gate"), "")?;
    let held = env.ok(&[
        "run",
        "review-file",
        "-p",
        "x",
        "--agent",
        &agent,
        "--trigger-data",
        "{}",
        "--detach",
    ])?;
    let held = held.trim().to_string();
    wait_until("the child workflow's worker runs", || Ok(status(&env, &held)? == "running"))?;
    let worker = env.json(&["ps"])?[0]["pid"].as_u64().context("worker pid")?.to_string();
    std::process::Command::new("kill").args(["-STOP", &worker]).status()?;
    let parent = env.ok(&["run", "review-all", "-p", "x", "--agent", &agent, "--detach"])?;
    let parent = parent.trim().to_string();
    let queue = env.home().join("run/queue");
    wait_until("the parent's worker hands children to the frozen worker", || {
        let children = threads_of(&env, "review-file")?.len() - 1;
        let queued = std::fs::read_dir(&queue).map_or(0, |d| {
            d.flatten().filter(|e| e.file_name().to_string_lossy().ends_with(".json")).count()
        });
        Ok(children == 2 && queued == 2)
    })?;
    crate::kill_9(&[worker]);
    std::fs::remove_file(env.dir.path().join("gate"))?;
    wait_until("the parent ends", || {
        Ok(!matches!(status(&env, &parent)?.as_str(), "running" | "waiting" | "queued"))
    })?;
    let record = env.json(&["thread", &parent])?;
    ensure!(record["status"] == "completed", "the parent {}: {}", record["status"], record["end"]);
    let children: Vec<Value> = threads_of(&env, "review-file")?
        .into_iter()
        .filter(|t| t["parent"] == parent.as_str())
        .collect();
    ensure!(children.len() == FILES.len(), "one child per file: {children:?}");
    ensure!(children.iter().all(|c| c["status"] == "completed"), "{children:?}");
    Ok(())
}
