//! The `openai` agent and the LLM extractor against a chat-completions server this test runs
//! on loopback; the failure policy; the `command` agent's timeout.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::{Value, json};

use crate::{Env, roles, thread_id_of};

/// A request the mock server got.
#[derive(Debug, Clone)]
pub struct Seen {
    at: Instant,
    pub body: Value,
    authorization: Option<String>,
    /// The W3C trace context the client sent.
    pub traceparent: Option<String>,
}

/// What the mock answers: status, body, and a delay before answering.
type Script = dyn Fn(usize, &Value) -> (u16, Value, Duration) + Send + Sync;

/// A chat-completions server on 127.0.0.1 with an ephemeral port, stopped on drop.
pub struct MockLlm {
    pub base_url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MockLlm {
    pub fn start(script: Box<Script>) -> Result<Self> {
        Self::start_with_header(script, None)
    }

    /// As [`MockLlm::start`], adding `header` (`Name: value`) to every answer that is not 200.
    fn start_with_header(script: Box<Script>, header: Option<&'static str>) -> Result<Self> {
        let server = tiny_http::Server::http("127.0.0.1:0").map_err(|e| anyhow::anyhow!("{e}"))?;
        let port = server.server_addr().to_ip().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (seen_in, stop_in) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !stop_in.load(Ordering::SeqCst) {
                let Ok(Some(mut request)) = server.recv_timeout(Duration::from_millis(50)) else {
                    continue;
                };
                let mut text = String::new();
                let _ = request.as_reader().read_to_string(&mut text);
                let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                let header_of = |name: &'static str| {
                    request
                        .headers()
                        .iter()
                        .find(|h| h.field.equiv(name))
                        .map(|h| h.value.as_str().to_string())
                };
                let (authorization, traceparent) =
                    (header_of("Authorization"), header_of("traceparent"));
                let n = {
                    let mut seen = seen_in.lock().unwrap();
                    seen.push(Seen {
                        at: Instant::now(),
                        body: body.clone(),
                        authorization,
                        traceparent,
                    });
                    seen.len()
                };
                let (status, reply, delay) = script(n, &body);
                // A client that timed out has gone; answering it later is harmless.
                let handle = std::thread::spawn(move || {
                    std::thread::sleep(delay);
                    let mut response = tiny_http::Response::from_string(reply.to_string())
                        .with_status_code(status)
                        .with_header(
                            "Content-Type: application/json".parse::<tiny_http::Header>().unwrap(),
                        );
                    if let Some(header) = header.filter(|_| status != 200) {
                        response.add_header(header.parse::<tiny_http::Header>().unwrap());
                    }
                    let _ = request.respond(response);
                });
                if delay.is_zero() {
                    let _ = handle.join();
                }
            }
        });
        Ok(MockLlm {
            base_url: format!("http://127.0.0.1:{port}/v1"),
            seen,
            stop,
            thread: Some(thread),
        })
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for MockLlm {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A chat-completions reply with `content`.
pub fn completion(content: &str) -> Value {
    json!({"id": "x", "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
    ]})
}

/// Answers for solve-issue by the role named in the system prompt.
pub fn by_role(body: &Value) -> Value {
    let system = body["messages"][0]["content"].as_str().unwrap_or_default();
    completion(if system.contains("You are the planner") {
        "Plan:\n```json\n{\"steps\": [\"fix it\"]}\n```"
    } else if system.contains("You are the developer") {
        "{\"summary\": \"fixed\"}"
    } else {
        "Approved. {\"approved\": true}"
    })
}

/// `reply` with the `usage` of a call of `input` and `output` tokens.
fn with_usage(mut reply: Value, input: u64, output: u64) -> Value {
    reply["usage"] = json!({"prompt_tokens": input, "completion_tokens": output});
    reply
}

/// The events `run --json` printed, one per line.
pub fn json_events(stdout: &str) -> Vec<Value> {
    stdout.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

const KEY: &str = "sk-test-secret-0123456789";

pub fn config(env: &Env, text: &str) -> Result<()> {
    std::fs::create_dir_all(env.home())?;
    std::fs::write(env.home().join("config.yaml"), text)?;
    Ok(())
}

/// Every file under the home, as text (lossy), for leak checks.
fn all_home_text(env: &Env) -> Result<String> {
    let mut text = String::new();
    let mut dirs = vec![env.home()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_none_or(|e| e != "sock") {
                text.push_str(&String::from_utf8_lossy(&std::fs::read(&path)?));
            }
        }
    }
    Ok(text)
}

#[test]
fn the_key_comes_from_the_command_that_runs_the_thread_not_the_worker() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    let llm = MockLlm::start(Box::new(|_, body| (200, by_role(body), Duration::ZERO)))?;
    config(
        &env,
        &format!(
            "agents:\n  local:\n    kind: openai\n    base_url: {}\n    model: m\n    api_key_env: UNCAGED_TEST_KEY\n",
            llm.base_url
        ),
    )?;
    // A worker started from a shell without the key, kept alive by a thread that waits.
    let gate = env.dir.path().join("gate");
    let held = env
        .write_script("held.sh", format!("#!/bin/sh\n{}\necho ok\n", crate::sh_wait_for(&gate)))?;
    let spec = format!("command:{}", held.display());
    env.ok(&["run", "solve-issue", "-p", "hold", "--agent", &spec, "--detach"])?;
    crate::wait_until("the worker runs", || {
        Ok(env.json(&["ps"])?.as_array().is_some_and(|a| a.len() == 1))
    })?;
    let worker = env.json(&["ps"])?[0]["pid"].clone();
    // Two commands with the key exported after the worker started, then changed.
    for key in ["sk-first-0000", "sk-second-1111"] {
        let run = env.run_with(
            &["run", "solve-issue", "-p", "x", "--agent", "local"],
            &[("UNCAGED_TEST_KEY", key)],
        )?;
        assert_eq!(run.code, 0, "{run:?}");
        assert!(run.stdout.contains(&format!("in worker {worker}")), "{}", run.stdout);
    }
    let sent: Vec<String> =
        llm.seen().into_iter().map(|s| s.authorization.unwrap_or_default()).collect();
    assert_eq!(sent.len(), 6, "{sent:?}");
    assert!(sent[..3].iter().all(|a| a == "Bearer sk-first-0000"), "{sent:?}");
    assert!(sent[3..].iter().all(|a| a == "Bearer sk-second-1111"), "{sent:?}");
    std::fs::write(&gate, "")?;
    Ok(())
}

// Through the CLI only: each of these runs twice, on a home directory (`…::files`) and on a
// fresh PostgreSQL database (`…::postgres`). A test added here covers both stores.
on_both_stores! {
#[test]
fn a_client_error_is_not_retried() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    let llm = MockLlm::start(Box::new(|_, _| (401, json!({"error": "bad key"}), Duration::ZERO)))?;
    config(
        &env,
        &format!(
            "agent: local\nagents:\n  local:\n    kind: openai\n    base_url: {}\n    model: m\n",
            llm.base_url
        ),
    )?;
    let run = env.run(&["run", "solve-issue", "-p", "x"])?;
    assert_eq!(run.code, 1, "{run:?}");
    assert_eq!(llm.seen().len(), 1);
    assert!(run.stdout.contains("HTTP 401"), "{}", run.stdout);
    Ok(())
}

#[test]
fn a_command_agent_exiting_75_is_retried() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let marker = env.dir.path().join("tried");
    let flaky = env.write_script(
        "flaky.sh",
        format!("#!/bin/sh\nif [ ! -f {m} ]; then touch {m}; echo 'busy' >&2; exit 75; fi\ncat > /dev/null\necho '{{\"steps\": [\"a\"], \"summary\": \"s\", \"approved\": true}}'\n", m = marker.display()),
    )?;
    config(
        &env,
        &format!(
            "agents:\n  flaky:\n    kind: command\n    command: {}\n    retry_delay: 10ms\n",
            flaky.display()
        ),
    )?;
    let run = env.run(&["run", "solve-issue", "-p", "x", "--agent", "flaky"])?;
    assert_eq!(run.code, 0, "{run:?}");
    let thread = thread_id_of(&run.stdout)?;
    let info = env.info_lines(&hash, &thread)?;
    assert!(info.iter().any(|l| {
        l["content"].as_str().unwrap().contains("failed with exit status 75: busy; retrying")
    }));
    Ok(())
}

#[test]
fn a_command_agent_that_times_out_fails_with_its_stderr() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let slow =
        env.write_script("slow.sh", "#!/bin/sh\necho 'loading the model' >&2\nexec sleep 30\n")?;
    config(
        &env,
        &format!(
            "agents:\n  slow:\n    kind: command\n    command: {}\n    timeout: 500ms\n    retries: 0\n",
            slow.display()
        ),
    )?;
    let run = env.run(&["run", "solve-issue", "-p", "x", "--agent", "slow"])?;
    assert_eq!(run.code, 1, "{run:?}");
    let lines = env.thread_lines(&hash, &thread_id_of(&run.stdout)?)?;
    let summary = lines.last().unwrap()["end"]["summary"].as_str().unwrap().to_string();
    assert!(
        summary.contains("timed out:")
            && summary.contains("did not answer within 500ms: loading the model"),
        "{summary}"
    );
    Ok(())
}

#[test]
fn a_key_echoed_by_the_server_is_redacted_from_everything_recorded() -> Result<()> {
    const KEY: &str = "sk-echoed-secret-4242";
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let llm = MockLlm::start(Box::new(|_, _| {
        let message = format!("invalid credentials: Authorization: Bearer {KEY}");
        (401, json!({"error": {"message": message}}), Duration::ZERO)
    }))?;
    config(
        &env,
        &format!(
            "agent: local\nagents:\n  local:\n    kind: openai\n    base_url: {}\n    model: m\n    api_key_env: UNCAGED_TEST_KEY\n",
            llm.base_url
        ),
    )?;
    let run = env.run_with(&["run", "solve-issue", "-p", "x"], &[("UNCAGED_TEST_KEY", KEY)])?;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(!run.stdout.contains(KEY) && !run.stderr.contains(KEY), "{run:?}");
    assert!(!all_home_text(&env)?.contains(KEY), "the key reached a file under the home");
    let lines = env.thread_lines(&hash, &thread_id_of(&run.stdout)?)?;
    let summary = lines.last().unwrap()["end"]["summary"].as_str().unwrap().to_string();
    assert!(summary.contains("Bearer [redacted]"), "{summary}");
    Ok(())
}

#[test]
fn a_rate_limit_is_retried_after_a_backoff() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let llm = MockLlm::start(Box::new(|n, body| match n {
        1 => (429, json!({"error": {"message": "slow down"}}), Duration::ZERO),
        _ => (200, by_role(body), Duration::ZERO),
    }))?;
    config(
        &env,
        &format!(
            "agent: local\nagents:\n  local:\n    kind: openai\n    base_url: {}\n    model: m\n    retries: 3\n    retry_delay: 300ms\n",
            llm.base_url
        ),
    )?;
    let run = env.run(&["run", "solve-issue", "-p", "x"])?;
    assert_eq!(run.code, 0, "{run:?}");
    let seen = llm.seen();
    assert_eq!(seen.len(), 4, "one retry, then one call per role");
    let waited = seen[1].at - seen[0].at;
    assert!(
        waited >= Duration::from_millis(300),
        "retried after {waited:?}, before the 300ms backoff"
    );
    let thread = thread_id_of(&run.stdout)?;
    let info = env.info_text(&hash, &thread)?;
    assert!(
        info.contains("attempt 1/4 failed")
            && info.contains("(transient)")
            && info.contains("HTTP 429"),
        "{info}"
    );
    assert!(info.contains("retrying in 300ms"), "{info}");
    Ok(())
}

#[test]
fn a_rate_limit_with_retry_after_is_retried_when_the_server_says() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let llm = MockLlm::start_with_header(
        Box::new(|n, body| match n {
            1 => (429, json!({"error": {"message": "slow down"}}), Duration::ZERO),
            _ => (200, by_role(body), Duration::ZERO),
        }),
        Some("Retry-After: 1"),
    )?;
    // The binding's own delay is far longer than what the server asks for.
    config(
        &env,
        &format!(
            "agent: local\nagents:\n  local:\n    kind: openai\n    base_url: {}\n    model: m\n    retries: 3\n    retry_delay: 10m\n",
            llm.base_url
        ),
    )?;
    let run = env.run(&["run", "solve-issue", "-p", "x"])?;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(llm.seen().len(), 4, "one retry, then one call per role");
    let thread = thread_id_of(&run.stdout)?;
    let info = env.info_text(&hash, &thread)?;
    assert!(info.contains("HTTP 429") && info.contains("retrying in 1s"), "{info}");
    Ok(())
}

#[test]
fn a_slow_server_times_out() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let llm = MockLlm::start(Box::new(|_, body| (200, by_role(body), Duration::from_secs(5))))?;
    config(
        &env,
        &format!(
            "agent: local\nagents:\n  local:\n    kind: openai\n    base_url: {}\n    model: m\n    timeout: 300ms\n    retries: 1\n    retry_delay: 10ms\n",
            llm.base_url
        ),
    )?;
    let run = env.run(&["run", "solve-issue", "-p", "x"])?;
    assert_eq!(run.code, 1, "{run:?}");
    let lines = env.thread_lines(&hash, &thread_id_of(&run.stdout)?)?;
    let summary = lines.last().unwrap()["end"]["summary"].as_str().unwrap().to_string();
    assert!(
        summary.contains("timed out: POST") && summary.contains("(after 2 attempts)"),
        "{summary}"
    );
    Ok(())
}

/// The usage an OpenAI-compatible endpoint reports, and a command agent's `usage` field, are
/// recorded with each step (kept in the journal, so a replay counts them too), added up per
/// thread, and priced by `prices:`.
#[test]
fn usage_is_recorded_per_step_added_up_per_thread_and_priced() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    let llm = MockLlm::start(Box::new(|_, body| {
        let mut reply = by_role(body);
        reply["model"] = json!("mock-model-2025-01-01");
        reply["usage"] = json!({"prompt_tokens": 1000, "completion_tokens": 200,
            "total_tokens": 1200, "prompt_tokens_details": {"cached_tokens": 400}});
        (200, reply, Duration::ZERO)
    }))?;
    let reviewer = env.write_script(
        "reviewer.sh",
        "#!/bin/sh\ncat >/dev/null\necho '{\"content\": \"LGTM\", \"meta\": {\"approved\": true}, \"usage\": {\"input_tokens\": 50, \"output_tokens\": 5, \"model\": \"house-model\"}}'\n",
    )?;
    config(
        &env,
        &format!(
            "agent: local\nagents:\n  local:\n    kind: openai\n    base_url: {}\n    model: mock-model\n\
             roles:\n  reviewer: review\nprices:\n  mock-model: {{input: 2.0, output: 10.0, cached_input: 1.0}}\n",
            llm.base_url
        ),
    )?;
    let mut text = std::fs::read_to_string(env.home().join("config.yaml"))?;
    text = text.replace(
        "roles:",
        &format!("  review:\n    kind: command\n    command: {}\nroles:", reviewer.display()),
    );
    std::fs::write(env.home().join("config.yaml"), text)?;
    let run = env.run(&["run", "solve-issue", "-p", "Fix the crash", "--json"])?;
    assert_eq!(run.code, 0, "{run:?}");
    let events = json_events(&run.stdout);
    let id = events[0]["thread"].as_str().unwrap().to_string();
    let record = env.json(&["thread", &id])?;
    let steps = record["steps"].as_array().unwrap();
    // 600 fresh tokens at $2/M, 400 cached at $1/M, 200 out at $10/M: $0.0036 a call.
    let priced = json!({"inputTokens": 1000, "outputTokens": 200, "cachedTokens": 400,
        "calls": 1, "model": "mock-model", "costUsd": 0.0036});
    assert_eq!(steps[0]["usage"], priced, "{record}");
    assert_eq!(steps[1]["usage"], priced);
    assert_eq!(
        steps[2]["usage"],
        json!({"inputTokens": 50, "outputTokens": 5, "calls": 1, "model": "house-model"})
    );
    let total = &record["usage"];
    assert_eq!((total["inputTokens"].clone(), total["outputTokens"].clone(), total["calls"].clone()),
        (json!(2050), json!(405), json!(3)));
    let cost = total["costUsd"].as_f64().unwrap();
    assert!((cost - 0.0072).abs() < 1e-9, "{cost}");
    // The `--json` step events carry it, and `thread` says it in a line.
    let step_events: Vec<&Value> = events.iter().filter(|e| e["type"] == "step").collect();
    assert_eq!(step_events[0]["step"]["usage"], priced);
    let shown = env.ok(&["thread", &id])?;
    assert!(shown.contains("usage: 2050 tokens in (800 cached), 405 out, $0.0072"), "{shown}");
    // The listing says what each thread spent, from the summary the store keeps.
    let listed = env.ok(&["threads"])?;
    let row = listed.lines().find(|l| l.contains(&id[..8])).unwrap_or_default();
    assert!(listed.starts_with("THREAD") && listed.contains("TOKENS") && listed.contains("COST"), "{listed}");
    assert!(row.contains(" 2455 ") && row.contains("$0.0072"), "{listed}");
    let listed = env.json(&["threads"])?;
    assert_eq!((listed[0]["tokens"].clone(), listed[0]["costUsd"].clone()), (json!(2455), total["costUsd"].clone()));
    Ok(())
}

/// A budget pauses a thread before the agent call that would go over it, keeping every step
/// and journaled call; `resume --raise-budget` continues it, and no call is made twice.
#[test]
fn a_budget_pauses_a_thread_and_a_raise_resumes_it() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    let calls = env.dir.path().join("calls");
    let agent = env.write_script(
        "agent.sh",
        format!(
            "#!/bin/sh\ninput=$(cat)\necho x >> {calls}\n\
             case \"$input\" in\n  *'\"name\":\"reviewer\"'*) meta='{{\"approved\": true}}' ;;\n  \
             *'\"name\":\"planner\"'*) meta='{{\"steps\": [\"a\"]}}' ;;\n  *) meta='{{\"summary\": \"s\"}}' ;;\nesac\n\
             echo \"{{\\\"content\\\": \\\"ok\\\", \\\"meta\\\": $meta, \\\"usage\\\": {{\\\"input_tokens\\\": 80, \\\"output_tokens\\\": 20}}}}\"\n",
            calls = calls.display()
        ),
    )?;
    let agent = format!("command:{}", agent.display());
    let run = env.run(&["run", "solve-issue", "-p", "x", "--agent", &agent, "--max-tokens", "150", "--json"])?;
    let events = json_events(&run.stdout);
    let id = events[0]["thread"].as_str().unwrap().to_string();
    // Two calls spent 200 tokens: the third is not made.
    let record = env.json(&["thread", &id])?;
    assert_eq!(record["status"], "paused", "{run:?}");
    assert_eq!(record["paused"]["by"], "budget");
    let reason = record["paused"]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("200 tokens spent, of a budget of 150"), "{reason}");
    assert_eq!(record["steps"].as_array().unwrap().len(), 2);
    assert_eq!(std::fs::read_to_string(&calls)?.lines().count(), 2);
    // Resumed with more: it completes, and only the third call is made.
    let e = env.fails(&["resume", &id, "--raise-budget", "coins=5"], 64)?;
    assert!(e.contains("no budget `coins`"), "{e}");
    env.ok(&["resume", &id, "--raise-budget", "tokens=1000"])?;
    let record = env.json(&["thread", &id])?;
    assert_eq!(record["status"], "completed", "{record}");
    assert_eq!(record["start"]["parameters"]["options"]["budget"], json!({"maxTokens": 150}));
    assert_eq!(std::fs::read_to_string(&calls)?.lines().count(), 3);
    assert_eq!(record["usage"]["inputTokens"], 240);
    // A budget of agent calls, and one of time, pause it the same way.
    let run = env.run(&["run", "solve-issue", "-p", "y", "--agent", &agent, "--max-agent-calls", "1", "--json"])?;
    let events = json_events(&run.stdout);
    let id = events[0]["thread"].as_str().unwrap().to_string();
    let record = env.json(&["thread", &id])?;
    assert_eq!((record["paused"]["by"].clone(), record["steps"].as_array().unwrap().len()), (json!("budget"), 1));
    // A workflow's default budget in config.yaml, which a run's own limit replaces.
    config(&env, "budgets:\n  solve-issue: {max_agent_calls: 2, max_duration: 1h}\n")?;
    let run = env.run(&["run", "solve-issue", "-p", "z", "--agent", &agent, "--json"])?;
    let events = json_events(&run.stdout);
    let id = events[0]["thread"].as_str().unwrap().to_string();
    let record = env.json(&["thread", &id])?;
    assert_eq!(record["start"]["parameters"]["options"]["budget"], json!({"maxAgentCalls": 2, "maxDurationMs": 3_600_000}));
    assert_eq!((record["paused"]["by"].clone(), record["steps"].as_array().unwrap().len()), (json!("budget"), 2));
    let run = env.run(&["run", "solve-issue", "-p", "w", "--agent", &agent, "--max-agent-calls", "9"])?;
    assert_eq!(run.code, 0, "{run:?}");
    config(&env, "budgets:\n  solve-issue: {max_calls: 2}\n")?;
    let e = env.fails(&["run", "solve-issue", "-p", "v"], 65)?;
    assert!(e.contains("budgets.solve-issue.max_calls"), "{e}");
    Ok(())
}

#[test]
fn openai_agent_answers_every_role_and_the_key_stays_out_of_files() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let llm = MockLlm::start(Box::new(|_, body| (200, by_role(body), Duration::ZERO)))?;
    config(
        &env,
        &format!(
            "agent: local\nagents:\n  local:\n    kind: openai\n    base_url: {}\n    model: mock-model\n    api_key_env: UNCAGED_TEST_KEY\n    temperature: 0.2\n    max_tokens: 500\n",
            llm.base_url
        ),
    )?;
    let run =
        env.run_with(&["run", "solve-issue", "-p", "Fix the crash"], &[("UNCAGED_TEST_KEY", KEY)])?;
    assert_eq!(run.code, 0, "{run:?}");
    let lines = env.thread_lines(&hash, &thread_id_of(&run.stdout)?)?;
    assert_eq!(roles(&lines), ["planner", "developer", "reviewer"]);
    assert_eq!(lines[1]["meta"], json!({"steps": ["fix it"]}));

    let seen = llm.seen();
    assert_eq!(seen.len(), 3);
    let first = &seen[0].body;
    assert_eq!(first["model"], "mock-model");
    assert_eq!(first["temperature"], 0.2);
    assert_eq!(first["max_tokens"], 500);
    assert_eq!(first["messages"][0]["role"], "system");
    assert!(first["messages"][0]["content"].as_str().unwrap().contains("You are the planner"));
    let user = seen[2].body["messages"][1]["content"].as_str().unwrap();
    assert!(
        user.contains("# Task\n\nFix the crash") && user.contains("# Step 2: developer"),
        "{user}"
    );
    assert_eq!(seen[0].authorization.as_deref(), Some(format!("Bearer {KEY}").as_str()));
    assert!(!all_home_text(&env)?.contains(KEY), "the API key leaked into the home directory");
    Ok(())
}

#[test]
fn server_errors_exhaust_the_retries_and_fail_the_thread() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let llm = MockLlm::start(Box::new(|_, _| (500, json!({"error": "boom"}), Duration::ZERO)))?;
    config(
        &env,
        &format!(
            "agent: local\nagents:\n  local:\n    kind: openai\n    base_url: {}\n    model: m\n    retries: 2\n    retry_delay: 20ms\n",
            llm.base_url
        ),
    )?;
    let run = env.run(&["run", "solve-issue", "-p", "x"])?;
    assert_eq!(run.code, 1, "{run:?}");
    assert_eq!(llm.seen().len(), 3, "the first attempt and two retries");
    let lines = env.thread_lines(&hash, &thread_id_of(&run.stdout)?)?;
    let end = &lines.last().unwrap()["end"];
    assert_eq!(end["status"], "failed");
    let summary = end["summary"].as_str().unwrap();
    let endpoint = format!("POST {}/chat/completions returned HTTP 500", llm.base_url);
    assert!(summary.contains(&endpoint) && summary.contains("(after 3 attempts)"), "{summary}");
    Ok(())
}

#[test]
fn the_extractor_falls_back_when_structured_outputs_are_refused() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    let llm = MockLlm::start(Box::new(|_, body| match body["model"].as_str() {
        Some("extractor") if body.get("response_format").is_some() => {
            (400, json!({"error": {"message": "response_format is not supported"}}), Duration::ZERO)
        }
        Some("extractor") => (200, completion("{\"approved\": true}"), Duration::ZERO),
        _ if body["messages"][0]["content"].as_str().unwrap().contains("You are the reviewer") => {
            (200, completion("Fine by me."), Duration::ZERO)
        }
        _ => (200, by_role(body), Duration::ZERO),
    }))?;
    config(
        &env,
        &format!(
            "agent: local\nagents:\n  local:\n    kind: openai\n    base_url: {url}\n    model: agent\n  extract:\n    kind: openai\n    base_url: {url}\n    model: extractor\nextractor:\n  agent: extract\n",
            url = llm.base_url
        ),
    )?;
    let run = env.run(&["run", "solve-issue", "-p", "x"])?;
    assert_eq!(run.code, 0, "{run:?}");
    let extractions: Vec<_> =
        llm.seen().into_iter().filter(|s| s.body["model"] == "extractor").collect();
    assert_eq!(extractions.len(), 2);
    assert!(extractions[1].body.get("response_format").is_none());
    let system = extractions[1].body["messages"][0]["content"].as_str().unwrap();
    assert!(
        system.contains("valid against this JSON Schema") && system.contains("\"approved\""),
        "{system}"
    );
    Ok(())
}

#[test]
fn the_llm_extractor_repairs_an_invalid_answer() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let llm = MockLlm::start(Box::new(|_, body| {
        let reply = match body["model"].as_str() {
            // The extractor: first an answer that does not validate, then a valid one.
            Some("extractor") if body["messages"].as_array().unwrap().len() <= 2 => {
                with_usage(completion("{\"approved\": \"yes\"}"), 100, 10)
            }
            Some("extractor") => with_usage(completion("{\"approved\": true}"), 120, 5),
            // The reviewer answers in prose only.
            _ if body["messages"][0]["content"]
                .as_str()
                .unwrap()
                .contains("You are the reviewer") =>
            {
                completion("I have reviewed it and I am happy with it.")
            }
            _ => by_role(body),
        };
        (200, reply, Duration::ZERO)
    }))?;
    config(
        &env,
        &format!(
            "agent: local\nagents:\n  local:\n    kind: openai\n    base_url: {url}\n    model: agent\n  extract:\n    kind: openai\n    base_url: {url}\n    model: extractor\nextractor:\n  agent: extract\n  retries: 2\n",
            url = llm.base_url
        ),
    )?;
    let run = env.run(&["run", "solve-issue", "-p", "x"])?;
    assert_eq!(run.code, 0, "{run:?}");
    let lines = env.thread_lines(&hash, &thread_id_of(&run.stdout)?)?;
    assert_eq!(lines[3]["content"], "I have reviewed it and I am happy with it.");
    assert_eq!(lines[3]["meta"], json!({"approved": true}));
    // Both extraction calls cost tokens: the step's usage says so, as no agent call.
    assert_eq!(
        lines[3]["usage"],
        json!({"inputTokens": 220, "outputTokens": 15, "calls": 0, "model": "extractor"})
    );

    let extractions: Vec<_> =
        llm.seen().into_iter().filter(|s| s.body["model"] == "extractor").collect();
    assert_eq!(extractions.len(), 2);
    let format = &extractions[0].body["response_format"];
    assert_eq!(format["type"], "json_schema");
    assert_eq!(format["json_schema"]["schema"]["required"], json!(["approved"]));
    let retry = extractions[1].body["messages"].as_array().unwrap();
    assert_eq!(retry.last().unwrap()["role"], "user");
    assert!(
        retry.last().unwrap()["content"].as_str().unwrap().contains("is not valid"),
        "{retry:?}"
    );
    Ok(())
}
}
