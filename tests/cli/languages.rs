//! Bundles in any language: the Rust, Python and JavaScript solve-issue record the same thread,
//! and `new` scaffolds a bundle in each language that builds, adds and runs.
//!
//! The Python and JavaScript components and toolchains come from `make bundles` (which the
//! README's `make test` runs first): componentize-py in target/py-venv, componentize-js and
//! esbuild in target/js-tools.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use crate::{Env, artifacts, read_jsonl, thread_id_of};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A file `make bundles` produces, or a failure saying to run it.
fn built(relative: &str) -> Result<PathBuf> {
    let path = repo().join(relative);
    ensure!(
        path.exists(),
        "{} is missing: run `make bundles` (or `make test`) first",
        path.display()
    );
    Ok(path)
}

/// The steps of a thread: role, content and meta, in order.
fn steps(env: &Env, hash: &str, thread: &str) -> Result<Vec<Value>> {
    Ok(read_jsonl(&env.home().join(format!("logs/{hash}/{thread}.data.jsonl")))?
        .into_iter()
        .filter(|l| l.get("role").is_some())
        .map(|l| json!({"role": l["role"], "content": l["content"], "meta": l["meta"]}))
        .collect())
}

#[test]
fn solve_issue_in_rust_python_and_javascript_record_the_same_thread() -> Result<()> {
    let env = Env::new()?;
    let answers = repo().join("bundles/solve-issue/demo-answers.yaml");
    let agent = format!("scripted:{}", answers.display());
    let mut threads = Vec::new();
    for (name, file) in [
        ("rust", PathBuf::from(artifacts::SOLVE_ISSUE)),
        ("python", built("target/bundles/solve_issue_py.wasm")?),
        ("js", built("target/bundles/solve_issue_js.wasm")?),
    ] {
        let added = env.json(&["add", name, file.to_str().unwrap()])?;
        let hash = added["hash"].as_str().unwrap().to_string();
        assert_eq!(added["roles"], json!(["planner", "developer", "reviewer"]), "{name}");
        let out = env.ok(&[
            "run",
            name,
            "-p",
            "Fix the crash when the input file is empty",
            "--agent",
            &agent,
        ])?;
        assert!(
            out.trim_end().ends_with("completed (0): approved after 2 development round(s)"),
            "{name}: {out}"
        );
        threads.push((name, steps(&env, &hash, &thread_id_of(&out)?)?));
    }
    let (_, reference) = &threads[0];
    assert_eq!(reference.len(), 5);
    for (name, recorded) in &threads[1..] {
        assert_eq!(recorded, reference, "{name} recorded a different thread than rust");
    }
    // The descriptors agree too: the same roles, prompts and schemas.
    let shows: Vec<Value> =
        ["rust", "python", "js"].iter().map(|n| env.json(&["show", n])).collect::<Result<_>>()?;
    for show in &shows[1..] {
        assert_eq!(show["roles"], shows[0]["roles"]);
        assert_eq!(show["description"], shows[0]["description"]);
        assert_eq!(show["inputSchema"], shows[0]["inputSchema"]);
    }
    // Each SDK declares the workflow's input, and each start is checked against it.
    assert_eq!(shows[0]["inputSchema"]["properties"]["issue"]["minimum"], 1, "{}", shows[0]);
    for name in ["rust", "python", "js"] {
        let e = env
            .fails(&["run", name, "-p", "x", "--data", r#"{"issue": 0}"#, "--agent", &agent], 65)?;
        ensure!(
            e.contains(&format!("workflow `{name}` does not take this data"))
                && e.contains("(at `/issue`)"),
            "{name}: {e}"
        );
        env.ok(&[
            "run",
            name,
            "-p",
            "x",
            "--data",
            r#"{"issue": 4, "title": "t"}"#,
            "--agent",
            &agent,
        ])?;
    }
    Ok(())
}

/// Scaffolds a bundle with `new`, builds it with `build`, then adds and runs it.
fn new_bundle_runs(lang: &str, build: impl FnOnce(&Path) -> Result<PathBuf>) -> Result<()> {
    let env = Env::new()?;
    let dir = env.dir.path().join(format!("hello-{lang}"));
    let out = env.ok(&["new", dir.to_str().unwrap(), "--lang", lang])?;
    assert!(out.contains("README.md"), "{out}");
    let readme = std::fs::read_to_string(dir.join("README.md"))?;
    assert!(readme.contains("uncaged-workflow add"), "{readme}");
    let wasm = build(&dir)?;
    env.ok(&["add", "hello", wasm.to_str().unwrap()])?;
    let out = env.ok(&["run", "hello", "-p", "Say hello"])?;
    assert!(out.trim_end().ends_with("completed (0): answered: Hello!"), "{out}");
    // A second `new` into the same directory is refused, leaving it as it was.
    let err = env.fails(&["new", dir.to_str().unwrap(), "--lang", lang], 64)?;
    assert!(err.contains("does not exist yet, or is empty"), "{err}");
    Ok(())
}

fn run(command: &mut Command) -> Result<()> {
    let out = command.output().with_context(|| format!("{command:?}"))?;
    ensure!(
        out.status.success(),
        "{command:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[test]
fn new_rust_bundle_builds_adds_and_runs() -> Result<()> {
    new_bundle_runs("rust", |dir| {
        // Share one target directory between runs of this test, so only the first pays.
        let target = repo().join("target/scaffold-test");
        run(Command::new(env!("CARGO"))
            .args(["build", "--target", "wasm32-wasip2", "--release", "--target-dir"])
            .arg(&target)
            .current_dir(dir)
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS"))?;
        Ok(target.join("wasm32-wasip2/release/hello_rust.wasm"))
    })
}

#[test]
fn new_python_bundle_builds_adds_and_runs() -> Result<()> {
    let tool = built("target/py-venv/bin/componentize-py")?;
    new_bundle_runs("python", |dir| {
        run(Command::new(dir.join("build.sh")).env("COMPONENTIZE_PY", &tool))?;
        Ok(dir.join("hello-python.wasm"))
    })
}

#[test]
fn new_javascript_bundle_builds_adds_and_runs() -> Result<()> {
    let tools = built("target/js-tools/node_modules/.bin")?;
    new_bundle_runs("js", |dir| {
        run(Command::new(dir.join("build.sh")).env("JS_TOOLS", &tools))?;
        Ok(dir.join("hello-js.wasm"))
    })
}
