//! The `human` agent: answered through the terminal (here a pipe) of a foreground run, or with
//! `answer` for a thread that waits.

use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde_json::json;

use crate::{Env, roles, thread_id_of};

/// A pseudo-terminal for a command (`script` from util-linux puts it on one): what is written
/// to the returned stdin arrives as typed at that terminal, as fast as it is written.
pub fn on_a_terminal(env: &Env, args: &[&str]) -> Result<std::process::Child> {
    let bin = env!("CARGO_BIN_EXE_uncaged-workflow");
    let command = std::iter::once(bin)
        .chain(args.iter().copied())
        .map(|a| format!("'{}'", a.replace('\'', "'\\''")))
        .collect::<Vec<_>>()
        .join(" ");
    Ok(env
        .command_of("script")
        .args(["-qfec", &command, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?)
}

/// Reads `child`'s output until `needle` shows (60 s at most), returning what was read.
pub fn read_until(out: &mut impl std::io::Read, needle: &str) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains(needle) {
        ensure!(Instant::now() < deadline, "no `{needle}` in: {}", String::from_utf8_lossy(&seen));
        let n = out.read(&mut buf)?;
        ensure!(n > 0, "output ended before `{needle}`: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    Ok(String::from_utf8_lossy(&seen).into_owned())
}

/// A foreground `run` whose reviewer is a person, answered by `typed` on its standard input;
/// what it printed, once it exited 0.
fn answered_run(env: &Env, typed: &[u8]) -> Result<(String, String)> {
    let mut child = env
        .command()
        .args(["run", "solve-issue", "-p", "Fix it", "--agent-for", "reviewer=human"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child.stdin.take().context("stdin")?.write_all(typed)?;
    let out = child.wait_with_output()?;
    let (stdout, stderr) = (String::from_utf8(out.stdout)?, String::from_utf8(out.stderr)?);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    Ok((stdout, stderr))
}

// Through the CLI only: each of these runs twice, on a home directory (`…::files`) and on a
// fresh PostgreSQL database (`…::postgres`). A test added here covers both stores.
on_both_stores! {
#[test]
fn a_foreground_run_asks_through_its_standard_input() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let (stdout, stderr) = answered_run(&env, b"Looks right to me.\n{\"approved\": true}\n.\n")?;
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

/// A pasted answer of twenty lines, written to a real terminal faster than anyone types,
/// arrives whole.
#[test]
fn a_pasted_answer_at_a_terminal_arrives_whole() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let mut child = on_a_terminal(
        &env,
        &[
            "run",
            "solve-issue",
            "-p",
            "Fix it",
            "--agent-for",
            "reviewer=human",
            "--color",
            "never",
        ],
    )?;
    let mut out = child.stdout.take().expect("stdout");
    // Written as soon as the question shows, before the line editor starts: typed ahead.
    read_until(&mut out, "You are the reviewer")?;
    let lines: Vec<String> = (1..=20).map(|i| format!("line {i} of the review")).collect();
    let typed = format!("{}\r{{\"approved\": true}}\r.\r", lines.join("\r"));
    child.stdin.as_mut().expect("stdin").write_all(typed.as_bytes())?;
    let rest = read_until(&mut out, "completed (0)")?;
    drop(child.stdin.take());
    child.wait()?;
    let thread = env.json(&["threads"])?[0]["threadId"].as_str().unwrap_or_default().to_string();
    let review = env.thread_lines(&hash, &thread)?.into_iter().find(|l| l["role"] == "reviewer");
    let content = review.map(|r| r["content"].as_str().unwrap_or_default().to_string());
    let want = format!("{}\n{{\"approved\": true}}", lines.join("\n"));
    ensure!(content.as_deref() == Some(want.as_str()), "answer {content:?}; terminal: {rest}");
    Ok(())
}

/// An answer that is not the JSON the role asks for is asked again, with the reason and the
/// shape expected; the thread is never failed by a typo.
#[test]
fn an_answer_that_does_not_fit_the_role_is_asked_again() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let (stdout, stderr) = answered_run(
        &env,
        b"ok, ship it\n.\n{\"approved\": \"yes\"}\n.\nShip it. {\"approved\": true}\n.\n",
    )?;
    ensure!(stderr.contains("answer with JSON like {\"approved\":"), "{stderr}");
    ensure!(
        stderr.contains("that answer does not fit role `reviewer`: the answer holds no JSON"),
        "{stderr}"
    );
    ensure!(stderr.matches("that answer does not fit").count() == 2, "{stderr}");
    let lines = env.thread_lines(&hash, &thread_id_of(&stdout)?)?;
    let review = lines.iter().find(|l| l["role"] == "reviewer").unwrap();
    assert_eq!(review["content"], "Ship it. {\"approved\": true}");
    Ok(())
}

/// `answer` refuses an answer that does not fit, in one line, and records nothing: the thread
/// still waits, and a fitting answer continues it.
#[test]
fn answer_refuses_a_typo_and_records_nothing() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let thread = env
        .ok(&["run", "solve-issue", "-p", "y", "--agent-for", "reviewer=human", "--detach"])?
        .trim()
        .to_string();
    crate::wait_until("it waits", || Ok(crate::status(&env, &thread)? == "waiting"))?;
    let calls = env.calls(&hash, &thread)?;
    let err = env.fails(&["answer", &thread, "LGTM"], 65)?;
    ensure!(
        err.contains("the answer for role `reviewer` does not fit") && err.contains("JSON like"),
        "{err}"
    );
    assert_eq!(env.calls(&hash, &thread)?, calls, "nothing journaled");
    assert_eq!(crate::status(&env, &thread)?, "waiting");
    let out = env.ok(&["answer", &thread, "{\"approved\": true}"])?;
    ensure!(out.contains("completed (0)"), "{out}");
    Ok(())
}

/// Answers sent at once: exactly one is accepted, it is the one the thread uses, and it is
/// the only one in the journal.
#[test]
fn concurrent_answers_accept_one_and_record_only_it() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    for round in 0..3 {
        let thread = env
            .ok(&["run", "solve-issue", "-p", "y", "--agent-for", "reviewer=human", "--detach"])?
            .trim()
            .to_string();
        crate::wait_until("it waits", || Ok(crate::status(&env, &thread)? == "waiting"))?;
        let children: Vec<_> = (0..8)
            .map(|i| {
                env.command()
                    .args([
                        "answer",
                        &thread,
                        &format!("answer {i}: {{\"approved\": true}}"),
                        "--detach",
                    ])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
            })
            .collect::<std::io::Result<_>>()?;
        let mut accepted = Vec::new();
        for (i, child) in children.into_iter().enumerate() {
            let out = child.wait_with_output()?;
            match out.status.code() {
                Some(0) => accepted.push(i),
                Some(75) => {}
                other => anyhow::bail!(
                    "answer {i} exited {other:?}: {}",
                    String::from_utf8_lossy(&out.stderr)
                ),
            }
        }
        ensure!(accepted.len() == 1, "round {round}: accepted {accepted:?}");
        crate::wait_until("it completes", || Ok(crate::status(&env, &thread)? == "completed"))?;
        let used = format!("answer {}: {{\"approved\": true}}", accepted[0]);
        let review =
            env.thread_lines(&hash, &thread)?.into_iter().find(|l| l["role"] == "reviewer");
        assert_eq!(review.map(|r| r["content"].clone()), Some(json!(used)));
        let answers: Vec<_> =
            env.calls(&hash, &thread)?.into_iter().filter(|c| c["role"] == "reviewer").collect();
        assert_eq!(answers.len(), 1, "only the accepted answer is journaled: {answers:?}");
    }
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
    // The wait is a control line between the steps, and so is its worker taking it up again.
    assert_eq!(lines[3]["paused"]["by"], "waiting");
    assert_eq!(lines[3]["paused"]["role"], "reviewer");
    assert!(lines[4]["continued"]["by"].as_str().is_some_and(|by| !by.is_empty()), "{}", lines[4]);
    assert_eq!(lines[5]["content"], "Ship it. {\"approved\": true}");

    let answer = env.write("answer.txt", "{\"approved\": true}")?;
    env.ok(&["answer", &detached, "--file", answer.to_str().unwrap()])?;
    assert_eq!(env.json(&["thread", &detached])?["status"], "completed");
    let err = env.fails(&["answer", &detached, "again"], 75)?;
    assert!(err.contains("is completed: it is not waiting for a human answer"), "{err}");
    Ok(())
}
}
