//! Agent bindings: scripted answers files, command agents, and binding errors.

use anyhow::Result;
use serde_json::json;

use crate::{Env, roles, thread_id_of};

/// Writes an executable script (run directly, by its #! line, never through our shell).
fn script(env: &Env, name: &str, body: &str) -> Result<String> {
    let path = env.write_script(name, format!("#!/bin/sh\n{body}"))?;
    Ok(path.display().to_string())
}

// Through the CLI only: each of these runs twice, on a home directory (`…::files`) and on a
// fresh PostgreSQL database (`…::postgres`). A test added here covers both stores.
on_both_stores! {
#[test]
fn bad_bindings_are_refused_before_the_thread_starts() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    // Specs given on the command line that cannot be used are usage errors.
    let err = env.fails(&["run", "solve-issue", "-p", "x", "--agent", "gpt-9"], 64)?;
    assert!(err.contains("agent binding `gpt-9`: not defined under `agents:`"), "{err}");
    let err =
        env.fails(&["run", "solve-issue", "-p", "x", "--agent-for", "tester=scripted"], 64)?;
    assert!(err.contains("the workflow has no role `tester`"), "{err}");
    env.fails(&["run", "solve-issue", "-p", "x", "--agent-for", "reviewer"], 64)?;
    assert_eq!(env.json(&["threads"])?, json!([]));

    // A binding defined in config.yaml, by name.
    std::fs::write(
        env.home().join("config.yaml"),
        "agents:\n  offline:\n    kind: scripted\nroles:\n  reviewer: offline\n",
    )?;
    env.ok(&["run", "solve-issue", "-p", "x"])?;
    Ok(())
}

#[test]
fn command_agent_gets_the_context_on_stdin() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let seen = env.dir.path().join("seen");
    std::fs::create_dir(&seen)?;
    // Saves its stdin and argument, answers approve-everything JSON for the reviewer.
    let agent = script(
        &env,
        "agent.sh",
        &format!(
            r#"n=$(ls {seen} | grep -c json); cat > {seen}/$n.json; echo "$1" > {seen}/$n.arg
case "$(cat {seen}/$n.json)" in
  *'"name":"reviewer"'*) echo '{{"content": "LGTM", "meta": {{"approved": true}}}}' ;;
  *) echo 'Done. {{"steps": ["a"], "summary": "did a"}}' ;;
esac"#,
            seen = seen.display()
        ),
    )?;
    let spec = format!("command:{agent}");
    let out = env.ok(&["run", "solve-issue", "-p", "Fix it", "--agent", &spec])?;
    let thread = thread_id_of(&out)?;
    let lines = env.thread_lines(&hash, &thread)?;
    assert_eq!(roles(&lines), ["planner", "developer", "reviewer"]);
    assert_eq!(lines[3]["content"], "LGTM");
    assert_eq!(lines[3]["meta"], json!({"approved": true}));

    let first: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(seen.join("0.json"))?)?;
    assert_eq!(first["threadId"], thread.as_str());
    assert_eq!(first["prompt"], "Fix it");
    assert_eq!(first["role"]["name"], "planner");
    assert!(first["role"]["systemPrompt"].as_str().unwrap().contains("You are the planner"));
    assert_eq!(first["steps"], json!([]));
    let third: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(seen.join("2.json"))?)?;
    assert_eq!(third["steps"].as_array().unwrap().len(), 2);
    assert_eq!(std::fs::read_to_string(seen.join("0.arg"))?.trim(), thread);
    Ok(())
}

#[test]
fn failing_command_agent_fails_the_thread_with_its_stderr() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let agent = script(
        &env,
        "broken.sh",
        "echo 'warming up' >&2\necho 'model quota exceeded' >&2\nexit 3",
    )?;
    let run = env.run(&[
        "run",
        "solve-issue",
        "-p",
        "x",
        "--agent-for",
        &format!("developer=command:{agent}"),
    ])?;
    assert_eq!(run.code, 1, "{run:?}");
    let lines = env.thread_lines(&hash, &thread_id_of(&run.stdout)?)?;
    assert_eq!(roles(&lines), ["planner"], "the planner ran on the default agent");
    let end = &lines.last().unwrap()["end"];
    assert_eq!(end["status"], "failed");
    let summary = end["summary"].as_str().unwrap();
    assert!(summary.contains("agent for role `developer` failed"), "{summary}");
    assert!(
        summary.contains("exit status 3") && summary.contains("warming up | model quota exceeded"),
        "{summary}"
    );

    // A program that is not there is refused before a thread exists.
    let err =
        env.fails(&["run", "solve-issue", "-p", "x", "--agent", "command:/no/such/program"], 64)?;
    assert!(err.contains("program `/no/such/program` does not exist"), "{err}");
    Ok(())
}

#[test]
fn scripted_answers_file_drives_the_thread() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let answers = env.write(
        "answers.yaml",
        r#"
planner: "Plan:\n```json\n{\"steps\": [\"write it\"]}\n```"
developer:
  - { summary: "first try" }
  - { summary: "second try" }
  - { summary: "third try" }
reviewer:
  - "Not yet. {\"approved\": false, \"comments\": [\"more\"]}"
  - "Still no. {\"approved\": false}"
  - { approved: true }
"#,
    )?;
    let spec = format!("scripted:{}", answers.display());
    let out = env.ok(&["run", "solve-issue", "-p", "x", "--agent", &spec])?;
    let lines = env.thread_lines(&hash, &thread_id_of(&out)?)?;
    assert_eq!(
        roles(&lines),
        ["planner", "developer", "reviewer", "developer", "reviewer", "developer", "reviewer"]
    );
    assert_eq!(lines[1]["meta"], json!({"steps": ["write it"]}));
    assert_eq!(lines[6]["meta"], json!({"summary": "third try"}));
    assert_eq!(lines[5]["content"], "Still no. {\"approved\": false}");
    assert_eq!(lines.last().unwrap()["end"]["summary"], "approved after 3 development round(s)");
    Ok(())
}
}
