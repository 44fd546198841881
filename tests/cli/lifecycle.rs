//! Threads that survive: the shared worker, ps/kill/pause/resume, fork, step, crash-safe
//! resume with the call journal.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};

use crate::{Env, alive, artifacts, roles, status, wait_until};

/// An agent that logs `start <n>` / `done <n>` (n = steps before the call) to `calls.log`,
/// sleeps `delay` seconds and answers for solve-issue: the reviewer approves on its second
/// review. `$UNCAGED_TEST_AGENT_PIDS` collects its pids.
fn slow_agent(env: &Env, delay: &str) -> Result<String> {
    let dir = env.dir.path();
    let path = env.write_script(
        "slow-agent.sh",
        format!(
            r#"#!/bin/sh
input=$(cat)
n=$(printf '%s' "$input" | grep -o '"role":"[a-z]*","content"' | wc -l)
echo "start $n" >> {log}
echo $$ >> {pids}
sleep {delay}
case "$input" in
  *'"role":{{"name":"planner"'*) answer='{{"steps": ["do it"]}}' ;;
  *'"role":{{"name":"developer"'*) answer="{{\"summary\": \"attempt $n\"}}" ;;
  *) if [ "$n" -ge 4 ]; then answer='{{"approved": true}}'; else answer='{{"approved": false}}'; fi ;;
esac
echo "answer for step $n: $answer"
echo "done $n" >> {log}
"#,
            log = dir.join("calls.log").display(),
            pids = dir.join("agent.pids").display(),
        ),
    )?;
    Ok(format!("command:{}", path.display()))
}

/// An agent that never answers; it writes its pid to `stuck.pid` first.
fn stuck_agent(env: &Env) -> Result<String> {
    let pid_file = env.dir.path().join("stuck.pid");
    let path = env.write_script(
        "stuck.sh",
        format!("#!/bin/sh\necho $$ > {}\nexec sleep 60\n", pid_file.display()),
    )?;
    Ok(format!("command:{}", path.display()))
}

fn calls_log(env: &Env) -> Result<Vec<String>> {
    let path = env.dir.path().join("calls.log");
    Ok(std::fs::read_to_string(path).unwrap_or_default().lines().map(str::to_string).collect())
}

fn ps(env: &Env) -> Result<Vec<Value>> {
    Ok(env.json(&["ps"])?.as_array().context("ps")?.clone())
}

fn detach(env: &Env, args: &[&str]) -> Result<String> {
    let mut args = args.to_vec();
    args.push("--detach");
    Ok(env.ok(&args)?.trim().to_string())
}

fn data_file(env: &Env, hash: &str, thread: &str) -> PathBuf {
    env.home().join(format!("logs/{hash}/{thread}.data.jsonl"))
}

/// The steps of a thread without their timestamps, for comparing runs.
fn steps_of(env: &Env, hash: &str, thread: &str) -> Result<Vec<Value>> {
    Ok(env
        .thread_lines(hash, thread)?
        .into_iter()
        .filter(|l| l.get("role").is_some())
        .map(|l| json!({"role": l["role"], "content": l["content"], "meta": l["meta"]}))
        .collect())
}

#[test]
fn threads_of_one_bundle_share_one_worker_that_exits_after_the_last() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    env.ok(&["add", "develop", artifacts::DEVELOP])?;
    let agent = slow_agent(&env, "0.3")?;
    let a = detach(&env, &["run", "solve-issue", "-p", "a", "--agent", &agent])?;
    let b = detach(&env, &["run", "solve-issue", "-p", "b", "--agent", &agent])?;
    let c = detach(&env, &["run", "develop", "-p", "c", "--agent", &stuck_agent(&env)?])?;
    wait_until("three threads run", || Ok(ps(&env)?.len() == 3))?;
    let running = ps(&env)?;
    let pid_of =
        |id: &str| running.iter().find(|t| t["threadId"] == id).map(|t| t["pid"].as_u64().unwrap());
    let (pa, pb, pc) = (pid_of(&a).unwrap(), pid_of(&b).unwrap(), pid_of(&c).unwrap());
    assert_eq!(pa, pb, "threads of one bundle share a worker");
    assert_ne!(pa, pc, "another bundle has its own worker");
    assert!(
        running.iter().any(|t| t["role"].is_string()),
        "ps shows the role at work: {running:?}"
    );
    let table = env.ok(&["ps"])?;
    assert!(
        table.starts_with("THREAD") && table.contains(&a) && table.contains("solve-issue"),
        "{table}"
    );

    env.ok(&["kill", &c])?;
    wait_until("both threads end", || {
        Ok(status(&env, &a)? == "completed" && status(&env, &b)? == "completed")
    })?;
    wait_until("the workers exit", || Ok(!alive(pa) && !alive(pc)))?;
    assert!(ps(&env)?.is_empty());
    assert!(env.ok(&["ps"])?.contains("no running threads"));
    Ok(())
}

#[test]
fn kill_stops_one_thread_and_its_agent_and_leaves_its_sibling() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let victim = detach(&env, &["run", "solve-issue", "-p", "v", "--agent", &stuck_agent(&env)?])?;
    let sibling =
        detach(&env, &["run", "solve-issue", "-p", "s", "--agent", &slow_agent(&env, "0.2")?])?;
    let pid_file = env.dir.path().join("stuck.pid");
    wait_until("the stuck agent runs", || {
        Ok(pid_file.exists() && !std::fs::read_to_string(&pid_file)?.is_empty())
    })?;
    let agent_pid: u64 = std::fs::read_to_string(&pid_file)?.trim().parse()?;
    assert!(alive(agent_pid));

    assert_eq!(env.ok(&["kill", &victim])?.trim(), format!("killed thread {victim}"));
    let lines = env.thread_lines(&hash, &victim)?;
    assert_eq!(lines.last().unwrap()["end"]["status"], "killed");
    assert_eq!(roles(&lines), Vec::<String>::new());
    wait_until("the agent process is gone", || Ok(!alive(agent_pid)))?;

    wait_until("the sibling completes", || Ok(status(&env, &sibling)? == "completed"))?;
    let err = env.fails(&["kill", &victim], 75)?;
    assert!(err.contains("is killed: it has already ended"), "{err}");
    Ok(())
}

/// The files under the home a process holds open.
fn open_files(pid: u64) -> Result<Vec<String>> {
    let mut files = Vec::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        if let Ok(target) = std::fs::read_link(fd?.path()) {
            files.push(target.display().to_string());
        }
    }
    Ok(files)
}

#[test]
fn a_waiting_thread_holds_only_its_data_file_open() -> Result<()> {
    // A worker holds thousands of waiting threads only if each keeps one descriptor: its data
    // file, whose lock says it runs. Its journal and debug log, written at the first step,
    // must be closed while it waits on the second.
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let pid_file = env.dir.path().join("stuck.pid");
    let agent = env.write_script(
        "plan-then-stick.sh",
        format!(
            "#!/bin/sh\ninput=$(cat)\ncase \"$input\" in\n  *'\"role\":{{\"name\":\"planner\"'*) \
             echo '{{\"steps\": [\"do it\"]}}' ;;\n  *) echo $$ > {pid}; exec sleep 60 ;;\nesac\n",
            pid = pid_file.display()
        ),
    )?;
    let agent = format!("command:{}", agent.display());
    let thread = detach(&env, &["run", "solve-issue", "-p", "w", "--agent", &agent])?;
    wait_until("the second agent call waits", || {
        Ok(pid_file.exists() && !std::fs::read_to_string(&pid_file)?.is_empty())
    })?;
    let logs = env.home().join(format!("logs/{hash}"));
    for written in ["calls", "info"] {
        let path = logs.join(format!("{thread}.{written}.jsonl"));
        ensure!(path.metadata()?.len() > 0, "{} was written at the first step", path.display());
    }
    let worker = ps(&env)?[0]["pid"].as_u64().context("worker pid")?;
    let held: Vec<String> =
        open_files(worker)?.into_iter().filter(|f| f.contains(&thread)).collect();
    assert_eq!(
        held,
        vec![data_file(&env, &hash, &thread).display().to_string()],
        "files of the waiting thread its worker holds open"
    );
    env.ok(&["kill", &thread])?;
    Ok(())
}

/// Runs solve-issue with the slow agent and a crash injected at `crash`, resumes it, and
/// checks the result against an uncrashed run: same steps, none lost or doubled, and no agent
/// call that completed was made again. On a shared store nobody resumes it: the crashed
/// worker's lease runs out and another worker takes the thread over.
fn crash_and_resume(crash: Option<&str>, kill_during_call: Option<usize>) -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let agent = slow_agent(&env, "0.2")?;
    let reference =
        crate::thread_id_of(&env.ok(&["run", "solve-issue", "-p", "c", "--agent", &agent])?)?;
    let expected = steps_of(&env, &hash, &reference)?;
    std::fs::remove_file(env.dir.path().join("calls.log"))?;
    // The worker that ran it waits a moment for more work: the crashing run must start its
    // own (which inherits the crash), not hand its thread to that one.
    env.wait_for_workers_to_exit()?;

    // A short lease, for the takeover on a shared store.
    let mut vars = vec![("UNCAGED_WORKFLOW_LEASE_MS", "1000")];
    vars.extend(crash.map(|c| ("UNCAGED_WORKFLOW_CRASH_AT", c)));
    let out =
        env.run_with(&["run", "solve-issue", "-p", "c", "--agent", &agent, "--detach"], &vars)?;
    ensure!(out.code == 0, "{out:?}");
    let thread = out.stdout.trim().to_string();
    if let Some(n) = kill_during_call {
        wait_until("the agent call is in flight", || {
            Ok(calls_log(&env)?.iter().filter(|l| l.starts_with("start")).count() == n)
        })?;
        let pid = ps(&env)?[0]["pid"].as_u64().unwrap();
        std::process::Command::new("kill").args(["-9", &pid.to_string()]).status()?;
    }
    if env.store.is_some() {
        // Its worker is gone once its lease has run out unrenewed.
        wait_until("the crashed worker's lease runs out", || {
            let expired =
                env.sql(&format!("SELECT lease_until < now() FROM threads WHERE id = '{thread}'"))?;
            Ok(expired.trim() == "t")
        })?;
        let before = steps_of(&env, &hash, &thread)?;
        assert!(before.len() < expected.len());
        env.ok(&["worker", "--exit-when-idle"])?;
        assert_eq!(status(&env, &thread)?, "completed", "crash {crash:?}");
    } else {
        wait_until("the worker is gone", || Ok(status(&env, &thread)? != "running"))?;
        assert_eq!(status(&env, &thread)?, "interrupted", "crash {crash:?}");
        let before = steps_of(&env, &hash, &thread)?;
        assert!(before.len() < expected.len());
        let out = env.ok(&["resume", &thread])?;
        assert!(out.contains("completed (0)"), "{out}");
    }
    let after = steps_of(&env, &hash, &thread)?;
    assert_eq!(after, expected, "crash {crash:?}: steps differ from an uncrashed run");
    let done: Vec<_> = calls_log(&env)?.into_iter().filter(|l| l.starts_with("done")).collect();
    assert_eq!(
        done,
        ["done 0", "done 1", "done 2", "done 3", "done 4"],
        "crash {crash:?}: a completed call was repeated"
    );
    Ok(())
}

#[test]
fn a_torn_last_line_is_repaired_when_the_thread_continues() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let thread = env.ok(&["thread", "start", "solve-issue", "-p", "t"])?.trim().to_string();
    env.ok(&["step", &thread])?;
    let file = data_file(&env, &hash, &thread);
    let mut text = std::fs::read_to_string(&file)?;
    text.push_str("{\"role\":\"developer\",\"con");
    std::fs::write(&file, text)?;
    let out = env.ok(&["resume", &thread])?;
    assert!(out.contains("completed (0)"), "{out}");
    let text = std::fs::read_to_string(&file)?;
    assert!(text.contains("\"con\n"), "the torn line was terminated");
    assert_eq!(
        roles(&read_jsonl_lenient(&file)?),
        ["planner", "developer", "reviewer", "developer", "reviewer"]
    );
    let info = env.info_text(&hash, &thread)?;
    assert!(info.contains("torn write"), "{info}");
    Ok(())
}

fn read_jsonl_lenient(path: &Path) -> Result<Vec<Value>> {
    Ok(std::fs::read_to_string(path)?
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

/// Any thread that has not ended can be ended: a paused one, one waiting for a person, one
/// whose worker died (interrupted) — each is recorded `killed`, its leftover agent stopped,
/// and `threads prune` then removes it like any ended thread.
#[test]
fn kill_ends_paused_waiting_and_interrupted_threads_and_prune_removes_them() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let paused = env.ok(&["thread", "start", "solve-issue", "-p", "p"])?.trim().to_string();
    assert_eq!(status(&env, &paused)?, "paused");
    let waiting = env
        .ok(&["run", "solve-issue", "-p", "w", "--agent-for", "planner=human", "--detach"])?
        .trim()
        .to_string();
    wait_until("it waits", || Ok(status(&env, &waiting)? == "waiting"))?;
    let agent = slow_agent(&env, "30")?;
    let interrupted = env
        .ok(&["run", "solve-issue", "-p", "i", "--agent", &agent, "--detach"])?
        .trim()
        .to_string();
    let mut worker = None;
    wait_until("its agent works", || {
        let ps = env.json(&["ps"])?;
        worker = ps.as_array().and_then(|p| {
            p.iter().find(|t| t["threadId"] == interrupted.as_str()).and_then(|t| t["pid"].as_u64())
        });
        Ok(worker.is_some() && env.dir.path().join("agent.pids").exists())
    })?;
    if env.store.is_none() {
        let worker = worker.context("the worker")?.to_string();
        std::process::Command::new("kill").args(["-9", &worker]).status()?;
        wait_until("it is interrupted", || Ok(status(&env, &interrupted)? == "interrupted"))?;
    }
    let agent_pid: u64 = std::fs::read_to_string(env.dir.path().join("agent.pids"))?
        .lines()
        .last()
        .context("the agent's pid")?
        .parse()?;
    for thread in [&paused, &waiting, &interrupted] {
        assert_eq!(env.ok(&["kill", thread])?.trim(), format!("killed thread {thread}"));
        assert_eq!(status(&env, thread)?, "killed");
        let end = env.thread_lines(&hash, thread)?.last().cloned().context("records")?;
        assert_eq!(end["end"]["status"], "killed", "{end}");
    }
    wait_until("the dead worker's agent is stopped", || Ok(!crate::alive(agent_pid)))?;
    let pruned = env.ok(&["threads", "prune", "--older-than", "0s", "--status", "killed"])?;
    assert!(pruned.contains("removed 3 thread(s)"), "{pruned}");
    Ok(())
}

// Through the CLI only: each of these runs twice, on a home directory (`…::files`) and on a
// fresh PostgreSQL database (`…::postgres`). A test added here covers both stores.
on_both_stores! {
/// A thread whose run panics — here the test's clock is taken away under its worker, which
/// then cannot tell the time — is let go: the worker says so, leaves the thread at rest for
/// `resume` rather than taking it up again, and exits once idle, as after any thread.
#[test]
fn a_thread_whose_run_panics_is_let_go_and_its_worker_exits() -> Result<()> {
    let env = Env::new()?;
    env.set_clock(1_795_000_000_000)?;
    let hash = env.add_solve_issue()?;
    let agent = slow_agent(&env, "1")?;
    let thread = detach(&env, &["run", "solve-issue", "-p", "x", "--agent", &agent])?;
    wait_until("the planner is asked", || Ok(!calls_log(&env)?.is_empty()))?;
    let worker = ps(&env)?
        .iter()
        .find(|t| t["threadId"] == thread.as_str())
        .and_then(|t| t["pid"].as_u64())
        .context("the thread's worker")?;
    std::fs::remove_file(env.dir.path().join("clock"))?;
    wait_until("the worker exits", || Ok(!alive(worker)))?;
    let logs = [format!("{hash}.log"), "pool-worker.log".to_string()]
        .map(|name| std::fs::read_to_string(env.home().join("run").join(name)).unwrap_or_default());
    let said = format!("thread {thread}: its run stopped unexpectedly");
    ensure!(logs.iter().any(|log| log.contains(&said)), "{logs:?}");
    let state = status(&env, &thread)?;
    ensure!(state != "running" && state != "queued", "left {state}");
    Ok(())
}

#[test]
fn control_commands_refuse_unknown_finished_and_malformed_ids() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    let done = crate::thread_id_of(&env.ok(&["run", "solve-issue", "-p", "x"])?)?;
    for command in ["kill", "pause", "resume", "step", "fork"] {
        let err = env.fails(&[command, "not-a-thread"], 64)?;
        assert!(err.contains("invalid thread id `not-a-thread`"), "{command}: {err}");
        let err = env.fails(&[command, "01KQXKW18CT8G75T53R8F4G7YG"], 66)?;
        assert!(err.contains("no thread `01KQXKW18CT8G75T53R8F4G7YG`"), "{command}: {err}");
    }
    for command in ["kill", "pause", "resume", "step"] {
        let err = env.fails(&[command, &done], 75)?;
        assert!(err.contains(&format!("thread `{done}` is completed")), "{command}: {err}");
    }
    Ok(())
}

#[test]
fn crash_after_a_step_was_persisted_then_resume() -> Result<()> {
    crash_and_resume(Some("step-persisted:3"), None)
}

#[test]
fn crash_after_an_agent_call_was_journaled_then_resume() -> Result<()> {
    crash_and_resume(Some("agent-recorded:2"), None)
}

#[test]
fn crash_before_an_agent_call_then_resume() -> Result<()> {
    crash_and_resume(Some("agent-call:3"), None)
}

#[test]
fn fork_keeps_a_prefix_and_leaves_the_original_untouched() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let original = crate::thread_id_of(&env.ok(&["run", "solve-issue", "-p", "orig"])?)?;
    let before = env.thread_lines(&hash, &original)?;
    let original_steps = steps_of(&env, &hash, &original)?;

    let fork_of = |args: &[&str]| -> Result<(String, Vec<Value>)> {
        let out = env.ok(args)?;
        let id = out
            .lines()
            .next()
            .and_then(|l| l.split(" into ").nth(1))
            .context("fork id")?
            .to_string();
        let lines = env.thread_lines(&hash, &id)?;
        Ok((id, lines))
    };
    let (at2, lines) = fork_of(&["fork", &original, "--at", "2"])?;
    assert_ne!(at2, original);
    assert_eq!(lines[0]["forkedFrom"], json!({"threadId": original, "step": 2}));
    assert_eq!(lines[0]["parameters"]["prompt"], "orig");
    let steps = steps_of(&env, &hash, &at2)?;
    assert_eq!(steps[..2], original_steps[..2]);
    assert_eq!(
        steps, original_steps,
        "the scripted agent answers a fork as it answered the original"
    );

    let (before_reviewer, lines) = fork_of(&["fork", &original, "--from-role", "reviewer"])?;
    // The last reviewer step is step 5: the fork keeps 4 and runs the reviewer again.
    assert_eq!(lines[0]["forkedFrom"]["step"], 4);
    assert_eq!(steps_of(&env, &hash, &before_reviewer)?[..4], original_steps[..4]);
    assert_eq!(lines.last().unwrap()["end"]["status"], "completed");

    assert_eq!(env.thread_lines(&hash, &original)?, before, "the original is untouched");
    let err = env.fails(&["fork", &original, "--at", "9"], 64)?;
    assert!(err.contains("there is no step 9 to fork at"), "{err}");
    let err = env.fails(&["fork", &original, "--from-role", "tester"], 64)?;
    assert!(err.contains("no step of role `tester`"), "{err}");
    Ok(())
}

#[test]
fn kill_9_during_an_agent_call_then_resume() -> Result<()> {
    crash_and_resume(None, Some(2))
}

#[test]
fn pause_then_resume_in_a_new_worker() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let agent = slow_agent(&env, "0.3")?;
    let thread = detach(&env, &["run", "solve-issue", "-p", "p", "--agent", &agent])?;
    wait_until("the first agent call starts", || Ok(!calls_log(&env)?.is_empty()))?;
    let pid = ps(&env)?[0]["pid"].as_u64().unwrap();
    assert_eq!(
        env.ok(&["pause", &thread])?.trim(),
        format!("thread {thread} pauses after its current step")
    );
    wait_until("the thread pauses", || Ok(status(&env, &thread)? == "paused"))?;
    wait_until("its worker exits", || Ok(!alive(pid)))?;
    let paused_steps = env.json(&["thread", &thread])?["steps"].as_array().unwrap().len();
    assert!((1..5).contains(&paused_steps), "paused after {paused_steps} steps");
    let err = env.fails(&["pause", &thread], 75)?;
    assert!(err.contains("is paused: it is not running"), "{err}");

    let out = env.ok(&["resume", &thread])?;
    assert!(out.contains(&format!("continuing after step {paused_steps}")), "{out}");
    assert!(
        out.trim_end().ends_with("completed (0): approved after 2 development round(s)"),
        "{out}"
    );
    let lines = env.thread_lines(&hash, &thread)?;
    assert_eq!(roles(&lines), ["planner", "developer", "reviewer", "developer", "reviewer"]);
    // Every agent call happened once.
    let done: Vec<_> = calls_log(&env)?.into_iter().filter(|l| l.starts_with("done")).collect();
    assert_eq!(done, ["done 0", "done 1", "done 2", "done 3", "done 4"]);
    let err = env.fails(&["resume", &thread], 75)?;
    assert!(err.contains("is completed: it has ended"), "{err}");
    Ok(())
}

#[test]
fn step_drives_a_thread_to_the_same_end_as_run() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let answers = "bundles/solve-issue/demo-answers.yaml";
    let answers = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(answers);
    let agent = format!("scripted:{}", answers.display());
    let by_run =
        crate::thread_id_of(&env.ok(&["run", "solve-issue", "-p", "same", "--agent", &agent])?)?;

    let thread = env
        .ok(&["thread", "start", "solve-issue", "-p", "same", "--agent", &agent])?
        .trim()
        .to_string();
    assert_eq!(status(&env, &thread)?, "paused");
    let mut printed = Vec::new();
    loop {
        let out: Value = serde_json::from_str(&env.ok(&["step", &thread])?)?;
        assert_eq!(out["thread"], thread.as_str());
        if out["type"] == "ended" {
            assert_eq!(out["status"], "completed");
            break;
        }
        assert_eq!(out["type"], "step");
        assert_eq!(out["index"], printed.len() + 1);
        printed.push(out["step"]["role"].as_str().unwrap().to_string());
        // Between steps the thread is at rest, and says so.
        assert_eq!(status(&env, &thread)?, "paused");
        if printed.len() > 10 {
            bail!("step never ends");
        }
    }
    assert_eq!(printed, ["planner", "developer", "reviewer", "developer", "reviewer"]);
    assert_eq!(steps_of(&env, &hash, &thread)?, steps_of(&env, &hash, &by_run)?);
    let err = env.fails(&["step", &thread], 75)?;
    assert!(err.contains("is completed"), "{err}");
    Ok(())
}
}
