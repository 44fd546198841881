//! `plan`: a workflow drafted from a sentence by a planner agent (scripted answers, a command
//! that reads the conversation, a model over structured output), repaired until `add`'s
//! validator takes it, confirmed or changed at the terminal, then written, added and
//! triggered. No network: the model is a server this test runs on loopback.

use std::io::Write;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use crate::Env;
use crate::llm::{MockLlm, completion, config};

/// 2030-01-01T08:59:00Z: a minute before the planned workflow's cron instant.
const BEFORE_NINE: u64 = 1_893_488_340_000;

/// A plan that names a step it does not have: what the validator sends back.
const BROKEN: &str = r#"{"name": "morning-digest", "description": "Sum up the night's failed CI runs", "trigger": {"type": "cron", "expression": "0 9 * * *"}, "failure_policy": {"on_step_failure": "stop", "max_retries": 0, "retry_delay_ms": 1000}, "steps": [{"id": "summarise", "description": "Sum up the failures", "depends_on": ["fetch"], "inputs": {"runs": "$steps.fetch.output"}}]}"#;

/// The same plan, repaired.
const REPAIRED: &str = r#"{"name": "morning-digest", "description": "Sum up the night's failed CI runs", "trigger": {"type": "cron", "expression": "0 9 * * *"}, "failure_policy": {"on_step_failure": "stop", "max_retries": 0, "retry_delay_ms": 1000}, "steps": [{"id": "fetch", "description": "List the failed runs", "depends_on": [], "inputs": {"when": "$trigger_data"}}, {"id": "summarise", "description": "Sum up the failures", "depends_on": ["fetch"], "inputs": {"runs": "$steps.fetch.output"}}]}"#;

/// The scripted planner's answers, in the order it is asked.
fn answers(plans: &[&str]) -> String {
    let mut text = String::from("$planner:\n");
    for plan in plans {
        text.push_str(&format!("  - {}\n", serde_json::to_string(plan).unwrap()));
    }
    text
}

/// Runs `plan` with `args`, `input` on its stdin.
fn plan_with_input(env: &Env, args: &[&str], input: &str) -> Result<crate::Run> {
    let mut child = env
        .command()
        .arg("plan")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    child.stdin.take().context("stdin")?.write_all(input.as_bytes())?;
    let out = child.wait_with_output()?;
    Ok(crate::Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout)?,
        stderr: String::from_utf8(out.stderr)?,
    })
}

on_both_stores! {
#[test]
fn a_sentence_becomes_a_registered_triggered_workflow() -> Result<()> {
    let env = Env::new()?;
    env.set_clock(BEFORE_NINE)?;
    env.write("plans.yaml", answers(&[BROKEN, REPAIRED]))?;
    let sentence = "Every morning at 9, sum up the night's failed CI runs";
    let run = env.run(&["plan", sentence, "--agent", "scripted:plans.yaml", "--yes"])?;
    ensure!(run.code == 0, "{run:?}");
    // The broken plan went back to the planner with add's own error, and the second was taken.
    assert!(
        run.stderr.contains("the plan did not validate: plan.yaml:1:")
            && run.stderr.contains("fetch"),
        "{}",
        run.stderr
    );
    assert!(run.stdout.contains("morning-digest: Sum up the night's failed CI runs"), "{}", run.stdout);
    assert!(run.stdout.contains("trigger: cron `0 9 * * *` (UTC)"), "{}", run.stdout);
    assert!(run.stdout.contains("└─ fetch: List the failed runs\n       └─ summarise: Sum up the failures"), "{}", run.stdout);
    assert!(run.stdout.contains("wrote morning-digest.yaml"), "{}", run.stdout);
    assert!(run.stdout.contains("its trigger is schedule morning-digest (cron 0 9 * * * (UTC))"), "{}", run.stdout);
    // The file is the plan as block YAML, and the registered workflow is built from it.
    let written = std::fs::read_to_string(env.dir.path().join("morning-digest.yaml"))?;
    assert!(written.starts_with("name: morning-digest\ndescription:"), "{written}");
    let shown = env.ok(&["show", "morning-digest"])?;
    assert!(shown.contains(written.trim_end()), "{shown}");
    // Its trigger fires at nine, and the thread it starts runs to its end.
    let pass = env.json(&["schedule", "tick"])?;
    ensure!(pass["started"].as_array().is_some_and(Vec::is_empty), "not yet: {pass}");
    env.advance(Duration::from_secs(60))?;
    let pass = env.json(&["schedule", "tick"])?;
    let started = pass["started"].as_array().context("started")?;
    ensure!(started.len() == 1, "{pass}");
    crate::wait_until("the planned workflow's thread completes", || {
        let threads = env.json(&["threads", "morning-digest"])?;
        Ok(threads.as_array().is_some_and(|t| t.len() == 1 && t[0]["status"] == "completed"))
    })?;
    Ok(())
}

#[test]
fn plans_that_never_validate_write_and_add_nothing() -> Result<()> {
    let env = Env::new()?;
    env.write("plans.yaml", answers(&[BROKEN]))?;
    let run = env.run(&[
        "plan", "Sum up CI failures", "--agent", "scripted:plans.yaml", "--yes", "--attempts", "2",
    ])?;
    ensure!(run.code == 65, "{run:?}");
    // Each refusal is reported as it goes back; the error is the last line.
    assert_eq!(run.stderr.matches("the plan did not validate").count(), 2, "{}", run.stderr);
    let e = run.stderr.lines().last().unwrap_or_default();
    assert!(e.contains("the planner gave no plan that validates in 2 attempt(s)"), "{e}");
    assert!(!env.dir.path().join("morning-digest.yaml").exists());
    assert_eq!(env.json(&["list"])?, json!([]));
    Ok(())
}
}

#[test]
fn a_person_changes_the_plan_in_words_then_confirms_it() -> Result<()> {
    let env = Env::new()?;
    let calls = env.dir.path().join("calls");
    std::fs::create_dir(&calls)?;
    let one_step = REPAIRED.replace(
        r#"{"id": "fetch", "description": "List the failed runs", "depends_on": [], "inputs": {"when": "$trigger_data"}}, {"id": "summarise", "description": "Sum up the failures", "depends_on": ["fetch"], "inputs": {"runs": "$steps.fetch.output"}}"#,
        r#"{"id": "summarise", "description": "Sum up the failures", "depends_on": [], "inputs": {}}"#,
    );
    std::fs::write(calls.join("answer-0"), &one_step)?;
    std::fs::write(calls.join("answer-1"), REPAIRED)?;
    // The planner: a program that keeps what it is sent, and answers the next plan.
    let planner = env.write_script(
        "planner.sh",
        format!(
            "#!/bin/sh\ncd {}\nn=$(ls | grep -c '^call-')\ncat > call-$n.json\ncat answer-$n\n",
            calls.display()
        ),
    )?;
    let agent = format!("command:{}", planner.display());
    let run = plan_with_input(
        &env,
        &["Sum up CI failures", "--agent", &agent, "--out", "digest.yaml", "--mermaid"],
        "what?\nm\nFetch the failed runs first\ny\n",
    )?;
    ensure!(run.code == 0, "{run:?}");
    assert!(run.stderr.contains("`what?`: answer y, m or q"), "{}", run.stderr);
    // Shown three times (the answer it did not understand shows it again), changed once.
    assert_eq!(run.stdout.matches("morning-digest: Sum up").count(), 3, "{}", run.stdout);
    assert_eq!(run.stdout.matches("flowchart LR").count(), 3, "{}", run.stdout);
    // The change went to the planner with the plan it changes, in the conversation.
    let second: Value = serde_json::from_slice(&std::fs::read(calls.join("call-1.json"))?)?;
    assert_eq!(second["prompt"], "Sum up CI failures");
    assert_eq!(second["role"]["name"], "$planner");
    let steps = second["steps"].as_array().context("steps")?;
    assert_eq!(steps.len(), 2, "{second}");
    assert_eq!(
        (steps[0]["role"].as_str(), steps[0]["content"].as_str()),
        (Some("$planner"), Some(one_step.as_str()))
    );
    assert_eq!(
        (steps[1]["role"].as_str(), steps[1]["content"].as_str()),
        (Some("$person"), Some("Fetch the failed runs first"))
    );
    let written = std::fs::read_to_string(env.dir.path().join("digest.yaml"))?;
    assert!(written.contains("- id: fetch"), "{written}");
    let listed = env.json(&["list"])?;
    assert_eq!(listed[0]["name"], "morning-digest", "{listed}");
    Ok(())
}

#[test]
fn quitting_or_no_answer_adds_nothing_and_a_file_is_not_replaced() -> Result<()> {
    let env = Env::new()?;
    env.write("plans.yaml", answers(&[REPAIRED]))?;
    let args = ["Sum up CI failures", "--agent", "scripted:plans.yaml"];
    let run = plan_with_input(&env, &args, "q\n")?;
    ensure!(run.code == 0 && run.stdout.contains("nothing written or added"), "{run:?}");
    let run = plan_with_input(&env, &args, "")?;
    ensure!(run.code == 64, "{run:?}");
    assert!(
        run.stderr.contains("no answer on standard input; --yes adds the plan without asking"),
        "{}",
        run.stderr
    );
    assert!(!env.dir.path().join("morning-digest.yaml").exists());
    assert_eq!(env.json(&["list"])?, json!([]));
    // A file in the way is named before anything is asked, and kept.
    env.write("morning-digest.yaml", "mine")?;
    let run = plan_with_input(&env, &args, "y\n")?;
    ensure!(run.code == 64 && run.stderr.contains("morning-digest.yaml exists"), "{run:?}");
    assert_eq!(std::fs::read_to_string(env.dir.path().join("morning-digest.yaml"))?, "mine");
    // A person cannot be the planner.
    let run = env.run(&["plan", "x", "--agent", "human", "--yes"])?;
    ensure!(run.code == 64 && run.stderr.contains("a person cannot be the planner"), "{run:?}");
    Ok(())
}

#[test]
fn a_model_plans_by_structured_output_and_repairs_its_plan() -> Result<()> {
    let env = Env::new()?;
    let llm = MockLlm::start(Box::new(|n, _| {
        let mut reply = completion(if n == 1 { BROKEN } else { REPAIRED });
        reply["usage"] = json!({"prompt_tokens": 1000, "completion_tokens": 200});
        (200, reply, Duration::ZERO)
    }))?;
    config(
        &env,
        &format!(
            "agents:\n  gpt:\n    kind: openai\n    base_url: {}\n    model: m\n",
            llm.base_url
        ),
    )?;
    let run = env.run(&["plan", "Sum up CI failures", "--agent", "gpt", "--yes"])?;
    ensure!(run.code == 0, "{run:?}");
    assert!(
        run.stderr.contains("the planner used 2000 tokens in, 400 out, in 2 call(s)"),
        "{}",
        run.stderr
    );
    let seen = llm.seen();
    assert_eq!(seen.len(), 2);
    // The workflow schema is the format the model must answer in.
    let format = &seen[0].body["response_format"];
    assert_eq!(format["type"], "json_schema", "{format}");
    assert_eq!(format["json_schema"]["schema"]["title"], "uncaged-workflow declarative workflow");
    assert_eq!(seen[0].body["messages"][1]["content"], "Sum up CI failures");
    // The second request carries the broken plan and what was wrong with it.
    let messages = seen[1].body["messages"].as_array().context("messages")?;
    assert_eq!(messages.len(), 4, "{messages:?}");
    assert_eq!(
        (messages[2]["role"].as_str(), messages[2]["content"].as_str()),
        (Some("assistant"), Some(BROKEN))
    );
    let sent_back = messages[3]["content"].as_str().unwrap_or_default();
    assert!(
        sent_back.starts_with("The plan does not validate: plan.yaml:1:")
            && sent_back.contains("fetch"),
        "{sent_back}"
    );
    assert_eq!(env.json(&["list"])?[0]["name"], "morning-digest");
    Ok(())
}
