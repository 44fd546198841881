//! Durable agents: an `openai` binding whose model calls the tools of MCP servers no one here
//! wrote (`@modelcontextprotocol/server-filesystem` from npm, `mcp-server-time` from PyPI, and
//! servers written with the official Python SDK, over stdio and Streamable HTTP), against a
//! model on loopback that plans the calls; each turn and tool call journaled, crashes in the
//! middle of the loop, a person's decisions, budgets, and servers that misbehave.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use crate::mock_model::{MockModel, Turn, offered, tool_results, turn_of};
use crate::{Env, Run, Serve, status, wait_until};

/// The repository's root (the MCP servers are installed under its `target/`).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A file `tests/mcp/install.sh` installs (`make test` runs it).
pub fn installed(path: &str) -> Result<String> {
    let path = repo().join(path);
    ensure!(
        path.exists(),
        "{} is missing: run tests/mcp/install.sh (make test does)",
        path.display()
    );
    // Not canonical: a venv's `python` is a link, and the venv is found through its path.
    Ok(std::path::absolute(&path)?.display().to_string())
}

/// The Python of the venv the MCP servers are installed in.
pub fn python() -> Result<String> {
    installed("target/mcp-venv/bin/python")
}

/// One of this repository's test servers (`tests/mcp/<name>`).
pub(crate) fn test_server(name: &str) -> Result<String> {
    Ok(repo().join("tests/mcp").join(name).canonicalize()?.display().to_string())
}

/// A workflow of one role, `developer`, whose answer holds a summary.
pub(crate) const DEV_YAML: &str = "description: A developer changes a repository with its tools\n\
roles:\n  developer:\n    description: Changes the repository\n    system_prompt: You are the developer.\n    \
schema:\n      type: object\n      required: [summary]\n      properties:\n        summary: {type: string}\n\
graph:\n  - from: $START\n    transitions: [{to: developer}]\n  - from: developer\n    transitions: [{to: $END}]\n";

/// The final answer the model gives.
pub const DONE: &str = "Done.\n{\"summary\": \"the work is done\"}";

/// A home with the `dev` workflow, and `developer` bound to `coder`: an `openai` binding of
/// `model` with `settings` (lines indented by four) and the tool servers `tools` (lines
/// indented by six).
pub fn workbench(model: &MockModel, settings: &str, tools: &str) -> Result<Env> {
    let env = Env::new()?;
    let flow = env.write("dev.yaml", DEV_YAML)?;
    env.ok(&["add", "dev", flow.to_str().context("path")?])?;
    let config = format!(
        "roles:\n  developer: coder\nagents:\n  coder:\n    kind: openai\n    base_url: {}\n    \
         model: m\n    retry_delay: 10ms\n{settings}    tools:\n{tools}",
        model.base_url
    );
    std::fs::write(env.home().join("config.yaml"), config)?;
    Ok(env)
}

/// The ledger server over stdio, given LEDGER_FILE, with `extra` settings (indented by eight).
pub fn ledger_server(extra: &str) -> Result<String> {
    Ok(format!(
        "      ledger:\n        command: {}\n        args: [{}]\n        env: [LEDGER_FILE]\n{extra}",
        python()?,
        test_server("ledger_server.py")?
    ))
}

/// Runs (or continues) the `dev` thread with LEDGER_FILE set to `ledger` (and, on PostgreSQL,
/// the workers' leases short, so that a killed worker's thread is free again soon).
fn with_ledger(env: &Env, args: &[&str], ledger: &Path) -> Result<Run> {
    env.run_with(
        args,
        &[("LEDGER_FILE", ledger.to_str().context("path")?), ("UNCAGED_WORKFLOW_LEASE_MS", "1500")],
    )
}

/// The entries in the ledger.
pub fn ledger_lines(ledger: &Path) -> Vec<String> {
    std::fs::read_to_string(ledger).unwrap_or_default().lines().map(str::to_string).collect()
}

/// The thread `run --json` started.
fn thread_of(run: &Run) -> Result<String> {
    let started = run.stdout.lines().next().context("no output")?;
    let event: Value = serde_json::from_str(started)?;
    Ok(event["thread"].as_str().context("thread")?.to_string())
}

/// The loop entries of a thread's journal, in order.
fn loop_entries(env: &Env, hash: &str, thread: &str) -> Result<Vec<Value>> {
    Ok(env.calls(hash, thread)?.into_iter().filter_map(|l| l.get("loop").cloned()).collect())
}

/// The bundle id of `dev`.
fn dev_hash(env: &Env) -> Result<String> {
    let shown = env.json(&["show", "dev"])?;
    Ok(shown["hash"].as_str().context("hash")?.to_string())
}

// Through the CLI only: each runs on a home directory and on a PostgreSQL database.
on_both_stores! {

/// The "done when": a developer reads and edits files in a repository through the
/// filesystem server from npm, two calls in one turn made at once, the model's text streamed
/// to `run --json` as `delta` events, and every turn and call shown by `thread`.
#[test]
fn a_developer_reads_and_edits_files_through_the_filesystem_server() -> Result<()> {
    let repo_dir = tempfile::tempdir()?;
    let root = repo_dir.path().canonicalize()?;
    std::fs::write(root.join("README.md"), "# demo\nThe parser crashes on empty input.\n")?;
    std::fs::write(root.join("parser.txt"), "parse(input) = input[0]\n")?;
    let file = |name: &str| root.join(name).display().to_string();
    let (readme, parser) = (file("README.md"), file("parser.txt"));
    let model = MockModel::start(move |body| match turn_of(body) {
        1 => Turn::calls(&[
            ("fs__read_text_file", json!({"path": readme})),
            ("fs__read_text_file", json!({"path": parser})),
        ])
        .saying("Let me read the repository first."),
        2 => Turn::call(
            "fs__write_file",
            json!({"path": parser, "content": "parse(input) = input.first()\n"}),
        ),
        _ => Turn::answer("Fixed the parser for empty input.\n{\"summary\": \"parser fixed\"}"),
    })?;
    let fs_server = filesystem_server(&root)?;
    let env = workbench(&model, "    stream: true\n", &fs_server)?;
    let run = env.run(&["run", "dev", "-p", "Fix the crash on empty input", "--json"])?;
    ensure!(run.code == 0, "{run:?}");
    ensure!(
        std::fs::read_to_string(root.join("parser.txt"))? == "parse(input) = input.first()\n",
        "the model's edit did not reach the file: {:?}",
        tool_results(&model.seen().last().cloned().unwrap_or_default())
    );
    // The model was given what the files hold, each under its own call.
    let seen = model.seen();
    ensure!(seen.len() == 3, "one request per turn: {}", seen.len());
    let results = tool_results(&seen[1]);
    ensure!(results.len() == 2, "{results:?}");
    ensure!(results[0].1.contains("The parser crashes"), "{results:?}");
    ensure!(results[1].1.contains("input[0]"), "{results:?}");
    ensure!(offered(&seen[0]).contains(&"fs__write_file".to_string()), "{:?}", offered(&seen[0]));
    // The text came as it was written, before the step.
    let events = crate::llm::json_events(&run.stdout);
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "delta")
        .map(|e| e["text"].as_str().unwrap_or_default())
        .collect();
    ensure!(
        deltas == "Let me read the repository first.Fixed the parser for empty input.\n{\"summary\": \"parser fixed\"}",
        "the deltas: {deltas:?} in {}",
        run.stdout
    );
    let last_delta = events.iter().rposition(|e| e["type"] == "delta").context("deltas")?;
    let step = events.iter().position(|e| e["type"] == "step").context("step")?;
    ensure!(last_delta < step, "the text streams before the step lands");
    // `thread` shows the turns and the calls.
    let thread = thread_of(&run)?;
    let shown = env.json(&["thread", &thread])?;
    let turns = &shown["steps"][0]["turns"];
    ensure!(turns.as_array().map(Vec::len) == Some(3), "{turns}");
    let calls = &turns[0]["toolCalls"];
    ensure!(calls.as_array().map(Vec::len) == Some(2), "{calls}");
    ensure!(calls[0]["tool"] == "fs.read_text_file" && calls[0]["status"] == "ok", "{calls}");
    ensure!(calls[0]["result"].as_str().is_some_and(|r| r.contains("# demo")), "{calls}");
    let text = env.ok(&["thread", &thread])?;
    ensure!(text.contains("fs.write_file"), "{text}");
    Ok(())
}

/// The "done when", second half, with the same filesystem server: the worker is
/// killed with `-9` while the model is asked its third turn, after it read a file and wrote
/// another; resumed, the thread asks that turn again, and neither the read nor the write is
/// made again (a line the test adds to the written file after the kill stays).
#[test]
fn a_developer_killed_in_the_middle_of_its_loop_makes_no_file_edit_twice() -> Result<()> {
    let repo_dir = tempfile::tempdir()?;
    let root = repo_dir.path().canonicalize()?;
    std::fs::write(root.join("parser.txt"), "parse(input) = input[0]\n")?;
    let (parser, fix) = (root.join("parser.txt").display().to_string(), root.join("fix.txt"));
    let go = root.join("go");
    let (fix_path, go_in) = (fix.display().to_string(), go.clone());
    let model = MockModel::start(move |body| match turn_of(body) {
        1 => Turn::call("fs__read_text_file", json!({"path": parser})),
        2 => Turn::call("fs__write_file", json!({"path": fix_path, "content": "use first()\n"})),
        _ => Turn::answer("Wrote the fix.\n{\"summary\": \"fix written\"}").gated(&go_in),
    })?;
    let fs_server = filesystem_server(&root)?;
    let env = workbench(&model, "    stream: true\n", &fs_server)?;
    let lease = ("UNCAGED_WORKFLOW_LEASE_MS", "1500");
    let run = env.run_with(&["run", "dev", "-p", "Fix the parser", "--detach"], &[lease])?;
    let thread = run.stdout.trim().to_string();
    wait_until("the third turn is asked", || Ok(model.seen().len() == 3))?;
    env.kill_the_worker()?;
    no_worker_runs(&env, &thread)?;
    ensure!(std::fs::read_to_string(&fix)? == "use first()\n", "the write was made");
    std::fs::write(&fix, "use first()\nadded after the kill\n")?;
    std::fs::write(&go, "")?;
    let resumed = env.run_with(&["resume", &thread], &[lease])?;
    ensure!(resumed.code == 0, "{resumed:?}");
    ensure!(
        std::fs::read_to_string(&fix)? == "use first()\nadded after the kill\n",
        "the write was made again: {:?}",
        std::fs::read_to_string(&fix)?
    );
    ensure!(model.asked(1) == 1 && model.asked(2) == 1, "a journaled turn asked twice");
    ensure!(model.asked(3) == 2, "the cut turn is asked again: {}", model.asked(3));
    let entries = loop_entries(&env, &dev_hash(&env)?, &thread)?;
    let started = entries.iter().filter(|e| e["entry"] == "toolStarted").count();
    ensure!(started == 2, "each call started once: {entries:?}");
    Ok(())
}

/// `mcp-server-time` from PyPI, over stdio: the model asks it the time in a zone, and is given
/// its answer.
#[test]
fn the_time_server_answers_the_model() -> Result<()> {
    let model = MockModel::start(|body| match turn_of(body) {
        1 => Turn::call("time__get_current_time", json!({"timezone": "Europe/Paris"})),
        _ => Turn::answer(DONE),
    })?;
    let server = format!(
        "      time:\n        command: {}\n        args: [--local-timezone, UTC]\n",
        installed("target/mcp-venv/bin/mcp-server-time")?
    );
    let env = workbench(&model, "", &server)?;
    let run = env.run(&["run", "dev", "-p", "What time is it in Paris?"])?;
    ensure!(run.code == 0, "{run:?}");
    let results = tool_results(&model.seen()[1]);
    ensure!(results.len() == 1 && results[0].1.contains("Europe/Paris"), "{results:?}");
    ensure!(results[0].1.contains("datetime"), "{results:?}");
    Ok(())
}

/// Ten turns, each appending to a ledger: every entry once, every turn asked once, and the
/// journal holds each turn's message and each call's start and result.
#[test]
fn a_loop_of_ten_turns_appends_each_entry_once() -> Result<()> {
    let model = MockModel::start(ten_appends)?;
    let env = workbench(&model, "", &ledger_server("")?)?;
    let ledger = env.dir.path().join("ledger");
    let run = with_ledger(&env, &["run", "dev", "-p", "Keep a ledger", "--json"], &ledger)?;
    ensure!(run.code == 0, "{run:?}");
    let expected: Vec<String> = (1..=10).map(|k| format!("turn-{k}")).collect();
    ensure!(ledger_lines(&ledger) == expected, "{:?}", ledger_lines(&ledger));
    ensure!((1..=11).all(|k| model.asked(k) == 1), "each turn asked once");
    let entries = loop_entries(&env, &dev_hash(&env)?, &thread_of(&run)?)?;
    let count = |kind: &str| entries.iter().filter(|e| e["entry"] == kind).count();
    ensure!((count("offered"), count("model"), count("toolStarted"), count("toolResult"))
        == (1, 11, 10, 10), "{entries:?}");
    Ok(())
}


/// The "done when", second half: `kill -9` of the worker while a tool call is in the
/// middle (it wrote its entry, and hangs), then `resume`. The call is not safe to repeat, so the
/// thread waits for a person, who sees it done and skips it: no call is made twice, no turn
/// asked twice, and the answer is recorded once.
#[test]
fn a_kill_9_in_the_middle_of_a_call_makes_no_call_twice() -> Result<()> {
    let model = MockModel::start(ten_appends)?;
    let env = workbench(&model, "", &ledger_server("")?)?;
    let ledger = env.dir.path().join("ledger");
    std::fs::write(ledger.with_extension("hang"), "turn-3")?;
    let run = with_ledger(&env, &["run", "dev", "-p", "Keep a ledger", "--json", "--detach"], &ledger)?;
    ensure!(run.code == 0, "{run:?}");
    let thread = run.stdout.trim().to_string();
    wait_until("turn 3 is appended", || Ok(ledger_lines(&ledger).len() == 3))?;
    env.kill_the_worker()?;
    std::fs::remove_file(ledger.with_extension("hang"))?;
    // Interrupted; on a database, queued again once the dead worker's lease runs out.
    wait_until("the thread is free", || {
        Ok(matches!(status(&env, &thread)?.as_str(), "interrupted" | "queued"))
    })?;
    let resumed = with_ledger(&env, &["resume", &thread], &ledger)?;
    ensure!(resumed.code == 75, "it waits for a person: {resumed:?}");
    ensure!(resumed.stdout.contains("--redo") && resumed.stdout.contains("--skip"), "{resumed:?}");
    let shown = env.json(&["thread", &thread])?;
    let wait = &shown["paused"]["call"]["tool"];
    ensure!(wait["why"] == "cut" && wait["tool"] == "ledger.append", "{wait}");
    ensure!(wait["arguments"].as_str().is_some_and(|a| a.contains("turn-3")), "{wait}");
    // The person sees the entry in the ledger, and skips the call.
    let answered =
        with_ledger(&env, &["answer", &thread, "--skip", "appended turn-3 (seen in the ledger)"], &ledger)?;
    ensure!(answered.code == 0, "{answered:?}");
    let expected: Vec<String> = (1..=10).map(|k| format!("turn-{k}")).collect();
    ensure!(ledger_lines(&ledger) == expected, "{:?}", ledger_lines(&ledger));
    ensure!((1..=11).all(|k| model.asked(k) == 1), "a turn asked twice");
    let results = tool_results(&model.seen()[3]);
    ensure!(results[2].1 == "appended turn-3 (seen in the ledger)", "{results:?}");
    let shown = env.json(&["thread", &thread])?;
    ensure!(shown["steps"].as_array().map(Vec::len) == Some(1), "{shown}");
    let calls = env.calls(&dev_hash(&env)?, &thread)?;
    ensure!(calls.iter().filter(|c| c["kind"] == "agent").count() == 1, "the answer once");
    Ok(())
}

/// A call to a tool its binding wants approved waits for a person, shown the tool, its
/// arguments and what the model said; `answer --approve` lets it be made, `--deny WHY` tells
/// the model why not; a decision of the wrong kind, or a text, is refused.
#[test]
fn an_approved_call_is_made_and_a_denied_one_is_not() -> Result<()> {
    let model = MockModel::start(|body| match turn_of(body) {
        1 => Turn::call("ledger__append", json!({"entry": "a"})).saying("I will write a."),
        2 => Turn::call("ledger__append", json!({"entry": "b"})),
        _ => Turn::answer(DONE),
    })?;
    let env = workbench(&model, "", &ledger_server("        approve: [append]\n")?)?;
    let ledger = env.dir.path().join("ledger");
    let run = with_ledger(&env, &["run", "dev", "-p", "Write a and b"], &ledger)?;
    ensure!(run.code == 75, "{run:?}");
    ensure!(run.stdout.contains("--approve") && run.stdout.contains("ledger.append"), "{run:?}");
    let thread = crate::thread_id_of(&run.stdout)?;
    let wait = env.json(&["thread", &thread])?["paused"]["call"]["tool"].clone();
    ensure!(wait["why"] == "approve" && wait["reasoning"] == "I will write a.", "{wait}");
    ensure!(ledger_lines(&ledger).is_empty(), "not made before it is approved");
    env.fails(&["answer", &thread, "--redo"], 64)?;
    env.fails(&["answer", &thread, "some text"], 64)?;
    let approved = with_ledger(&env, &["answer", &thread, "--approve"], &ledger)?;
    ensure!(approved.code == 75, "b waits too: {approved:?}");
    ensure!(ledger_lines(&ledger) == ["a"], "{:?}", ledger_lines(&ledger));
    let denied = with_ledger(&env, &["answer", &thread, "--deny", "b is not wanted"], &ledger)?;
    ensure!(denied.code == 0, "{denied:?}");
    ensure!(ledger_lines(&ledger) == ["a"], "{:?}", ledger_lines(&ledger));
    let results = tool_results(&model.seen().last().cloned().unwrap_or_default());
    ensure!(results[1].1 == "A person did not allow this call: b is not wanted", "{results:?}");
    ensure!((1..=3).all(|k| model.asked(k) == 1), "a turn asked twice");
    let turns = &env.json(&["thread", &thread])?["steps"][0]["turns"];
    ensure!(turns[1]["toolCalls"][0]["status"] == "denied", "{turns}");
    Ok(())
}

/// `run --approve server.tool` has a person approve that tool's calls in this thread, though
/// its binding does not ask it: recorded with the thread, so the run that an answer resumes
/// asks again for the next call.
#[test]
fn a_run_asks_for_approvals_of_its_own() -> Result<()> {
    let model = MockModel::start(|body| match turn_of(body) {
        1 => Turn::call("ledger__read", json!({})),
        k @ 2..=3 => Turn::call("ledger__append", json!({"entry": format!("e{k}")})),
        _ => Turn::answer(DONE),
    })?;
    let env = workbench(&model, "", &ledger_server("")?)?;
    let ledger = env.dir.path().join("ledger");
    env.fails(&["run", "dev", "-p", "x", "--approve", "ledger"], 64)?;
    let run = with_ledger(&env, &["run", "dev", "-p", "Append", "--approve", "ledger.append"], &ledger)?;
    ensure!(run.code == 75, "the read is made, the append waits: {run:?}");
    let thread = crate::thread_id_of(&run.stdout)?;
    let shown = env.json(&["thread", &thread])?;
    ensure!(shown["start"]["parameters"]["options"]["approve"] == json!(["ledger.append"]), "{shown}");
    ensure!(shown["paused"]["call"]["tool"]["tool"] == "ledger.append", "{shown}");
    let approved = with_ledger(&env, &["answer", &thread, "--approve"], &ledger)?;
    ensure!(approved.code == 75, "the second append waits too: {approved:?}");
    let approved = with_ledger(&env, &["answer", &thread, "--approve"], &ledger)?;
    ensure!(approved.code == 0, "{approved:?}");
    ensure!(ledger_lines(&ledger) == ["e2", "e3"], "{:?}", ledger_lines(&ledger));
    Ok(())
}

/// What a thread has spent is checked before each model turn: a loop that crosses its budget
/// pauses between turns, and `resume --raise-budget` goes on from the journal.
#[test]
fn a_budget_crossed_in_the_middle_of_a_loop_pauses_it_between_turns() -> Result<()> {
    let model = MockModel::start(ten_appends)?;
    let env = workbench(&model, "", &ledger_server("")?)?;
    let ledger = env.dir.path().join("ledger");
    // 110 tokens a turn: the fourth turn would begin at 330.
    let run = with_ledger(&env, &["run", "dev", "-p", "Keep a ledger", "--max-tokens", "300"], &ledger)?;
    ensure!(run.code == 75, "{run:?}");
    let thread = crate::thread_id_of(&run.stdout)?;
    let shown = env.json(&["thread", &thread])?;
    ensure!(shown["status"] == "paused" && shown["paused"]["by"] == "budget", "{shown}");
    ensure!(ledger_lines(&ledger).len() == 3 && model.seen().len() == 3, "three turns");
    let resumed =
        with_ledger(&env, &["resume", &thread, "--raise-budget", "tokens=100000"], &ledger)?;
    ensure!(resumed.code == 0, "{resumed:?}");
    ensure!(ledger_lines(&ledger).len() == 10, "{:?}", ledger_lines(&ledger));
    ensure!((1..=11).all(|k| model.asked(k) == 1), "a turn asked twice");
    let usage = &env.json(&["thread", &thread])?["usage"];
    ensure!(usage["inputTokens"] == 1100 && usage["calls"] == 1, "{usage}");
    Ok(())
}

/// Servers that misbehave are the model's news, not the thread's end: a call past its
/// timeout, a server that dies in a call, a result of 50 MiB (cut to the binding's size, with
/// a marker), a tool the binding does not allow, and one the server added after the call
/// began.
#[test]
fn a_slow_a_dying_a_huge_and_an_unoffered_tool_are_told_to_the_model() -> Result<()> {
    let model = MockModel::start(|body| match turn_of(body) {
        1 => Turn::calls(&[("ledger__slow", json!({"seconds": 30})), ("ledger__big", json!({"mebibytes": 50}))]),
        2 => Turn::call("ledger__append", json!({"entry": "x"})),
        3 => Turn::call("ledger__die", json!({})),
        4 => Turn::call("ledger__late", json!({})),
        5 => Turn::call("ledger__slow", json!({"seconds": "soon"})),
        _ => Turn::answer(DONE),
    })?;
    let settings = "        allow: [slow, big, die, late, read]\n        timeout: 2s\n        max_result_bytes: 1000\n";
    let env = workbench(&model, "", &ledger_server(settings)?)?;
    let ledger = env.dir.path().join("ledger");
    let run = with_ledger(&env, &["run", "dev", "-p", "Misbehave", "--json"], &ledger)?;
    ensure!(run.code == 0, "{run:?}");
    let seen = model.seen();
    ensure!(!offered(&seen[0]).contains(&"ledger__append".to_string()), "{:?}", offered(&seen[0]));
    let results = tool_results(&seen[5]);
    let result = |i: usize| results[i].1.as_str();
    ensure!(result(0).contains("gave no result within 2s"), "slow: {}", result(0));
    ensure!(result(1).len() < 1200 && result(1).contains("cut: the result was 50.0 MiB"), "big: {}", &result(1)[result(1).len().saturating_sub(200)..]);
    ensure!(result(2).contains("no tool `ledger__append` offered"), "unallowed: {}", result(2));
    ensure!(ledger_lines(&ledger).is_empty(), "an unallowed tool is never called");
    ensure!(result(3).contains("tool server `ledger` failed the call"), "die: {}", result(3));
    ensure!(result(4).contains("no tool `ledger__late` offered"), "late: {}", result(4));
    ensure!(result(5).contains("do not match its input schema"), "schema: {}", result(5));
    // The journal keeps the cut result, not 50 MiB.
    let journal = serde_json::to_string(&loop_entries(&env, &dev_hash(&env)?, &thread_of(&run)?)?)?;
    ensure!(journal.len() < 64 << 10, "the journal holds {} bytes", journal.len());
    Ok(())
}

/// A model that never stops calling tools is stopped at `max_turns`, the step failing with
/// why; the call is not retried.
#[test]
fn a_model_that_never_stops_calling_tools_is_stopped_at_max_turns() -> Result<()> {
    let model = MockModel::start(|_| Turn::call("ledger__read", json!({})))?;
    let env = workbench(&model, "    max_turns: 3\n", &ledger_server("")?)?;
    let ledger = env.dir.path().join("ledger");
    let run = with_ledger(&env, &["run", "dev", "-p", "Loop"], &ledger)?;
    ensure!(run.code == 1, "{run:?}");
    ensure!(run.stdout.contains("still asked for tools after 3 turns"), "{run:?}");
    ensure!(model.seen().len() == 3, "{} requests", model.seen().len());
    Ok(())
}

/// A server gets only the variables its binding names (and PATH), and what its tools return
/// has every secret the host holds redacted before the model or the journal sees it.
#[test]
fn a_server_gets_only_its_variables_and_its_results_are_redacted() -> Result<()> {
    const KEY: &str = "sk-tools-secret-0123456789";
    let model = MockModel::start(|body| match turn_of(body) {
        1 => Turn::calls(&[
            ("ledger__environment", json!({})),
            ("ledger__append", json!({"entry": KEY})),
            ("ledger__append", json!({"entry": "\u{1b}[2Jcleared\u{202e}"})),
        ]),
        _ => Turn::answer(DONE),
    })?;
    let env = workbench(&model, "    api_key_env: UNCAGED_TEST_KEY\n", &ledger_server("")?)?;
    let ledger = env.dir.path().join("ledger");
    let run = env.run_with(
        &["run", "dev", "-p", "Leak", "--json"],
        &[("LEDGER_FILE", ledger.to_str().context("path")?), ("UNCAGED_TEST_KEY", KEY)],
    )?;
    ensure!(run.code == 0, "{run:?}");
    let results = tool_results(&model.seen()[1]);
    let variables: Vec<&str> = results[0].1.lines().collect();
    ensure!(variables.contains(&"LEDGER_FILE") && variables.contains(&"PATH"), "{variables:?}");
    for unnamed in ["UNCAGED_TEST_KEY", "HOME", "UNCAGED_WORKFLOW_HOME"] {
        ensure!(!variables.contains(&unnamed), "{unnamed} reached the server: {variables:?}");
    }
    ensure!(results[1].1 == "appended [redacted]", "{results:?}");
    let journal = serde_json::to_string(&loop_entries(&env, &dev_hash(&env)?, &thread_of(&run)?)?)?;
    ensure!(journal.contains("appended [redacted]") && !journal.contains("appended sk-"), "{journal}");
    // A tool's text is shown escaped on a terminal: its control characters cannot act there.
    let shown = env.ok(&["thread", &thread_of(&run)?])?;
    ensure!(shown.contains("appended \\u{1b}[2Jcleared\\u{202e}"), "{shown}");
    ensure!(!shown.contains('\u{1b}') && !shown.contains('\u{202e}'), "{shown:?}");
    Ok(())
}

/// A server over Streamable HTTP, written with the official Python SDK, that refuses requests
/// without its bearer token: the binding sends it from a variable of the command that runs the
/// thread, and a run without the variable is refused at once.
#[test]
fn a_streamable_http_server_gets_its_header_from_a_variable() -> Result<()> {
    let token = "search-token-0123456789";
    let mut server = std::process::Command::new(python()?)
        .arg(test_server("search_server.py")?)
        .env("SEARCH_TOKEN", token)
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let _stop = KillOnDrop(server.id());
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(server.stdout.take().context("stdout")?),
        &mut line,
    )?;
    let port = line.trim().strip_prefix("port ").context("the server's port")?.to_string();
    let model = MockModel::start(|body| match turn_of(body) {
        1 => Turn::call("search__search", json!({"query": "crash"})),
        _ => Turn::answer(DONE),
    })?;
    let tools = format!(
        "      search:\n        url: http://127.0.0.1:{port}/mcp\n        headers:\n          \
         Authorization: \"Bearer ${{SEARCH_TOKEN}}\"\n"
    );
    let env = workbench(&model, "", &tools)?;
    let refused = env.run(&["run", "dev", "-p", "Search"])?;
    ensure!(refused.code != 0, "{refused:?}");
    let text = format!("{}{}", refused.stdout, refused.stderr);
    ensure!(text.contains("`SEARCH_TOKEN` is not set"), "{text}");
    let run = env.run_with(&["run", "dev", "-p", "Search"], &[("SEARCH_TOKEN", token)])?;
    ensure!(run.code == 0, "{run:?}");
    let results = tool_results(&model.seen().last().cloned().unwrap_or_default());
    ensure!(results[0].1 == "3 documents match 'crash'", "{results:?}");
    Ok(())
}

/// A tool server that dies in the middle of a call is reaped at once, not left a zombie of
/// the worker for the rest of its agent call (at 9e65bc6 it stayed one until the call ended).
#[test]
fn a_tool_server_that_died_leaves_no_zombie() -> Result<()> {
    let gates = tempfile::tempdir()?;
    let gate = gates.path().join("go");
    let next = gate.clone();
    let model = MockModel::start(move |body| match turn_of(body) {
        1 => Turn::call("ledger__die", json!({})),
        // The next turn waits: the call goes on, the server dead.
        2 => Turn::answer(DONE).gated(&next),
        _ => Turn::answer(DONE),
    })?;
    // Streamed: the mock holds a gated turn's text back.
    let env = workbench(&model, "    stream: true\n", &ledger_server("        allow: [die]\n")?)?;
    let ledger = env.dir.path().join("ledger");
    let run = with_ledger(&env, &["run", "dev", "-p", "Die", "--detach"], &ledger)?;
    ensure!(run.code == 0, "{run:?}");
    let thread = run.stdout.trim().to_string();
    wait_until("the turn after the server died is asked", || Ok(model.asked(2) == 1))?;
    let ps = env.json(&["ps"])?;
    let worker = ps[0]["pid"].as_u64().with_context(|| format!("the worker's pid: {ps}"))?;
    wait_until("no child of the worker is a zombie", || Ok(zombies_of(worker).is_empty()))?;
    std::fs::write(&gate, "")?;
    ensure!(at_rest(&env, &thread)? == "completed", "{}", status(&env, &thread)?);
    Ok(())
}

/// `pause` while a tool call runs: the loop stops before its next turn, and `resume` goes on
/// from the journal, asking no turn twice.
#[test]
fn a_pause_stops_a_loop_between_its_turns() -> Result<()> {
    let model = MockModel::start(|body| match turn_of(body) {
        1 => Turn::call("ledger__slow", json!({"seconds": 1.5})),
        2 => Turn::call("ledger__append", json!({"entry": "after"})),
        _ => Turn::answer(DONE),
    })?;
    let env = workbench(&model, "", &ledger_server("")?)?;
    let ledger = env.dir.path().join("ledger");
    let run = with_ledger(&env, &["run", "dev", "-p", "Pause me", "--detach"], &ledger)?;
    let thread = run.stdout.trim().to_string();
    wait_until("the first turn is asked", || Ok(model.seen().len() == 1))?;
    env.ok(&["pause", &thread])?;
    ensure!(at_rest(&env, &thread)? == "paused", "{}", status(&env, &thread)?);
    ensure!(model.seen().len() == 1 && ledger_lines(&ledger).is_empty(), "no turn after the pause");
    let resumed = with_ledger(&env, &["resume", &thread], &ledger)?;
    ensure!(resumed.code == 0, "{resumed:?}");
    ensure!(ledger_lines(&ledger) == ["after"], "{:?}", ledger_lines(&ledger));
    ensure!((1..=3).all(|k| model.asked(k) == 1), "a turn asked twice");
    Ok(())
}

/// A person decides from the API and from the web view, and a worker crash between the two
/// asks nobody twice: an approved call the crash cut waits on a decision about the cut, not on
/// the approval again.
#[tokio::test]
async fn decisions_from_the_api_and_the_web_view_hold_across_a_worker_crash() -> Result<()> {
    let model = MockModel::start(|body| match turn_of(body) {
        1 => Turn::call("ledger__append", json!({"entry": "a"})).saying("Writing a."),
        2 => Turn::call("ledger__append", json!({"entry": "b"})),
        _ => Turn::answer(DONE),
    })?;
    let env = workbench(&model, "", &ledger_server("        approve: [append]\n")?)?;
    let ledger = env.dir.path().join("ledger");
    let ledger_var = ("LEDGER_FILE", ledger.to_str().context("path")?);
    let lease = ("UNCAGED_WORKFLOW_LEASE_MS", "1500");
    let crash = ("UNCAGED_WORKFLOW_CRASH_AT", "tool-called:1");
    let token = env.ok(&["token", "create", "--name", "ci"])?.trim().to_string();
    // Every worker this serve starts crashes once its first tool call returns.
    let serve = Serve::start(&env, &["--no-schedules"], &[ledger_var, lease, crash])?;
    let run = env.run_with(&["run", "dev", "-p", "Write a and b", "--detach"], &[ledger_var, lease, crash])?;
    let thread = run.stdout.trim().to_string();
    wait_until("it waits for approval", || Ok(status(&env, &thread)? == "waiting"))?;
    let call_id = env.json(&["thread", &thread])?["paused"]["call"]["tool"]["callId"].clone();
    let http = uncaged_workflow::http::client_builder().build()?;
    let answer = |body: Value| {
        http.post(format!("http://{}/api/v1/threads/{thread}/answer", serve.addr))
            .bearer_auth(&token)
            .json(&body)
            .send()
    };
    let refused = answer(json!({"decision": "deny"})).await?;
    ensure!(refused.status() == 400, "a denial needs its why: {}", refused.status());
    let approved = answer(json!({"decision": "approve"})).await?;
    ensure!(approved.status() == 200, "{}", approved.text().await?);
    wait_until("the call is made", || Ok(ledger_lines(&ledger) == ["a"]))?;
    // Its worker crashed with it: no worker runs the thread (the record still reads as it was
    // before the crash, waiting; on a database, queued once the lease runs out).
    no_worker_runs(&env, &thread)?;
    serve.stop()?;
    // Resumed without the crash: the cut call waits on a person; the approval is not asked
    // again.
    let resumed = env.run_with(&["resume", &thread], &[ledger_var, lease])?;
    ensure!(resumed.code == 75, "{resumed:?}");
    let wait = env.json(&["thread", &thread])?["paused"]["call"]["tool"].clone();
    ensure!(wait["why"] == "cut" && wait["callId"] == call_id, "{wait}");
    // The web view decides the rest.
    let serve = Serve::start(&env, &["--no-schedules"], &[ledger_var, lease])?;
    let driver = crate::web::Driver::start()?;
    let browser = driver.browser().await?;
    browser.goto(&format!("http://{}/#/thread/{thread}", serve.addr)).await?;
    crate::web::wait_for(&browser, "the cut call is shown",
        "return (document.getElementById('tool-wait')?.textContent || '').includes('ledger.append')").await?;
    crate::web::interact(&browser, "decision-text", Some("a is in the ledger already")).await?;
    crate::web::interact(&browser, "skip-call", None).await?;
    let waits = wait_until("b waits for approval", || {
        let shown = env.json(&["thread", &thread])?;
        Ok(shown["paused"]["call"]["tool"]["arguments"].as_str().is_some_and(|a| a.contains("\"b\"")))
    });
    let notice = crate::web::eval(&browser, "return document.getElementById('notice')?.textContent || ''").await?;
    ensure!(waits.is_ok(), "the page said {notice}; the thread: {}", env.json(&["thread", &thread])?["paused"]);
    crate::web::wait_for(&browser, "b's approval is asked",
        "return (document.getElementById('tool-arguments')?.textContent || '').includes('\"b\"')").await?;
    crate::web::interact(&browser, "approve-call", None).await?;
    wait_until("it completes", || Ok(status(&env, &thread)? == "completed"))?;
    ensure!(ledger_lines(&ledger) == ["a", "b"], "{:?}", ledger_lines(&ledger));
    ensure!((1..=3).all(|k| model.asked(k) == 1), "a turn asked twice");
    let results = tool_results(&model.seen()[1]);
    ensure!(results[0].1 == "a is in the ledger already", "{results:?}");
    // The page shows the step's turns and calls.
    browser.refresh().await?;
    crate::web::wait_for(&browser, "the turns are shown",
        "return document.querySelectorAll('table.tool-calls tr').length === 2").await?;
    browser.close().await?;
    Ok(())
}

/// With `stream: true`, what the model writes reaches the API's event stream as `delta`
/// events and the web view's page as it grows, before its step.
#[tokio::test]
async fn the_api_and_the_web_view_show_a_models_text_as_it_grows() -> Result<()> {
    let gate = tempfile::tempdir()?;
    let go = gate.path().join("go");
    let text = "Thinking about the parser, slowly and out loud. ".repeat(4) + DONE;
    let streamed = text.clone();
    let go_in = go.clone();
    let model = MockModel::start(move |_| {
        Turn::answer(&streamed).gated(&go_in).paced(std::time::Duration::from_millis(40))
    })?;
    let env = workbench(&model, "    stream: true\n", &ledger_server("")?)?;
    let ledger = env.dir.path().join("ledger");
    let ledger_var = ("LEDGER_FILE", ledger.to_str().context("path")?);
    let token = env.ok(&["token", "create", "--name", "ci"])?.trim().to_string();
    let serve = Serve::start(&env, &["--no-schedules"], &[ledger_var])?;
    let run = env.run_with(&["run", "dev", "-p", "Think aloud", "--detach"], &[ledger_var])?;
    let thread = run.stdout.trim().to_string();
    wait_until("the model is asked", || Ok(model.seen().len() == 1))?;
    let driver = crate::web::Driver::start()?;
    let browser = driver.browser().await?;
    browser.goto(&format!("http://{}/#/thread/{thread}", serve.addr)).await?;
    crate::web::wait_for(&browser, "the page shows the thread", "return !!document.getElementById('working')").await?;
    let http = uncaged_workflow::http::client_builder().build()?;
    let mut events = http
        .get(format!("http://{}/api/v1/threads/{thread}/events", serve.addr))
        .bearer_auth(&token)
        .send()
        .await?;
    ensure!(events.status() == 200, "{}", events.status());
    // Both follow the thread's live text now: the model may write.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    std::fs::write(&go, "")?;
    crate::web::wait_for(&browser, "the page shows the text as it grows",
        "return (document.getElementById('live-text')?.textContent || '').includes('Thinking about')").await?;
    let mut read = String::new();
    while let Some(chunk) = events.chunk().await? {
        read.push_str(std::str::from_utf8(&chunk)?);
        if read.contains("event: ended") {
            break;
        }
    }
    let deltas: String = read
        .split("\n\n")
        .filter(|block| block.starts_with("event: delta"))
        .filter_map(|block| block.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .map(|event| event["text"].as_str().unwrap_or_default().to_string())
        .collect();
    ensure!(!deltas.is_empty() && text.ends_with(&deltas), "the deltas {deltas:?} of {text:?}");
    let (last_delta, step) = (read.rfind("event: delta").unwrap_or(0), read.find("event: step"));
    ensure!(step.is_some_and(|step| last_delta < step), "the text comes before its step");
    browser.close().await?;
    Ok(())
}


/// `kill -9` (an abort, no cleanup) at seeded points of a ten-turn loop whose tool appends to a
/// ledger — after a model turn came back and before it was journaled, after a tool call
/// returned and before its result was, after the answer was journaled — then the thread is
/// resumed until it ends, a person skipping a cut call whose entry is in the ledger and
/// redoing one whose is not. Every entry is appended once; every turn is asked once, but the
/// one the kill cut; the answer is recorded once. `UNCAGED_CRASH_TRIALS` sets the trials
/// (`make test-crash`); `UNCAGED_TEST_SEED` replays a run.
#[test]
fn a_kill_at_any_point_of_a_loop_makes_no_tool_call_twice() -> Result<()> {
    let trials: usize =
        std::env::var("UNCAGED_CRASH_TRIALS").ok().and_then(|n| n.parse().ok()).unwrap_or(2);
    let (seed, mut random) = crate::Random::seeded();
    for trial in 0..trials {
        let (point, n) = match random.below(3) {
            0 => ("model-turn", 1 + random.below(11)),
            1 => ("tool-called", 1 + random.below(10)),
            _ => ("agent-recorded", 1),
        };
        let context = format!("seed {seed}, trial {trial}: a kill at `{point}` #{n}");
        crash_trial(point, n).with_context(|| context.clone())?;
    }
    Ok(())
}


/// The result of a read-only call is not synced alone; it lands with the next turn's synced
/// write. `kill -9` between the two (after the result was written, before the next turn
/// was asked): resumed, the thread asks no turn twice and asks no person; the result is kept,
/// or, where the crash lost it (a database keeps such a write in the process until the next
/// synced one), the read is made again — and one result of each call is journaled.
#[test]
fn a_kill_between_a_read_only_calls_result_and_the_next_turn_asks_no_turn_twice() -> Result<()> {
    let model = MockModel::start(|body| match turn_of(body) {
        k @ 1..=3 => Turn::call("ledger__read", json!({})).saying(&format!("read {k}")),
        _ => Turn::answer(DONE),
    })?;
    let env = workbench(&model, "", &ledger_server("")?)?;
    let ledger = env.dir.path().join("ledger");
    std::fs::write(&ledger, "entry\n")?;
    let ledger_var = ("LEDGER_FILE", ledger.to_str().context("path")?);
    let lease = ("UNCAGED_WORKFLOW_LEASE_MS", "1500");
    let run = env.run_with(
        &["run", "dev", "-p", "Read the ledger", "--detach"],
        &[ledger_var, lease, ("UNCAGED_WORKFLOW_CRASH_AT", "tool-result-written:2")],
    )?;
    let thread = run.stdout.trim().to_string();
    no_worker_runs(&env, &thread)?;
    ensure!(model.asked(3) == 0, "the third turn was asked before the kill");
    let resumed = env.run_with(&["resume", &thread], &[ledger_var, lease])?;
    ensure!(resumed.code == 0, "{resumed:?}");
    ensure!((1..=4).all(|k| model.asked(k) == 1), "a turn was asked twice");
    let entries = loop_entries(&env, &dev_hash(&env)?, &thread)?;
    let results = entries.iter().filter(|e| e["entry"] == "toolResult").count();
    ensure!(results == 3, "one result of each call: {entries:?}");
    ensure!(!entries.iter().any(|e| e["entry"] == "decision"), "a person was asked: {entries:?}");
    Ok(())
}

/// A foreground `run` asks the person at it about a call to approve (`yes`, or `no` and why),
/// its standard input not a terminal: the first approved, the second denied.
#[test]
fn run_asks_about_a_tool_call_on_its_standard_input() -> Result<()> {
    use std::io::Write;
    let model = MockModel::start(|body| match turn_of(body) {
        1 => Turn::call("ledger__append", json!({"entry": "a"})),
        2 => Turn::call("ledger__append", json!({"entry": "b"})),
        _ => Turn::answer(DONE),
    })?;
    let env = workbench(&model, "", &ledger_server("        approve: [append]\n")?)?;
    let ledger = env.dir.path().join("ledger");
    let mut child = env
        .command()
        .args(["run", "dev", "-p", "Write a and b"])
        .env("LEDGER_FILE", &ledger)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    child.stdin.take().context("stdin")?.write_all(b"maybe\nyes\nno b is not wanted\n")?;
    let out = child.wait_with_output()?;
    let (stdout, stderr) = (String::from_utf8(out.stdout)?, String::from_utf8(out.stderr)?);
    ensure!(out.status.code() == Some(0), "{stdout}\n{stderr}");
    ensure!(stderr.contains("asks to call tool `ledger.append`"), "{stderr}");
    ensure!(stderr.contains("answer `yes`, or `no` and why"), "a reply that is no decision is asked again: {stderr}");
    ensure!(ledger_lines(&ledger) == ["a"], "{:?}", ledger_lines(&ledger));
    let results = tool_results(&model.seen()[2]);
    ensure!(results[1].1 == "A person did not allow this call: b is not wanted", "{results:?}");
    Ok(())
}

/// On a terminal, `run` writes out the model's text as it comes (`stream: true`), before the
/// step's line.
#[test]
fn run_shows_the_models_text_as_it_grows_on_a_terminal() -> Result<()> {
    let model = MockModel::start(|body| match turn_of(body) {
        1 => Turn::call("ledger__read", json!({})).saying("Reading the ledger first."),
        _ => Turn::answer(DONE),
    })?;
    let env = workbench(&model, "    stream: true\n", &ledger_server("")?)?;
    std::fs::write(env.dir.path().join("ledger"), "")?;
    let ledger = env.dir.path().join("ledger").display().to_string();
    let args = ["env", &format!("LEDGER_FILE={ledger}"), env!("CARGO_BIN_EXE_uncaged-workflow"), "run", "dev", "-p", "Read"];
    let command = args.iter().map(|a| format!("'{}'", a.replace('\'', "'\\''"))).collect::<Vec<_>>().join(" ");
    let mut child = env
        .command_of("script")
        .args(["-qfec", &command, "/dev/null"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let mut out = child.stdout.take().context("stdout")?;
    let shown = match crate::human::read_until(&mut out, "(0): reached") {
        Ok(shown) => shown,
        Err(e) => {
            let status = child.wait()?;
            let mut err = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().context("stderr")?, &mut err)?;
            anyhow::bail!("{e}; script exited {status}: {err}");
        }
    };
    let _ = child.wait();
    // Each turn's text on a line of its own, before the step's line.
    let first = shown.find("developer ▸ Reading the ledger first.\r\n").with_context(|| format!("{shown:?}"))?;
    let second = shown.find("developer ▸ Done.").with_context(|| format!("{shown:?}"))?;
    let step = shown.find("[1] developer").with_context(|| format!("{shown:?}"))?;
    ensure!(first < second && second < step, "the text comes before the step: {shown:?}");
    Ok(())
}

}

/// One trial of [`a_kill_at_any_point_of_a_loop_makes_no_tool_call_twice`].
fn crash_trial(point: &str, n: u64) -> Result<()> {
    let model = MockModel::start(ten_appends)?;
    let env = workbench(&model, "", &ledger_server("")?)?;
    let ledger = env.dir.path().join("ledger");
    let ledger_var = ("LEDGER_FILE", ledger.to_str().context("path")?);
    let lease = ("UNCAGED_WORKFLOW_LEASE_MS", "1500");
    let crash = format!("{point}:{n}");
    let run = env.run_with(
        &["run", "dev", "-p", "Keep a ledger", "--detach"],
        &[ledger_var, lease, ("UNCAGED_WORKFLOW_CRASH_AT", &crash)],
    )?;
    let thread = run.stdout.trim().to_string();
    no_worker_runs(&env, &thread)?;
    for _ in 0..12 {
        let state = status(&env, &thread)?;
        if state == "completed" {
            break;
        }
        let shown = env.json(&["thread", &thread])?;
        let continued = match shown["paused"]["call"]["tool"].as_object() {
            // A call the kill cut, not safe to repeat: the person looks in the ledger.
            Some(wait) if state == "waiting" => {
                let arguments: Value =
                    serde_json::from_str(wait["arguments"].as_str().unwrap_or("{}"))?;
                let entry = arguments["entry"].as_str().unwrap_or_default().to_string();
                match ledger_lines(&ledger).contains(&entry) {
                    true => env.run_with(
                        &["answer", &thread, "--skip", &format!("appended {entry}")],
                        &[ledger_var, lease],
                    )?,
                    false => env.run_with(&["answer", &thread, "--redo"], &[ledger_var, lease])?,
                }
            }
            _ => env.run_with(&["resume", &thread], &[ledger_var, lease])?,
        };
        ensure!(matches!(continued.code, 0 | 75), "{continued:?}");
    }
    ensure!(status(&env, &thread)? == "completed", "{}", env.json(&["thread", &thread])?);
    let expected: Vec<String> = (1..=10).map(|k| format!("turn-{k}")).collect();
    ensure!(ledger_lines(&ledger) == expected, "the ledger: {:?}", ledger_lines(&ledger));
    for turn in 1..=11 {
        let cut = point == "model-turn" && turn as u64 == n;
        let asked = model.asked(turn);
        ensure!(asked == 1 || (cut && asked == 2), "turn {turn} was asked {asked} times");
    }
    let shown = env.json(&["thread", &thread])?;
    ensure!(shown["steps"].as_array().map(Vec::len) == Some(1), "{shown}");
    let calls = env.calls(&dev_hash(&env)?, &thread)?;
    ensure!(calls.iter().filter(|c| c["kind"] == "agent").count() == 1, "the answer once");
    Ok(())
}

/// The model of the ledger loop: turn k appends `turn-k`, for ten turns, then answers.
fn ten_appends(body: &Value) -> Turn {
    match turn_of(body) {
        k @ 1..=10 => Turn::call("ledger__append", json!({"entry": format!("turn-{k}")})),
        _ => Turn::answer(DONE),
    }
}

/// The filesystem server from npm over stdio, rooted at `root`.
fn filesystem_server(root: &Path) -> Result<String> {
    Ok(format!(
        "      fs:\n        command: node\n        args: [{}, {}]\n",
        installed(
            "target/mcp-node/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"
        )?,
        root.display()
    ))
}

/// Waits until no worker runs `thread` (its worker was killed; on a database the thread is
/// queued again once the dead worker's lease runs out).
fn no_worker_runs(env: &Env, thread: &str) -> Result<()> {
    wait_until("no worker runs the thread", || {
        let ps = env.json(&["ps"])?;
        let running = ps
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p["threadId"] == thread && p["state"] == "running");
        Ok(!running && status(env, thread)? != "running")
    })
}

/// SIGTERM to a worker in the middle of a durable agent's loop hands the thread back at the
/// next turn's boundary (on a database, where workers hand threads back): the next turn is
/// asked only by the worker that goes on with it, from the journal (at 9e65bc6 the stopping
/// worker asked it, and the step was dropped only once the grace ran out).
#[test]
fn a_worker_stopped_with_sigterm_hands_a_loop_back_between_its_turns() -> Result<()> {
    crate::use_store(crate::TestStore::Postgres);
    let model = MockModel::start(|body| match turn_of(body) {
        1 => Turn::call("ledger__slow", json!({"seconds": 1.5})),
        2 => Turn::call("ledger__append", json!({"entry": "after"})),
        _ => Turn::answer(DONE),
    })?;
    let env = workbench(&model, "", &ledger_server("")?)?;
    let ledger = env.dir.path().join("ledger");
    // A grace longer than the test waits: only a stop between the turns ends the worker soon.
    let mut worker = env
        .command()
        .args(["worker", "--grace", "120s"])
        .env("LEDGER_FILE", &ledger)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let mut ready = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(worker.stdout.take().context("stdout")?),
        &mut ready,
    )?;
    ensure!(ready.starts_with("ready"), "the worker did not come up: {ready:?}");
    let run = with_ledger(&env, &["run", "dev", "-p", "Hand me back", "--detach"], &ledger)?;
    ensure!(run.code == 0, "{run:?}");
    let thread = run.stdout.trim().to_string();
    wait_until("the first turn is asked", || Ok(model.seen().len() == 1))?;
    std::process::Command::new("kill").args(["-TERM", &worker.id().to_string()]).status()?;
    let mut exited = None;
    wait_until("the worker hands the thread back and exits", || {
        exited = worker.try_wait()?;
        Ok(exited.is_some())
    })?;
    ensure!(exited.is_some_and(|s| s.success()), "it exited {exited:?}");
    ensure!(model.asked(2) == 0, "the stopping worker asked the next turn");
    ensure!(ledger_lines(&ledger).is_empty(), "{:?}", ledger_lines(&ledger));
    let resumed = with_ledger(&env, &["resume", &thread], &ledger)?;
    ensure!(resumed.code == 0, "{resumed:?}");
    ensure!(ledger_lines(&ledger) == ["after"], "{:?}", ledger_lines(&ledger));
    ensure!((1..=3).all(|k| model.asked(k) == 1), "a turn asked twice");
    Ok(())
}

/// The children of process `parent` that are zombies (exited, not reaped).
fn zombies_of(parent: u64) -> Vec<u64> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return vec![] };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u64>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // After the command's name: state, parent.
            let mut fields = stat.rsplit(')').next().unwrap_or("").split_whitespace();
            fields.next() == Some("Z") && fields.next() == Some(parent.to_string().as_str())
        })
        .collect()
}

/// Waits until the thread rests (neither running nor queued).
fn at_rest(env: &Env, thread: &str) -> Result<String> {
    let mut last = String::new();
    wait_until("the thread rests", || {
        last = status(env, thread)?;
        Ok(!matches!(last.as_str(), "running" | "queued"))
    })?;
    Ok(last)
}

/// Kills a process when dropped (a server a test started).
pub(crate) struct KillOnDrop(pub(crate) u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill").args(["-9", &self.0.to_string()]).status();
    }
}

/// A workflow of three roles, each answered by the one binding `coder`.
const THREE_ROLES_YAML: &str = "description: Three roles ask one durable agent\n\
roles:\n  a: {description: A, system_prompt: You are a., schema: {type: object, required: [summary], properties: {summary: {type: string}}}}\n  \
b: {description: B, system_prompt: You are b., schema: {type: object, required: [summary], properties: {summary: {type: string}}}}\n  \
c: {description: C, system_prompt: You are c., schema: {type: object, required: [summary], properties: {summary: {type: string}}}}\n\
graph:\n  - from: $START\n    transitions: [{to: a}]\n  - from: a\n    transitions: [{to: b}]\n  \
- from: b\n    transitions: [{to: c}]\n  - from: c\n    transitions: [{to: $END}]\n";

/// The process ids of the ledger server's starts, in order.
fn server_starts(ledger: &Path) -> Vec<u64> {
    let starts = std::fs::read_to_string(ledger.with_extension("starts")).unwrap_or_default();
    starts.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

on_both_stores! {

/// Three agent calls of one thread, each appending through the ledger server over stdio: the
/// server is started once for the thread, used by every call, and stopped when the thread
/// ends; a second thread starts its own.
#[test]
fn a_threads_stdio_tool_server_is_started_once_and_stops_with_it() -> Result<()> {
    let model = MockModel::start(|body| {
        let system = body["messages"][0]["content"].as_str().unwrap_or_default().to_string();
        match turn_of(body) {
            1 => Turn::call("ledger__append", json!({"entry": system})),
            _ => Turn::answer(DONE),
        }
    })?;
    let env = workbench(&model, "", &ledger_server("")?)?;
    let flow = env.write("three.yaml", THREE_ROLES_YAML)?;
    env.ok(&["add", "three", flow.to_str().context("path")?])?;
    let config = std::fs::read_to_string(env.home().join("config.yaml"))?
        .replace("roles:\n  developer: coder\n", "roles:\n  a: coder\n  b: coder\n  c: coder\n");
    std::fs::write(env.home().join("config.yaml"), config)?;
    let ledger = env.dir.path().join("ledger");
    let run = with_ledger(&env, &["run", "three", "-p", "Keep a ledger"], &ledger)?;
    ensure!(run.code == 0, "{run:?}");
    ensure!(
        ledger_lines(&ledger) == ["You are a.", "You are b.", "You are c."],
        "{:?}",
        ledger_lines(&ledger)
    );
    let starts = server_starts(&ledger);
    ensure!(starts.len() == 1, "the server started {} times for one thread", starts.len());
    wait_until("the server stopped with its thread", || Ok(!crate::alive(starts[0])))?;
    let run = with_ledger(&env, &["run", "three", "-p", "Again"], &ledger)?;
    ensure!(run.code == 0, "{run:?}");
    ensure!(server_starts(&ledger).len() == 2, "a thread starts its own server");
    Ok(())
}
}
