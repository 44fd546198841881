//! The `human` agent: answered through the terminal (here a pipe) of a foreground run, or with
//! `answer` for a thread that waits.

use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use serde_json::json;

use crate::{Env, roles, thread_id_of};

#[test]
fn a_foreground_run_asks_through_its_standard_input() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let mut child = env
        .command()
        .args(["run", "solve-issue", "-p", "Fix it", "--agent-for", "reviewer=human"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child.stdin.take().unwrap().write_all(b"Looks right to me.\n{\"approved\": true}\n.\n")?;
    let out = child.wait_with_output()?;
    let stdout = String::from_utf8(out.stdout)?;
    let stderr = String::from_utf8(out.stderr)?;
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    // The question showed the role's prompt and the thread so far.
    assert!(stderr.contains("a human answer is needed for role `reviewer`"), "{stderr}");
    assert!(
        stderr.contains("You are the reviewer") && stderr.contains("# Step 2: developer"),
        "{stderr}"
    );
    let lines = env.thread_lines(&hash, &thread_id_of(&stdout)?)?;
    assert_eq!(roles(&lines), ["planner", "developer", "reviewer"]);
    // On a shared store the thread rested waiting while the question was put (a pause marker
    // before the answer's step); either way the answer is the reviewer's step.
    let review = lines.iter().find(|l| l["role"] == "reviewer").unwrap();
    assert_eq!(review["content"], "Looks right to me.\n{\"approved\": true}");
    assert_eq!(review["meta"], json!({"approved": true}));
    Ok(())
}

#[test]
fn without_anyone_to_ask_the_thread_waits_for_answer() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    // A foreground run whose input is empty: nobody answers, the thread waits.
    let run = env.run(&["run", "solve-issue", "-p", "x", "--agent-for", "reviewer=human"])?;
    assert_eq!(run.code, 75, "{run:?}");
    let thread = thread_id_of(&run.stdout)?;
    assert!(
        run.stdout.contains(&format!("`uncaged-workflow answer {thread} TEXT` continues it")),
        "{}",
        run.stdout
    );
    assert_eq!(env.json(&["thread", &thread])?["status"], "waiting");

    // A detached one waits too; threads and ps show both.
    let detached = env
        .ok(&["run", "solve-issue", "-p", "y", "--agent-for", "reviewer=human", "--detach"])?
        .trim()
        .to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    while env.json(&["thread", &detached])?["status"] != "waiting" {
        ensure!(Instant::now() < deadline, "the detached thread never waited");
        std::thread::sleep(Duration::from_millis(20));
    }
    let threads = env.json(&["threads"])?;
    assert!(threads.as_array().unwrap().iter().all(|t| t["status"] == "waiting"), "{threads}");
    let ps = env.json(&["ps"])?;
    let waiting: Vec<_> =
        ps.as_array().unwrap().iter().filter(|t| t["state"] == "waiting").collect();
    assert_eq!(waiting.len(), 2, "{ps}");
    assert_eq!(waiting[0]["role"], "reviewer");
    assert!(env.ok(&["ps"])?.contains("waiting"));

    let err = env.fails(&["answer", &thread], 64)?;
    assert!(err.contains("required"), "{err}");
    let out = env.ok(&["answer", &thread, "Ship it. {\"approved\": true}"])?;
    assert!(out.contains("completed (0)"), "{out}");
    let lines = env.thread_lines(&hash, &thread)?;
    assert_eq!(roles(&lines), ["planner", "developer", "reviewer"]);
    // The wait is a control line between the steps.
    assert_eq!(lines[3]["paused"]["by"], "waiting");
    assert_eq!(lines[3]["paused"]["role"], "reviewer");
    assert_eq!(lines[4]["content"], "Ship it. {\"approved\": true}");

    let answer = env.write("answer.txt", "{\"approved\": true}")?;
    env.ok(&["answer", &detached, "--file", answer.to_str().unwrap()])?;
    assert_eq!(env.json(&["thread", &detached])?["status"], "completed");
    let err = env.fails(&["answer", &detached, "again"], 75)?;
    assert!(err.contains("is completed: it is not waiting for a human answer"), "{err}");
    Ok(())
}
