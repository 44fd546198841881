//! What people expect of a command line (cargo, ripgrep, gh, docker): completions and a man
//! page, ids by their prefix, names with a suggestion, prompts from stdin or a file, filters,
//! quiet and colour, help without noise, scaffolds that build anywhere.

use anyhow::{Context, Result, ensure};
use serde_json::Value;

use crate::{Env, thread_id_of};

/// What the binary answers a shell that asks for completions of `words` (the protocol the
/// script `completions bash` installs).
fn complete(env: &Env, words: &[&str]) -> Result<Vec<String>> {
    let out = env
        .command()
        .env("COMPLETE", "bash")
        .env("_CLAP_COMPLETE_INDEX", (words.len() - 1).to_string())
        .env("_CLAP_IFS", "\n")
        .arg("--")
        .args(words)
        .output()?;
    ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8(out.stdout)?.lines().map(str::to_string).collect())
}

#[test]
fn completions_offer_thread_ids_and_workflow_names_and_man_pages_render() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    env.json(&["add", "sorter", crate::artifacts::SOLVE_ISSUE])?;
    let thread = thread_id_of(&env.ok(&["run", "solve-issue", "-p", "x"])?)?;
    let script = env.ok(&["completions", "bash"])?;
    ensure!(
        script.contains("COMPLETE=\"bash\"") && script.contains("uncaged-workflow"),
        "{script}"
    );
    for shell in ["zsh", "fish", "powershell", "elvish"] {
        ensure!(!env.ok(&["completions", shell])?.is_empty(), "{shell}");
    }
    assert_eq!(complete(&env, &["uncaged-workflow", "run", "so"])?, ["solve-issue", "sorter"]);
    assert_eq!(complete(&env, &["uncaged-workflow", "run", "sol"])?, ["solve-issue"]);
    assert_eq!(complete(&env, &["uncaged-workflow", "thread", &thread[..6]])?, [thread.as_str()]);
    assert_eq!(complete(&env, &["uncaged-workflow", "kill", "7"])?, Vec::<String>::new());
    let subcommands = complete(&env, &["uncaged-workflow", "thr"])?;
    ensure!(subcommands.contains(&"threads".to_string()), "{subcommands:?}");

    let page = env.ok(&["man"])?;
    ensure!(page.contains(".TH uncaged-workflow 1") && page.contains("Exit codes"), "{page}");
    let run = env.ok(&["man", "run"])?;
    ensure!(run.contains(".TH uncaged-workflow-run") && run.contains("prompt\\-file"), "{run}");
    env.fails(&["man", "nope"], 64)?;
    Ok(())
}

#[test]
fn a_thread_is_named_by_a_unique_prefix_and_an_unknown_workflow_gets_a_suggestion() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    let a = env.ok(&["thread", "start", "solve-issue", "-p", "a"])?.trim().to_string();
    let b = env.ok(&["thread", "start", "solve-issue", "-p", "b"])?.trim().to_string();
    let common = a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count();
    ensure!(common >= 4, "two ids made together share their time: {a} {b}");
    // A prefix only `a` has, in lower case: every command takes it.
    let own = a[..common + 1].to_ascii_lowercase();
    assert_eq!(env.json(&["thread", &own])?["start"]["threadId"], a.as_str());
    assert_eq!(env.ok(&["kill", &own])?.trim(), format!("killed thread {a}"));
    // A prefix both have is refused, naming them.
    let err = env.fails(&["thread", &a[..common]], 64)?;
    ensure!(err.contains("is ambiguous") && err.contains(&a) && err.contains(&b), "{err}");
    let err = env.fails(&["thread", &a[..3]], 64)?;
    ensure!(err.contains("or its first 4 or more"), "{err}");
    env.fails(&["thread", "7ZZZZZ"], 66)?;

    let err = env.fails(&["run", "solve-isue", "-p", "x"], 66)?;
    ensure!(err.contains("no workflow named `solve-isue` (did you mean `solve-issue`?)"), "{err}");
    let err = env.fails(&["show", "zebra"], 66)?;
    ensure!(err.contains("see `uncaged-workflow list`"), "{err}");
    Ok(())
}

#[test]
fn a_prompt_comes_from_stdin_or_a_file_and_help_lists_every_agent_kind() -> Result<()> {
    use std::io::Write;
    let env = Env::new()?;
    env.add_solve_issue()?;
    let prompt = "Fix the parser.\nIt crashes on an empty file.\n";
    let mut child = env
        .command()
        .args(["run", "solve-issue", "-p", "-", "--detach"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    child.stdin.take().context("stdin")?.write_all(prompt.as_bytes())?;
    let out = child.wait_with_output()?;
    ensure!(out.status.success(), "run -p - failed");
    let thread = String::from_utf8(out.stdout)?.trim().to_string();
    let shown = env.json(&["thread", &thread])?;
    assert_eq!(shown["start"]["parameters"]["prompt"], prompt);

    let file = env.write("issue.md", "From a file.")?;
    let thread = env
        .ok(&["thread", "start", "solve-issue", "--prompt-file", file.to_str().context("path")?])?
        .trim()
        .to_string();
    assert_eq!(env.json(&["thread", &thread])?["start"]["parameters"]["prompt"], "From a file.");
    let err = env.fails(&["run", "solve-issue", "--prompt-file", "missing.md"], 66)?;
    ensure!(err.contains("prompt file") && err.contains("missing.md"), "{err}");
    env.fails(&["run", "solve-issue"], 64)?;
    env.fails(&["run", "solve-issue", "-p", "x", "--prompt-file", "issue.md"], 64)?;

    let help = env.ok(&["run", "--help"])?;
    for kind in ["scripted", "command:PROGRAM", "human", "openai"] {
        ensure!(help.contains(kind), "run --help lacks {kind}:\n{help}");
    }
    Ok(())
}

#[test]
fn threads_filter_by_status_workflow_age_and_count_and_runs_can_be_quiet() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    env.json(&["add", "other", crate::artifacts::SOLVE_ISSUE])?;
    let done = thread_id_of(&env.ok(&["run", "solve-issue", "-p", "x"])?)?;
    let failed =
        thread_id_of(&env.run(&["run", "solve-issue", "-p", "x", "--max-rounds", "1"])?.stdout)?;
    let paused = env.ok(&["thread", "start", "other", "-p", "x"])?.trim().to_string();
    let ids = |args: &[&str]| -> Result<Vec<String>> {
        let mut all = vec!["threads"];
        all.extend(args);
        let list = env.json(&all)?;
        Ok(list
            .as_array()
            .context("a list")?
            .iter()
            .map(|t: &Value| t["threadId"].as_str().unwrap_or_default().to_string())
            .collect())
    };
    assert_eq!(ids(&["--status", "failed"])?, [failed.as_str()]);
    assert_eq!(
        ids(&["--status", "paused", "--status", "completed"])?,
        [done.clone(), paused.clone()]
    );
    assert_eq!(ids(&["--workflow", "other"])?, [paused.as_str()]);
    assert_eq!(
        ids(&["--limit", "2"])?,
        [failed.clone(), paused.clone()],
        "the newest, oldest first"
    );
    assert_eq!(ids(&["--since", "1h"])?.len(), 3);
    env.fails(&["threads", "--status", "asleep"], 64)?;

    // --quiet prints nothing; the exit code says how it ended.
    let quiet = env.run(&["run", "solve-issue", "-p", "x", "--quiet"])?;
    assert_eq!((quiet.code, quiet.stdout.as_str(), quiet.stderr.as_str()), (0, "", ""));
    let quiet = env.run(&["run", "solve-issue", "-p", "x", "-q", "--max-rounds", "1"])?;
    assert_eq!((quiet.code, quiet.stdout.as_str()), (2, ""), "max rounds reached");
    Ok(())
}

#[test]
fn colour_follows_the_flag_and_no_color() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    env.ok(&["run", "solve-issue", "-p", "x"])?;
    let painted = env.ok(&["threads", "--color", "always"])?;
    ensure!(painted.contains("\u{1b}[32mcompleted\u{1b}[0m"), "{painted:?}");
    // The header and the other columns stay plain, and so do the widths.
    ensure!(painted.starts_with("THREAD"), "{painted:?}");
    for (args, vars) in [
        (vec!["threads"], vec![]),
        (vec!["threads", "--color", "never"], vec![]),
        (vec!["threads", "--color", "auto"], vec![("NO_COLOR", "1")]),
    ] {
        let out = env.run_with(&args, &vars)?;
        ensure!(!out.stdout.contains('\u{1b}'), "{args:?} {vars:?}: {:?}", out.stdout);
    }
    let err = env.run(&["--color", "always", "thread", "7ZZZZZ"])?;
    ensure!(err.stderr.starts_with("\u{1b}[31muncaged-workflow:\u{1b}[0m"), "{:?}", err.stderr);
    Ok(())
}

#[test]
fn help_shows_no_empty_environment_value() -> Result<()> {
    let env = Env::new()?;
    let help = env.run_with(&["--help"], &[("UNCAGED_WORKFLOW_HOME", "")])?;
    ensure!(!help.stdout.contains("=]"), "{}", help.stdout);
    ensure!(help.stdout.contains("[env: UNCAGED_WORKFLOW_HOME]"), "{}", help.stdout);
    Ok(())
}

/// The scaffolds carry nothing of the machine that wrote them: the Rust one holds the SDK it
/// builds against (no absolute path), the JavaScript one pins its whole toolchain's tree.
#[test]
fn scaffolds_hold_no_path_of_this_machine_and_pin_their_tools() -> Result<()> {
    let env = Env::new()?;
    let rust = env.dir.path().join("hello-rust");
    env.ok(&["new", rust.to_str().context("path")?, "--lang", "rust"])?;
    let manifest = std::fs::read_to_string(rust.join("Cargo.toml"))?;
    ensure!(manifest.contains("uncaged-workflow-sdk = { path = \"sdk\" }"), "{manifest}");
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize()?;
    for file in walk(&rust)? {
        let text = std::fs::read_to_string(&file)?;
        ensure!(
            !text.contains(&repo.display().to_string()),
            "{} names {}",
            file.display(),
            repo.display()
        );
    }
    ensure!(rust.join("sdk/src/lib.rs").exists() && rust.join("wit/workflow.wit").exists());

    let js = env.dir.path().join("hello-js");
    env.ok(&["new", js.to_str().context("path")?, "--lang", "js"])?;
    let package: Value = serde_json::from_str(&std::fs::read_to_string(js.join("package.json"))?)?;
    let lock: Value =
        serde_json::from_str(&std::fs::read_to_string(js.join("package-lock.json"))?)?;
    assert_eq!(lock["name"], "hello-js");
    // Every pinned tool is in the lock file at the version package.json asks for.
    for (tool, version) in package["devDependencies"].as_object().context("devDependencies")? {
        let locked = &lock["packages"][format!("node_modules/{tool}")]["version"];
        assert_eq!(locked, version, "{tool}");
    }
    let readme = std::fs::read_to_string(js.join("README.md"))?;
    ensure!(readme.contains("npm ci"), "{readme}");
    Ok(())
}

fn walk(dir: &std::path::Path) -> Result<Vec<std::path::PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            files.extend(walk(&path)?);
        } else {
            files.push(path);
        }
    }
    Ok(files)
}
