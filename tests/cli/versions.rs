//! Versions that move: `replay` checks recorded threads against a bundle not registered yet —
//! the journal answers every call, no agent is asked, no thread changes — and says, per
//! thread, compatible or where it diverges.

use std::path::Path;

use anyhow::{Context, Result, ensure};
use serde_json::Value;

use crate::{Env, artifacts};

/// Plan, develop, review: a DAG whose steps read the step before (the reviewer's prompt is its
/// description).
pub(crate) const FLOW: &str = r#"description: Plan, develop, review
steps:
  - id: plan
    description: Plan the change.
    inputs: {task: $prompt}
  - id: develop
    description: Develop it.
    depends_on: [plan]
    inputs: {plan: $steps.plan.output}
  - id: review
    description: Review it.
    depends_on: [develop]
    inputs: {change: $steps.develop.output}
"#;

/// Two threads run to their end, and one stopped after its first step; the added file.
fn recorded(env: &Env) -> Result<(Vec<String>, String)> {
    let file = env.write("flow.yaml", FLOW)?;
    env.ok(&["add", "flow", &file.display().to_string()])?;
    let mut ids = Vec::new();
    for prompt in ["one", "two"] {
        env.ok(&["run", "flow", "-p", prompt])?;
    }
    for thread in env.json(&["threads", "flow"])?.as_array().context("threads")? {
        ids.push(thread["threadId"].as_str().context("id")?.to_string());
    }
    let stopped = env.ok(&["thread", "start", "flow", "-p", "three"])?.trim().to_string();
    env.ok(&["step", &stopped])?;
    Ok((ids, stopped))
}

/// Every thread as `thread --json` shows it: what must not change.
fn snapshot(env: &Env) -> Result<Vec<Value>> {
    let mut all = Vec::new();
    for thread in env.json(&["threads"])?.as_array().context("threads")? {
        all.push(env.json(&["thread", thread["threadId"].as_str().context("id")?])?);
    }
    Ok(all)
}

/// `replay` of `text` (written as `name`) against workflow `flow`: its exit code and output.
fn replay(env: &Env, name: &str, text: &str, extra: &[&str]) -> Result<crate::Run> {
    let file = env.write(name, text)?;
    let mut args = vec!["replay", file.to_str().context("path")?, "--workflow", "flow"];
    args.extend_from_slice(extra);
    env.run(&args)
}

/// A command agent that logs `ROLE` for each call to `calls.log`, and fails for `role` until
/// the file `fixed` exists, and for any input that says `bad-mode`.
fn failing_agent(env: &Env, role: &str) -> Result<String> {
    let dir = env.dir.path().display().to_string();
    let script = env.write_script(
        "agent.sh",
        format!(
            "#!/bin/sh\ninput=$(cat)\nrole=$(printf '%s' \"$input\" | sed -n 's/.*\"role\":{{\"name\":\"\\([^\"]*\\)\".*/\\1/p')\necho \"$role\" >> {dir}/calls.log\nif [ \"$role\" = {role} ] && [ ! -f {dir}/fixed ]; then echo 'broken' >&2; exit 1; fi\ncase \"$input\" in *bad-mode*) echo 'bad mode' >&2; exit 1 ;; esac\ncase \"$role\" in\n  planner) echo '{{\"steps\": [\"fix it\"]}}' ;;\n  developer) echo '{{\"summary\": \"done\"}}' ;;\n  reviewer) echo '{{\"approved\": true}}' ;;\n  *) echo '{{}}' ;;\nesac\n"
        ),
    )?;
    Ok(format!("command:{}", script.display()))
}

/// A run of workflow `flow` (added from `text`) on an agent that fails for `role`.
struct FailedRun {
    /// The workflow file.
    file: std::path::PathBuf,
    /// The agent spec.
    agent: String,
    run: crate::Run,
    /// The thread.
    id: String,
}

/// Adds `text` as workflow `flow` and runs it once on [`failing_agent`] for `role`.
fn failed_run(env: &Env, text: &str, role: &str) -> Result<FailedRun> {
    let file = env.write("flow.yaml", text)?;
    env.ok(&["add", "flow", file.to_str().context("path")?])?;
    let agent = failing_agent(env, role)?;
    let run = env.run(&["run", "flow", "-p", "x", "--agent", &agent])?;
    let id = env.json(&["threads", "flow"])?[0]["threadId"].as_str().context("id")?.to_string();
    Ok(FailedRun { file, agent, run, id })
}

fn calls_log(env: &Env) -> Vec<String> {
    std::fs::read_to_string(env.dir.path().join("calls.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

on_both_stores! {
/// What does not change what a thread did is accepted; what does is refused at the step where
/// it shows; the threads are the same after as before.
#[test]
fn replay_accepts_what_threads_did_not_do_and_refuses_what_they_did() -> Result<()> {
    let env = Env::new()?;
    let (_, stopped) = recorded(&env)?;
    let before = snapshot(&env)?;
    // Accepted: the workflow's description, and a role's prompt.
    let accepted = [
        FLOW.replace("description: Plan, develop, review", "description: Plan, build, check"),
        FLOW.replace("description: Review it.", "description: Review it closely."),
    ];
    for (i, text) in accepted.iter().enumerate() {
        let run = replay(&env, &format!("ok{i}.yaml"), text, &[])?;
        ensure!(run.code == 0, "version {i} should replay: {run:?}");
        assert!(run.stdout.contains("3 of 3 thread(s) of flow replay"), "{}", run.stdout);
    }
    // A fix in the routing after the last step a thread recorded: accepted for the thread
    // stopped after step 1, refused by those that ran step 3 the old way.
    let late = FLOW.replace(
        "inputs: {change: $steps.develop.output}",
        "inputs: {change: $steps.develop.output, plan: $steps.plan.output}",
    )
    .replace("depends_on: [develop]", "depends_on: [develop, plan]");
    let run = replay(&env, "late.yaml", &late, &["--threads", &stopped])?;
    ensure!(run.code == 0 && run.stdout.contains("1 of 1 thread(s)"), "{run:?}");
    let run = replay(&env, "late.yaml", &late, &[])?;
    ensure!(run.code == 79 && run.stdout.contains("1 of 3 thread(s)"), "{run:?}");
    assert!(run.stdout.contains("diverges at step 3"), "{}", run.stdout);
    // Refused: another request for a recorded call, and a new step before the last.
    let changed = FLOW.replace("inputs: {plan: $steps.plan.output}", "inputs: {plan: $steps.plan.output, note: fast}");
    let run = replay(&env, "changed.yaml", &changed, &[])?;
    ensure!(run.code == 79, "{run:?}");
    assert!(
        run.stdout.contains("diverges at step 2: call 0 of step 2 (Agent, role `develop`) is another request than the one the thread recorded"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains(&format!("{stopped}  compatible (1 steps)")), "{}", run.stdout);
    let inserted = FLOW.replace(
        "  - id: review\n",
        "  - id: test\n    description: Test it.\n    depends_on: [plan]\n    inputs: {}\n  - id: review\n",
    );
    let run = replay(&env, "inserted.yaml", &inserted, &["--json"])?;
    ensure!(run.code == 79, "{run:?}");
    let report: Value = serde_json::from_str(&run.stdout)?;
    assert_eq!(report["diverged"], 2, "{report}");
    assert_eq!(report["compatible"], 1, "{report}");
    let diverged: Vec<&Value> = report["threads"]
        .as_array()
        .context("threads")?
        .iter()
        .filter(|t| t["result"]["verdict"] == "diverges")
        .collect();
    assert_eq!(diverged[0]["result"]["step"], 2, "{report}");
    // Nothing of any thread changed.
    assert_eq!(snapshot(&env)?, before);
    Ok(())
}

/// `upgrade`: a thread moves to a version that does what it did, and continues on it; one the
/// version diverges from is refused and stays as it was; ended threads are skipped; a dry run
/// changes nothing; `--workflow --all` reports per thread.
#[test]
fn upgrade_moves_what_the_new_version_replays_and_refuses_the_rest() -> Result<()> {
    let env = Env::new()?;
    let (ids, stopped) = recorded(&env)?;
    let old = env.json(&["show", "flow"])?["hash"].as_str().context("hash")?.to_string();
    let v2 = env.write("v2.yaml", FLOW.replace("Review it.", "Review it closely."))?;
    let before = env.json(&["thread", &stopped])?;
    // Accepted, each in a dry run: a changed description, and a fix in the routing after the
    // last step the thread recorded.
    let late = FLOW
        .replace("inputs: {change: $steps.develop.output}", "inputs: {change: $steps.develop.output, plan: $steps.plan.output}")
        .replace("depends_on: [develop]", "depends_on: [develop, plan]");
    for (name, text) in [("desc.yaml", FLOW.replace("Plan, develop, review", "Plan and ship")), ("late.yaml", late)] {
        let file = env.write(name, text)?;
        env.ok(&["add", "flow", file.to_str().context("path")?])?;
        let dry = env.ok(&["upgrade", &stopped, "--dry-run"])?;
        assert!(dry.contains("would upgrade"), "{name}: {dry}");
    }
    // And a new step before the last one it recorded: refused.
    let inserted = FLOW.replace(
        "  - id: develop\n",
        "  - id: test\n    description: Test it.\n    inputs: {}\n  - id: develop\n",
    );
    let file = env.write("inserted.yaml", inserted)?;
    env.ok(&["add", "flow", file.to_str().context("path")?])?;
    let refused = env.run(&["upgrade", &stopped])?;
    ensure!(refused.code == 79 && refused.stdout.contains("diverges at step 1"), "{refused:?}");
    assert_eq!(env.json(&["thread", &stopped])?, before);
    let new = env.json(&["add", "flow", v2.to_str().context("path")?])?["hash"]
        .as_str()
        .context("hash")?
        .to_string();
    let dry = env.ok(&["upgrade", &stopped, "--dry-run"])?;
    assert_eq!(dry.trim(), format!("{stopped}  would upgrade from {old} to {new} after step 1"));
    assert_eq!(env.json(&["thread", &stopped])?, before, "a dry run changes nothing");
    let done = env.ok(&["upgrade", &stopped, "--latest"])?;
    assert_eq!(done.trim(), format!("{stopped}  upgraded from {old} to {new} after step 1"));
    let shown = env.ok(&["thread", &stopped])?;
    assert!(shown.contains(&format!("upgraded from {old} to {new} after step 1")), "{shown}");
    let record = env.json(&["thread", &stopped])?;
    assert_eq!(record["upgrades"][0]["to"], new.as_str(), "{record}");
    // It goes on, on the new version, from its journal.
    let resumed = env.run(&["resume", &stopped])?;
    assert_eq!(resumed.code, 0, "{resumed:?}");
    assert!(resumed.stdout.contains(&format!("bundle {new}")), "{}", resumed.stdout);
    assert_eq!(crate::status(&env, &stopped)?, "completed");
    let again = env.ok(&["upgrade", &ids[0]])?;
    assert!(again.contains("skipped: it has ended (completed)"), "{again}");
    // A thread that ran `develop` the v2 way refuses a version that asks it differently.
    let held = env.ok(&["thread", "start", "flow", "-p", "four"])?.trim().to_string();
    env.ok(&["step", &held])?;
    env.ok(&["step", &held])?;
    let v3 = env.write("v3.yaml", FLOW.replace("{plan: $steps.plan.output}", "{plan: $steps.plan.output, x: 1}"))?;
    env.ok(&["add", "flow", v3.to_str().context("path")?])?;
    let lines = env.thread_lines(&new, &held)?;
    let refused = env.run(&["upgrade", &held])?;
    assert_eq!(refused.code, 79, "{refused:?}");
    assert!(refused.stdout.contains("refused from") && refused.stdout.contains("diverges at step 2"), "{}", refused.stdout);
    assert_eq!(env.thread_lines(&new, &held)?, lines, "a refused thread is untouched");
    // Many at once: one refused, the ended ones skipped.
    let all = env.run(&["upgrade", "--workflow", "flow", "--all", "--dry-run", "--json"])?;
    assert_eq!(all.code, 79, "{all:?}");
    let report: Value = serde_json::from_str(&all.stdout)?;
    let outcomes: Vec<&str> = report["threads"]
        .as_array()
        .context("threads")?
        .iter()
        .map(|t| t["result"]["outcome"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(outcomes, ["refused"], "only the paused thread has not ended: {report}");
    Ok(())
}

/// `retry` of a failed DAG thread runs the failed step and the one skipped because of it, and
/// nothing else; of a failed graph (code) thread, the failed step: the calls that succeeded are
/// never asked again.
#[test]
fn retry_runs_again_only_what_failed() -> Result<()> {
    let env = Env::new()?;
    let FailedRun { agent, run, id, .. } = failed_run(&env, FLOW, "develop")?;
    ensure!(run.code != 0, "develop fails: {run:?}");
    assert_eq!(crate::status(&env, &id)?, "failed");
    std::fs::write(env.dir.path().join("fixed"), "")?;
    let retried = env.run(&["retry", &id, "--agent", &agent])?;
    assert_eq!(retried.code, 0, "{retried:?}");
    assert!(retried.stderr.contains("retried after step"), "{}", retried.stderr);
    assert_eq!(crate::status(&env, &id)?, "completed");
    // Each develop attempt asks again (3 tries the first time, one now); plan once, review once.
    let calls = calls_log(&env);
    assert_eq!(calls.iter().filter(|c| *c == "plan").count(), 1, "{calls:?}");
    assert_eq!(calls.iter().filter(|c| *c == "review").count(), 1, "{calls:?}");
    let record = env.json(&["thread", &id])?;
    assert_eq!(record["retries"].as_array().map(Vec::len), Some(1), "{record}");
    // A thread that has not failed is not retried.
    let e = env.run(&["retry", &id])?;
    ensure!(e.code == 75 && e.stderr.contains("only a failed thread is retried"), "{e:?}");

    // A code bundle's graph: the developer fails until fixed.
    std::fs::remove_file(env.dir.path().join("fixed"))?;
    std::fs::remove_file(env.dir.path().join("calls.log"))?;
    env.add_solve_issue()?;
    let agent = failing_agent(&env, "developer")?;
    let run = env.run(&["run", "solve-issue", "-p", "x", "--agent", &agent])?;
    ensure!(run.code != 0, "developer fails: {run:?}");
    let id =
        env.json(&["threads", "solve-issue"])?[0]["threadId"].as_str().context("id")?.to_string();
    assert_eq!(crate::status(&env, &id)?, "failed");
    std::fs::write(env.dir.path().join("fixed"), "")?;
    let retried = env.run(&["retry", &id, "--agent", &agent])?;
    assert_eq!(retried.code, 0, "{retried:?}");
    let calls = calls_log(&env);
    assert_eq!(calls.iter().filter(|c| *c == "planner").count(), 1, "{calls:?}");
    Ok(())
}

/// Under `skip_dependents`, a retry runs the failed step and the one skipped because of it —
/// and not the independent step that succeeded meanwhile.
#[test]
fn retry_of_a_dag_runs_the_failed_and_skipped_steps_and_nothing_else() -> Result<()> {
    let env = Env::new()?;
    let flow = format!(
        "{}  - id: lint\n    description: Lint it.\n    depends_on: [plan]\n    inputs: {{}}\nfailure_policy: {{on_step_failure: skip_dependents, max_retries: 0, retry_delay_ms: 10}}\n",
        FLOW
    );
    let FailedRun { file, agent, run, id } = failed_run(&env, &flow, "develop")?;
    ensure!(run.code != 0, "{run:?}");
    let before: Vec<String> = calls_log(&env);
    ensure!(before.contains(&"lint".to_string()) && !before.contains(&"review".to_string()), "{before:?}");
    std::fs::write(env.dir.path().join("fixed"), "")?;
    let retried = env.run(&["retry", &id, "--agent", &agent])?;
    assert_eq!(retried.code, 0, "{retried:?}");
    let after = calls_log(&env)[before.len()..].to_vec();
    assert_eq!(after, ["develop", "review"], "only the failed step and the one it skipped");
    let record = env.json(&["thread", &id])?;
    let retried: Vec<&Value> = record["steps"]
        .as_array()
        .context("steps")?
        .iter()
        .filter(|s| s["role"] == "$user")
        .collect();
    assert_eq!(retried.len(), 2, "{record}");
    // Replayed, the retry's records are met as a resumed thread meets them: it replays whole.
    let run = env.run(&["replay", file.to_str().context("path")?, "--workflow", "flow"])?;
    ensure!(run.code == 0 && run.stdout.contains(&format!("{id}  compatible")), "{run:?}");
    Ok(())
}

/// `retry --from-step N` continues after the first N steps: the ones after are history.
#[test]
fn retry_from_an_earlier_step_keeps_only_the_steps_before_it() -> Result<()> {
    let env = Env::new()?;
    let FailedRun { agent, id, .. } = failed_run(&env, FLOW, "develop")?;
    std::fs::write(env.dir.path().join("fixed"), "")?;
    let e = env.run(&["retry", &id, "--from-step", "9"])?;
    ensure!(e.code == 64, "a step the thread does not have: {e:?}");
    let retried = env.run(&["retry", &id, "--from-step", "1", "--agent", &agent])?;
    assert_eq!(retried.code, 0, "{retried:?}");
    let record = env.json(&["thread", &id])?;
    let roles: Vec<&str> = record["steps"]
        .as_array()
        .context("steps")?
        .iter()
        .map(|s| s["role"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(roles, ["plan", "develop", "review"], "{record}");
    assert_eq!(record["retries"][0]["retry"]["fromStep"], 1, "{record}");
    let calls = calls_log(&env);
    assert_eq!(calls.iter().filter(|c| *c == "plan").count(), 1, "{calls:?}");
    Ok(())
}

/// The cycle a fix takes: the failed step's version is fixed and added, and `retry --latest`
/// moves the thread to it and runs the failed step the new way; what succeeded is not asked
/// again.
#[test]
fn retry_latest_runs_the_failed_step_on_the_fixed_version() -> Result<()> {
    let env = Env::new()?;
    let broken = FLOW.replace("{plan: $steps.plan.output}", "{plan: $steps.plan.output, mode: bad-mode}");
    std::fs::write(env.dir.path().join("fixed"), "")?;
    let FailedRun { agent, run, id, .. } = failed_run(&env, &broken, "none")?;
    ensure!(run.code != 0, "develop fails on bad-mode: {run:?}");
    let fixed = FLOW.replace("{plan: $steps.plan.output}", "{plan: $steps.plan.output, mode: good}");
    let v2 = env.write("v2.yaml", fixed)?;
    let new = env.json(&["add", "flow", v2.to_str().context("path")?])?["hash"]
        .as_str()
        .context("hash")?
        .to_string();
    let retried = env.run(&["retry", &id, "--latest", "--agent", &agent])?;
    assert_eq!(retried.code, 0, "{retried:?}");
    assert!(retried.stderr.contains(&format!("to {new} after step")), "{}", retried.stderr);
    let record = env.json(&["thread", &id])?;
    assert_eq!(record["status"], "completed", "{record}");
    assert_eq!(record["upgrades"][0]["to"], new.as_str(), "{record}");
    let calls = calls_log(&env);
    assert_eq!(calls.iter().filter(|c| *c == "plan").count(), 1, "{calls:?}");
    Ok(())
}

/// Threads recorded under every contract version replay through their bundles.
#[test]
fn threads_of_every_contract_version_replay() -> Result<()> {
    let env = Env::new()?;
    let fixture = |contract: &str| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("../tests/fixtures/solve-issue-{contract}.wasm"))
            .to_string_lossy()
            .into_owned()
    };
    let (first, second) = (fixture("0.1.0"), fixture("0.2.0"));
    for (bundle, contract) in
        [(first.as_str(), "0.1.0"), (second.as_str(), "0.2.0"), (artifacts::SOLVE_ISSUE, "0.3.0")]
    {
        env.ok(&["add", "solve-issue", bundle])?;
        assert_eq!(env.json(&["show", "solve-issue"])?["contract"], contract);
        env.ok(&["run", "solve-issue", "-p", contract])?;
        let thread = env.json(&["threads", "solve-issue", "--limit", "1"])?;
        let id = thread[0]["threadId"].as_str().context("id")?.to_string();
        let run = env.run(&["replay", bundle, "--workflow", "solve-issue", "--threads", &id])?;
        ensure!(run.code == 0, "contract {contract}: {run:?}");
        assert!(run.stdout.contains(&format!("{id}  compatible (")), "{}", run.stdout);
    }
    Ok(())
}
}

/// In a project's CI: replay the threads kept as fixtures, and add only what replays.
#[test]
fn replay_gates_a_ci_script_by_its_exit_code() -> Result<()> {
    let env = Env::new()?;
    recorded(&env)?;
    let good = env.write("good.yaml", FLOW.replace("Review it.", "Review it well."))?;
    let bad = env.write("bad.yaml", FLOW.replace("{task: $prompt}", "{task: $prompt, x: 1}"))?;
    let script = env.write_script(
        "ci.sh",
        format!(
            "#!/bin/sh\nset -e\nfor f in {} {}; do\n  if {bin} replay \"$f\" --workflow flow --last 10 > /dev/null; then\n    {bin} add flow \"$f\" > /dev/null; echo \"added $f\"\n  else\n    echo \"refused $f ($?)\"\n  fi\ndone\n",
            good.display(),
            bad.display(),
            bin = env!("CARGO_BIN_EXE_uncaged-workflow"),
        ),
    )?;
    let out = env.command_of(script.to_str().context("path")?).output()?;
    let text = String::from_utf8(out.stdout)?;
    ensure!(out.status.success(), "{text} {}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(&format!("added {}", good.display())), "{text}");
    assert!(text.contains(&format!("refused {} (79)", bad.display())), "{text}");
    Ok(())
}

/// `thread diff`: a fork and its original, step by step.
#[test]
fn thread_diff_shows_what_a_fork_changed() -> Result<()> {
    let env = Env::new()?;
    let (ids, stopped) = recorded(&env)?;
    let original = &ids[0];
    env.write("answers.yaml", "review:\n  - {verdict: rework}\n")?;
    let fork =
        env.ok(&["fork", original, "--at", "2", "--agent", "scripted:answers.yaml", "--detach"])?;
    let fork = fork.trim().to_string();
    crate::wait_until("the fork ends", || Ok(crate::status(&env, &fork)? == "completed"))?;
    let shown = env.ok(&["thread", "diff", original, &fork])?;
    assert!(shown.contains("[1] plan         same"), "{shown}");
    assert!(shown.contains("[3] review       changed: content, meta"), "{shown}");
    assert!(shown.contains("B: review {\"verdict\":\"rework\"}"), "{shown}");
    assert!(shown.ends_with("2 same, 1 changed, 0 only in A, 0 only in B\n"), "{shown}");
    let compared = env.json(&["thread", "diff", original, &stopped])?;
    assert_eq!(compared["same"], 1, "{compared}");
    assert_eq!(compared["onlyInA"], 2, "{compared}");
    assert_eq!(compared["steps"][2]["kind"], "onlyInA", "{compared}");
    Ok(())
}

/// The process is killed (`abort`, as `kill -9`) around the one record an upgrade or a retry
/// appends: the thread is always on its old version untouched or on the new one whole (and
/// a retry reopened or not), never a mix, and `resume` or a second try completes it.
#[test]
fn a_crash_in_an_upgrade_or_a_retry_leaves_the_old_or_the_new_whole() -> Result<()> {
    for point in ["upgrade-judged", "upgrade-recorded"] {
        let env = Env::new()?;
        let (_, stopped) = recorded(&env)?;
        let old = env.json(&["show", "flow"])?["hash"].as_str().context("hash")?.to_string();
        let v2 = env.write("v2.yaml", FLOW.replace("Review it.", "Review it closely."))?;
        env.ok(&["add", "flow", v2.to_str().context("path")?])?;
        let crashed = env.run_with(
            &["upgrade", &stopped],
            &[("UNCAGED_WORKFLOW_CRASH_AT", &format!("{point}:1"))],
        )?;
        ensure!(crashed.code != 0, "{point}: {crashed:?}");
        let record = env.json(&["thread", &stopped])?;
        let upgrades = record["upgrades"].as_array().map_or(0, Vec::len);
        match point {
            "upgrade-judged" => ensure!(upgrades == 0, "{point}: {record}"),
            _ => ensure!(upgrades == 1, "{point}: {record}"),
        }
        ensure!(record["steps"].as_array().map(Vec::len) == Some(1), "{point}: {record}");
        // Tried again, it moves (or says it is there already), and the thread completes.
        let again = env.ok(&["upgrade", &stopped])?;
        ensure!(again.contains("upgraded from") || again.contains("runs"), "{point}: {again}");
        let resumed = env.run(&["resume", &stopped])?;
        ensure!(resumed.code == 0, "{point}: {resumed:?}");
        let record = env.json(&["thread", &stopped])?;
        ensure!(record["upgrades"][0]["from"] == old.as_str(), "{point}: {record}");
    }
    for point in ["retry-reopening", "retry-reopened"] {
        let env = Env::new()?;
        let FailedRun { agent, id, .. } = failed_run(&env, FLOW, "develop")?;
        std::fs::write(env.dir.path().join("fixed"), "")?;
        let crashed = env.run_with(
            &["retry", &id, "--agent", &agent],
            &[("UNCAGED_WORKFLOW_CRASH_AT", &format!("{point}:1"))],
        )?;
        ensure!(crashed.code != 0, "{point}: {crashed:?}");
        let status = crate::status(&env, &id)?;
        let next = match (point, status.as_str()) {
            ("retry-reopening", "failed") => "retry",
            ("retry-reopened", "paused") => "resume",
            _ => anyhow::bail!("{point}: the thread is {status}"),
        };
        let done = env.run(&[next, &id, "--agent", &agent])?;
        ensure!(done.code == 0, "{point}: {done:?}");
        ensure!(crate::status(&env, &id)? == "completed", "{point}");
        let calls = calls_log(&env);
        ensure!(calls.iter().filter(|c| *c == "plan").count() == 1, "{point}: {calls:?}");
    }
    Ok(())
}

/// A running thread is paused first, after its current step, then moved. (Its worker's log is
/// a home directory's: a file-store test.)
#[test]
fn upgrade_pauses_a_running_thread_first() -> Result<()> {
    let env = Env::new()?;
    let file = env.write("flow.yaml", FLOW)?;
    env.ok(&["add", "flow", file.to_str().context("path")?])?;
    let (gate, agent) = env.gate_agent()?;
    let id = env.ok(&["run", "flow", "-p", "x", "--agent", &agent, "--detach"])?.trim().to_string();
    crate::wait_until("it runs", || Ok(crate::status(&env, &id)? == "running"))?;
    let v2 = env.write("v2.yaml", FLOW.replace("Review it.", "Review it closely."))?;
    env.ok(&["add", "flow", v2.to_str().context("path")?])?;
    let upgrading =
        env.command().args(["upgrade", &id]).stdout(std::process::Stdio::piped()).spawn()?;
    // The worker says it took the request (its log), and only then lets the step finish.
    let hash = env.json(&["thread", &id])?["start"]["hash"].as_str().context("hash")?.to_string();
    let log = env.home().join("run").join(format!("{hash}.log"));
    crate::wait_until("the worker takes the pause request", || {
        Ok(std::fs::read_to_string(&log)
            .is_ok_and(|l| l.contains(&format!("thread {id}: pause requested"))))
    })?;
    std::fs::remove_file(&gate)?;
    let out = upgrading.wait_with_output()?;
    let text = String::from_utf8(out.stdout)?;
    ensure!(out.status.success() && text.contains("upgraded from"), "{text}");
    assert_eq!(crate::status(&env, &id)?, "paused");
    Ok(())
}

on_both_stores! {
/// A listing follows a retried thread: `threads` read before the retry (so a listing cache
/// holds its failed summary) and after it agree with `thread` — completed, with its steps —
/// and `threads prune --dry-run` offers no retried thread (at 4abdda5 the home's index kept
/// it `failed` with its old step count).
#[test]
fn a_retried_thread_is_listed_as_it_is_now() -> Result<()> {
    let env = Env::new()?;
    let FailedRun { agent, run, id, .. } = failed_run(&env, FLOW, "develop")?;
    ensure!(run.code != 0, "develop fails: {run:?}");
    let listed = |env: &Env| -> Result<Value> {
        let all = env.json(&["threads"])?;
        all.as_array()
            .and_then(|a| a.iter().find(|t| t["threadId"] == id.as_str()).cloned())
            .context("listed")
    };
    assert_eq!(listed(&env)?["status"], "failed");
    std::fs::write(env.dir.path().join("fixed"), "")?;
    let retried = env.run(&["retry", &id, "--agent", &agent])?;
    assert_eq!(retried.code, 0, "{retried:?}");
    let thread = env.json(&["thread", &id])?;
    assert_eq!(thread["status"], "completed");
    let now = listed(&env)?;
    assert_eq!(now["status"], "completed", "{now}");
    assert_eq!(now["steps"], thread["steps"].as_array().map(Vec::len).context("steps")?, "{now}");
    let pruned = env.json(&["threads", "prune", "--older-than", "0s", "--status", "failed", "--dry-run"])?;
    ensure!(!pruned.to_string().contains(&id), "a completed thread offered as failed: {pruned}");
    Ok(())
}
}
