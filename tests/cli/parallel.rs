//! Contract 0.2: agents asked at once, parallel groups recorded whole, exactly once per call
//! across a crash, trigger data; and bundles built for 0.1.0 still running.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use crate::{Env, artifacts, roles, status, thread_id_of, wait_until};

const REVIEWERS: [&str; 3] = ["security-reviewer", "tests-reviewer", "style-reviewer"];

/// Adds review-panel and returns its hash.
fn add_review_panel(env: &Env) -> Result<String> {
    let added = env.json(&["add", "review-panel", artifacts::REVIEW_PANEL])?;
    Ok(added["hash"].as_str().context("hash")?.to_string())
}

/// A command agent for review-panel that logs `start|done ROLE ROUND NANOS` to `agents.log`,
/// sleeps `delay` seconds (for the style reviewer: until the file `gate` exists, if given),
/// and answers: reviewers approve from the second round on.
fn panel_agent(env: &Env, delay: &str, gate: Option<&Path>) -> Result<String> {
    let log = env.dir.path().join("agents.log");
    let wait_gate = match gate {
        Some(gate) => {
            format!("if [ \"$role\" = style-reviewer ]; then {}; fi", crate::sh_wait_for(gate))
        }
        None => String::new(),
    };
    let script = env.write_script(
        "panel-agent.sh",
        format!(
            r#"#!/bin/sh
input=$(cat)
role=$(printf '%s' "$input" | sed -n 's/.*"role":{{"name":"\([a-z-]*\)".*/\1/p')
round=$(printf '%s' "$input" | grep -o '"role":"developer"' | wc -l)
echo "start $role $round $(date +%s%N)" >> {log}
sleep {delay}
{wait_gate}
echo "done $role $round $(date +%s%N)" >> {log}
case "$role" in
  developer) echo '{{"summary": "changed"}}' ;;
  *) if [ "$round" -ge 2 ]; then echo '{{"approved": true}}'; else echo '{{"approved": false, "comments": ["again"]}}'; fi ;;
esac
"#,
            log = log.display(),
        ),
    )?;
    Ok(format!("command:{}", script.display()))
}

/// `agents.log` as (event, role, round, nanoseconds).
fn agent_log(env: &Env) -> Result<Vec<(String, String, u32, u128)>> {
    let text = std::fs::read_to_string(env.dir.path().join("agents.log")).unwrap_or_default();
    text.lines()
        .map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            ensure!(f.len() == 4, "bad agent log line {line:?}");
            Ok((f[0].to_string(), f[1].to_string(), f[2].parse()?, f[3].parse()?))
        })
        .collect()
}

/// The step lines of a thread's data file.
fn steps(env: &Env, hash: &str, thread: &str) -> Result<Vec<Value>> {
    Ok(env.thread_lines(hash, thread)?.into_iter().filter(|l| l.get("role").is_some()).collect())
}

#[test]
fn kill_9_inside_a_group_then_resume_asks_only_the_unanswered_agent() -> Result<()> {
    let env = Env::new()?;
    let hash = add_review_panel(&env)?;
    let gate = env.dir.path().join("gate");
    let agent = panel_agent(&env, "0", Some(&gate))?;
    let thread = env
        .ok(&["run", "review-panel", "-p", "x", "--agent", &agent, "--detach"])?
        .trim()
        .to_string();
    // Two reviewers answered and were journaled; the style reviewer has started and waits
    // at its gate.
    wait_until("the style reviewer is at work", || {
        Ok(agent_log(&env)?
            .iter()
            .any(|(event, role, ..)| event == "start" && role == "style-reviewer"))
    })?;
    env.kill_once_journaled(&hash, &thread, 1, 2)?;
    assert_eq!(roles(&steps(&env, &hash, &thread)?), ["developer"], "no part of the group");

    std::fs::write(&gate, "")?;
    let out = env.ok(&["resume", &thread])?;
    assert!(out.contains("completed (0)"), "{out}");
    let steps = steps(&env, &hash, &thread)?;
    assert_eq!(steps.len(), 8, "no step recorded twice: {:?}", roles(&steps));

    // From the agents' own log: every answer given once, and only the unanswered call of the
    // interrupted group made again.
    let log = agent_log(&env)?;
    let mut done: HashMap<(String, u32), usize> = HashMap::new();
    let mut started: HashMap<(String, u32), usize> = HashMap::new();
    for (event, role, round, _) in &log {
        let counts = if event == "done" { &mut done } else { &mut started };
        *counts.entry((role.clone(), *round)).or_default() += 1;
    }
    assert!(done.values().all(|&n| n == 1), "an answer was given twice: {log:?}");
    assert_eq!(started[&("security-reviewer".into(), 1)], 1, "{log:?}");
    assert_eq!(started[&("tests-reviewer".into(), 1)], 1, "{log:?}");
    assert_eq!(started[&("style-reviewer".into(), 1)], 2, "killed once, asked again: {log:?}");
    Ok(())
}

/// `step` on a parallel group prints every step it took, and each step of a group carries its
/// own duration (its agent's call), not the group's: the same figures in `step`, `thread`
/// and `run`, on either store.
#[test]
fn each_step_of_a_group_has_its_own_duration_and_step_prints_every_one() -> Result<()> {
    let env = Env::new()?;
    add_review_panel(&env)?;
    let agent = env.write_script(
        "timed.sh",
        r#"#!/bin/sh
input=$(cat)
case "$input" in
  *'"name":"developer"'*) echo '{"summary": "changed"}' ; exit 0 ;;
  *'"name":"security-reviewer"'*) sleep 0.1 ;;
  *'"name":"tests-reviewer"'*) sleep 0.6 ;;
  *'"name":"style-reviewer"'*) sleep 1.2 ;;
esac
echo '{"approved": true}'
"#,
    )?;
    let agent = format!("command:{}", agent.display());
    let thread = env
        .ok(&["thread", "start", "review-panel", "-p", "x", "--agent", &agent])?
        .trim()
        .to_string();
    let lines = |out: String| -> Result<Vec<Value>> {
        out.lines().map(|l| serde_json::from_str(l).context("a JSON line")).collect()
    };
    let first = lines(env.ok(&["step", &thread])?)?;
    assert_eq!(first.len(), 1, "{first:?}");
    let group = lines(env.ok(&["step", &thread])?)?;
    let indexes: Vec<&Value> = group.iter().map(|e| &e["index"]).collect();
    assert_eq!(indexes, [2, 3, 4], "every step of the group printed: {group:?}");
    let ms = |e: &Value| e["step"]["durationMs"].as_u64().unwrap_or(0);
    let by_role: HashMap<&str, u64> =
        group.iter().map(|e| (e["step"]["role"].as_str().unwrap_or(""), ms(e))).collect();
    // Lower bounds hold however loaded the machine; the group's own duration (what every
    // step showed before) would be the style reviewer's for all three.
    assert!(by_role["tests-reviewer"] >= 600, "{by_role:?}");
    assert!(by_role["style-reviewer"] >= 1200, "{by_role:?}");
    assert!(by_role["security-reviewer"] < by_role["style-reviewer"], "{by_role:?}");
    assert!(group.iter().all(|e| e["step"]["agent"] == agent.as_str()), "{group:?}");
    // `thread` shows the same figures.
    let shown = env.json(&["thread", &thread])?;
    for (i, e) in group.iter().enumerate() {
        assert_eq!(shown["steps"][i + 1]["durationMs"], e["step"]["durationMs"], "{shown}");
    }
    Ok(())
}

// Through the CLI only: each of these runs twice, on a home directory (`…::files`) and on a
// fresh PostgreSQL database (`…::postgres`). A test added here covers both stores.
on_both_stores! {
#[test]
fn a_bundle_built_for_contract_0_1_keeps_running() -> Result<()> {
    let env = Env::new()?;
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/solve-issue-0.1.0.wasm");
    env.ok(&["add", "old", fixture.to_str().unwrap()])?;
    assert_eq!(env.json(&["show", "old"])?["contract"], "0.1.0");
    assert!(env.ok(&["show", "old"])?.contains("contract: uncaged:workflow@0.1.0"));
    let out = env.ok(&["run", "old", "-p", "Fix the crash"])?;
    assert!(out.contains("completed (0): approved after 2 development round(s)"), "{out}");
    // The same thread as the 0.2 build of the same workflow.
    env.add_solve_issue()?;
    let new = env.ok(&["run", "solve-issue", "-p", "Fix the crash"])?;
    let strip = |out: &str| -> Vec<String> {
        out.lines()
            .filter(|l| l.starts_with('['))
            .map(|l| l.split(',').next().unwrap().to_string())
            .collect()
    };
    assert_eq!(strip(&out), strip(&new));
    Ok(())
}

#[test]
fn a_component_of_another_contract_version_is_refused_naming_it() -> Result<()> {
    let env = Env::new()?;
    let mut bytes = std::fs::read(artifacts::REVIEW_PANEL)?;
    // The same component, its contract names moved to a version no host runs (same length,
    // so the binary stays well-formed).
    let (from, to) = (b"uncaged:workflow/".as_slice(), b"@0.3.0".as_slice());
    let mut i = 0;
    let mut replaced = 0;
    while let Some(at) = bytes[i..].windows(from.len()).position(|w| w == from) {
        let start = i + at;
        let end = bytes[start..].iter().position(|&b| b == b'@').map(|p| start + p);
        if let Some(end) = end.filter(|&e| bytes[e..].starts_with(to)) {
            bytes[end..end + to.len()].copy_from_slice(b"@0.9.0");
            replaced += 1;
        }
        i = start + from.len();
    }
    ensure!(replaced > 0, "no contract name found in the component");
    let path = env.write("future.wasm", bytes)?;
    let err = env.fails(&["add", "future", path.to_str().unwrap()], 65)?;
    assert!(err.contains("uncaged:workflow@0.9.0"), "{err}");
    assert!(err.contains("0.1.0, 0.2.0 and 0.3.0"), "{err}");
    Ok(())
}

#[test]
fn a_pause_during_a_group_stops_after_the_whole_group() -> Result<()> {
    let env = Env::new()?;
    let hash = add_review_panel(&env)?;
    // Long enough that the pause surely arrives while the reviewers work.
    let agent = panel_agent(&env, "2", None)?;
    let thread = env
        .ok(&["run", "review-panel", "-p", "x", "--agent", &agent, "--detach"])?
        .trim()
        .to_string();
    wait_until("the reviewers work", || {
        Ok(env.json(&["ps"])?[0]["role"].as_str().is_some_and(|r| r.contains("style-reviewer")))
    })?;
    env.ok(&["pause", &thread])?;
    wait_until("the thread pauses", || Ok(status(&env, &thread)? == "paused"))?;
    let mut expected = vec!["developer"];
    expected.extend(REVIEWERS);
    assert_eq!(roles(&steps(&env, &hash, &thread)?), expected);
    Ok(())
}

#[test]
fn forking_inside_a_group_is_refused_and_at_its_edge_works() -> Result<()> {
    let env = Env::new()?;
    add_review_panel(&env)?;
    let thread = thread_id_of(&env.ok(&["run", "review-panel", "-p", "x"])?)?;
    let err = env.fails(&["fork", &thread, "--at", "3"], 64)?;
    assert!(
        err.contains("inside a parallel group (steps 2-4 ran together): fork at 1 or 4"),
        "{err}"
    );
    for at in ["1", "4"] {
        let out = env.ok(&["fork", &thread, "--at", at])?;
        assert!(out.contains("completed (0)"), "--at {at}: {out}");
    }
    Ok(())
}

#[test]
fn kill_during_a_group_stops_every_agent_of_it() -> Result<()> {
    let env = Env::new()?;
    add_review_panel(&env)?;
    let pids = env.dir.path().join("pids");
    // The developer answers; each reviewer records its pid and works for ten minutes.
    let script = env.write_script(
        "stuck-reviewers.sh",
        format!(
            "#!/bin/sh\ninput=$(cat)\ncase \"$input\" in\n  *'\"role\":{{\"name\":\"developer\"'*) echo '{{\"summary\": \"x\"}}' ;;\n  *) echo $$ >> {}; exec sleep 600 ;;\nesac\n",
            pids.display()
        ),
    )?;
    let agent = format!("command:{}", script.display());
    let thread = env
        .ok(&["run", "review-panel", "-p", "x", "--agent", &agent, "--detach"])?
        .trim()
        .to_string();
    let reviewers = || -> Vec<u64> {
        std::fs::read_to_string(&pids)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    };
    wait_until("three reviewers work", || Ok(reviewers().len() == 3))?;
    let running = reviewers();
    assert!(running.iter().all(|&pid| crate::alive(pid)));
    env.ok(&["kill", &thread])?;
    wait_until("every reviewer is stopped", || Ok(running.iter().all(|&pid| !crate::alive(pid))))?;
    assert_eq!(status(&env, &thread)?, "killed");
    Ok(())
}

#[test]
fn review_panel_in_rust_python_and_javascript_record_the_same_thread() -> Result<()> {
    let env = Env::new()?;
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut threads = Vec::new();
    for (name, file) in [
        ("rust", PathBuf::from(artifacts::REVIEW_PANEL)),
        ("python", repo.join("target/bundles/review_panel_py.wasm")),
        ("js", repo.join("target/bundles/review_panel_js.wasm")),
    ] {
        ensure!(file.exists(), "{} is missing: run `make bundles` first", file.display());
        let hash = env.json(&["add", name, file.to_str().unwrap()])?["hash"]
            .as_str()
            .context("hash")?
            .to_string();
        let out = env.ok(&["run", name, "-p", "Validate the upload size"])?;
        assert!(out.contains("all three reviewers approved after 2 round(s)"), "{name}: {out}");
        let steps: Vec<Value> = steps(&env, &hash, &thread_id_of(&out)?)?
            .into_iter()
            .map(|s| json!([s["role"], s["content"], s["meta"], s["group"]]))
            .collect();
        threads.push((name, steps));
    }
    assert_eq!(threads[0].1.len(), 8);
    for (name, steps) in &threads[1..] {
        assert_eq!(steps, &threads[0].1, "{name} recorded a different thread than rust");
    }
    let shows: Vec<Value> =
        ["rust", "python", "js"].iter().map(|n| env.json(&["show", n])).collect::<Result<_>>()?;
    for show in &shows {
        assert_eq!(show["roles"], shows[0]["roles"]);
        assert_eq!(show["contract"], "0.3.0");
    }
    Ok(())
}

#[test]
fn three_reviewers_work_at_once_and_their_steps_land_as_one_group() -> Result<()> {
    let env = Env::new()?;
    let hash = add_review_panel(&env)?;
    let agent = panel_agent(&env, "1", None)?;
    let out =
        env.ok(&["run", "review-panel", "-p", "Validate the upload size", "--agent", &agent])?;
    assert!(out.contains("completed (0): all three reviewers approved after 2 round(s)"), "{out}");
    assert!(out.contains("[2 ∥ 2-4] security-reviewer"), "each step printed with its group: {out}");
    let thread = thread_id_of(&out)?;

    let steps = steps(&env, &hash, &thread)?;
    let mut expected = vec!["developer"];
    expected.extend(REVIEWERS);
    expected.push("developer");
    expected.extend(REVIEWERS);
    assert_eq!(roles(&steps), expected);
    for (i, step) in steps.iter().enumerate() {
        let group = match i + 1 {
            2..=4 => json!({"first": 2, "size": 3}),
            6..=8 => json!({"first": 6, "size": 3}),
            _ => Value::Null,
        };
        assert_eq!(step["group"], group, "step {}", i + 1);
    }

    // The agents' own clocks: in each round the three reviews overlap (each sleeps 1 s; one
    // after another, each would start after the previous one was done).
    let log = agent_log(&env)?;
    for round in [1, 2] {
        let at = |event: &str| -> Vec<u128> {
            log.iter()
                .filter(|(e, role, r, _)| e == event && *r == round && role != "developer")
                .map(|&(_, _, _, ns)| ns)
                .collect()
        };
        let (starts, ends) = (at("start"), at("done"));
        assert_eq!((starts.len(), ends.len()), (3, 3), "round {round}: {log:?}");
        assert!(
            starts.iter().max() < ends.iter().min(),
            "round {round}: every review started before any finished: {log:?}"
        );
    }
    // The call journal agrees: the three answers of a round were journaled within one sleep.
    let calls = env.calls(&hash, &thread)?;
    let answered: Vec<u64> = calls
        .iter()
        .filter(|c| c["kind"] == "agent" && c["step"] == 1)
        .map(|c| c["timestamp"].as_u64().unwrap())
        .collect();
    assert_eq!(answered.len(), 3, "{calls:?}");
    assert!(answered.iter().max().unwrap() - answered.iter().min().unwrap() < 1000, "{answered:?}");

    // `thread` marks the steps that ran together, as text and as JSON.
    let shown = env.ok(&["thread", &thread])?;
    assert!(shown.contains("[3 ∥ 2-4] tests-reviewer"), "{shown}");
    let json = env.json(&["thread", &thread])?;
    assert_eq!(json["steps"][6]["group"], json!({"first": 6, "size": 3}), "{json}");
    Ok(())
}

#[test]
fn trigger_data_is_recorded_in_the_start_record() -> Result<()> {
    let env = Env::new()?;
    let hash = add_review_panel(&env)?;
    let data = r#"{"id": 7, "title": "new item"}"#;
    let out = env.ok(&["run", "review-panel", "-p", "x", "--trigger-data", data])?;
    let thread = thread_id_of(&out)?;
    let start = &env.thread_lines(&hash, &thread)?[0];
    assert_eq!(start["triggerData"], json!({"id": 7, "title": "new item"}));
    let err = env.fails(&["run", "review-panel", "-p", "x", "--trigger-data", "{not json"], 64)?;
    assert!(err.contains("--trigger-data is not JSON"), "{err}");
    Ok(())
}
}
