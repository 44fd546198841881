//! `kill -9` at random moments of `run`, `fork`, `resume` and `thread rm` — the command, and
//! often its worker too — then every thread left is resumed to its end and checked: no step
//! lost or recorded twice (every thread ends with the steps of an uncrashed run), no agent
//! call made again once its answer was journaled, no half-made or half-removed thread.
//!
//! `make test` runs a few trials of each; `make test-crash` runs 100
//! (`UNCAGED_CRASH_TRIALS`). The kill delays come from a fixed seed (`UNCAGED_CRASH_SEED`).

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::Value;

use crate::{Env, thread_id_of, wait_until};

fn trials() -> usize {
    std::env::var("UNCAGED_CRASH_TRIALS").ok().and_then(|v| v.parse().ok()).unwrap_or(3)
}

/// A small deterministic generator for kill delays.
struct Delays(u64);

impl Delays {
    fn new() -> Self {
        let seed = std::env::var("UNCAGED_CRASH_SEED").ok().and_then(|v| v.parse().ok());
        Delays(seed.unwrap_or(0x9e37_79b9_7f4a_7c15))
    }

    /// A delay in `0..max_ms` milliseconds.
    fn next(&mut self, max_ms: u64) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        Duration::from_millis(self.0 % max_ms)
    }

    fn coin(&mut self) -> bool {
        self.next(2).as_millis() == 1
    }
}

/// A home (or database) with `solve-issue` and a command agent that logs every call.
pub struct Rig {
    pub env: Env,
    pub hash: String,
    /// `command:…/agent.sh`.
    pub agent: String,
    delays: Delays,
}

impl Rig {
    fn new() -> Result<Self> {
        Rig::with(Env::new()?)
    }

    /// A rig in `env`.
    pub fn with(env: Env) -> Result<Self> {
        let hash = env.add_solve_issue()?;
        let log = env.dir.path().join("agent.log");
        // Each call logs its start and its answer with the thread and step, in milliseconds.
        // An input cut short (its worker was killed while handing it over, so its stdin
        // closed early) is no call: nobody is left to read the answer, and its step, counted
        // from what arrived, would be an earlier one's.
        let script = env.write_script(
            "agent.sh",
            format!(
                r#"#!/bin/sh
input=$(cat)
case "$input" in
  *'}}') ;;
  *) echo "cut $1 $(date +%s%3N)" >> {log}; exit 1 ;;
esac
n=$(printf '%s' "$input" | grep -o '"role":"[a-z]*","content"' | wc -l)
echo "start $1 $n $(date +%s%3N)" >> {log}
sleep ${{UNCAGED_TEST_AGENT_SLEEP:-0.03}}
case "$input" in
  *'"role":{{"name":"planner"'*) answer='{{"steps": ["do it"]}}' ;;
  *'"role":{{"name":"developer"'*) answer="{{\"summary\": \"attempt $n\"}}" ;;
  *) if [ "$n" -ge 4 ]; then answer='{{"approved": true}}'; else answer='{{"approved": false}}'; fi ;;
esac
echo "$answer"
echo "done $1 $n $(date +%s%3N)" >> {log}
"#,
                log = log.display()
            ),
        )?;
        let agent = format!("command:{}", script.display());
        Ok(Rig { env, hash, agent, delays: Delays::new() })
    }

    /// The binary with `args`, in this rig's home and store, quiet.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_uncaged-workflow"));
        match &self.env.store {
            Some(url) => command.env("UNCAGED_WORKFLOW_STORE", url),
            None => command.env_remove("UNCAGED_WORKFLOW_STORE"),
        };
        command
            .args(args)
            .env("UNCAGED_WORKFLOW_HOME", self.env.home())
            .current_dir(self.env.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        command
    }

    /// Runs `args`, and `kill -9`s it after a random delay; on a coin toss the workers too.
    fn kill_during(&mut self, args: &[&str], max_ms: u64) -> Result<()> {
        let mut child = self.command(args).spawn()?;
        std::thread::sleep(self.delays.next(max_ms));
        let _ = child.kill();
        let _ = child.wait();
        if self.delays.coin() {
            self.kill_workers();
        }
        Ok(())
    }

    /// `kill -9` of every worker of this home.
    fn kill_workers(&self) {
        let home = self.env.home().display().to_string();
        crate::kill_9(&crate::processes_where("cmdline", |cmdline| {
            let mut args = cmdline.split(|&b| b == 0);
            args.clone().any(|a| a == home.as_bytes()) && args.any(|a| a == b"worker")
        }));
    }

    pub fn threads(&self) -> Result<Vec<Value>> {
        Ok(self.env.json(&["threads"])?.as_array().context("threads")?.clone())
    }

    /// Waits for every worker to finish, then resumes each thread that has not ended.
    fn settle(&self) -> Result<()> {
        if self.env.store.is_some() {
            // On a database store, threads whose worker was killed stay queued until a
            // worker takes them over: start one.
            self.command(&["worker", "--exit-when-idle"]).spawn()?;
        }
        wait_until("no thread runs", || {
            Ok(self.threads()?.iter().all(|t| {
                !["running", "queued"].contains(&t["status"].as_str().unwrap_or_default())
            }))
        })?;
        for thread in self.threads()? {
            let id = thread["threadId"].as_str().unwrap();
            if ["paused", "interrupted"].contains(&thread["status"].as_str().unwrap()) {
                let out = self.env.run(&["resume", id])?;
                ensure!(out.stdout.contains("completed (0)"), "resume {id}: {out:?}");
            }
        }
        Ok(())
    }

    /// The steps every thread must end with (role and meta of each).
    fn steps(&self, thread: &str) -> Result<Vec<Value>> {
        Ok(self
            .env
            .thread_lines(&self.hash, thread)?
            .into_iter()
            .filter(|l| l.get("role").is_some())
            .map(|l| serde_json::json!([l["role"], l["meta"]]))
            .collect())
    }

    /// Checks every thread against `reference`; returns (lost or duplicated steps, agent calls
    /// made again after their answer was journaled).
    pub fn check(&self, reference: &[Value]) -> Result<(usize, usize)> {
        let mut wrong_steps = 0;
        for thread in self.threads()? {
            let id = thread["threadId"].as_str().unwrap();
            ensure!(thread["status"] == "completed", "{id} is {}", thread["status"]);
            let steps = self.steps(id)?;
            if steps != reference {
                wrong_steps += steps.len().abs_diff(reference.len()).max(1);
            }
        }
        // Calls by (thread, step): their start times; and when each answer was journaled.
        let log = std::fs::read_to_string(self.env.dir.path().join("agent.log"))?;
        let cut = log.lines().filter(|line| line.starts_with("cut ")).count();
        if cut > 0 {
            eprintln!("{cut} agent input(s) cut short by a killed process (not calls)");
        }
        let mut starts: BTreeMap<(String, u64), Vec<u64>> = BTreeMap::new();
        for line in log.lines() {
            let words: Vec<&str> = line.split(' ').collect();
            if words[0] == "start" {
                starts
                    .entry((words[1].into(), words[2].parse()?))
                    .or_default()
                    .push(words[3].parse()?);
            }
        }
        let mut repeated = 0;
        for ((thread, step), times) in &starts {
            let journaled = self
                .env
                .calls(&self.hash, thread)
                .unwrap_or_default()
                .into_iter()
                .find(|c| c["kind"] == "agent" && c["step"].as_u64() == Some(*step));
            if let Some(at) = journaled.and_then(|c| c["timestamp"].as_u64()) {
                let again = times.iter().filter(|&&t| t > at).count();
                if again > 0 {
                    eprintln!("thread {thread} step {step}: journaled at {at}, started {times:?}");
                }
                repeated += again;
            }
        }
        Ok((wrong_steps, repeated))
    }

    pub fn reference(&self) -> Result<Vec<Value>> {
        let out = self.env.ok(&["run", "solve-issue", "-p", "c", "--agent", &self.agent])?;
        self.steps(&thread_id_of(&out)?)
    }
}

pub fn report(what: &str, trials: usize, (wrong, repeated): (usize, usize)) {
    eprintln!(
        "crash trials: {what} x{trials}: lost or duplicated steps {wrong}, agent calls repeated {repeated}"
    );
}

#[test]
fn kill_9_during_run_and_resume_loses_and_repeats_nothing() -> Result<()> {
    let mut rig = Rig::new()?;
    let reference = rig.reference()?;
    let n = trials();
    for _ in 0..n {
        let agent = rig.agent.clone();
        rig.kill_during(&["run", "solve-issue", "-p", "c", "--agent", &agent], 400)?;
        // A resume killed in turn, for the threads the first kill left unfinished.
        wait_until("no thread runs", || {
            Ok(rig.threads()?.iter().all(|t| {
                !["running", "queued"].contains(&t["status"].as_str().unwrap_or_default())
            }))
        })?;
        for thread in rig.threads()? {
            if thread["status"] == "interrupted" {
                let id = thread["threadId"].as_str().unwrap().to_string();
                rig.kill_during(&["resume", &id], 200)?;
            }
        }
    }
    rig.settle()?;
    let found = rig.check(&reference)?;
    report("run+resume", n, found);
    assert_eq!(found, (0, 0));
    Ok(())
}

#[test]
fn kill_9_during_fork_and_thread_rm_leaves_whole_threads_or_none() -> Result<()> {
    let mut rig = Rig::new()?;
    let reference = rig.reference()?;
    let original = rig.threads()?[0]["threadId"].as_str().unwrap().to_string();
    let n = trials();
    for _ in 0..n {
        let agent = rig.agent.clone();
        rig.kill_during(&["fork", &original, "--at", "2", "--agent", &agent], 300)?;
    }
    rig.settle()?;
    let found = rig.check(&reference)?;
    report("fork", n, found);
    assert_eq!(found, (0, 0));

    // Removals killed at random: each thread is whole or gone, and nothing of a gone one stays
    // once a later removal has run.
    let victims: Vec<String> = rig
        .threads()?
        .iter()
        .map(|t| t["threadId"].as_str().unwrap().to_string())
        .filter(|id| *id != original)
        .collect();
    for victim in &victims {
        rig.kill_during(&["thread", "rm", victim], 20)?;
    }
    rig.env.ok(&["threads", "prune", "--older-than", "1h"])?;
    let dir = rig.env.home().join(format!("logs/{}", rig.hash));
    for victim in &victims {
        let listed = rig.threads()?.iter().any(|t| t["threadId"] == victim.as_str());
        let files: Vec<_> = std::fs::read_dir(&dir)?
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|f| f.contains(victim.as_str()))
            .collect();
        if listed {
            assert_eq!(rig.steps(victim)?, reference, "{victim} is listed but not whole");
        } else {
            assert!(files.is_empty(), "{victim} is gone but left {files:?}");
        }
    }
    let found = rig.check(&reference)?;
    report("thread rm", victims.len(), found);
    assert_eq!(found, (0, 0));
    Ok(())
}
