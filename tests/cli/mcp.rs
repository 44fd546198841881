//! The MCP server, called by clients no one here wrote: the official Python SDK (PyPI `mcp`,
//! driven by tests/mcp/client.py) over stdio (`uncaged-workflow mcp`) and over Streamable HTTP
//! (`serve`'s /mcp), in the SDK's own protocol negotiation (2026-07-28) and in the handshake
//! of earlier versions (`legacy`), and the official TypeScript SDK over HTTP. Each test runs on
//! both stores.

use std::io::BufRead;
use std::process::Stdio;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use crate::tools::{installed, python, repo};
use crate::{Env, Serve, status, wait_until};

/// The approval a person gives solve-issue's reviewer.
const APPROVED: &str = "{\"approved\": true, \"comments\": []}";

/// The tests' Python client.
fn client_script() -> Result<String> {
    Ok(repo().join("tests/mcp/client.py").canonicalize()?.display().to_string())
}

/// How a test's client reaches the server.
#[derive(Clone, Copy)]
pub enum Via<'a> {
    /// `uncaged-workflow mcp`, started by the client on the test's store.
    Stdio,
    /// `serve`'s /mcp, with a token (or none).
    Http(&'a Serve, Option<&'a str>),
}

/// The client's command for `plan`, in protocol `mode` (`auto` or `legacy`).
pub fn client(env: &Env, via: Via, mode: &str, plan: &Value) -> Result<std::process::Command> {
    let mut command = env.command_of(&python()?);
    command.args([&client_script()?, "--mode", mode, "--plan", &plan.to_string()]);
    match via {
        Via::Stdio => {
            command.args(["--stdio", env!("CARGO_BIN_EXE_uncaged-workflow")]);
        }
        Via::Http(serve, token) => {
            command.args(["--http", &format!("http://{}/mcp", serve.addr)]);
            if let Some(token) = token {
                command.args(["--token", token]);
            }
        }
    }
    Ok(command)
}

/// Carries out `plan` with the client; a JSON line per step (the last an `error` if one
/// failed).
fn steps(env: &Env, via: Via, mode: &str, plan: Value) -> Result<Vec<Value>> {
    let out = client(env, via, mode, &plan)?.stderr(Stdio::piped()).output()?;
    let stdout = String::from_utf8(out.stdout)?;
    let lines: Vec<Value> = stdout
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .with_context(|| format!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr)))?;
    ensure!(
        out.status.success(),
        "the client exited with {}: {stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(lines)
}

/// Carries out `plan`, every step of which must succeed.
fn ok_steps(env: &Env, via: Via, mode: &str, plan: Value) -> Result<Vec<Value>> {
    let lines = steps(env, via, mode, plan)?;
    ensure!(lines.iter().all(|l| l.get("error").is_none()), "a step failed: {lines:?}");
    Ok(lines)
}

/// The thread a call's result names.
fn thread_of(result: &Value) -> Result<String> {
    Ok(result["_meta"]["uncaged-workflow/thread"].as_str().context("a thread")?.to_string())
}

/// A home with solve-issue, a token `ci`, and `serve` on it.
fn serving(env: &Env) -> Result<(Serve, String)> {
    env.add_solve_issue()?;
    let token = env.ok(&["token", "create", "--name", "ci"])?.trim().to_string();
    let serve = Serve::start(env, &["--no-schedules"], &[])?;
    Ok((serve, token))
}

/// Binds solve-issue's roles to a scripted agent that takes `delay` an answer (a call long
/// enough to cut in the middle).
fn slow(env: &Env, delay: &str) -> Result<()> {
    let config = format!("agent: slow\nagents:\n  slow:\n    kind: scripted\n    delay: {delay}\n");
    std::fs::write(env.home().join("config.yaml"), config)?;
    Ok(())
}

/// The only thread with prompt `prompt`.
fn thread_prompted(env: &Env, prompt: &str) -> Result<Value> {
    let threads = env.json(&["threads"])?;
    let found: Vec<&Value> =
        threads.as_array().context("threads")?.iter().filter(|t| t["prompt"] == prompt).collect();
    ensure!(found.len() == 1, "{} threads prompted {prompt:?}: {threads}", found.len());
    Ok(found[0].clone())
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?)
}

/// Posts `body` (bytes) to `/mcp` with `headers`; the status and the body as JSON.
async fn post(serve: &Serve, headers: &[(&str, &str)], body: Vec<u8>) -> Result<(u16, Value)> {
    let http = uncaged_workflow::http::client_builder().build()?;
    let mut request = http
        .post(format!("http://{}/mcp", serve.addr))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await?;
    let status = response.status().as_u16();
    let session =
        response.headers().get("mcp-session-id").and_then(|s| s.to_str().ok()).map(str::to_string);
    let text = response.text().await?;
    // A response may come as server-sent events: its JSON-RPC message is the last `data:` line
    // that holds one.
    let message = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .rfind(|d| !d.trim().is_empty())
        .unwrap_or(&text)
        .to_string();
    let mut body: Value = serde_json::from_str(message.trim())
        .with_context(|| format!("{status}: not JSON: {text:?}"))?;
    if let (Some(session), Some(object)) = (session, body.as_object_mut()) {
        object.insert("session".into(), json!(session));
    }
    Ok((status, body))
}

on_both_stores! {

/// The issue's first test: a client lists the workflows and calls one to its end, hearing a
/// progress notification per step, over stdio and over HTTP, in both protocol generations;
/// the thread is named as started over MCP in `threads`, `thread` and the API.
#[test]
fn a_client_calls_a_workflow_to_its_end_with_progress_over_stdio_and_http() -> Result<()> {
    let env = Env::new()?;
    let (serve, token) = serving(&env)?;
    let ways = [
        ("stdio", Via::Stdio, "legacy"),
        ("stdio", Via::Stdio, "auto"),
        ("http", Via::Http(&serve, Some(&token)), "legacy"),
        ("http", Via::Http(&serve, Some(&token)), "auto"),
    ];
    for (transport, via, mode) in ways {
        let prompt = format!("fix it ({transport}, {mode})");
        let data = json!({"issue": 7, "title": "<b>it breaks</b>"});
        let lines = ok_steps(&env, via, mode, json!([
            {"op": "list"},
            {"op": "call", "tool": "solve-issue", "args": {"prompt": prompt, "data": data}},
        ]))?;
        let names: Vec<&str> =
            lines[0]["tools"].as_array().context("tools")?.iter().filter_map(|t| t["name"].as_str()).collect();
        assert_eq!(
            names,
            ["solve-issue", "list_threads", "get_thread", "answer_thread", "kill_thread"],
            "{transport} {mode}"
        );
        let schema = &lines[0]["tools"][0]["inputSchema"];
        assert_eq!(schema["required"], json!(["prompt"]), "{schema}");
        assert_eq!(schema["properties"]["data"]["type"], "object", "{schema}");
        let result = &lines[1]["result"];
        assert_eq!(result["isError"], false, "{result}");
        let id = thread_of(result)?;
        let thread = env.json(&["thread", &id])?;
        assert_eq!(thread["status"], "completed");
        assert_eq!(thread["start"]["triggerData"], data);
        let steps = thread["steps"].as_array().context("steps")?;
        assert_eq!(result["structuredContent"], steps.last().context("a step")?["meta"], "{result}");
        assert_eq!(result["content"][0]["text"], thread["end"]["summary"], "{result}");
        // One progress notification per step, in order, naming its role.
        let progress = lines[1]["progress"].as_array().context("progress")?;
        assert_eq!(progress.len(), steps.len(), "{progress:?}");
        for (i, (note, step)) in progress.iter().zip(steps).enumerate() {
            let note = note.as_str().context("a message")?;
            let role = step["role"].as_str().context("role")?;
            ensure!(note.starts_with(&format!("step {}: {role}: ", i + 1)), "{note}");
        }
        let caller = if transport == "stdio" { "stdio" } else { "token:ci" };
        let started_by = format!("mcp {caller} (mcp)");
        assert_eq!(thread["start"]["startedBy"], json!({"via": "mcp", "caller": caller, "client": "mcp"}));
        assert_eq!(thread_prompted(&env, &prompt)?["startedBy"], started_by.as_str());
        let shown = env.ok(&["thread", &id])?;
        ensure!(shown.contains(&format!("started by {started_by}")), "{shown}");
    }
    let listed = env.ok(&["threads"])?;
    ensure!(listed.lines().next().is_some_and(|h| h.contains("STARTED BY")), "{listed}");
    ensure!(listed.contains("mcp token:ci (mcp)"), "{listed}");
    Ok(())
}

/// A call's progress, its question and its end come as its worker says it stored them (over
/// the worker's socket, or the database's notifications), not from polling the store: with
/// the store read once an hour besides, a call of slow steps still hears every step, is asked,
/// and ends, over stdio and over HTTP.
#[test]
fn a_calls_progress_question_and_end_are_pushed_not_polled() -> Result<()> {
    let env = Env::new()?;
    let (serve, token) = serving(&env)?;
    std::fs::write(
        env.home().join("config.yaml"),
        "mcp:\n  poll: 1h\nagent: slow\nagents:\n  slow:\n    kind: scripted\n    delay: 300ms\n\
         roles:\n  reviewer: human\n",
    )?;
    for via in [Via::Stdio, Via::Http(&serve, Some(&token))] {
        let lines = ok_steps(&env, via, "auto", json!([
            {"op": "call", "tool": "solve-issue", "args": {"prompt": "push it"}, "answers": [APPROVED]},
        ]))?;
        let result = &lines[0]["result"];
        assert_eq!(result["structuredContent"], json!({"approved": true, "comments": []}), "{result}");
        let id = thread_of(result)?;
        assert_eq!(status(&env, &id)?, "completed");
        assert_eq!(lines[0]["asked"].as_array().map(Vec::len), Some(1), "{lines:?}");
        let steps = env.json(&["thread", &id])?["steps"].as_array().context("steps")?.len();
        let progress = lines[0]["progress"].as_array().context("progress")?;
        // Every step, before the question and after its answer, told as it was stored.
        ensure!(progress.len() == steps && steps == 3, "{progress:?}, {steps} steps");
    }
    // A step is told while the thread runs on, not when it comes to rest: a call cancelled at
    // its first progress kills a thread that has steps still to go.
    let slow_only = "mcp:\n  poll: 1h\nagent: slow\nagents:\n  slow:\n    kind: scripted\n    delay: 300ms\n";
    std::fs::write(env.home().join("config.yaml"), slow_only)?;
    for (prompt, via) in [("push stdio", Via::Stdio), ("push http", Via::Http(&serve, Some(&token)))] {
        let lines = ok_steps(&env, via, "legacy", json!([
            {"op": "cancel", "tool": "solve-issue", "args": {"prompt": prompt}, "after_progress": 1},
        ]))?;
        assert_eq!(lines[0]["cancelled"], true);
        let id = thread_prompted(&env, prompt)?["threadId"].as_str().context("id")?.to_string();
        wait_until("the cancelled call's thread is killed", || Ok(status(&env, &id)? == "killed"))?;
    }
    Ok(())
}

/// A thread that waits for a person is answered through the client: on 2026-07-28 the call
/// asks the person (an elicitation in an `InputRequiredResult`) and goes on with the answer;
/// with the tasks extension the task asks (`input_required`) and `tasks/update` answers; a
/// client of an earlier version is told the thread's id and question, and answers with
/// `answer_thread`.
#[test]
fn a_thread_that_waits_for_a_person_is_answered_through_the_client() -> Result<()> {
    let env = Env::new()?;
    let (serve, token) = serving(&env)?;
    std::fs::write(env.home().join("config.yaml"), "roles:\n  reviewer: human\n")?;
    for via in [Via::Stdio, Via::Http(&serve, Some(&token))] {
        let lines = ok_steps(&env, via, "auto", json!([
            {"op": "call", "tool": "solve-issue", "args": {"prompt": "ask me"}, "answers": [APPROVED]},
        ]))?;
        let asked = lines[0]["asked"].as_array().context("asked")?;
        ensure!(asked.len() == 1 && asked[0].as_str().is_some_and(|q| q.contains("reviewer")), "{asked:?}");
        let result = &lines[0]["result"];
        assert_eq!(result["structuredContent"], json!({"approved": true, "comments": []}), "{result}");
        assert_eq!(status(&env, &thread_of(result)?)?, "completed");
        // The steps before the question are told once, not again after the answer.
        let progress = lines[0]["progress"].as_array().context("progress")?;
        assert_eq!(progress.len(), 3, "{progress:?}");
    }
    // A person who declines is not asked again: the call answers with the waiting thread.
    let lines = ok_steps(&env, Via::Stdio, "auto", json!([
        {"op": "call", "tool": "solve-issue", "args": {"prompt": "ask me, I decline"}},
    ]))?;
    assert_eq!(lines[0]["asked"].as_array().map(Vec::len), Some(1), "{lines:?}");
    let result = &lines[0]["result"];
    assert_eq!(result["structuredContent"]["status"], "waiting", "{result}");
    // The tasks extension.
    let lines = ok_steps(&env, Via::Http(&serve, Some(&token)), "auto", json!([
        {"op": "task", "tool": "solve-issue", "args": {"prompt": "ask my task"}, "answers": [APPROVED]},
    ]))?;
    let task = &lines[0];
    assert_eq!(task["statuses"].as_array().context("statuses")?.last(), Some(&json!("completed")), "{task}");
    ensure!(task["statuses"].as_array().context("statuses")?.contains(&json!("input_required")), "{task}");
    let id = task["task"]["taskId"].as_str().context("a task id")?;
    assert_eq!(task["final"]["result"]["structuredContent"]["approved"], true, "{task}");
    assert_eq!(status(&env, id)?, "completed");
    // An earlier protocol: the call answers with the thread and its question.
    let lines = ok_steps(&env, Via::Stdio, "legacy", json!([
        {"op": "call", "tool": "solve-issue", "args": {"prompt": "ask me later"}},
    ]))?;
    let result = &lines[0]["result"];
    assert_eq!(result["isError"], false, "{result}");
    assert_eq!(result["structuredContent"]["status"], "waiting", "{result}");
    ensure!(result["structuredContent"]["question"].as_str().is_some_and(|q| q.contains("reviewer")), "{result}");
    let text = result["content"][0]["text"].as_str().context("text")?;
    ensure!(text.contains("answer_thread") && text.contains("get_thread"), "{text}");
    let id = thread_of(result)?;
    let lines = ok_steps(&env, Via::Stdio, "legacy", json!([
        {"op": "call", "tool": "answer_thread", "args": {"thread": id, "text": APPROVED}},
    ]))?;
    assert_eq!(lines[0]["result"]["isError"], false, "{lines:?}");
    wait_until("the answered thread ends", || Ok(status(&env, &id)? == "completed"))?;
    let lines = ok_steps(&env, Via::Stdio, "legacy", json!([
        {"op": "call", "tool": "get_thread", "args": {"thread": id}},
    ]))?;
    assert_eq!(lines[0]["result"]["structuredContent"]["status"], "completed", "{lines:?}");
    Ok(())
}

/// Cancelling a call kills its thread: a `notifications/cancelled` from a client that keeps a
/// session (stdio, HTTP), and `tasks/cancel` of a call's task.
#[test]
fn cancelling_a_call_kills_its_thread() -> Result<()> {
    let env = Env::new()?;
    let (serve, token) = serving(&env)?;
    slow(&env, "400ms")?;
    for (prompt, via) in [("cancel stdio", Via::Stdio), ("cancel http", Via::Http(&serve, Some(&token)))] {
        let lines = ok_steps(&env, via, "legacy", json!([
            {"op": "cancel", "tool": "solve-issue", "args": {"prompt": prompt}, "after_progress": 1},
        ]))?;
        assert_eq!(lines[0]["cancelled"], true);
        let id = thread_prompted(&env, prompt)?["threadId"].as_str().context("id")?.to_string();
        wait_until("the cancelled call's thread is killed", || Ok(status(&env, &id)? == "killed"))?;
    }
    // A task at once, for a thread that runs on (not after `mcp.task_after`).
    let config = std::fs::read_to_string(env.home().join("config.yaml"))?;
    std::fs::write(env.home().join("config.yaml"), format!("{config}mcp:\n  task_after: 0s\n"))?;
    let lines = ok_steps(&env, Via::Http(&serve, Some(&token)), "auto", json!([
        {"op": "task", "tool": "solve-issue", "args": {"prompt": "cancel task"}, "cancel_at": "working"},
    ]))?;
    assert_eq!(lines[0]["final"]["status"], "cancelled", "{lines:?}");
    let id = lines[0]["task"]["taskId"].as_str().context("id")?;
    assert_eq!(status(&env, id)?, "killed");
    Ok(())
}

/// A client that goes away mid-call (no goodbye) leaves its thread running: it completes, and
/// another client reads its result.
#[test]
fn a_dropped_connection_leaves_the_thread_to_complete() -> Result<()> {
    let env = Env::new()?;
    let (serve, token) = serving(&env)?;
    slow(&env, "200ms")?;
    for (prompt, via) in [("drop stdio", Via::Stdio), ("drop http", Via::Http(&serve, Some(&token)))] {
        let lines = steps(&env, via, "auto", json!([
            {"op": "drop", "tool": "solve-issue", "args": {"prompt": prompt}, "after_progress": 1},
        ]))?;
        assert_eq!(lines, [json!({"dropped": true})]);
        let id = thread_prompted(&env, prompt)?["threadId"].as_str().context("id")?.to_string();
        wait_until("the dropped call's thread completes", || Ok(status(&env, &id)? == "completed"))?;
        let lines = ok_steps(&env, via, "auto", json!([
            {"op": "call", "tool": "get_thread", "args": {"thread": id}},
        ]))?;
        let thread = &lines[0]["result"]["structuredContent"];
        assert_eq!(thread["status"], "completed", "{thread}");
        assert_eq!(thread["steps"].as_array().map(Vec::len), Some(5), "{thread}");
    }
    let lines = ok_steps(&env, Via::Stdio, "auto", json!([
        {"op": "call", "tool": "list_threads", "args": {"status": "completed", "workflow": "solve-issue"}},
    ]))?;
    let listed = lines[0]["result"]["structuredContent"]["threads"].as_array().context("threads")?.clone();
    let prompts: Vec<&str> = listed.iter().filter_map(|t| t["prompt"].as_str()).collect();
    assert_eq!(prompts, ["drop http", "drop stdio"], "{listed:?}");
    assert_eq!(listed[0]["startedBy"], "mcp token:ci (mcp)");
    Ok(())
}

/// A thread that fails, or is killed (`kill_thread`, from another client) while its call
/// follows it, answers the call with an error result saying why.
/// A workflow that declares its input offers it as its tool's `data` (required, when the
/// schema requires a field), and a call with data it refuses is an error result naming where,
/// which starts nothing: over stdio and HTTP, with the official Python SDK.
#[test]
fn a_workflows_declared_input_is_its_tools_data_and_bad_data_an_error_result() -> Result<()> {
    let env = Env::new()?;
    let flow = env.write(
        "triage.yaml",
        "description: Triage an issue\ninputs:\n  type: object\n  required: [issue]\n  \
         properties:\n    issue: {type: integer, minimum: 1}\n  $defs:\n    unused: {type: string}\n\
         roles:\n  a:\n    description: A\nsteps:\n  - id: a\n    role: a\n",
    )?;
    env.ok(&["add", "triage", flow.to_str().unwrap()])?;
    let token = env.ok(&["token", "create", "--name", "ci"])?.trim().to_string();
    let serve = Serve::start(&env, &["--no-schedules"], &[])?;
    for via in [Via::Stdio, Via::Http(&serve, Some(&token))] {
        let lines = ok_steps(&env, via, "auto", json!([
            {"op": "list"},
            {"op": "call", "tool": "triage", "args": {"prompt": "p", "data": {"issue": 0}}},
            {"op": "call", "tool": "triage", "args": {"prompt": "p"}},
            {"op": "call", "tool": "triage", "args": {"prompt": "p", "data": {"issue": 9}}},
        ]))?;
        let schema = &lines[0]["tools"][0]["inputSchema"];
        assert_eq!(schema["required"], json!(["prompt", "data"]), "{schema}");
        let data = &schema["properties"]["data"];
        assert_eq!(data["properties"]["issue"], json!({"type": "integer", "minimum": 1}), "{schema}");
        assert_eq!(data["required"], json!(["issue"]), "{schema}");
        // Its definitions are where its `#/$defs/…` references resolve: the tool schema's root.
        assert_eq!(schema["$defs"]["unused"], json!({"type": "string"}), "{schema}");
        for (i, said) in [(1, "(at `/issue`)"), (2, "\"issue\" is a required property")] {
            let result = &lines[i]["result"];
            assert_eq!(result["isError"], true, "{result}");
            let text = result["content"][0]["text"].as_str().context("text")?;
            ensure!(text.contains("workflow `triage` does not take this data") && text.contains(said), "{text}");
        }
        assert_eq!(lines[3]["result"]["isError"], false, "{lines:?}");
    }
    // Only the two calls with good data started a thread.
    assert_eq!(env.json(&["threads"])?.as_array().map(Vec::len), Some(2));
    serve.stop()
}

#[test]
fn a_failed_or_killed_thread_is_an_error_result() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    let config = "agent: broken\nagents:\n  broken:\n    kind: command\n    command: /bin/false\n    retries: 0\n";
    std::fs::write(env.home().join("config.yaml"), config)?;
    let lines = ok_steps(&env, Via::Stdio, "auto", json!([
        {"op": "call", "tool": "solve-issue", "args": {"prompt": "fail"}},
    ]))?;
    let result = &lines[0]["result"];
    assert_eq!(result["isError"], true, "{result}");
    let text = result["content"][0]["text"].as_str().context("text")?;
    ensure!(text.contains(&format!("thread {} failed", thread_of(result)?)), "{text}");
    // A thread killed (with kill_thread, by another client) while a call follows it.
    slow(&env, "2s")?;
    let plan = json!([{"op": "call", "tool": "solve-issue", "args": {"prompt": "kill me"}}]);
    let following = client(&env, Via::Stdio, "auto", &plan)?.stdout(Stdio::piped()).spawn()?;
    let mut id = String::new();
    wait_until("the call's thread runs", || {
        let threads = env.json(&["threads"])?;
        let found = threads.as_array().into_iter().flatten().find(|t| t["prompt"] == "kill me");
        id = found.and_then(|t| t["threadId"].as_str()).unwrap_or_default().to_string();
        Ok(!id.is_empty())
    })?;
    let lines = ok_steps(&env, Via::Stdio, "legacy", json!([
        {"op": "call", "tool": "kill_thread", "args": {"thread": id}},
        {"op": "call", "tool": "kill_thread", "args": {"thread": id}},
    ]))?;
    assert_eq!(lines[0]["result"]["isError"], false, "{lines:?}");
    assert_eq!(status(&env, &id)?, "killed");
    // Killing it again is the tool's error, which the model reads.
    assert_eq!(lines[1]["result"]["isError"], true, "{lines:?}");
    let out = following.wait_with_output()?;
    let heard: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(heard["result"]["isError"], true, "{heard}");
    let text = heard["result"]["content"][0]["text"].as_str().context("text")?;
    ensure!(text.contains(&format!("thread {id} killed")), "{text}");
    Ok(())
}

/// The same call sent again starts one thread: the same idempotency key in `_meta` (also
/// through two `serve` on one store), and the same request id in the same session.
#[test]
fn a_call_sent_again_starts_one_thread() -> Result<()> {
    let env = Env::new()?;
    let (serve, token) = serving(&env)?;
    let other = Serve::start(&env, &["--no-schedules"], &[])?;
    let key = json!({"uncaged-workflow/idempotency-key": "issue-7"});
    let call = json!({"op": "call", "tool": "solve-issue", "args": {"prompt": "once"}, "meta": key});
    let first = ok_steps(&env, Via::Http(&serve, Some(&token)), "auto", json!([call, call]))?;
    let again = ok_steps(&env, Via::Http(&other, Some(&token)), "legacy", json!([call]))?;
    let ids: Vec<String> =
        first.iter().chain(&again).map(|l| thread_of(&l["result"])).collect::<Result<_>>()?;
    ensure!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    thread_prompted(&env, "once")?;
    // The same request id, twice, in one session.
    runtime()?.block_on(async {
        let auth = format!("Bearer {token}");
        let headers = [("authorization", auth.as_str())];
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}});
        let (status, body) = post(&serve, &headers, serde_json::to_vec(&init)?).await?;
        ensure!(status == 200, "{status} {body}");
        let session = body["session"].as_str().context("a session")?.to_string();
        let in_session = [("authorization", auth.as_str()), ("mcp-session-id", session.as_str()),
            ("mcp-protocol-version", "2025-11-25")];
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let (status, _) = post(&serve, &in_session, serde_json::to_vec(&initialized)?)
            .await
            .or_else(|_| Ok::<_, anyhow::Error>((202, Value::Null)))?;
        ensure!(status == 202, "{status}");
        let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "solve-issue", "arguments": {"prompt": "request seven"}}});
        let mut threads = vec![];
        for _ in 0..2 {
            let (status, body) = post(&serve, &in_session, serde_json::to_vec(&call)?).await?;
            ensure!(status == 200, "{status} {body}");
            threads.push(thread_of(&body["result"])?);
        }
        ensure!(threads[0] == threads[1], "{threads:?}");
        Ok(())
    })?;
    thread_prompted(&env, "request seven")?;
    Ok(())
}

/// Auth as the API's: no token, a wrong one, a foreign Origin, a foreign Host are refused; a read-only token
/// sees and calls only the tools that read; nothing is started by any of them. Malformed
/// JSON-RPC and a 50 MiB request get a JSON-RPC error, and the server serves on.
#[test]
fn tokens_origins_and_bad_requests_are_refused_and_nothing_starts() -> Result<()> {
    let env = Env::new()?;
    let (serve, token) = serving(&env)?;
    let viewer = env.ok(&["token", "create", "--name", "viewer", "--read-only"])?.trim().to_string();
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string().into_bytes();
    runtime()?.block_on(async {
        let bearer = format!("Bearer {token}");
        let refused = [
            (vec![], 401),
            (vec![("authorization", "Bearer uwt_not_a_token")], 401),
            (vec![("authorization", bearer.as_str()), ("origin", "http://evil.example")], 403),
        ];
        for (headers, expected) in refused {
            let (status, body) = post(&serve, &headers, list.clone()).await?;
            assert_eq!(status, expected, "{headers:?}: {body}");
            ensure!(body["error"]["message"].is_string() && body["jsonrpc"] == "2.0", "{body}");
        }
        // A name rebound to the loopback is not one this server answers to.
        let rebound = [("authorization", bearer.as_str()), ("host", "evil.example")];
        let (status, body) = post(&serve, &rebound, list.clone()).await?;
        assert_eq!(status, 421, "{body}");
        let own = format!("http://{}", serve.addr);
        let ok = [("authorization", bearer.as_str()), ("origin", own.as_str())];
        let bad = [
            (b"{not json".to_vec(), 400, -32700),
            (b"{}".to_vec(), 400, -32600),
            (b"[1, 2]".to_vec(), 400, -32600),
            (vec![b'a'; 50 << 20], 413, -32600),
        ];
        for (body, expected, code) in bad {
            let (status, answer) = post(&serve, &ok, body).await?;
            assert_eq!((status, answer["error"]["code"].as_i64()), (expected, Some(code)), "{answer}");
        }
        Ok(())
    })?;
    // The SDK's client without a token does not get as far as a session.
    let out = client(&env, Via::Http(&serve, None), "legacy", &json!([{"op": "list"}]))?.output()?;
    ensure!(!out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    ensure!(String::from_utf8_lossy(&out.stderr).contains("a token is required"), "{}", String::from_utf8_lossy(&out.stderr));
    let viewer_via = Via::Http(&serve, Some(&viewer));
    let lines = ok_steps(&env, viewer_via, "auto", json!([{"op": "list"}]))?;
    let names: Vec<&str> =
        lines[0]["tools"].as_array().context("tools")?.iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["list_threads", "get_thread"]);
    for (tool, args) in [("solve-issue", json!({"prompt": "no"})), ("kill_thread", json!({"thread": "01M8H9EMB6MZ195GKK1K67KCXS"}))] {
        let lines = steps(&env, viewer_via, "auto", json!([{"op": "call", "tool": tool, "args": args}]))?;
        ensure!(lines[0].get("error").is_some() || lines[0]["result"]["isError"] == true, "{tool}: {lines:?}");
    }
    assert_eq!(env.json(&["threads"])?, json!([]));
    // The server serves on.
    let lines = ok_steps(&env, Via::Http(&serve, Some(&token)), "auto", json!([
        {"op": "call", "tool": "solve-issue", "args": {"prompt": "still here"}},
    ]))?;
    assert_eq!(lines[0]["result"]["isError"], false);
    Ok(())
}

/// The tools follow the registry while a client is connected (`notifications/tools/list_changed`
/// when a workflow is added), and `mcp.workflows` in config.yaml limits which are offered.
#[test]
fn the_offered_tools_follow_the_registry_and_the_config() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    let plan = json!([{"op": "list"}, {"op": "wait_list_changed", "timeout": 30}, {"op": "list"}]);
    let mut child = client(&env, Via::Stdio, "legacy", &plan)?
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut lines = std::io::BufReader::new(child.stdout.take().context("stdout")?).lines();
    let first: Value = serde_json::from_str(&lines.next().context("a listing")??)?;
    assert_eq!(first["tools"].as_array().map(Vec::len), Some(5), "{first}");
    let flow = env.write("review.yaml", REVIEW_YAML)?;
    env.ok(&["add", "review", flow.to_str().context("path")?])?;
    let told: Value = serde_json::from_str(&lines.next().context("news")??)?;
    assert_eq!(told, json!({"list_changed": true}));
    let second: Value = serde_json::from_str(&lines.next().context("a listing")??)?;
    let names: Vec<&str> =
        second["tools"].as_array().context("tools")?.iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names[..2], ["review", "solve-issue"]);
    ensure!(second["tools"][0]["description"] == "Reviews a change", "{second}");
    child.wait()?;
    std::fs::write(env.home().join("config.yaml"), "mcp:\n  workflows: [review]\n")?;
    let lines = steps(&env, Via::Stdio, "auto", json!([
        {"op": "list"},
        {"op": "call", "tool": "solve-issue", "args": {"prompt": "not offered"}},
    ]))?;
    let names: Vec<&str> =
        lines[0]["tools"].as_array().context("tools")?.iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names[..2], ["review", "list_threads"]);
    ensure!(lines[1].get("error").is_some_and(|e| e.as_str().is_some_and(|e| e.contains("no tool"))), "{lines:?}");
    Ok(())
}

/// A second client no one here wrote: the official TypeScript SDK lists the tools and calls
/// one over HTTP, with progress.
#[test]
fn the_typescript_sdk_lists_and_calls_a_workflow_over_http() -> Result<()> {
    let env = Env::new()?;
    let (serve, token) = serving(&env)?;
    let script = repo().join("tests/mcp/ts_client.mjs").canonicalize()?;
    let modules = installed("target/mcp-node/node_modules")?;
    let out = env
        .command_of("node")
        .env("MCP_NODE_MODULES", modules)
        .arg(script)
        .args([&format!("http://{}/mcp", serve.addr), &token, "solve-issue", r#"{"prompt": "from typescript"}"#])
        .output()?;
    let stdout = String::from_utf8(out.stdout)?;
    ensure!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let got: Value = serde_json::from_str(stdout.trim())?;
    assert_eq!(got["tools"][0], "solve-issue", "{got}");
    assert_eq!(got["result"]["isError"], false, "{got}");
    assert_eq!(got["progress"].as_array().map(Vec::len), Some(5), "{got}");
    let thread = thread_prompted(&env, "from typescript")?;
    assert_eq!(thread["status"], "completed");
    assert_eq!(thread["startedBy"], "mcp token:ci (ts-test-client)");
    Ok(())
}

/// A client on protocol 2025-11-25 (the TypeScript SDK 1.x) runs calls as that version's
/// tasks, over HTTP and stdio: the handshake and the tool list say a workflow may run as a
/// task; a task runs to its result; one whose thread waits for a person asks it through the
/// client (an elicitation related to the task) and goes on with the answer; `tasks/cancel`
/// kills the thread; `tasks/list` lists this caller's calls and `tasks/get` reads one. At
/// 9e65bc6 such a client could do none of this (the SDK drops a call's `task`, and refuses
/// `tasks/get` from a client without the 2026-07-28 extension).
#[test]
fn a_client_on_2025_11_25_runs_calls_as_tasks() -> Result<()> {
    let env = Env::new()?;
    let (serve, token) = serving(&env)?;
    std::fs::write(env.home().join("config.yaml"), "roles:\n  reviewer: human\n")?;
    let script = repo().join("tests/mcp/ts_tasks_client.mjs").canonicalize()?;
    let modules = installed("target/mcp-node/node_modules")?;
    let url = format!("http://{}/mcp", serve.addr);
    let mut vars = serde_json::Map::new();
    vars.insert("UNCAGED_WORKFLOW_HOME".into(), json!(env.home().display().to_string()));
    if let Some(store) = &env.store {
        vars.insert("UNCAGED_WORKFLOW_STORE".into(), json!(store));
    }
    let binary = env!("CARGO_BIN_EXE_uncaged-workflow");
    let answer = json!({"answer": APPROVED});
    for way in ["http", "stdio"] {
        let plan = json!([
            {"op": "tools"},
            {"op": "task", "tool": "solve-issue", "args": {"prompt": format!("ask {way}")}, "answers": [answer]},
            {"op": "task", "tool": "solve-issue", "args": {"prompt": format!("cancel {way}")}, "cancel": true},
            {"op": "list"},
        ])
        .to_string();
        let target: Vec<String> = match way {
            "http" => vec![url.clone(), token.clone()],
            _ => vec![binary.into(), json!(["mcp"]).to_string(), Value::Object(vars.clone()).to_string()],
        };
        let out = env
            .command_of("node")
            .env("MCP_NODE_MODULES", &modules)
            .arg(&script)
            .arg(way)
            .args(&target)
            .arg(&plan)
            .output()?;
        let stdout = String::from_utf8(out.stdout)?;
        ensure!(out.status.success(), "{way}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        let lines: Vec<Value> = stdout.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
        ensure!(lines.len() == 5, "{way}: {stdout}");
        let tasks = &lines[0]["capabilities"]["tasks"];
        assert_eq!(tasks["requests"]["tools"]["call"], json!({}), "{way}: {}", lines[0]);
        let tools = lines[1]["tools"].as_array().context("tools")?;
        assert_eq!(tools[0]["execution"], json!({"taskSupport": "optional"}), "{way}: {tools:?}");
        ensure!(tools[1..].iter().all(|t| t["execution"].is_null()), "{way}: operations are no tasks: {tools:?}");

        // Asked through the client, answered, completed with the last step's meta.
        let asked = &lines[2];
        ensure!(asked["error"].is_null(), "{way}: {asked}");
        let seen = asked["seen"].as_array().context("seen")?;
        ensure!(seen.contains(&json!("status:input_required")) && seen.last() == Some(&json!("result")), "{way}: {asked}");
        assert_eq!(asked["result"]["structuredContent"], json!({"approved": true, "comments": []}), "{way}: {asked}");
        let id = asked["task"]["taskId"].as_str().context("a task id")?;
        let question = &asked["asked"][0];
        ensure!(question["message"].as_str().is_some_and(|q| q.contains("reviewer")), "{way}: {question}");
        assert_eq!(question["meta"]["io.modelcontextprotocol/related-task"]["taskId"], id, "{way}: {question}");
        assert_eq!(status(&env, id)?, "completed", "{way}");

        // Cancelled: its thread is killed.
        let cancelled = &lines[3];
        ensure!(cancelled["seen"].as_array().is_some_and(|s| s.contains(&json!("status:cancelled"))), "{way}: {cancelled}");
        let killed = cancelled["task"]["taskId"].as_str().context("a task id")?;
        wait_until("the cancelled task's thread is killed", || Ok(status(&env, killed)? == "killed"))?;

        // This caller's calls, the newest first; the other transport's caller's are not listed.
        let listed: Vec<&str> = lines[4]["tasks"].as_array().context("tasks")?.iter()
            .filter_map(|t| t["taskId"].as_str()).collect();
        assert_eq!(listed, [killed, id], "{way}: {}", lines[4]);
        let statuses: Vec<&Value> = lines[4]["tasks"].as_array().context("tasks")?.iter().map(|t| &t["status"]).collect();
        assert_eq!(statuses[1], "completed", "{way}: {}", lines[4]);
    }
    // A task picked up again by another connection: its client went away once it had the
    // task; a new one reads it, answers the person's question it waits on, and gets its result.
    let client = |plan: Value| -> Result<Vec<Value>> {
        let out = env
            .command_of("node")
            .env("MCP_NODE_MODULES", &modules)
            .arg(&script)
            .args(["http", &url, &token, &plan.to_string()])
            .output()?;
        let stdout = String::from_utf8(out.stdout)?;
        ensure!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        Ok(stdout.lines().map(serde_json::from_str).collect::<Result<_, _>>()?)
    };
    let started = client(json!([{"op": "start", "tool": "solve-issue", "args": {"prompt": "pick me up"}}]))?;
    let id = started[1]["task"]["taskId"].as_str().context("a task id")?.to_string();
    wait_until("the task waits for a person", || Ok(status(&env, &id)? == "waiting"))?;
    let picked = client(json!([
        {"op": "get", "task": id},
        {"op": "result", "task": id, "answers": [answer]},
    ]))?;
    assert_eq!(picked[1]["status"], "input_required", "{picked:?}");
    assert_eq!(picked[2]["structuredContent"], json!({"approved": true, "comments": []}), "{picked:?}");
    assert_eq!(picked[2]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"], id.as_str());
    assert_eq!(status(&env, &id)?, "completed");
    Ok(())
}

/// The MCP Inspector's CLI (npm, pinned in tests/mcp/package.json), the tool most people try a
/// server with, calls a workflow over HTTP and over stdio and shows its result: the last
/// step's meta and the summary. It declares the tasks extension but polls no task it is handed
/// (at 9e65bc6 it was handed one at once, and showed `"content": []`).
#[test]
fn the_mcp_inspector_shows_a_calls_result() -> Result<()> {
    let env = Env::new()?;
    let (serve, token) = serving(&env)?;
    let inspector = installed("target/mcp-node/node_modules/.bin/mcp-inspector")?;
    let url = format!("http://{}/mcp", serve.addr);
    let auth = format!("Authorization: Bearer {token}");
    let binary = env!("CARGO_BIN_EXE_uncaged-workflow");
    let home = format!("UNCAGED_WORKFLOW_HOME={}", env.home().display());
    let mut over: Vec<(&str, Vec<&str>)> =
        vec![("http", vec![&url, "--transport", "http", "--header", &auth])];
    // Over stdio the Inspector starts `uncaged-workflow mcp` with only the variables it is given.
    let store = env.store.as_ref().map(|url| format!("UNCAGED_WORKFLOW_STORE={url}"));
    let mut stdio = vec!["-e", &home];
    if let Some(store) = &store {
        stdio.extend(["-e", store]);
    }
    stdio.extend([binary, "mcp"]);
    over.push(("stdio", stdio));
    for (way, target) in over {
        let prompt = format!("prompt=from the inspector over {way}");
        let out = env
            .command_of("node")
            .arg(&inspector)
            .arg("--cli")
            .args(&target)
            .args(["--method", "tools/call", "--tool-name", "solve-issue", "--tool-arg", &prompt])
            .output()?;
        let stdout = String::from_utf8(out.stdout)?;
        ensure!(out.status.success(), "{way}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        let shown: Value = serde_json::from_str(stdout.trim()).with_context(|| format!("{way}: {stdout}"))?;
        assert_eq!(shown["structuredContent"], json!({"approved": true, "comments": []}), "{way}: {shown}");
        assert_eq!(shown["content"][0]["text"], "approved after 2 development round(s)", "{way}: {shown}");
        ensure!(shown.get("taskId").is_none(), "{way}: handed a task: {shown}");
        assert_eq!(status(&env, &thread_of(&shown)?)?, "completed", "{way}");
    }
    Ok(())
}

}

/// A second workflow, added while a client is connected.
const REVIEW_YAML: &str = "description: Reviews a change\nroles:\n  reviewer:\n    \
description: Reviews\n    system_prompt: You review.\n\
graph:\n  - from: $START\n    transitions: [{to: reviewer}]\n  - from: reviewer\n    transitions: [{to: $END}]\n";
