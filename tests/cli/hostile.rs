//! What an outside review broke, each as the attack it made: a hostile bundle against the host,
//! its agents, its sibling threads and the terminal; careless input against the CLI. Each test
//! failed on the code the review attacked (00b48ed) and names the defence it proves.

use std::path::PathBuf;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use crate::sandbox::{attack, attack_with, failed_with};
use crate::{Env, artifacts, thread_id_of};

/// The escape sequences the adversary's `escapes` attack writes.
const ESCAPES: &str = "\u{1b}]0;pwned\u{7}\u{1b}[8mhidden\u{1b}[0m\u{1b}[2K\u{202e}desrever";

/// A copy of the descriptor fixture whose descriptor is `spec` (see its crate docs).
fn descriptor_bundle(env: &Env, name: &str, spec: &Value) -> Result<PathBuf> {
    const MARKER: &[u8] = b"UNCAGED-DESCRIPTOR-SLOT:";
    const SLOT_LEN: usize = 4096;
    let mut bytes = std::fs::read(artifacts::DESCRIPTOR)?;
    let at = bytes.windows(MARKER.len()).position(|w| w == MARKER).context("no slot")?;
    let text = spec.to_string();
    ensure!(text.len() <= SLOT_LEN - MARKER.len(), "spec too long for the slot");
    let slot = &mut bytes[at + MARKER.len()..at + SLOT_LEN];
    slot.fill(b' ');
    slot[..text.len()].copy_from_slice(text.as_bytes());
    env.write(&format!("{name}.wasm"), bytes)
}

/// A script outside any test home (so it can be named before the home exists).
fn script(body: &str) -> Result<(tempfile::TempDir, String)> {
    use std::os::unix::fs::PermissionsExt;
    let dir = super::scratch::tempdir()?;
    let path = dir.path().join("agent.sh");
    std::fs::write(&path, body)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    let spec = format!("command:{}", path.display());
    Ok((dir, spec))
}

// 1. A recursive JSON Schema.

#[test]
fn a_recursive_schema_is_refused_and_cannot_take_the_worker_down() -> Result<()> {
    // `attack` proves the sibling thread in the same worker completes afterwards.
    let (_env, outcome) = attack("recursive-schema", &[], &[])?;
    assert_eq!(outcome.end["status"], "completed", "{}", outcome.end);
    let error = outcome.steps[0]["meta"]["error"].as_str().unwrap();
    assert!(error.contains("InvalidSchema") && error.contains("refers to itself"), "{error}");

    let env = Env::new()?;
    let spec = json!({"description": "d", "roles": [
        {"name": "r", "schema": {"allOf": [{"$ref": "#"}]}}
    ]});
    let bundle = descriptor_bundle(&env, "recursive", &spec)?;
    let err = env.fails(&["add", "w", bundle.to_str().unwrap()], 65)?;
    assert!(err.contains("role `r` has an invalid JSON Schema: it refers to itself"), "{err}");
    // The input schema, which every start is validated against, is held to the same bounds.
    let role = json!([{"name": "r", "schema": {}}]);
    for (input, said) in [
        (
            json!({"allOf": [{"$ref": "#"}]}),
            "its input schema is not a valid JSON Schema: it refers to itself",
        ),
        (json!("{not json"), "its input schema is not JSON"),
        (json!({"type": 7}), "its input schema is not a valid JSON Schema"),
    ] {
        let spec = json!({"description": "d", "roles": role, "input_schema": input});
        let bundle = descriptor_bundle(&env, "input", &spec)?;
        let err = env.fails(&["add", "w", bundle.to_str().unwrap()], 65)?;
        assert!(err.contains(said), "{input}: {err}");
    }
    assert_eq!(env.json(&["list"])?, json!([]));
    Ok(())
}

// 2. The thread id an agent program receives.

#[test]
fn agent_programs_get_the_hosts_thread_id_whatever_the_bundle_says() -> Result<()> {
    let (_dir, agent) = script("#!/bin/sh\nprintf 'argv:%s' \"$*\"\n")?;
    let (_env, outcome) =
        attack_with("thread-id:--injected-option=1", &[], &[], &["--agent", &agent])?;
    let thread = outcome.printed[0]["thread"].as_str().unwrap();
    let content = outcome.steps[0]["content"].as_str().unwrap();
    assert_eq!(content, format!("argv:{thread}"));
    Ok(())
}

// 3. An agent for a role the bundle never declared.

#[test]
fn no_agent_answers_a_role_the_bundle_does_not_declare() -> Result<()> {
    let called = super::scratch::tempdir()?;
    let mark = called.path().join("called");
    let (_dir, agent) = script(&format!("#!/bin/sh\ntouch {}\necho hi\n", mark.display()))?;
    let (_env, outcome) = attack_with("ghost-role", &[], &[], &["--agent", &agent])?;
    let content = outcome.steps[0]["content"].as_str().unwrap();
    assert!(content.contains("Unavailable") && content.contains("declares no role `ghost`"));
    assert!(!mark.exists(), "the agent program ran for an undeclared role");
    Ok(())
}

// 4. What a bundle yields is checked and stamped by the host.

#[test]
fn a_step_whose_meta_breaks_its_schema_fails_the_thread() -> Result<()> {
    let (_env, outcome) = attack("bad-meta", &[], &[])?;
    failed_with(&outcome, "yielded a `strict` step whose meta does not match the role's schema");
    assert_eq!(outcome.end["endedBy"], "host");
    assert!(outcome.steps.is_empty(), "the bad step was not recorded");
    Ok(())
}

#[test]
fn steps_are_stamped_with_the_hosts_clock() -> Result<()> {
    for claimed in ["0", "18446744073709551615"] {
        let before = now_ms();
        let (_env, outcome) = attack(&format!("timestamp:{claimed}"), &[], &[])?;
        let stamped = outcome.steps[0]["timestamp"].as_u64().unwrap();
        assert!(stamped >= before && stamped <= now_ms(), "{claimed} recorded as {stamped}");
    }
    Ok(())
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

// 5. A bundle's return code cannot pass for the host's.

#[test]
fn a_workflows_return_code_cannot_pass_for_the_hosts() -> Result<()> {
    for (code, exit) in [(70, 1), (130, 1), (-1, 1), (3, 3), (63, 63)] {
        let (_env, outcome) = attack(&format!("return:{code}"), &[], &[])?;
        assert_eq!(outcome.end["returnCode"], code);
        assert_eq!(outcome.end["endedBy"], "workflow");
        assert_eq!(outcome.end["status"], "failed");
        assert_eq!(outcome.code, exit, "run's exit code for a workflow's {code}");
    }
    let (_env, outcome) = attack("panic", &[], &[])?;
    assert_eq!((outcome.code, &outcome.end["endedBy"]), (70, &json!("host")));
    Ok(())
}

// 6. Time blocked in WASI.

#[test]
fn sleeping_in_wasi_counts_against_the_step_budget() -> Result<()> {
    let (_env, outcome) = attack("sleep", &["cpu-per-step=1s"], &[])?;
    failed_with(&outcome, "used more than 1s of guest time");
    failed_with(&outcome, "(limits.cpu-per-step)");
    Ok(())
}

// 7. Terminal injection.

#[test]
fn escape_sequences_reach_the_terminal_escaped_and_json_exact() -> Result<()> {
    let env = Env::new()?;
    env.json(&["add", "adversary", artifacts::ADVERSARY])?;
    let run = env.run(&["run", "adversary", "-p", "escapes"])?;
    let thread = thread_id_of(&run.stdout)?;
    let shown = env.ok(&["thread", &thread])?;
    for (what, text) in [("run", &run.stdout), ("thread", &shown)] {
        assert!(!text.contains('\u{1b}') && !text.contains('\u{7}'), "{what}: {text:?}");
        assert!(!text.contains('\u{202e}'), "{what}: {text:?}");
        assert!(text.contains("\\u{1b}]0;pwned\\u{7}"), "{what} shows them escaped: {text}");
    }
    let exact = env.json(&["thread", &thread])?;
    assert_eq!(exact["steps"][0]["content"], ESCAPES);
    assert_eq!(exact["end"]["summary"], ESCAPES);

    let spec = json!({"description": ESCAPES, "roles": [
        {"name": "probe", "description": ESCAPES, "schema": {}}
    ]});
    let bundle = descriptor_bundle(&env, "escapes", &spec)?;
    let added = env.ok(&["add", "esc", bundle.to_str().unwrap()])?;
    for (what, text) in
        [("add", added), ("show", env.ok(&["show", "esc"])?), ("list", env.ok(&["list"])?)]
    {
        assert!(!text.contains('\u{1b}') && !text.contains('\u{202e}'), "{what}: {text:?}");
    }
    let spec = json!({"description": "d", "roles": [{"name": "a\u{1b}[2Kb", "schema": {}}]});
    let bundle = descriptor_bundle(&env, "bad-name", &spec)?;
    let err = env.fails(&["add", "bad", bundle.to_str().unwrap()], 65)?;
    assert!(err.contains("role name") && !err.contains('\u{1b}'), "{err:?}");
    Ok(())
}

// 8. Descriptor bombs.

#[test]
fn descriptor_bombs_are_refused_and_list_reads_no_descriptor() -> Result<()> {
    let env = Env::new()?;
    let roles = json!({"description": "d", "roles": [{"name": "probe", "schema": {}}],
                       "extra_roles": 100_000});
    let bundle = descriptor_bundle(&env, "roles", &roles)?;
    let err = env.fails(&["add", "w", bundle.to_str().unwrap()], 65)?;
    assert!(err.contains("declares 100001 roles, over the limit of 64 (limits.roles)"), "{err}");
    let big = json!({"description": "x", "repeat": 50_000_000,
                     "roles": [{"name": "probe", "schema": {}}]});
    let bundle = descriptor_bundle(&env, "big", &big)?;
    let err = env.fails(&["add", "w", bundle.to_str().unwrap()], 65)?;
    assert!(err.contains("over the descriptor limit (1.0 MiB; limits.descriptor)"), "{err}");
    assert_eq!(env.json(&["list"])?, json!([]));

    // The limits are the operator's: raised in config.yaml, the same bundle is accepted.
    std::fs::create_dir_all(env.home())?;
    std::fs::write(env.home().join("config.yaml"), "limits:\n  roles: 200000\n")?;
    env.ok(&["add", "many", descriptor_bundle(&env, "roles", &roles)?.to_str().unwrap()])?;

    // `list` takes descriptions from the registry: it works with every descriptor gone.
    let hash = env.add_solve_issue()?;
    for entry in std::fs::read_dir(env.home().join("bundles"))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "yaml") {
            std::fs::remove_file(path)?;
        }
    }
    let listed = env.ok(&["list"])?;
    assert!(listed.contains(&hash) && listed.contains("Solve an issue"), "{listed}");
    Ok(())
}

// 9. Malformed ids.

#[test]
fn a_malformed_thread_id_touches_nothing() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let thread = thread_id_of(&env.ok(&["run", "solve-issue", "-p", "x"])?)?;
    assert!(thread.starts_with('0'));
    // `8` overflows a ULID's 128 bits; a lax parser reads it as `0` — this very thread.
    let overflowing = format!("8{}", &thread[1..]);
    for command in [vec!["thread", "rm", &overflowing], vec!["thread", &overflowing]] {
        let err = env.fails(&command, 64)?;
        assert!(err.contains("invalid thread id"), "{err}");
    }
    let lowercase = thread.to_lowercase();
    assert_eq!(env.json(&["thread", &lowercase])?["start"]["threadId"], thread.as_str());
    let data = env.home().join(format!("logs/{hash}/{thread}.data.jsonl"));
    assert!(data.exists(), "the thread is still there");
    Ok(())
}

// 10. What `add` reads.

#[test]
fn add_refuses_what_is_not_a_regular_file_before_reading_it() -> Result<()> {
    let env = Env::new()?;
    let fifo = env.dir.path().join("pipe.wasm");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status()?;
    ensure!(made.success(), "mkfifo");
    for path in [fifo.to_str().unwrap(), "/dev/zero", env.dir.path().to_str().unwrap()] {
        let err = env.fails(&["add", "w", path], 65)?;
        assert!(err.contains("a bundle is a `.wasm` file"), "{err}");
    }
    // A sparse 1 GiB file: refused for its size before a byte is read.
    let sparse = env.write("sparse.wasm", b"")?;
    std::fs::OpenOptions::new().write(true).open(&sparse)?.set_len(1 << 30)?;
    let err = env.fails(&["add", "w", sparse.to_str().unwrap()], 65)?;
    assert!(err.contains("over the bundle size limit (128.0 MiB; limits.bundle-size)"), "{err}");
    // Under the limit, its header is checked before the rest is read.
    std::fs::create_dir_all(env.home())?;
    std::fs::write(env.home().join("config.yaml"), "limits:\n  bundle-size: 2GiB\n")?;
    let err = env.fails(&["add", "w", sparse.to_str().unwrap()], 65)?;
    assert!(err.contains("not a WebAssembly file"), "{err}");
    std::fs::write(env.home().join("config.yaml"), "limits:\n  bundle-size: 1KiB\n")?;
    let err = env.fails(&["add", "w", artifacts::SOLVE_ISSUE], 65)?;
    assert!(err.contains("over the bundle size limit (1.0 KiB"), "{err}");
    Ok(())
}

// 11. A reader that goes away.

#[test]
fn output_into_a_closed_pipe_exits_quietly() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    for _ in 0..3 {
        env.ok(&["run", "solve-issue", "-p", "x"])?;
    }
    for command in [&["threads"][..], &["list"], &["show", "solve-issue"], &["thread", "--help"]] {
        let (reader, writer) = std::io::pipe()?;
        drop(reader);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_uncaged-workflow"))
            .args(command)
            .env("UNCAGED_WORKFLOW_HOME", env.home())
            .stdout(writer)
            .output()?;
        let stderr = String::from_utf8(out.stderr)?;
        assert_eq!(out.status.code(), Some(0), "{command:?}: {stderr}");
        assert!(stderr.is_empty(), "{command:?}: {stderr}");
    }
    Ok(())
}

// 12. Refused before a thread exists.

#[test]
fn unusable_limits_agents_and_answers_are_refused_before_a_thread_exists() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    let no_exec = env.write("not-executable.sh", "#!/bin/sh\necho hi\n")?;
    let not_exec = format!("command:{}", no_exec.display());
    for args in [
        &["--limit", "memory=0"][..],
        &["--limit", "cpu-per-step=0"],
        &["--limit", "string=0"],
        &["--agent", "command:/nonexistent/agent"],
        &["--agent", "command:no-such-program-on-path"],
        &["--agent", &not_exec],
        &["--agent-for", "planner=command:/nonexistent/agent"],
    ] {
        let mut command = vec!["run", "solve-issue", "-p", "x"];
        command.extend(args);
        let err = env.fails(&command, 64)?;
        assert!(
            err.contains("must be more than zero")
                || err.contains("does not exist")
                || err.contains("is not on PATH")
                || err.contains("is not an executable file"),
            "{args:?}: {err}"
        );
    }
    // In config.yaml the same mistake is bad data, still caught before a thread exists.
    std::fs::write(
        env.home().join("config.yaml"),
        "agents:\n  gone:\n    kind: command\n    command: /nonexistent/agent\n",
    )?;
    let err = env.fails(&["run", "solve-issue", "-p", "x", "--agent", "gone"], 65)?;
    assert!(err.contains("program `/nonexistent/agent` does not exist"), "{err}");
    assert_eq!(env.json(&["threads"])?, json!([]), "no thread was created");

    std::fs::remove_file(env.home().join("config.yaml"))?;
    let waiting = env.ok(&["thread", "start", "solve-issue", "-p", "x", "--agent", "human"])?;
    let id = waiting.trim();
    env.run(&["resume", id, "--detach"])?;
    crate::wait_until(
        "the thread waits",
        || Ok(env.json(&["thread", id])?["status"] == "waiting"),
    )?;
    for empty in ["", "   "] {
        let err = env.fails(&["answer", id, empty], 64)?;
        assert!(err.contains("the answer is empty"), "{err}");
    }
    let blank = env.write("blank.txt", "\n\n")?;
    let err = env.fails(&["answer", id, "--file", blank.to_str().unwrap()], 64)?;
    assert!(err.contains("the answer is empty"), "{err}");
    assert_eq!(env.json(&["thread", id])?["status"], "waiting");
    Ok(())
}

// 13. Exit codes that match the README's table.

#[test]
fn exit_codes_match_the_table() -> Result<()> {
    let env = Env::new()?;
    let err = env.fails(&["add", "w", "missing.wasm"], 66)?;
    assert!(err.contains("bundle missing.wasm does not exist"), "{err}");
    let hash = env.add_solve_issue()?;
    std::fs::write(env.home().join("config.yaml"), [0xff, 0xfe, 0x00, 0x9c, 0x80])?;
    let err = env.fails(&["run", "solve-issue", "-p", "x"], 65)?;
    assert!(err.contains("config.yaml: not UTF-8 text"), "{err}");
    std::fs::remove_file(env.home().join("config.yaml"))?;
    std::fs::remove_file(env.home().join(format!("bundles/{hash}.yaml")))?;
    let err = env.fails(&["show", "solve-issue"], 66)?;
    assert!(err.contains(&format!("{hash}.yaml does not exist")), "{err}");
    env.fails(&["run", "solve-issue", "-p", "x"], 66)?;
    Ok(())
}

// 14. Thread files too large to continue, and thread files of noise.

#[test]
fn a_step_too_large_to_continue_is_named_with_its_file_and_line() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let id = env.ok(&["thread", "start", "solve-issue", "-p", "x", "--limit", "string=1KiB"])?;
    let id = id.trim();
    let data = env.home().join(format!("logs/{hash}/{id}.data.jsonl"));
    let step = json!({"role": "planner", "content": "x".repeat(4096), "meta": {"steps": ["a"]},
                      "timestamp": 1});
    let mut text = std::fs::read_to_string(&data)?;
    text.push_str(&format!("{step}\n"));
    std::fs::write(&data, text)?;
    let err = env.fails(&["resume", id], 65)?;
    assert!(
        err.contains(&format!("thread `{id}`: step 1 (line 3 of its data file) is 4.0 KiB, over the string limit (1.0 KiB; limits.string)")),
        "{err}"
    );
    Ok(())
}

#[test]
fn a_thread_file_of_noise_keeps_the_debug_log_small() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let id = env.ok(&["thread", "start", "solve-issue", "-p", "x"])?;
    let id = id.trim();
    let data = env.home().join(format!("logs/{hash}/{id}.data.jsonl"));
    let mut bytes = std::fs::read(&data)?;
    let mut x: u32 = 2463534242;
    for _ in 0..4 << 20 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        bytes.push(x as u8);
    }
    bytes.push(b'\n');
    std::fs::write(&data, bytes)?;
    env.run(&["resume", id])?;
    let info = std::fs::metadata(env.home().join(format!("logs/{hash}/{id}.info.jsonl")))?.len();
    assert!(info < 64 << 10, "the debug log grew to {info} bytes");
    let lines = env.info_lines(&hash, id)?;
    assert!(lines.iter().any(|l| l["content"].as_str().unwrap_or("").contains("unreadable line")));
    Ok(())
}
