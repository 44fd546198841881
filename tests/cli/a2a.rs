//! A2A: `serve` as an A2A v1.0 agent, called by the official Python SDK's client (PyPI's
//! `a2a-sdk`, which `make test` installs) over both bindings it answers — JSON-RPC and
//! HTTP+JSON — as another agent would: the agent card, a task that asks its reviewer (a person)
//! and is answered by the next message, a message sent again (one task), a streamed task and
//! its cancellation, the listing.

use anyhow::{Context, Result, ensure};
use serde_json::Value;

use crate::tools::{python, repo};
use crate::{Env, Serve};

/// The server's token.
const TOKEN: &str = "a2a-test-token-0123456789";

/// What the SDK's client saw, by `what`.
fn client(
    serve: &Serve,
    serve_err: &std::path::Path,
    binding: &str,
    push: &str,
) -> Result<std::collections::HashMap<String, Value>> {
    let out = std::process::Command::new(python()?)
        .arg(repo().join("tests/reach/a2a_client.py"))
        .args([&format!("http://{}", serve.addr), TOKEN, "solve-issue", binding, push])
        .output()
        .context("run the A2A client (`make test` installs a2a-sdk)")?;
    ensure!(
        out.status.success(),
        "the A2A client failed:\n{}\n{}\nserve: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(serve_err).unwrap_or_default()
    );
    let mut seen = std::collections::HashMap::new();
    for line in String::from_utf8(out.stdout)?.lines() {
        let value: Value = serde_json::from_str(line)?;
        seen.insert(value["what"].as_str().unwrap_or_default().to_string(), value);
    }
    Ok(seen)
}

/// The SDK's agent (`tests/reach/a2a_agent.py`), killed when dropped.
struct RemoteAgent {
    child: std::process::Child,
    port: u16,
    seen: std::path::PathBuf,
}

impl RemoteAgent {
    fn start(env: &Env, token: &str) -> Result<RemoteAgent> {
        use std::io::BufRead;
        let seen = env.dir.path().join("agent-seen.jsonl");
        let mut child = std::process::Command::new(python()?)
            .arg(repo().join("tests/reach/a2a_agent.py"))
            .arg(&seen)
            .arg(token)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .context("start the A2A agent")?;
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
        let port = line.trim().strip_prefix("port=").context("a port")?.parse()?;
        Ok(RemoteAgent { child, port, seen })
    }
}

impl Drop for RemoteAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `POST /a2a/rest/tasks/{task}:cancel`, its body a moment after its headers, then a
/// listing on the same connection: how many answers came back on it (the task ended: the
/// cancel is refused, which is as good an answer).
fn two_requests_on_one_connection(addr: &str, task: &str) -> Result<usize> {
    use std::io::{Read, Write};
    let body = format!("{{\"id\":\"{task}\"}}");
    let head = format!(
        "POST /a2a/rest/tasks/{task}:cancel HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer \
         {TOKEN}\r\nA2A-Version: 1.0\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let list = format!(
        "GET /a2a/rest/tasks?pageSize=1 HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer \
         {TOKEN}\r\nA2A-Version: 1.0\r\n\r\n"
    );
    let mut socket = std::net::TcpStream::connect(addr)?;
    socket.write_all(head.as_bytes())?;
    // Two packets, as a client that writes headers and body apart sends them: the server must
    // not answer (and close) before it has the body.
    std::thread::sleep(std::time::Duration::from_millis(100));
    socket.write_all(body.as_bytes())?;
    let mut answers = String::new();
    let mut buf = [0u8; 65536];
    socket.set_read_timeout(Some(std::time::Duration::from_secs(60)))?;
    let read = socket.read(&mut buf)?;
    answers.push_str(&String::from_utf8_lossy(&buf[..read]));
    // A closed connection refuses the write, or answers it with nothing.
    if socket.write_all(list.as_bytes()).is_ok() {
        while answers.matches("HTTP/1.1 ").count() < 2 {
            match socket.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(read) => answers.push_str(&String::from_utf8_lossy(&buf[..read])),
            }
        }
    }
    Ok(answers.matches("HTTP/1.1 ").count())
}

on_both_stores! {

/// `kind: a2a`: a role bound to an agent written with the official SDK's server is answered
/// by it — the role's instructions and the thread sent as one message, with its token and the
/// skill asked for — and its artifacts are the step (text, and the data part as its meta),
/// journaled as any agent's answer; without its token, the call fails saying which variable.
#[test]
fn a_role_bound_to_an_a2a_agent_is_answered_by_it() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    let agent = RemoteAgent::start(&env, "remote-token")?;
    std::fs::write(
        env.home().join("config.yaml"),
        format!(
            "agents:\n  remote:\n    kind: a2a\n    url: http://127.0.0.1:{0}\n    \
             token_env: REVIEWER_TOKEN\n    skill: review\n    retries: 0\n  unset:\n    kind: a2a\n    \
             url: http://127.0.0.1:{0}\n    token_env: NOBODY_SET_THIS_TOKEN\nroles:\n  reviewer: remote\n",
            agent.port
        ),
    )?;
    let run = env.run_with(&["run", "solve-issue", "-p", "Fix the parser"], &[("REVIEWER_TOKEN", "remote-token")])?;
    ensure!(run.code == 0, "{run:?}");
    let thread = crate::thread_id_of(&run.stdout)?;
    let shown = env.json(&["thread", &thread])?;
    let review = shown["steps"].as_array().context("steps")?.iter().find(|s| s["role"] == "reviewer").context("a review")?.clone();
    ensure!(review["content"] == "Reviewed by the A2A agent: the change is sound.", "{review}");
    ensure!(review["meta"] == serde_json::json!({"approved": true}), "{review}");
    ensure!(review["agent"] == "remote", "{review}");
    let seen = std::fs::read_to_string(&agent.seen)?;
    let message: Value = serde_json::from_str(seen.lines().next().context("a message")?)?;
    let text = message["parts"][0]["text"].as_str().unwrap_or_default();
    ensure!(text.contains("reviewer") && text.contains("Fix the parser"), "{message}");
    ensure!(message["metadata"]["skill"] == "review", "{message}");
    ensure!(message["messageId"].as_str().is_some_and(|id| id.starts_with(&thread)), "{message}");

    // (A worker keeps the environment it was started with: a variable nobody set is missing
    // there too.)
    let run = env.run(&["run", "solve-issue", "-p", "No token", "--agent-for", "reviewer=unset"])?;
    ensure!(run.code != 0, "{run:?}");
    let failed = crate::thread_id_of(&run.stdout)?;
    let summary = env.json(&["thread", &failed])?["end"].to_string();
    ensure!(summary.contains("NOBODY_SET_THIS_TOKEN"), "{summary}");
    Ok(())
}

/// The issue's "done when" for A2A: the SDK's client calls a workflow, answers its question,
/// and cancels another, over JSON-RPC and over HTTP+JSON; the answer is journaled as made
/// through A2A, by the token's name.
#[test]
fn the_sdk_client_calls_answers_and_cancels_over_both_bindings() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    let receivers = crate::notify::Receivers::start(&env, 0)?;
    // Pushes to the receiver on loopback: allowed here, refused by default.
    std::fs::write(
        env.home().join("config.yaml"),
        "roles:\n  reviewer: human\nnotify:\n  poll: 100ms\n  a2a_push_private: true\n",
    )?;
    let push = format!("http://127.0.0.1:{}/push", receivers.http);
    let serve = Serve::start(&env, &["--token", TOKEN], &[])?;
    for binding in ["JSONRPC", "HTTP+JSON"] {
        let seen = client(&serve, &env.dir.path().join("serve.err"), binding, &push)?;
        let card = &seen["card"];
        ensure!(card["skills"] == serde_json::json!(["solve-issue"]), "{card}");
        ensure!(card["bindings"] == serde_json::json!(["JSONRPC", "HTTP+JSON"]), "{card}");
        let asked = &seen["asked"];
        ensure!(asked["state"] == "TASK_STATE_INPUT_REQUIRED", "{binding}: {asked}");
        ensure!(asked["question"].as_str().is_some_and(|q| q.contains("reviewer")), "{asked}");
        let id = asked["id"].as_str().context("a task id")?;
        ensure!(seen["again"]["id"] == id, "a message sent again started another task");
        let answered = &seen["answered"];
        ensure!(answered["state"] == "TASK_STATE_COMPLETED", "{binding}: {answered}");
        let artifacts = answered["artifacts"].as_array().context("artifacts")?;
        ensure!(artifacts.len() == 1 && artifacts[0]["name"] == "reviewer", "{answered}");
        ensure!(seen["got"]["state"] == "TASK_STATE_COMPLETED");
        let streamed = &seen["streamed"];
        let events: Vec<&str> = streamed["events"].as_array().context("events")?.iter().filter_map(Value::as_str).collect();
        ensure!(events.first() == Some(&"task"), "{streamed}");
        ensure!(events.contains(&"TASK_STATE_WORKING"), "steps are told: {streamed}");
        ensure!(events.last() == Some(&"TASK_STATE_INPUT_REQUIRED"), "{streamed}");
        // Subscribed again while it waits: the task, and that it waits (nothing new to tell).
        let subscribed = &seen["subscribed"]["events"];
        ensure!(subscribed == &serde_json::json!(["task", "TASK_STATE_INPUT_REQUIRED"]), "{subscribed}");
        ensure!(seen["canceled"]["state"] == "TASK_STATE_CANCELED", "{}", seen["canceled"]);
        let streamed_id = streamed["id"].as_str().context("the streamed task")?;
        ensure!(env.json(&["thread", streamed_id])?["status"] == "killed");
        let listed = seen["listed"]["ids"].as_array().context("listed")?;
        ensure!(listed.iter().any(|t| t == id) && listed.iter().any(|t| t == streamed_id), "{listed:?}");
        // The answer is the thread's, journaled as made through A2A by the server's token.
        let decisions = env.json(&["thread", id])?["decisions"].clone();
        ensure!(decisions[0]["by"] == serde_json::json!({"who": "server", "via": "a2a"}), "{decisions}");
        let started = env.json(&["thread", id])?["start"]["startedBy"].clone();
        ensure!(started.to_string().contains("a2a"), "{started}");
        // Pushed once per rest, with the client's token: the question, then the end.
        let mut states = vec![];
        crate::wait_until("the task's end is pushed", || {
            states = receivers
                .received("push")?
                .into_iter()
                .filter(|p| p["payload"]["task"]["id"] == id)
                .map(|p| {
                    ensure!(p["token"] == "push-secret", "{p}");
                    Ok(p["payload"]["task"]["status"]["state"].as_str().unwrap_or_default().to_string())
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(states.contains(&"TASK_STATE_COMPLETED".to_string()))
        })?;
        // (The question may have been answered before a poll saw it: a rest shorter than
        // `notify.poll` can go untold; the end never does.)
        let mut told = states.clone();
        told.dedup();
        ensure!(told == states && states.last().is_some_and(|s| s == "TASK_STATE_COMPLETED"), "{states:?}");
        let notices = env.json(&["thread", id])?["notifications"].clone();
        let pushes = notices.as_array().context("notifications")?;
        ensure!(pushes.len() == states.len() && pushes.iter().all(|n| n["state"] == "sent"), "{notices}");
    }
    // A body sent after its headers (as httpx writes them) is read even where the SDK's handler
    // does not read it (HTTP+JSON cancel): the connection stays open for the next request.
    let asked = client(&serve, &env.dir.path().join("serve.err"), "JSONRPC", &push)?;
    let task = asked["asked"]["id"].as_str().context("a task")?;
    ensure!(two_requests_on_one_connection(&serve.addr, task)? == 2, "the connection was closed");
    // Without a token, nothing but the card.
    let anonymous = std::process::Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", "-H", "content-type: application/json", "-d", "{}"])
        .arg(format!("http://{}/a2a/jsonrpc", serve.addr))
        .output()?;
    ensure!(String::from_utf8(anonymous.stdout)? == "401");
    serve.stop()?;
    Ok(())
}

}
