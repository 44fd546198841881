//! Untrusted bundles: each attack of the adversary fixture is contained — the thread ends as
//! the test says, the worker survives, and a sibling thread in the same worker completes.

use anyhow::{Context, Result, ensure};
use serde_json::Value;

use crate::{Env, artifacts, read_jsonl, wait_until};

/// The outcome of one attack.
pub struct Outcome {
    pub end: Value,
    pub steps: Vec<Value>,
    pub info: String,
    /// What `run --json` printed, one object per line.
    pub printed: Vec<Value>,
    /// `run`'s exit code.
    pub code: i32,
}

/// Runs the adversary with `prompt` (and `--limit`s) while a sibling thread of the same
/// bundle waits in the same worker; checks the worker survived and the sibling completes.
pub fn attack(prompt: &str, limits: &[&str], env_vars: &[(&str, &str)]) -> Result<(Env, Outcome)> {
    attack_with(prompt, limits, env_vars, &[])
}

/// [`attack`], with more arguments for the attack's `run` (its agent, say).
pub fn attack_with(
    prompt: &str,
    limits: &[&str],
    env_vars: &[(&str, &str)],
    extra: &[&str],
) -> Result<(Env, Outcome)> {
    let env = Env::new()?;
    let hash = env.json(&["add", "adversary", artifacts::ADVERSARY])?["hash"]
        .as_str()
        .unwrap()
        .to_string();
    let gate = env.dir.path().join("gate");
    let agent = env.write_script(
        "gated.sh",
        format!(
            "#!/bin/sh\nwhile [ ! -f {} ]; do sleep 0.02; done\necho released\n",
            gate.display()
        ),
    )?;
    let sibling = env
        .ok(&[
            "run",
            "adversary",
            "-p",
            "ok",
            "--agent",
            &format!("command:{}", agent.display()),
            "--detach",
        ])?
        .trim()
        .to_string();
    wait_until("the sibling runs", || Ok(env.json(&["ps"])?.as_array().unwrap().len() == 1))?;
    let worker = env.json(&["ps"])?[0]["pid"].as_u64().unwrap();

    let mut args = vec!["run", "adversary", "-p", prompt, "--json"];
    for limit in limits {
        args.extend(["--limit", limit]);
    }
    args.extend(extra);
    let out = env.run_with(&args, env_vars)?;
    let stdout = out.stdout;
    let lines: Vec<Value> =
        stdout.lines().map(serde_json::from_str).collect::<Result<_, _>>().context("run --json")?;
    ensure!(
        lines[0]["worker"].as_u64() == Some(worker),
        "the attack ran in the sibling's worker: {stdout}"
    );
    let thread = lines[0]["thread"].as_str().unwrap().to_string();
    let data = read_jsonl(&env.home().join(format!("logs/{hash}/{thread}.data.jsonl")))?;
    let end = data.last().unwrap()["end"].clone();
    let steps = data.iter().filter(|l| l.get("role").is_some()).cloned().collect();
    let info = env.info_text(&hash, &thread)?;
    let return_code = end["returnCode"].as_i64().unwrap() as i32;
    let by_workflow = end["endedBy"] == "workflow";
    let expected = if by_workflow && !(0..=63).contains(&return_code) { 1 } else { return_code };
    ensure!(out.code == expected, "exit code {} for {end}", out.code);

    // The host survived: the sibling, released now, completes in the same worker.
    std::fs::write(&gate, "")?;
    wait_until("the sibling completes", || {
        Ok(env.json(&["thread", &sibling])?["status"] == "completed")
    })?;
    let answer = &env.json(&["thread", &sibling])?["steps"][0]["content"];
    ensure!(answer.as_str().unwrap().trim() == "released", "{answer}");
    Ok((env, Outcome { end, steps, info, printed: lines, code: out.code }))
}

pub fn failed_with(outcome: &Outcome, needle: &str) {
    assert_eq!(outcome.end["status"], "failed", "{}", outcome.end);
    assert_eq!(outcome.end["returnCode"], 70);
    let summary = outcome.end["summary"].as_str().unwrap();
    assert!(summary.contains(needle), "summary `{summary}` lacks `{needle}`");
}

#[test]
fn an_infinite_loop_hits_the_cpu_limit() -> Result<()> {
    let (_env, outcome) = attack("loop", &["cpu-per-step=1s"], &[])?;
    failed_with(
        &outcome,
        "limit exceeded: the bundle used more than 1s of guest time (computing, or blocked in \
         WASI such as a sleep) during step 1 (limits.cpu-per-step)",
    );
    Ok(())
}

#[test]
fn a_memory_bomb_hits_the_memory_limit() -> Result<()> {
    let (_env, outcome) = attack("memory", &["memory=64MiB"], &[])?;
    failed_with(&outcome, "over the memory limit (64.0 MiB; limits.memory)");
    Ok(())
}

#[test]
fn runaway_recursion_traps() -> Result<()> {
    let (_env, outcome) = attack("recursion", &[], &[])?;
    // Rust keeps its stack in linear memory: the overflow runs off its bottom (out of bounds)
    // before wasm's own call stack is exhausted. Either way the guest traps.
    let summary = outcome.end["summary"].as_str().unwrap();
    assert!(
        summary.contains("trapped during step 1: wasm trap: out of bounds memory access")
            || summary.contains("overflowed its stack"),
        "{summary}"
    );
    failed_with(&outcome, "during step 1");
    Ok(())
}

#[test]
fn a_panic_ends_the_thread_with_its_message() -> Result<()> {
    let (_env, outcome) = attack("panic", &[], &[])?;
    failed_with(&outcome, "the bundle aborted during step 1:");
    failed_with(&outcome, "adversary panics on purpose");
    assert!(outcome.info.contains("panicked at"), "the panic is in the debug log");
    Ok(())
}

#[test]
fn the_filesystem_is_out_of_reach() -> Result<()> {
    let (_env, outcome) = attack("read-file", &[], &[])?;
    assert_eq!(outcome.end["status"], "completed");
    let meta = &outcome.steps[0]["meta"];
    assert_eq!(meta["read"], false, "{meta}");
    assert!(!outcome.steps[0]["content"].as_str().unwrap().contains("root:"));
    Ok(())
}

#[test]
fn the_environment_and_arguments_are_empty() -> Result<()> {
    let (_env, outcome) = attack("env", &[], &[("UNCAGED_TEST_API_KEY", "sk-secret-value")])?;
    assert_eq!(outcome.end["status"], "completed");
    let meta = &outcome.steps[0]["meta"];
    assert_eq!(meta["vars"], serde_json::json!([]), "{meta}");
    assert_eq!(meta["args"], serde_json::json!([]), "{meta}");
    Ok(())
}

#[test]
fn sockets_are_refused() -> Result<()> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let port = listener.local_addr()?.port();
    let (_env, outcome) = attack(&format!("socket:{port}"), &[], &[])?;
    assert_eq!(outcome.end["status"], "completed");
    assert_eq!(outcome.steps[0]["meta"]["connected"], false, "{}", outcome.steps[0]["meta"]);
    assert!(listener.accept().is_err(), "nothing connected to the test's listener");
    Ok(())
}

#[test]
fn a_giant_string_hits_the_string_limit() -> Result<()> {
    let (_env, outcome) = attack("giant", &[], &[])?;
    failed_with(
        &outcome,
        "limit exceeded: the content of step 1 is 64.0 MiB, over the string limit (16.0 MiB; limits.string)",
    );
    assert!(outcome.steps.is_empty());
    Ok(())
}

#[test]
fn a_flood_of_log_lines_is_capped() -> Result<()> {
    let (_env, outcome) = attack("log-flood", &["output=256KiB"], &[])?;
    assert_eq!(outcome.end["status"], "completed");
    assert!(outcome.info.len() < 300 << 10, "debug log is {} bytes", outcome.info.len());
    assert!(outcome.info.contains("guest output limit reached (limits.output)"));
    Ok(())
}

#[test]
fn a_flood_of_stdout_is_capped() -> Result<()> {
    let (_env, outcome) = attack("stdout-flood", &["output=256KiB"], &[])?;
    assert_eq!(outcome.end["status"], "completed");
    assert!(outcome.info.len() < 300 << 10, "debug log is {} bytes", outcome.info.len());
    assert!(outcome.info.contains("stdout flood line 0 "));
    Ok(())
}

#[test]
fn an_xxh64_collision_is_refused() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    // Pretend the stored bundle under this id had other bytes.
    let registry = env.home().join("workflow.yaml");
    let text = std::fs::read_to_string(&registry)?;
    let forged = text
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("sha256:") {
                "    sha256: 0000".to_string()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&registry, forged)?;
    let err = env.fails(&["add", "again", artifacts::SOLVE_ISSUE], 65)?;
    assert!(
        err.contains(&format!(
            "XXH64 collision: a different bundle with id `{hash}` is already stored"
        )),
        "{err}"
    );
    Ok(())
}

#[test]
fn a_stale_or_foreign_aot_cache_file_is_a_miss() -> Result<()> {
    let env = Env::new()?;
    env.own_cache()?;
    let hash = env.add_solve_issue()?;
    let cache = std::fs::read_dir(env.home().join("cache"))?
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "cwasm"))
        .context("the AOT cache file")?;
    std::fs::write(&cache, b"not native code at all")?;
    let out = env.ok(&["run", "solve-issue", "-p", "x"])?;
    assert!(out.lines().next().unwrap().ends_with("(compiled now)"), "{out}");
    assert!(out.contains("completed (0)"));
    let log = std::fs::read_to_string(env.home().join(format!("run/{hash}.log")))?;
    assert!(log.contains("ignoring unusable AOT cache file"), "{log}");
    // It was rewritten: the next run (its worker started for it) loads it.
    env.wait_for_workers_to_exit()?;
    let out = env.ok(&["run", "solve-issue", "-p", "x"])?;
    assert!(out.lines().next().unwrap().ends_with("(precompiled)"), "{out}");
    Ok(())
}

#[test]
fn worker_refuses_threads_over_its_limit_and_rounds_over_the_cap() -> Result<()> {
    let env = Env::new()?;
    env.json(&["add", "adversary", artifacts::ADVERSARY])?;
    std::fs::write(
        env.home().join("config.yaml"),
        "limits:\n  max-threads: 1\n  max-rounds: 50\n",
    )?;
    let gate = env.dir.path().join("gate");
    let agent = env
        .write_script("gated.sh", format!("#!/bin/sh\n{}\necho ok\n", crate::sh_wait_for(&gate)))?;
    let spec = format!("command:{}", agent.display());
    env.ok(&["run", "adversary", "-p", "ok", "--agent", &spec, "--detach"])?;
    let err = env.fails(&["run", "adversary", "-p", "ok", "--agent", &spec], 75)?;
    assert!(err.contains("already runs 1 threads, its limit (limits.max-threads)"), "{err}");
    std::fs::write(&gate, "")?;
    let err = env.fails(&["run", "adversary", "-p", "ok", "--max-rounds", "51"], 64)?;
    assert!(
        err.contains("max rounds 51 is over the host's hard cap of 50 (limits.max-rounds)"),
        "{err}"
    );
    let err = env.fails(&["run", "adversary", "-p", "ok", "--limit", "memory=lots"], 64)?;
    assert!(err.contains("`lots` is not a size"), "{err}");
    std::fs::write(env.home().join("config.yaml"), "limits:\n  memory: lots\n")?;
    let err = env.fails(&["run", "adversary", "-p", "ok"], 65)?;
    assert!(err.contains("config.yaml: limits.memory: `lots` is not a size"), "{err}");
    Ok(())
}

// Through the CLI only: each of these runs twice, on a home directory (`…::files`) and on a
// fresh PostgreSQL database (`…::postgres`). A test added here covers both stores.
on_both_stores! {
#[test]
fn a_home_that_cannot_be_written_is_reported() -> Result<()> {
    let env = Env::new()?;
    let file = env.write("not-a-dir", "")?;
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_uncaged-workflow"))
        .args(["--home", &format!("{}/home", file.display()), "add", "w", artifacts::SOLVE_ISSUE])
        .env_remove("UNCAGED_WORKFLOW_HOME")
        .output()?;
    assert_eq!(run.status.code(), Some(74));
    let err = String::from_utf8(run.stderr)?;
    assert!(err.contains("not-a-dir/home") && err.contains("Not a directory"), "{err}");
    assert_eq!(err.trim().lines().count(), 1);
    Ok(())
}

#[test]
fn add_refuses_an_invalid_schema_and_random_bytes() -> Result<()> {
    let env = Env::new()?;
    let err = env.fails(&["add", "w", artifacts::BAD_SCHEMA], 65)?;
    assert!(err.contains("role `judge` has an invalid JSON Schema"), "{err}");
    // Random bytes after a valid magic and version: not a component.
    let mut bytes = b"\0asm\x0d\0\x01\0".to_vec();
    let mut x: u32 = 2463534242;
    for _ in 0..4096 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        bytes.push(x as u8);
    }
    let random = env.write("random.wasm", &bytes)?;
    let err = env.fails(&["add", "w", random.to_str().unwrap()], 65)?;
    assert!(err.contains("not a valid WebAssembly component"), "{err}");
    let noise = env.write("noise.wasm", &bytes[8..])?;
    let err = env.fails(&["add", "w", noise.to_str().unwrap()], 65)?;
    assert!(err.contains("not a WebAssembly file"), "{err}");
    Ok(())
}
}
