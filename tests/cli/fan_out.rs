//! Fan-out: a DAG step run once per item of an array (`for_each`), at most `max_parallel` at
//! once, its output the items' outputs in order; each item its own journaled call, so a worker
//! killed in the middle re-asks none of the items already answered.

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use crate::{Env, read_jsonl, status, wait_until};

/// A workflow that lists files, reviews each (two at a time), and sums the reviews up.
const REVIEW_EACH: &str = r#"description: Review each changed file
steps:
  - id: list
    description: List the changed files.
    inputs:
      change: $prompt
    schema:
      type: object
      required: [files]
      properties:
        files: { type: array, items: { type: string } }
  - id: review
    description: Review one file.
    depends_on: [list]
    for_each: $steps.list.output.files
    max_parallel: 2
    inputs:
      file: $item
      note: "File ${index}: ${item}, of ${steps.list.output.files}"
    schema:
      type: object
      required: [file, verdict]
      properties:
        file: { type: string }
        verdict: { type: string }
  - id: summary
    description: Sum the reviews up.
    depends_on: [review]
    inputs:
      reviews: $steps.review.output
    schema:
      type: object
      required: [verdict]
      properties:
        verdict: { type: string }
"#;

/// A command agent: logs `start|done STEP ITEM TIME` to `agents.log` and each input to
/// `inputs.jsonl`; a review takes `UNCAGED_TEST_REVIEW_SLEEP` seconds.
fn agent(env: &Env, files: &[&str]) -> Result<String> {
    let dir = env.dir.path().display().to_string();
    let files = serde_json::to_string(files)?;
    let script = env.write_script(
        "review-agent.py",
        format!(
            r#"#!/usr/bin/env python3
import json, os, sys, time
ctx = json.load(sys.stdin)
step = ctx["role"]["name"]
given = json.loads(ctx.get("input") or "null") or {{}}
item = given.get("inputs", {{}}).get("file", "-")
def log(event):
    with open(os.path.join("{dir}", "agents.log"), "a") as f:
        f.write(f"{{event}} {{step}} {{item}} {{time.time()}}\n")
log("start")
with open(os.path.join("{dir}", "inputs.jsonl"), "a") as f:
    f.write(json.dumps({{"step": step, "input": given}}) + "\n")
if step == "review":
    time.sleep(float(os.environ.get("UNCAGED_TEST_REVIEW_SLEEP", "0.05")))
answers = {{
    "list": {{"files": {files}}},
    "review": {{"file": item, "verdict": "fine"}},
    "summary": {{"verdict": "all fine"}},
}}
print(json.dumps(answers[step]))
log("done")
"#
        ),
    )?;
    Ok(format!("command:{}", script.display()))
}

/// (event, step, item) of each line of `agents.log`, with its time.
fn log(env: &Env) -> Vec<(String, String, String, f64)> {
    std::fs::read_to_string(env.dir.path().join("agents.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split(' ').collect();
            Some((w[0].into(), w[1].into(), w[2].into(), w.get(3)?.parse().ok()?))
        })
        .collect()
}

/// The most calls of `step` at work at the same time, by the log.
fn most_at_once(events: &[(String, String, String, f64)], step: &str) -> usize {
    let mut timeline: Vec<(f64, i32)> = events
        .iter()
        .filter(|e| e.1 == step)
        .map(|e| (e.3, if e.0 == "start" { 1 } else { -1 }))
        .collect();
    timeline.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let (mut now, mut most) = (0, 0);
    for (_, change) in timeline {
        now += change;
        most = most.max(now);
    }
    most as usize
}

fn add(env: &Env) -> Result<String> {
    let file = env.write("review-each.yaml", REVIEW_EACH)?;
    let added = env.json(&["add", "review-each", &file.display().to_string()])?;
    Ok(added["hash"].as_str().context("hash")?.to_string())
}

on_both_stores! {
/// Each item is asked once, with `$item` and `$index`, two at a time; the step's output is the
/// array of the items' metas in the items' order, and the next step reads it whole.
#[test]
fn a_for_each_step_runs_once_per_item_and_gives_their_outputs_in_order() -> Result<()> {
    let env = Env::new()?;
    let hash = add(&env)?;
    let files = ["a.rs", "b.rs", "c.rs", "d.rs", "e.rs"];
    let agent = agent(&env, &files)?;
    let run = env.run(&["run", "review-each", "-p", "the change", "--agent", &agent])?;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("all 3 steps succeeded"), "{run:?}");
    let id = env.json(&["threads"])?[0]["threadId"].as_str().context("thread")?.to_string();
    let record = env.json(&["thread", &id])?;
    let steps = record["steps"].as_array().context("steps")?;
    assert_eq!(steps.len(), 3, "one step for the whole fan-out: {record}");
    let reviews: Vec<Value> = files.iter().map(|f| json!({"file": f, "verdict": "fine"})).collect();
    assert_eq!(steps[1]["role"], "review");
    assert_eq!(steps[1]["meta"], json!(reviews));
    let events = log(&env);
    let asked: Vec<&str> =
        events.iter().filter(|e| e.0 == "start" && e.1 == "review").map(|e| e.2.as_str()).collect();
    assert_eq!(asked.len(), 5, "each item once: {asked:?}");
    let most = most_at_once(&events, "review");
    ensure!(most <= 2, "{most} reviews at once, over max_parallel 2");
    let inputs = read_jsonl(&env.dir.path().join("inputs.jsonl"))?;
    let third = inputs
        .iter()
        .find(|i| i["step"] == "review" && i["input"]["inputs"]["file"] == "c.rs")
        .context("c.rs's input")?;
    assert_eq!(third["input"]["item"], json!({"index": 2, "of": 5}));
    let note = format!("File 2: c.rs, of {}", serde_json::to_string(&files)?);
    assert_eq!(third["input"]["inputs"]["note"], json!(note));
    let summary = inputs.iter().find(|i| i["step"] == "summary").context("summary's input")?;
    assert_eq!(summary["input"]["inputs"]["reviews"], json!(reviews));
    // The fan-out shows on the graph.
    let graph = env.ok(&["show", "review-each", "--graph"])?;
    assert!(graph.contains("for each of $steps.list.output.files"), "{graph}");
    let _ = hash;
    Ok(())
}

/// An empty list fans out to nothing: the step succeeds with an empty array.
#[test]
fn a_fan_out_over_no_items_succeeds_with_an_empty_output() -> Result<()> {
    let env = Env::new()?;
    add(&env)?;
    let agent = agent(&env, &[])?;
    let run = env.run(&["run", "review-each", "-p", "nothing changed", "--agent", &agent])?;
    assert_eq!(run.code, 0, "{run:?}");
    let id = env.json(&["threads"])?[0]["threadId"].as_str().context("thread")?.to_string();
    let record = env.json(&["thread", &id])?;
    assert_eq!(record["steps"][1]["meta"], json!([]));
    Ok(())
}

}

/// `kill -9` of the worker in the middle of a fan-out, at points picked at random: resumed,
/// the thread asks again only the items whose answers were not journaled, and ends with every
/// item's output once.
///
/// On a home directory: what is under test is the journal's answer to a fan-out's calls, one
/// implementation for both stores (the store contract suite runs the journal on both); a
/// database's takeover of a killed worker's threads is tested in `shared_store`.
#[test]
fn a_worker_killed_mid_fan_out_re_asks_no_answered_item() -> Result<()> {
    // Killed at three points of the fan-out picked at random: after 1 to 5 of its 6 items
    // are journaled.
    let (seed, mut random) = crate::Random::seeded();
    for _ in 0..3 {
        let answered = 1 + random.below(5) as usize;
        killed_after(answered)
            .with_context(|| format!("killed after {answered} answers (seed {seed})"))?;
    }
    Ok(())
}

fn killed_after(answered: usize) -> Result<()> {
    let env = Env::new()?;
    let hash = add(&env)?;
    let files = ["a.rs", "b.rs", "c.rs", "d.rs", "e.rs", "f.rs"];
    let agent = agent(&env, &files)?;
    let slow = [("UNCAGED_TEST_REVIEW_SLEEP", "0.3")];
    let run = env.run_with(
        &["run", "review-each", "-p", "the change", "--agent", &agent, "--detach"],
        &slow,
    )?;
    let id = run.stdout.trim().to_string();
    ensure!(!id.is_empty(), "{run:?}");
    // The fan-out is the thread's second generator step (index 1); two items answered.
    // Items answer two at a time: the count may pass `answered` in one move, so at least.
    wait_until("the answers are journaled", || {
        let calls = env.calls(&hash, &id).unwrap_or_default();
        Ok(calls.iter().filter(|c| c["kind"] == "agent" && c["step"] == 1).count() >= answered)
    })?;
    env.kill_the_worker()?;
    wait_until("the thread is interrupted", || Ok(status(&env, &id)? == "interrupted"))?;
    // What the journal holds now that the worker is dead: these items are answered.
    let journaled =
        env.calls(&hash, &id)?.iter().filter(|c| c["kind"] == "agent" && c["step"] == 1).count();
    ensure!(journaled >= answered, "{journaled} items journaled");
    let asked_before = log(&env).iter().filter(|e| e.0 == "start" && e.1 == "review").count();
    let resumed = env.run_with(&["resume", &id, "--agent", &agent], &slow)?;
    assert_eq!(resumed.code, 0, "{resumed:?}");
    wait_until("the thread ends", || Ok(status(&env, &id)? == "completed"))?;
    let record = env.json(&["thread", &id])?;
    let reviews: Vec<Value> = files.iter().map(|f| json!({"file": f, "verdict": "fine"})).collect();
    assert_eq!(record["steps"][1]["meta"], json!(reviews), "every item's output, once, in order");
    // Resumed, exactly the items not journaled are asked: none answered is asked again.
    let asked_after =
        log(&env).iter().filter(|e| e.0 == "start" && e.1 == "review").count() - asked_before;
    assert_eq!(
        asked_after,
        files.len() - journaled,
        "{journaled} of {} were journaled",
        files.len()
    );
    Ok(())
}
