//! Live instances as a bounded cache: a worker's thread waiting on its agents gives its
//! instance up (`limits.evict-after`), so a worker runs more threads than it has instances
//! (`limits.live-instances`), and the rebuilt thread takes its calls' answers without asking
//! anyone twice.

use anyhow::{Context, Result, ensure};

use crate::{Env, alive, status, wait_until};

/// An agent for solve-issue whose planners meet at a barrier: each writes `arrived/<pid>` and
/// waits (up to 60 s) until `meet` planners have; `calls.log` gets `plan` per planner asked.
fn barrier_agent(env: &Env, meet: usize) -> Result<String> {
    let dir = env.dir.path();
    std::fs::create_dir_all(dir.join("arrived"))?;
    let path = env.write_script(
        "barrier.sh",
        format!(
            r#"#!/bin/sh
input=$(cat)
case "$input" in
  *'"role":{{"name":"planner"'*)
    echo plan >> {log}
    echo $$ > {arrived}/$$
    i=0
    while [ "$(ls {arrived} | wc -l)" -lt {meet} ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
    echo '{{"steps": ["meet"]}}' ;;
  *'"role":{{"name":"developer"'*) echo '{{"summary": "met"}}' ;;
  *) echo '{{"approved": true}}' ;;
esac
"#,
            log = dir.join("calls.log").display(),
            arrived = dir.join("arrived").display(),
        ),
    )?;
    Ok(format!("command:{}", path.display()))
}

fn limits(env: &Env, live: usize) -> Result<()> {
    crate::llm::config(env, &format!("limits:\n  live-instances: {live}\n  evict-after: 200ms\n"))
}

on_both_stores! {
#[test]
fn threads_waiting_on_agents_give_their_instances_to_others() -> Result<()> {
    // Four threads meet at a barrier on a worker that keeps two instances: without eviction
    // the two waiting would hold both, and the other two could never arrive.
    let env = Env::new()?;
    limits(&env, 2)?;
    let hash = env.add_solve_issue()?;
    let agent = barrier_agent(&env, 4)?;
    let mut threads = Vec::new();
    for n in 0..4 {
        let prompt = format!("issue {n}");
        let out = env.ok(&["run", "solve-issue", "-p", &prompt, "--agent", &agent, "--detach"])?;
        threads.push(out.trim().to_string());
    }
    wait_until("every thread ends", || {
        Ok(threads.iter().all(|t| status(&env, t).is_ok_and(|s| s != "running")))
    })?;
    let mut given_up = 0;
    for thread in &threads {
        ensure!(status(&env, thread)? == "completed", "thread {thread}: {}", status(&env, thread)?);
        let log = env.info_text(&hash, thread)?;
        let (gave, asked) =
            (log.matches("instance given up after 200ms").count(), log.matches(": asking agent").count());
        // A rebuilt instance takes its answers at once: it is never given up again for calls
        // already answered.
        ensure!(gave <= asked, "thread {thread} gave {gave} instances up for {asked} calls: {log}");
        given_up += gave;
    }
    // The third and the fourth thread each started on an instance another gave up.
    ensure!(given_up >= 2, "{given_up} instances given up");
    let log = std::fs::read_to_string(env.dir.path().join("calls.log"))?;
    ensure!(log.lines().count() == 4, "each planner asked once, not again by a rebuilt instance: {log}");
    Ok(())
}

#[test]
fn a_thread_killed_while_it_holds_no_instance_stops_its_agent() -> Result<()> {
    let env = Env::new()?;
    limits(&env, 2)?;
    let hash = env.add_solve_issue()?;
    // Its planner waits for three more that never come.
    let agent = barrier_agent(&env, 4)?;
    let thread = env.ok(&["run", "solve-issue", "-p", "x", "--agent", &agent, "--detach"])?;
    let thread = thread.trim();
    wait_until("the instance is given up", || {
        Ok(env.info_text(&hash, thread).is_ok_and(|log| log.contains("instance given up")))
    })?;
    let arrived = std::fs::read_dir(env.dir.path().join("arrived"))?
        .next()
        .context("the planner arrived")??
        .file_name();
    let pid: u64 = arrived.to_string_lossy().parse()?;
    ensure!(alive(pid), "the planner waits");
    env.ok(&["kill", thread])?;
    ensure!(status(&env, thread)? == "killed");
    wait_until("the planner is stopped", || Ok(!alive(pid)))?;
    Ok(())
}
}
