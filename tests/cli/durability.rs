//! Nothing lost, nothing leaked: a thread appears whole or not at all, a full disk interrupts a
//! thread instead of failing it, an agent process does not outlive its worker, and a misspelt
//! key in `config.yaml` is refused rather than ignored.

use std::path::Path;

use anyhow::{Context, Result, ensure};
use serde_json::json;

use crate::{Env, alive, read_jsonl, status, thread_id_of, wait_until};

/// An agent for solve-issue that answers each role, after `gate` exists if one is given.
fn agent(env: &Env, gate: Option<&Path>) -> Result<String> {
    let wait = gate.map_or(String::new(), |gate| format!("{}\n", crate::sh_wait_for(gate)));
    let path = env.write_script(
        "agent.sh",
        format!(
            r#"#!/bin/sh
input=$(cat)
{wait}case "$input" in
  *'"role":{{"name":"planner"'*) echo '{{"steps": ["do it"]}}' ;;
  *'"role":{{"name":"developer"'*) echo '{{"summary": "done"}}' ;;
  *) echo '{{"approved": true}}' ;;
esac
"#
        ),
    )?;
    Ok(format!("command:{}", path.display()))
}

#[test]
fn a_crash_while_creating_a_thread_or_a_fork_leaves_no_thread() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let crash = [("UNCAGED_WORKFLOW_CRASH_AT", "thread-create:1")];
    let out = env.run_with(&["run", "solve-issue", "-p", "x"], &crash)?;
    ensure!(out.code != 0, "the crash point was not reached: {out:?}");
    assert_eq!(env.json(&["threads"])?, json!([]));
    let listed = env.run(&["threads"])?;
    assert!(listed.stderr.is_empty(), "{}", listed.stderr);

    let original = thread_id_of(&env.ok(&["run", "solve-issue", "-p", "x"])?)?;
    let data = env.home().join(format!("logs/{hash}/{original}.data.jsonl"));
    let before = std::fs::read(&data)?;
    let out = env.run_with(&["fork", &original, "--at", "2"], &crash)?;
    ensure!(out.code != 0, "the crash point was not reached: {out:?}");
    let threads = env.json(&["threads"])?;
    assert_eq!(threads.as_array().unwrap().len(), 1, "{threads}");
    assert_eq!(std::fs::read(&data)?, before, "the original is untouched");
    // What a crash can leave is not a thread: every file of the thread directory is the
    // original's, or a temporary file no listing reads.
    for entry in std::fs::read_dir(data.parent().unwrap())? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        assert!(name.starts_with(&original) || name.starts_with(".tmp-"), "{name}");
    }
    Ok(())
}

#[test]
fn thread_rm_removes_a_thread_file_whatever_its_state() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let dir = env.home().join(format!("logs/{hash}"));
    std::fs::create_dir_all(&dir)?;
    // An empty file and one of noise, as an older version could leave after a crash.
    for (id, content) in
        [("01KQXKW18CT8G75T53R8F4G7YG", &b""[..]), ("01KQXKW18CT8G75T53R8F4G7YH", b"\xff\x00")]
    {
        let path = dir.join(format!("{id}.data.jsonl"));
        std::fs::write(&path, content)?;
        assert_eq!(env.ok(&["thread", "rm", id])?.trim(), format!("deleted thread {id}"));
        assert!(!path.exists());
    }
    Ok(())
}

/// A small tmpfs mounted for the test, unmounted when dropped.
#[test]
fn a_full_disk_interrupts_a_thread_and_resume_continues_it() -> Result<()> {
    let env = Env::new()?;
    let Some(disk) = crate::Mount::tmpfs(&env.home(), "64M")? else { return Ok(()) };
    let hash = env.add_solve_issue()?;
    let gate = env.dir.path().join("gate");
    let agent = agent(&env, Some(&gate))?;
    let thread = env.ok(&["run", "solve-issue", "-p", "x", "--agent", &agent, "--detach"])?;
    let thread = thread.trim();
    wait_until("the planner's agent runs", || Ok(env.json(&["ps"])?[0]["role"] == "planner"))?;
    let filler = disk.fill()?;
    std::fs::write(&gate, "")?;
    wait_until("the thread stops", || Ok(status(&env, thread)? != "running"))?;
    assert_eq!(status(&env, thread)?, "interrupted", "a full disk ends nothing");
    let lines = read_jsonl(&env.home().join(format!("logs/{hash}/{thread}.data.jsonl")))?;
    assert!(lines.iter().all(|l| l.get("end").is_none()), "no end record: {lines:?}");

    std::fs::remove_file(filler)?;
    let out = env.ok(&["resume", thread])?;
    assert!(out.contains("completed (0)"), "{out}");
    Ok(())
}

/// An append the disk has room for only part of leaves no fragment: the part that was written
/// is cut back off, so that once there is room again, the records that follow are whole and
/// no damaged line sits in the middle of the thread's files (at 4abdda5 the fragment stayed,
/// and the next append landed after it). A real full file system: a small tmpfs.
#[test]
fn an_append_cut_short_by_a_full_disk_leaves_no_fragment() -> Result<()> {
    let env = Env::new()?;
    if env.store.is_some() {
        return Ok(());
    }
    let Some(disk) = crate::Mount::tmpfs(&env.home(), "64M")? else { return Ok(()) };
    let hash = env.add_solve_issue()?;
    let gate = env.dir.path().join("gate");
    // Each answer is 256 KiB: an append of it has room for a part only.
    let script = env.write_script(
        "big.sh",
        format!(
            r#"#!/bin/sh
input=$(cat)
{}
pad=$(head -c 262144 /dev/zero | tr '\0' x)
case "$input" in
  *'"role":{{"name":"planner"'*) echo "{{\"steps\": [\"$pad\"]}}" ;;
  *'"role":{{"name":"developer"'*) echo "{{\"summary\": \"$pad\"}}" ;;
  *) echo '{{"approved": true}}' ;;
esac
"#,
            crate::sh_wait_for(&gate)
        ),
    )?;
    let agent = format!("command:{}", script.display());
    let thread = env.ok(&["run", "solve-issue", "-p", "x", "--agent", &agent, "--detach"])?;
    let thread = thread.trim();
    wait_until("the planner's agent runs", || Ok(env.json(&["ps"])?[0]["role"] == "planner"))?;
    let filler = disk.fill()?;
    // Room for 64 KiB of the answer's 256.
    let len = std::fs::metadata(&filler)?.len();
    std::fs::OpenOptions::new().write(true).open(&filler)?.set_len(len - (64 << 10))?;
    std::fs::write(&gate, "")?;
    wait_until("the thread stops", || Ok(status(&env, thread)? != "running"))?;
    assert_eq!(status(&env, thread)?, "interrupted", "a full disk ends nothing");
    let files = [
        env.home().join(format!("logs/{hash}/{thread}.data.jsonl")),
        env.home().join(format!("logs/{hash}/{thread}.calls.jsonl")),
    ];
    for file in &files {
        let bytes = std::fs::read(file).unwrap_or_default();
        ensure!(
            bytes.is_empty() || bytes.ends_with(b"\n"),
            "{}: a fragment at its end",
            file.display()
        );
    }
    std::fs::remove_file(filler)?;
    let out = env.ok(&["resume", thread])?;
    assert!(out.contains("completed (0)"), "{out}");
    for file in &files {
        let text = std::fs::read_to_string(file)?;
        for (n, line) in text.lines().enumerate() {
            ensure!(
                serde_json::from_str::<serde_json::Value>(line).is_ok(),
                "{} line {}: not a record: {:.80}",
                file.display(),
                n + 1,
                line
            );
        }
    }
    Ok(())
}

#[test]
fn an_agent_process_does_not_outlive_its_worker() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    let pid_file = env.dir.path().join("agent.pid");
    // It would sleep well past any wait of this test if nothing stopped it.
    let stuck = env.write_script(
        "stuck.sh",
        format!("#!/bin/sh\necho $$ > {}\nexec sleep 600\n", pid_file.display()),
    )?;
    let spec = format!("command:{}", stuck.display());
    let thread = env.ok(&["run", "solve-issue", "-p", "x", "--agent", &spec, "--detach"])?;
    let agent = pid_written_to(&pid_file, "the agent runs")?;
    assert!(alive(agent));
    env.kill_the_worker()?;
    wait_until("the agent is gone with its worker", || Ok(!alive(agent)))?;
    // The worker's files (its run lock) close a moment after the agent's death signal: the
    // thread that spawned the agent exits before the last of the worker's threads.
    wait_until("the thread is interrupted", || Ok(status(&env, thread.trim())? == "interrupted"))?;
    Ok(())
}

/// Waits until an agent script has written a process id to `file`, and reads it.
fn pid_written_to(file: &Path, what: &str) -> Result<u64> {
    wait_until(what, || Ok(std::fs::read_to_string(file).is_ok_and(|t| t.ends_with('\n'))))?;
    Ok(std::fs::read_to_string(file)?.trim().parse()?)
}

#[test]
fn what_an_agent_started_is_stopped_before_its_thread_runs_again() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    let dir = env.dir.path();
    let helper_pid = dir.join("helper.pid");
    // The agent starts a helper (a compiler, a test run…) in its process group and works on;
    // the helper is not the worker's child, so the worker's death does not reach it.
    let agent = env.write_script(
        "coder.sh",
        format!("#!/bin/sh\nsleep 600 & echo $! > {}\nexec sleep 600\n", helper_pid.display()),
    )?;
    let spec = format!("command:{}", agent.display());
    let thread = env.ok(&["run", "solve-issue", "-p", "x", "--agent", &spec, "--detach"])?;
    let thread = thread.trim();
    let helper = pid_written_to(&helper_pid, "the helper runs")?;
    env.kill_the_worker()?;
    wait_until("the thread is interrupted", || Ok(status(&env, thread)? == "interrupted"))?;
    assert!(alive(helper), "the helper outlives the worker (what this test is about)");

    let out = env.ok(&["resume", thread, "--agent", "scripted"])?;
    assert!(out.contains("completed (0)"), "{out}");
    assert!(!alive(helper), "the helper was stopped before the call was made again");
    assert!(!env.home().join(format!("run/agents/{thread}.json")).exists());
    Ok(())
}

#[test]
fn misspelt_keys_in_config_are_refused_with_the_closest_one() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    let config = env.home().join("config.yaml");
    for (yaml, wanted) in [
        (
            "agents:\n  llm:\n    kind: openai\n    base_url: http://127.0.0.1:9/v1\n    model: m\n    api_key_envv: KEY\n",
            "unknown key `agents.llm.api_key_envv`; did you mean `agents.llm.api_key_env`?",
        ),
        (
            "agents:\n  c:\n    kind: command\n    command: /bin/true\n    timout: 5\n",
            "unknown key `agents.c.timout`; did you mean `agents.c.timeout`?",
        ),
        ("extractor:\n  agent: x\n  retrys: 2\n", "did you mean `extractor.retries`?"),
        ("limits:\n  memroy: 1GiB\n", "did you mean `limits.memory`?"),
    ] {
        std::fs::write(&config, yaml)?;
        let err = env.fails(&["run", "solve-issue", "-p", "x"], 65)?;
        assert!(err.contains(wanted), "{err}");
        assert!(err.contains("config.yaml"), "{err}");
    }
    assert_eq!(env.json(&["threads"])?, json!([]));
    Ok(())
}

/// A value of the wrong type in config.yaml is named by its whole key path.
#[test]
fn a_config_value_of_the_wrong_type_names_its_key_path() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    let config = env.home().join("config.yaml");
    for (yaml, wanted) in [
        (
            "agents:\n  reviewer:\n    kind: command\n    command: /bin/true\n    timeout: [1]\n",
            "agents.reviewer.timeout: expected seconds or a duration, got a list",
        ),
        (
            "agents:\n  r:\n    kind: openai\n    base_url: http://x\n    model: m\n    temperature: hot\n",
            "agents.r.temperature: invalid type: string \"hot\", expected f64",
        ),
        ("agents:\n  c:\n    kind: command\n    command: 5\n", "agents.c.command: invalid type"),
        ("roles:\n  planner: [x]\n", "roles.planner: invalid type: sequence"),
        ("limits:\n  max-rounds: abc\n", "limits.max-rounds: `abc` is not a whole number"),
        ("limits:\n  memory: [1]\n", "limits.memory: expected a number or a size, got a list"),
    ] {
        std::fs::write(&config, yaml)?;
        let err = env.fails(&["run", "solve-issue", "-p", "x"], 65)?;
        assert!(err.contains(wanted) && err.contains("config.yaml: "), "{yaml}: {err}");
    }
    Ok(())
}

/// A home that cannot be written to is read as it is: a listing says nothing of the cache it
/// could not keep, and a command that must write fails in one line.
#[test]
fn a_read_only_home_lists_quietly_and_fails_in_one_line() -> Result<()> {
    let env = Env::new()?;
    if env.store.is_some() {
        return Ok(());
    }
    // A cache of its own, in the home: read-only with it.
    env.own_cache()?;
    let hash = env.add_solve_issue()?;
    let thread = thread_id_of(&env.ok(&["run", "solve-issue", "-p", "x"])?)?;
    // The listing index is not written yet for a thread made since the last listing.
    std::fs::remove_file(env.home().join("logs/threads.index")).ok();
    let Some(_mount) = crate::Mount::read_only(&env.home())? else { return Ok(()) };
    // A bundle not compiled yet: its code cannot be cached either, and that is not said
    // before the one-line error (at 4abdda5 a WARN line came first).
    let err = env.fails(&["add", "develop", crate::artifacts::DEVELOP], 74)?;
    assert!(err.contains("Read-only"), "{err}");
    let listed = env.run(&["threads"])?;
    assert_eq!((listed.code, listed.stderr.as_str()), (0, ""), "{}", listed.stdout);
    assert!(listed.stdout.contains(&thread), "{}", listed.stdout);
    let err = env.fails(&["run", "solve-issue", "-p", "x"], 74)?;
    assert!(err.contains(&format!("logs/{hash}")) && err.contains("Read-only"), "{err}");
    Ok(())
}

#[test]
fn prune_removes_only_ended_threads_that_match_and_finishes_crashed_removals() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let run = |args: &[&str]| -> Result<String> {
        let mut all = vec!["run", "solve-issue", "-p", "x"];
        all.extend(args);
        thread_id_of(&env.run(&all)?.stdout)
    };
    let completed = [run(&[])?, run(&[])?, run(&[])?];
    let failed = run(&["--max-rounds", "1"])?;
    assert_eq!(status(&env, &failed)?, "failed");
    let paused = env.ok(&["thread", "start", "solve-issue", "-p", "x"])?.trim().to_string();
    let count = || -> Result<usize> { Ok(env.json(&["threads"])?.as_array().unwrap().len()) };

    let dry = env.ok(&["threads", "prune", "--older-than", "0s", "--dry-run"])?;
    assert!(dry.contains("would remove 4 thread(s)"), "{dry}");
    assert_eq!(count()?, 5);
    let none = env.ok(&["threads", "prune", "--older-than", "1h"])?;
    assert!(none.contains("removed 0 thread(s)"), "{none}");
    let gone = env.json(&["threads", "prune", "--older-than", "0s", "--status", "failed"])?;
    assert_eq!(gone[0]["threadId"], failed.as_str());
    assert_eq!(gone.as_array().unwrap().len(), 1);
    let gone = env.json(&["threads", "prune", "--older-than", "0s", "--workflow", "other"])?;
    assert_eq!(gone, json!([]));
    env.ok(&["threads", "prune", "--older-than", "0s"])?;
    let left = env.json(&["threads"])?;
    assert_eq!(left.as_array().unwrap().len(), 1, "{left}");
    assert_eq!(left[0]["threadId"], paused.as_str());
    let dir = env.home().join(format!("logs/{hash}"));
    for id in completed.iter().chain([&failed]) {
        for kind in ["data", "calls", "info"] {
            assert!(!dir.join(format!("{id}.{kind}.jsonl")).exists(), "{id}.{kind} is left");
        }
    }

    // A removal killed halfway: the thread is gone at once, and the next removal finishes it.
    let victim = run(&[])?;
    let crash = [("UNCAGED_WORKFLOW_CRASH_AT", "thread-removing:1")];
    let out = env.run_with(&["thread", "rm", &victim], &crash)?;
    ensure!(out.code != 0, "the crash point was not reached: {out:?}");
    env.fails(&["thread", &victim], 66)?;
    assert!(dir.join(format!("{victim}.calls.jsonl")).exists(), "the crash left its journal");
    env.ok(&["threads", "prune", "--older-than", "1h"])?;
    let leftovers: Vec<_> = std::fs::read_dir(&dir)?
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(&victim))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    Ok(())
}

#[test]
fn threads_are_listed_from_an_index_rebuilt_when_missing() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let ended: Vec<String> = (0..3)
        .map(|_| thread_id_of(&env.ok(&["run", "solve-issue", "-p", "x"])?))
        .collect::<Result<_>>()?;
    let waiting = env.ok(&["thread", "start", "solve-issue", "-p", "y"])?.trim().to_string();
    let listed = env.json(&["threads"])?;
    assert_eq!(listed.as_array().unwrap().len(), 4);
    let index = env.home().join("logs/threads.index");
    assert!(index.exists());

    // An ended thread is listed from the index, without its file being read again...
    let data = env.home().join(format!("logs/{hash}/{}.data.jsonl", ended[0]));
    std::fs::write(&data, "damaged\n")?;
    assert_eq!(env.json(&["threads"])?, listed);
    // ...while a thread that has not ended is read each time.
    env.run(&["resume", &waiting])?;
    let now = env.json(&["threads"])?;
    assert_eq!(now[3]["status"], "completed", "{now}");
    // Without the index, it is rebuilt from the files (the damaged one is skipped).
    std::fs::remove_file(&index)?;
    let rebuilt = env.run(&["threads", "--json"])?;
    let rebuilt: serde_json::Value = serde_json::from_str(&rebuilt.stdout)?;
    assert_eq!(rebuilt.as_array().unwrap().len(), 3, "{rebuilt}");
    assert!(index.exists(), "the index was written again");
    // The rebuilt index holds the threads that have ended since: damaged now, still listed.
    let resumed = env.home().join(format!("logs/{hash}/{waiting}.data.jsonl"));
    std::fs::write(&resumed, "damaged\n")?;
    assert_eq!(env.json(&["threads"])?, rebuilt);
    // A removed thread leaves the listing, index or not.
    env.ok(&["thread", "rm", &ended[1]])?;
    assert_eq!(env.json(&["threads"])?.as_array().unwrap().len(), 2);
    // An index that is not one is rebuilt from the files, not trusted: the damaged files
    // are skipped now.
    std::fs::write(&index, "garbage")?;
    assert_eq!(env.json(&["threads"])?.as_array().unwrap().len(), 1);
    Ok(())
}

/// Everything under the home that holds a thread's content — its records, its call journal
/// (agents' whole answers), its debug log — is private to its owner, and so are the folders.
#[test]
fn a_threads_files_and_the_home_folders_are_private() -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new()?;
    if env.store.is_some() {
        return Ok(()); // the database's own access control holds them
    }
    let hash = env.add_solve_issue()?;
    let out = env.ok(&["run", "solve-issue", "-p", "p", "--agent", &agent(&env, None)?])?;
    let thread = thread_id_of(&out)?;
    let mode = |path: &std::path::Path| -> Result<u32> {
        Ok(std::fs::metadata(path)
            .with_context(|| path.display().to_string())?
            .permissions()
            .mode()
            & 0o777)
    };
    use anyhow::Context;
    let home = env.home();
    for dir in
        [home.clone(), home.join("logs"), home.join(format!("logs/{hash}")), home.join("bundles")]
    {
        assert_eq!(mode(&dir)?, 0o700, "{}", dir.display());
    }
    for kind in ["data", "calls", "info"] {
        let file = home.join(format!("logs/{hash}/{thread}.{kind}.jsonl"));
        assert_eq!(mode(&file)?, 0o600, "{}", file.display());
    }
    for file in [home.join("workflow.yaml"), home.join(format!("bundles/{hash}.wasm"))] {
        assert_eq!(mode(&file)?, 0o600, "{}", file.display());
    }
    Ok(())
}

/// A full disk stops only the thread whose write failed: it is interrupted with the reason in
/// one line, its siblings in the same worker go on, the worker stays up, and `resume`
/// continues the thread once there is room. (A real full file system: a small tmpfs.)
#[test]
fn a_full_disk_stops_only_the_thread_that_could_not_write() -> Result<()> {
    let env = Env::new()?;
    if env.store.is_some() {
        return Ok(());
    }
    let Some(disk) = crate::Mount::tmpfs(&env.home(), "64M")? else { return Ok(()) };
    let hash = env.add_solve_issue()?;
    // Each thread's agent waits for the gate named by its prompt.
    let gates = env.dir.path().to_path_buf();
    let script = env.write_script(
        "gated.sh",
        format!(
            r#"#!/bin/sh
input=$(cat)
gate=$(printf '%s' "$input" | sed -n 's/.*"prompt":"\([a-z]*\)".*/\1/p')
while [ ! -f {0}/"$gate" ]; do [ -d {0} ] || exit 1; sleep 0.02; done
case "$input" in
  *'"role":{{"name":"planner"'*) echo '{{"steps": ["do it"]}}' ;;
  *'"role":{{"name":"developer"'*) echo '{{"summary": "done"}}' ;;
  *) echo '{{"approved": true}}' ;;
esac
"#,
            gates.display()
        ),
    )?;
    let agent = format!("command:{}", script.display());
    let start = |name: &str| -> Result<String> {
        Ok(env
            .ok(&["run", "solve-issue", "-p", name, "--agent", &agent, "--detach"])?
            .trim()
            .to_string())
    };
    let (victim, first, second) = (start("victim")?, start("first")?, start("second")?);
    wait_until("three agents work", || {
        Ok(env
            .json(&["ps"])?
            .as_array()
            .is_some_and(|p| p.iter().filter(|t| t["role"] == "planner").count() == 3))
    })?;
    let worker = env.json(&["ps"])?[0]["pid"].as_u64().context("worker")?;
    let filler = disk.fill()?;
    std::fs::write(gates.join("victim"), "")?;
    wait_until("the victim stops", || Ok(status(&env, &victim)? != "running"))?;
    assert_eq!(status(&env, &victim)?, "interrupted");
    assert!(alive(worker), "the worker went down with the thread");
    for sibling in [&first, &second] {
        assert_eq!(status(&env, sibling)?, "running", "a sibling stopped");
    }
    let ps = env.json(&["ps"])?;
    assert!(ps.as_array().is_some_and(|p| p.iter().all(|t| t["pid"] == worker)), "{ps}");
    // Room again: the siblings complete in the same worker, and `resume` continues the victim.
    std::fs::remove_file(filler)?;
    std::fs::write(gates.join("first"), "")?;
    std::fs::write(gates.join("second"), "")?;
    for sibling in [&first, &second] {
        wait_until("a sibling completes", || Ok(status(&env, sibling)? == "completed"))?;
    }
    let out = env.ok(&["resume", &victim])?;
    assert!(out.contains("completed (0)"), "{out}");
    let steps = read_jsonl(&env.home().join(format!("logs/{hash}/{victim}.data.jsonl")))?;
    assert_eq!(steps.iter().filter(|l| l.get("role").is_some()).count(), 3);
    Ok(())
}

/// A command killed in the middle of handing its thread to the bundle's worker (queued, not
/// yet taken) leaves a thread at rest that `thread` and the listing call `interrupted`, not
/// `queued` for a worker that will never take it (a bundle's worker takes only what it is
/// handed); `resume` runs it to its end.
#[test]
fn a_thread_whose_hand_over_was_cut_reads_as_interrupted_everywhere() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    let crash = [("UNCAGED_WORKFLOW_CRASH_AT", "hand-over-queued:1")];
    let out = env.run_with(&["run", "solve-issue", "-p", "cut", "--detach"], &crash)?;
    ensure!(out.code != 0, "the crash point was not reached: {out:?}");
    let threads = env.json(&["threads"])?;
    let listed = threads.as_array().context("threads")?;
    ensure!(listed.len() == 1, "{threads}");
    let thread = listed[0]["threadId"].as_str().context("id")?.to_string();
    ensure!(listed[0]["status"] == "interrupted", "listed: {threads}");
    let shown = env.json(&["thread", &thread])?;
    ensure!(shown["status"] == "interrupted", "shown: {}", shown["status"]);
    let queue = env.home().join("run/queue").join(format!("{thread}.json"));
    ensure!(queue.exists(), "the cut hand-over left its queue entry");
    let resumed = env.ok(&["resume", &thread])?;
    ensure!(resumed.contains("completed (0)"), "{resumed}");
    Ok(())
}
