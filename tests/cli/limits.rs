//! Provider limits shared by every thread of every worker: a fleet of threads against a mock
//! provider that enforces its own limits (it counts requests, tokens and calls in flight on the
//! test's clock and answers 429 past them, trusting nothing the host counts), on both stores.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use crate::llm::{by_role, config};
use crate::{Env, Serve, status, wait_until};

/// The limits the mock provider enforces itself, over a minute of the test's clock.
#[derive(Debug, Clone, Copy, Default)]
struct Enforced {
    requests_per_minute: Option<usize>,
    tokens_per_minute: Option<u64>,
    concurrent: Option<usize>,
    /// Answer the first request with 429 and `Retry-After` this many seconds.
    retry_after_once: Option<u64>,
    /// Never answer the first request (its caller is killed while it is in flight).
    hold_first: bool,
}

/// What the provider answered one request.
#[derive(Debug, Clone)]
struct Answered {
    /// When it came, on the test's clock (ms).
    at: u64,
    status: u16,
    tokens: u64,
}

/// A chat-completions provider on loopback enforcing [`Enforced`], stopped on drop.
struct LimitedProvider {
    base_url: String,
    answered: Arc<Mutex<Vec<Answered>>>,
    stop: Arc<AtomicBool>,
    /// The client of the held first request is gone.
    client_gone: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LimitedProvider {
    fn start(env: &Env, enforced: Enforced) -> Result<Self> {
        let server = tiny_http::Server::http("127.0.0.1:0").map_err(|e| anyhow::anyhow!("{e}"))?;
        let port = server.server_addr().to_ip().unwrap().port();
        let answered = Arc::new(Mutex::new(Vec::<Answered>::new()));
        let in_flight = Arc::new(Mutex::new(0usize));
        let stop = Arc::new(AtomicBool::new(false));
        let client_gone = Arc::new(AtomicBool::new(false));
        let clock = env.clock_file_path();
        let (answered_in, stop_in) = (answered.clone(), stop.clone());
        let client_gone_in = client_gone.clone();
        let thread = std::thread::spawn(move || {
            while !stop_in.load(Ordering::SeqCst) {
                let Ok(Some(mut request)) = server.recv_timeout(Duration::from_millis(20)) else {
                    continue;
                };
                let mut text = String::new();
                let _ = request.as_reader().read_to_string(&mut text);
                let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                let now: u64 = std::fs::read_to_string(&clock)
                    .ok()
                    .and_then(|t| t.trim().parse().ok())
                    .unwrap_or(0);
                // The provider's own count of a request: its messages' text, a token for four
                // bytes, and the twenty tokens of every answer.
                let tokens = (body["messages"].to_string().len() as u64).div_ceil(4) + 20;
                let refusal = {
                    let answered = answered_in.lock().unwrap();
                    let window: Vec<&Answered> = answered
                        .iter()
                        .filter(|a| a.status == 200 && a.at + 60_000 > now)
                        .collect();
                    let used: u64 = window.iter().map(|a| a.tokens).sum();
                    let flying = *in_flight.lock().unwrap();
                    if enforced.retry_after_once.is_some() && answered.is_empty() {
                        Some(enforced.retry_after_once)
                    } else if enforced.requests_per_minute.is_some_and(|max| window.len() >= max)
                        || enforced.tokens_per_minute.is_some_and(|max| used + tokens > max)
                        || enforced.concurrent.is_some_and(|max| flying >= max)
                    {
                        Some(None)
                    } else {
                        None
                    }
                };
                let status = if refusal.is_some() { 429 } else { 200 };
                answered_in.lock().unwrap().push(Answered { at: now, status, tokens });
                if refusal.is_none() {
                    *in_flight.lock().unwrap() += 1;
                }
                let (in_flight, client_gone) = (in_flight.clone(), client_gone_in.clone());
                let held = enforced.hold_first && answered_in.lock().unwrap().len() == 1;
                std::thread::spawn(move || {
                    if held {
                        // Held until its client is gone (the test kills it, then says so):
                        // then the call no longer counts as in flight, as a provider sees a
                        // connection close.
                        while !client_gone.load(Ordering::SeqCst) {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        *in_flight.lock().unwrap() -= 1;
                        return;
                    }
                    let response = match refusal {
                        Some(retry_after) => {
                            let mut response = tiny_http::Response::from_string(
                                json!({"error": {"message": "rate limit reached"}}).to_string(),
                            )
                            .with_status_code(429);
                            if let Some(seconds) = retry_after {
                                response.add_header(
                                    format!("Retry-After: {seconds}")
                                        .parse::<tiny_http::Header>()
                                        .unwrap(),
                                );
                            }
                            response
                        }
                        None => {
                            // A call takes a while: calls overlap, and `concurrent` matters.
                            std::thread::sleep(Duration::from_millis(150));
                            let mut reply = by_role(&body);
                            reply["usage"] =
                                json!({"prompt_tokens": tokens - 20, "completion_tokens": 20});
                            *in_flight.lock().unwrap() -= 1;
                            tiny_http::Response::from_string(reply.to_string())
                        }
                    };
                    let _ = request.respond(response.with_header(
                        "Content-Type: application/json".parse::<tiny_http::Header>().unwrap(),
                    ));
                });
            }
        });
        Ok(LimitedProvider {
            base_url: format!("http://127.0.0.1:{port}/v1"),
            answered,
            stop,
            client_gone,
            thread: Some(thread),
        })
    }

    fn answered(&self) -> Vec<Answered> {
        self.answered.lock().unwrap().clone()
    }

    fn refused(&self) -> usize {
        self.answered().iter().filter(|a| a.status == 429).count()
    }
}

impl Drop for LimitedProvider {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.client_gone.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The value of series `name` of the limit `mock-limit` in `/metrics`' text.
fn metric(metrics: &str, name: &str) -> Result<f64> {
    let prefix = format!("uncaged_workflow_{name}{{limit=\"mock-limit\"}} ");
    let line = metrics.lines().find(|l| l.starts_with(&prefix));
    Ok(line.with_context(|| format!("{prefix} in {metrics}"))?[prefix.len()..].parse()?)
}

/// The body of `GET path` from a server of the test's on `addr` (plain HTTP/1.0).
fn get(addr: &str, path: &str) -> Result<String> {
    get_with(addr, path, "")
}

/// [`get`], with `headers` (lines ending in CRLF).
fn get_with(addr: &str, path: &str, headers: &str) -> Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr)?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n{headers}\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").context("an HTTP response")?;
    ensure!(head.starts_with("HTTP/1.") && head.contains(" 200 "), "{head}");
    Ok(body.to_string())
}

/// A home with solve-issue on the test's clock, whose every role is asked of a provider
/// enforcing `enforced` through the limit `mock-limit` (`limit`, as config.yaml writes it).
fn on_a_limit(enforced: Enforced, limit: &str) -> Result<(Env, LimitedProvider)> {
    let env = Env::new()?;
    env.set_clock(1_000_000_000_000)?;
    env.add_solve_issue()?;
    let provider = LimitedProvider::start(&env, enforced)?;
    limited(&env, &provider, limit)?;
    Ok((env, provider))
}

/// A home whose every role is asked of the provider through the limit `mock-limit`.
fn limited(env: &Env, provider: &LimitedProvider, limit: &str) -> Result<()> {
    config(
        env,
        &format!(
            "agent: provider\nagents:\n  provider:\n    kind: openai\n    base_url: {}\n    model: m\n    max_tokens: 50\n    limit: mock-limit\nlimits:\n  mock-limit: {limit}\n",
            provider.base_url
        ),
    )
}

/// Starts `n` threads of solve-issue in the background; their ids.
fn start_threads(env: &Env, n: usize) -> Result<Vec<String>> {
    (0..n)
        .map(|i| {
            let out = env.ok(&["run", "solve-issue", "-p", &format!("issue {i}"), "--detach"])?;
            Ok(out.split_whitespace().find(|w| w.len() == 26).unwrap_or_default().to_string())
        })
        .collect()
}

/// The threads `ps` shows waiting for `limit`.
fn waiting_for(env: &Env, limit: &str) -> Result<usize> {
    let ps = env.json(&["ps"])?;
    Ok(ps.as_array().into_iter().flatten().filter(|t| t["waitingFor"] == limit).count())
}

fn all_completed(env: &Env, threads: &[String]) -> Result<bool> {
    for thread in threads {
        match status(env, thread)?.as_str() {
            "completed" => {}
            "failed" | "killed" | "interrupted" => {
                anyhow::bail!("thread {thread} ended {}", status(env, thread)?)
            }
            _ => return Ok(false),
        }
    }
    Ok(true)
}

on_both_stores! {
    /// Four threads of three calls each against a provider that allows six requests a minute
    /// and two at once: the first six go, the rest wait (shown as waiting for the limit) until
    /// the minute has passed, and the provider never has to say 429.
    #[test]
    fn a_fleet_of_threads_shares_one_limit_and_is_never_refused() -> Result<()> {
        let (env, provider) = on_a_limit(
            Enforced { requests_per_minute: Some(6), concurrent: Some(2), ..Default::default() },
            "{requests_per_minute: 6, concurrent: 2}",
        )?;
        let threads = start_threads(&env, 4)?;
        wait_until("six calls answered and the others waiting for the limit", || {
            Ok(provider.answered().len() == 6 && waiting_for(&env, "mock-limit")? > 0)
        })?;
        // Nothing more is sent while the minute lasts, however long it takes.
        std::thread::sleep(Duration::from_millis(800));
        ensure!(provider.answered().len() == 6, "{:?}", provider.answered());
        let ps = env.ok(&["ps"])?;
        ensure!(ps.contains("waiting for mock-limit"), "{ps}");
        // The listing of threads says so too, on a terminal, in JSON and in the API.
        let listed = env.ok(&["threads"])?;
        ensure!(listed.contains("waiting for mock-limit"), "{listed}");
        let listed = env.json(&["threads"])?;
        let waiting = |list: &Value| {
            list.as_array().into_iter().flatten().filter(|t| t["waitingFor"] == "mock-limit").count()
        };
        ensure!(waiting(&listed) >= 1, "{listed}");
        // The limit's use as Prometheus reads it, from the state every worker shares.
        let serve = Serve::start(&env, &["--token", "limits-test-token-0123"], &[])?;
        let bearer = "Authorization: Bearer limits-test-token-0123\r\n";
        let api: Value = serde_json::from_str(&get_with(&serve.addr, "/api/v1/threads", bearer)?)?;
        ensure!(waiting(&api["threads"]) >= 1, "{api}");
        let metrics = get_with(&serve.addr, "/metrics", bearer)?;
        let series = |name: &str| metric(&metrics, name);
        ensure!(series("limit_requests")? == 6.0 && series("limit_requests_served_total")? == 6.0);
        ensure!(series("limit_waiting")? >= 1.0 && series("limit_closed")? == 0.0, "{metrics}");
        env.advance(Duration::from_secs(61))?;
        wait_until("the next six calls", || Ok(provider.answered().len() == 12))?;
        wait_until("every thread completed", || all_completed(&env, &threads))?;
        ensure!(provider.refused() == 0, "the provider refused calls: {:?}", provider.answered());
        ensure!(provider.answered().len() == 12);
        let metrics = get_with(&serve.addr, "/metrics", bearer)?;
        ensure!(
            metrics.contains("uncaged_workflow_limit_requests_served_total{limit=\"mock-limit\"} 12"),
            "{metrics}"
        );
        // Those held over the minute waited the 61 s the clock moved, at least.
        ensure!(metric(&metrics, "limit_wait_seconds_total")? >= 61.0, "{metrics}");
        Ok(())
    }

    /// A provider's 429 with `Retry-After: 5` closes the limit for every thread: no call of it
    /// is sent until the five seconds (of the test's clock) have passed.
    #[test]
    fn a_providers_retry_after_holds_every_thread_of_the_limit() -> Result<()> {
        let (env, provider) = on_a_limit(
            Enforced { retry_after_once: Some(5), ..Default::default() },
            "{requests_per_minute: 1000, concurrent: 1}",
        )?;
        let threads = start_threads(&env, 3)?;
        wait_until("the 429 and every thread waiting for the limit", || {
            Ok(provider.refused() == 1 && waiting_for(&env, "mock-limit")? == 3)
        })?;
        std::thread::sleep(Duration::from_millis(800));
        ensure!(provider.answered().len() == 1, "sent while closed: {:?}", provider.answered());
        env.advance(Duration::from_secs(4))?;
        std::thread::sleep(Duration::from_millis(500));
        ensure!(provider.answered().len() == 1, "sent before the 5 s: {:?}", provider.answered());
        env.advance(Duration::from_secs(2))?;
        wait_until("every thread completed", || all_completed(&env, &threads))?;
        let answered = provider.answered();
        ensure!(answered.len() == 1 + 9 && provider.refused() == 1, "{answered:?}");
        let reopened = answered[0].at + 5_000;
        ensure!(answered[1..].iter().all(|a| a.at >= reopened), "{answered:?}");
        Ok(())
    }

    /// `kill -9` of a worker whose call is in flight: the call's place in the limit is given
    /// back when its lease (15 s of the test's clock) runs out, not before, and the thread,
    /// resumed, completes without the provider ever refusing a call.
    #[test]
    fn a_killed_workers_call_gives_its_place_back_by_lease() -> Result<()> {
        let (env, provider) = on_a_limit(
            Enforced { concurrent: Some(1), hold_first: true, ..Default::default() },
            "{concurrent: 1}",
        )?;
        // A short lease of the thread itself on a database, so that it can be resumed soon.
        let lease = [("UNCAGED_WORKFLOW_LEASE_MS", "1000")];
        let run = env.run_with(&["run", "solve-issue", "-p", "x", "--detach"], &lease)?;
        ensure!(run.code == 0, "{run:?}");
        let thread = run.stdout.split_whitespace().find(|w| w.len() == 26).unwrap_or_default();
        wait_until("the first call in flight", || Ok(provider.answered().len() == 1))?;
        env.kill_the_worker()?;
        provider.client_gone.store(true, Ordering::SeqCst);
        wait_until("the thread resumed by a new worker", || {
            Ok(env.run_with(&["resume", thread, "--detach"], &lease)?.code == 0)
        })?;
        wait_until("its call waiting for the dead worker's place", || {
            Ok(waiting_for(&env, "mock-limit")? == 1)
        })?;
        std::thread::sleep(Duration::from_millis(800));
        ensure!(provider.answered().len() == 1, "sent before the lease ran out");
        env.advance(Duration::from_secs(16))?;
        wait_until("the thread completed", || all_completed(&env, &[thread.to_string()]))
            .with_context(|| {
                format!(
                    "{:?}\n{:?}\n{}",
                    provider.answered(),
                    env.run(&["ps", "--json"]).map(|r| r.stdout),
                    std::fs::read_to_string(env.home().join("limits/mock-limit.json"))
                        .unwrap_or_default()
                )
            })?;
        // The cut call was never answered, so it was asked again; every other once.
        ensure!(provider.answered().len() == 4 && provider.refused() == 0, "{:?}", provider.answered());
        Ok(())
    }

    /// A thread waiting for its turn in a limit can be paused, and goes on when resumed.
    /// A thread waiting for a limit's capacity takes no worker slot: on a worker that runs one
    /// thread at a time, a thread that asks no provider runs to its end meanwhile.
    #[test]
    fn a_thread_waiting_for_a_limit_takes_no_worker_slot() -> Result<()> {
        let (env, provider) = on_a_limit(
            Enforced { requests_per_minute: Some(1), ..Default::default() },
            "{requests_per_minute: 1}",
        )?;
        let path = env.home().join("config.yaml");
        let text = std::fs::read_to_string(&path)?;
        std::fs::write(&path, text.replace("limits:\n", "limits:\n  max-threads: 1\n"))?;
        let waiting = start_threads(&env, 1)?;
        wait_until("the thread waiting for its second call", || {
            Ok(provider.answered().len() == 1 && waiting_for(&env, "mock-limit")? == 1)
        })?;
        let out = env.ok(&["run", "solve-issue", "-p", "offline", "--agent", "scripted"])?;
        ensure!(out.contains("completed"), "{out}");
        ensure!(waiting_for(&env, "mock-limit")? == 1, "the other still waits");
        env.advance(Duration::from_secs(61))?;
        wait_until("the next call", || Ok(provider.answered().len() == 2))?;
        env.advance(Duration::from_secs(61))?;
        wait_until("the waiting thread completed", || all_completed(&env, &waiting))?;
        ensure!(provider.refused() == 0);
        Ok(())
    }

    #[test]
    fn a_thread_waiting_for_a_limit_pauses_and_resumes() -> Result<()> {
        let (env, provider) = on_a_limit(
            Enforced { requests_per_minute: Some(1), ..Default::default() },
            "{requests_per_minute: 1}",
        )?;
        let threads = start_threads(&env, 1)?;
        let thread = &threads[0];
        wait_until("the thread waiting for its second call", || {
            Ok(provider.answered().len() == 1 && waiting_for(&env, "mock-limit")? == 1)
        })?;
        // Told by `thread`, and by the API the web view reads the thread from.
        ensure!(env.json(&["thread", thread])?["waitingFor"] == "mock-limit");
        let shown = env.ok(&["thread", thread])?;
        ensure!(shown.contains("waiting for its turn in provider limit mock-limit"), "{shown}");
        let serve = Serve::start(&env, &[], &[])?;
        let page = get(&serve.addr, "/")?;
        let csrf = page
            .split("name=\"csrf\" content=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .context("the page's csrf token")?;
        let api = get_with(
            &serve.addr,
            &format!("/api/v1/threads/{thread}"),
            &format!("x-uncaged-csrf: {csrf}\r\naccept: application/json\r\n"),
        )?;
        let api: Value = serde_json::from_str(&api)?;
        ensure!(api["working"]["waitingFor"] == "mock-limit", "{api}");
        drop(serve);
        env.ok(&["pause", thread])?;
        wait_until("the thread paused", || Ok(status(&env, thread)? == "paused"))?;
        ensure!(waiting_for(&env, "mock-limit")? == 0);
        ensure!(env.json(&["thread", thread])?["waitingFor"].is_null());
        env.advance(Duration::from_secs(61))?;
        env.ok(&["resume", thread, "--detach"])?;
        wait_until("the next call", || Ok(provider.answered().len() == 2))?;
        env.advance(Duration::from_secs(61))?;
        wait_until("the thread completed", || all_completed(&env, &threads))?;
        ensure!(provider.refused() == 0 && provider.answered().len() == 3);
        Ok(())
    }
}

#[test]
fn a_binding_naming_an_unknown_limit_is_refused_with_the_limits_there_are() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    config(
        &env,
        "agent: p\nagents:\n  p:\n    kind: openai\n    base_url: http://127.0.0.1:9/v1\n    model: m\n    limit: nope\nlimits:\n  memory: 64MiB\n  openai-main: {requests_per_minute: 5}\n",
    )?;
    let err = env.fails(&["run", "solve-issue", "-p", "x"], 65)?;
    ensure!(err.contains("agents.p.limit") && err.contains("openai-main"), "{err}");
    config(&env, "limits:\n  openai-main: {requests_per_minute: 0}\n")?;
    let err = env.fails(&["run", "solve-issue", "-p", "x"], 65)?;
    ensure!(err.contains("limits.openai-main") && err.contains("more than zero"), "{err}");
    config(&env, "limits:\n  openai-main: {requests_per_mintue: 5}\n")?;
    let err = env.fails(&["run", "solve-issue", "-p", "x"], 65)?;
    ensure!(err.contains("requests_per_mintue"), "{err}");
    Ok(())
}
