//! Bad input: every malformed file or argument gets one clear line and a distinct exit code,
//! and nothing on disk is lost.

use anyhow::Result;

use crate::{Env, artifacts};

#[test]
fn add_refuses_what_is_not_a_bundle() -> Result<()> {
    let env = Env::new()?;
    let text = env.write("notes.wasm", "hello, I am text")?;
    let err = env.fails(&["add", "w", text.to_str().unwrap()], 65)?;
    assert!(err.contains("notes.wasm: not a WebAssembly file"), "{err}");

    let empty = env.write("empty.wasm", "")?;
    let err = env.fails(&["add", "w", empty.to_str().unwrap()], 65)?;
    assert!(err.contains("not a WebAssembly file"), "{err}");

    // The smallest core module: magic and version 1.
    let core = env.write("core.wasm", b"\0asm\x01\0\0\0")?;
    let err = env.fails(&["add", "w", core.to_str().unwrap()], 65)?;
    assert!(err.contains("a core WebAssembly module, not a component"), "{err}");

    let bytes = std::fs::read(artifacts::SOLVE_ISSUE)?;
    let truncated = env.write("truncated.wasm", &bytes[..bytes.len() / 2])?;
    let err = env.fails(&["add", "w", truncated.to_str().unwrap()], 65)?;
    assert!(err.contains("not a valid WebAssembly component"), "{err}");

    let err = env.fails(&["add", "w", artifacts::BAD_IMPORT], 65)?;
    assert!(
        err.contains("it imports `test:fixtures/spy`, which the host does not provide"),
        "{err}"
    );

    let err = env.fails(&["add", "w", artifacts::NO_WORKFLOW_EXPORT], 65)?;
    assert!(err.contains("it does not export `uncaged:workflow/workflow`"), "{err}");

    let err = env.fails(&["add", "w", "missing.wasm"], 66)?;
    assert!(err.contains("bundle missing.wasm does not exist"), "{err}");

    let err = env.fails(&["add", "bad name", artifacts::SOLVE_ISSUE], 64)?;
    assert!(err.contains("invalid workflow name `bad name`"), "{err}");

    // Nothing was registered or stored by any of these.
    assert_eq!(env.json(&["list"])?, serde_json::json!([]));
    assert!(
        !env.home().join("bundles").exists()
            || std::fs::read_dir(env.home().join("bundles"))?.count() == 0
    );
    Ok(())
}

#[test]
fn unknown_and_malformed_names_and_ids() -> Result<()> {
    let env = Env::new()?;
    let err = env.fails(&["show", "nope"], 66)?;
    assert!(err.contains("no workflow named `nope`"), "{err}");
    env.fails(&["history", "nope"], 66)?;
    env.fails(&["rollback", "nope"], 66)?;
    let err = env.fails(&["thread", "not-a-ulid"], 64)?;
    assert!(err.contains("invalid thread id `not-a-ulid`"), "{err}");
    let err = env.fails(&["thread", "01KQXKW18CT8G75T53R8F4G7YG"], 66)?;
    assert!(err.contains("no thread `01KQXKW18CT8G75T53R8F4G7YG`"), "{err}");
    env.fails(&["thread", "rm", "zzz"], 64)?;
    env.fails(&["frobnicate"], 64)?;
    Ok(())
}

#[test]
fn corrupt_registry_is_reported_with_its_line_and_never_overwritten() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    let registry = env.home().join("workflow.yaml");
    let corrupt = "workflows:\n  solve-issue:\n    hash: [unclosed\n";
    std::fs::write(&registry, corrupt)?;
    let err = env.fails(&["list"], 65)?;
    assert!(err.contains("workflow.yaml") && err.contains("line"), "{err}");
    let err = env.fails(&["add", "develop", artifacts::DEVELOP], 65)?;
    assert!(err.contains("workflow.yaml"), "{err}");
    assert_eq!(
        std::fs::read_to_string(&registry)?,
        corrupt,
        "a corrupt registry must not be overwritten"
    );
    Ok(())
}

#[test]
fn corrupt_config_and_answers_files() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    std::fs::write(env.home().join("config.yaml"), "agents: [this is: not, a map\n")?;
    let err = env.fails(&["run", "solve-issue", "-p", "x"], 65)?;
    assert!(err.contains("config.yaml") && err.contains("line"), "{err}");
    std::fs::write(env.home().join("config.yaml"), "agentz: {}\n")?;
    let err = env.fails(&["run", "solve-issue", "-p", "x"], 65)?;
    assert!(err.contains("unknown key `agentz`; did you mean `agent`?"), "{err}");
    std::fs::remove_file(env.home().join("config.yaml"))?;

    let answers = env.write("answers.yaml", "planner: [unclosed\n")?;
    let spec = format!("scripted:{}", answers.display());
    let err = env.fails(&["run", "solve-issue", "-p", "x", "--agent", &spec], 65)?;
    assert!(err.contains("scripted answers") && err.contains("do not parse"), "{err}");
    // No thread was started for any of these.
    assert_eq!(env.json(&["threads"])?, serde_json::json!([]));
    Ok(())
}

#[test]
fn missing_or_tampered_bundle_files_are_refused() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let file = env.home().join(format!("bundles/{hash}.wasm"));
    let mut bytes = std::fs::read(&file)?;
    let last = bytes.len() - 1;
    bytes[last] ^= 0xFF;
    std::fs::write(&file, &bytes)?;
    let err = env.fails(&["run", "solve-issue", "-p", "x"], 65)?;
    assert!(
        err.contains("modified after it was added") && err.contains("refusing to run it"),
        "{err}"
    );

    std::fs::remove_file(&file)?;
    let err = env.fails(&["run", "solve-issue", "-p", "x"], 66)?;
    assert!(
        err.contains(&format!("bundle `{hash}` of workflow `solve-issue` is missing")),
        "{err}"
    );

    // Adding the right bytes again repairs the store.
    env.add_solve_issue()?;
    env.ok(&["run", "solve-issue", "-p", "x"])?;
    Ok(())
}

#[test]
fn thread_files_with_bad_lines_are_still_read() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let thread = crate::thread_id_of(
        &env.run(&["run", "solve-issue", "-p", "x", "--max-rounds", "2"])?.stdout,
    )?;
    let path = env.home().join(format!("logs/{hash}/{thread}.data.jsonl"));
    let mut text = std::fs::read_to_string(&path)?;
    text.push_str("{\"role\":\"torn"); // a crash mid-append
    std::fs::write(&path, text)?;
    let shown = env.json(&["thread", &thread])?;
    assert_eq!(shown["steps"].as_array().unwrap().len(), 2);
    assert_eq!(env.json(&["threads"])?[0]["steps"], 2);
    Ok(())
}
