//! `serve` under attack, with real sockets: stalled connections by the thousand, thousands of
//! live views of one large thread, hundreds of answers at once, a failing poll, and the small
//! things (its own address, JSON errors, a cookie per port).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use crate::{Env, Serve, status, wait_until};

/// Raises this process's open-files limit to its hard limit: these tests hold thousands of
/// sockets.
fn many_descriptors() -> Result<()> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    limit.current = limit.maximum;
    setrlimit(Resource::Nofile, limit)?;
    Ok(())
}

/// The resident memory of process `pid`, in MiB.
fn rss_mib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).context("VmRSS")?;
    let kib: u64 = line.split_whitespace().nth(1).context("a number")?.parse()?;
    Ok(kib / 1024)
}

/// A plain HTTP/1.1 GET on `stream`; the status line of the answer.
fn get(addr: &str, path: &str) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let code = answer.split(' ').nth(1).context("a status")?.parse()?;
    Ok((code, answer))
}

/// Whether the server has closed `stream` (what it reads ends), within `wait`.
fn closed_by_server(stream: &mut TcpStream, wait: Duration) -> bool {
    let _ = stream.set_read_timeout(Some(wait));
    let mut buf = [0u8; 512];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => {
                return e.kind() != std::io::ErrorKind::WouldBlock
                    && e.kind() != std::io::ErrorKind::TimedOut;
            }
        }
    }
}

/// `n` connections to `addr` that began a request and never finish its headers: each holds
/// one of the server's connections until its header timeout.
fn hold_connections(addr: &str, n: usize) -> Result<Vec<TcpStream>> {
    (0..n)
        .map(|_| {
            let mut stream = TcpStream::connect(addr)?;
            write!(stream, "GET / HTTP/1.1\r\nHost: {addr}\r\n")?;
            Ok(stream)
        })
        .collect()
}

/// 1,100 connections that never finish their headers: a normal request is still answered, the
/// stalled ones are cut off after the header timeout, and past the cap new connections are
/// refused with a clear answer.
#[test]
fn stalled_connections_neither_starve_requests_nor_stay_open() -> Result<()> {
    many_descriptors()?;
    let env = Env::new()?;
    std::fs::create_dir_all(env.home())?;
    std::fs::write(
        env.home().join("config.yaml"),
        "serve:\n  header_timeout: 2s\n  idle_timeout: 3s\n  max_connections: 1500\n",
    )?;
    let serve = Serve::start(&env, &["--no-schedules"], &[])?;
    let addr = serve.addr.clone();
    let mut stalled: Vec<TcpStream> = (0..1100)
        .map(|_| {
            let mut stream = TcpStream::connect(&addr)?;
            write!(stream, "GET /api/v1/health HTTP/1.1\r\nHost: {addr}\r\nX-Slow: ")?;
            Ok(stream)
        })
        .collect::<Result<_>>()?;
    let started = Instant::now();
    let (code, _) = get(&addr, "/api/v1/health")?;
    let latency = started.elapsed();
    assert_eq!(code, 200);
    eprintln!("serve figure: a request under 1,100 stalled connections took {latency:?}");
    // Every stalled connection is cut off (header timeout 2 s; 60 s is a bound for a hung test).
    let deadline = Instant::now() + Duration::from_secs(60);
    for (i, stream) in stalled.iter_mut().enumerate() {
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        ensure!(closed_by_server(stream, left), "stalled connection {i} is still open");
    }
    // A connection that sends nothing at all is closed once idle.
    let mut quiet = TcpStream::connect(&addr)?;
    ensure!(closed_by_server(&mut quiet, Duration::from_secs(60)), "an idle connection stays open");
    drop(serve);

    // Past the cap, a new connection gets a 503 with the reason, at once.
    std::fs::write(env.home().join("config.yaml"), "serve:\n  max_connections: 20\n")?;
    let serve = Serve::start(&env, &["--no-schedules"], &[])?;
    let addr = serve.addr.clone();
    let _held = hold_connections(&addr, 20)?;
    std::thread::sleep(Duration::from_millis(200));
    let (code, answer) = get(&addr, "/api/v1/health")?;
    assert_eq!(code, 503, "{answer}");
    ensure!(
        answer.contains("limit of 20 connections") && answer.contains("application/json"),
        "{answer}"
    );
    // The API's error shape, `{"error": {"code", "message"}}` (at 4abdda5 `error` was text).
    let body: Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).context("a body")?)?;
    assert_eq!(body["error"]["code"], "too_many_connections", "{body}");
    ensure!(body["error"]["message"].as_str().is_some_and(|m| m.contains("limit of 20")), "{body}");
    Ok(())
}

/// Past the cap, a client whose request goes out after its 503 came (a slow client, or one
/// that writes its request in pieces) still reads the 503: the server reads what it sends
/// rather than answering it with a reset.
#[test]
fn a_refused_client_reads_its_503_whenever_it_sends_its_request() -> Result<()> {
    let env = Env::new()?;
    std::fs::create_dir_all(env.home())?;
    std::fs::write(env.home().join("config.yaml"), "serve:\n  max_connections: 2\n")?;
    let serve = Serve::start(&env, &["--no-schedules"], &[])?;
    let addr = serve.addr.clone();
    // Accepted in order: these two hold the cap.
    let _held = hold_connections(&addr, 2)?;
    let mut refused = TcpStream::connect(&addr)?;
    refused.set_read_timeout(Some(Duration::from_secs(30)))?;
    refused.peek(&mut [0u8; 1]).context("the answer arrives")?;
    for piece in ["GET /api/v1/health HTTP/1.1\r\n", &format!("Host: {addr}\r\n"), "\r\n"] {
        refused.write_all(piece.as_bytes()).with_context(|| format!("sending {piece:?}"))?;
        std::thread::yield_now();
    }
    refused.shutdown(std::net::Shutdown::Write)?;
    let mut answer = String::new();
    refused.read_to_string(&mut answer).context("reading the answer")?;
    ensure!(answer.starts_with("HTTP/1.1 503") && answer.contains("limit of 2"), "{answer}");
    Ok(())
}

/// 2,000 live views of one thread holding 2 MiB of steps: the thread is watched once, the
/// server's memory stays bounded while they watch and after they close, and each view still
/// hears of a change.
#[test]
fn two_thousand_live_views_of_a_large_thread_keep_memory_bounded() -> Result<()> {
    many_descriptors()?;
    let env = Env::new()?;
    env.add_solve_issue()?;
    // Each answer ~700 KB: three steps hold over 2 MiB.
    let agent = env.write_script(
        "big.sh",
        "#!/bin/sh\ninput=$(cat)\nhead -c 700000 /dev/zero | tr '\\0' x\necho\ncase \"$input\" in\n  *'\"role\":{\"name\":\"planner\"'*) echo '{\"steps\": [\"a\"]}' ;;\n  *'\"role\":{\"name\":\"developer\"'*) echo '{\"summary\": \"b\"}' ;;\n  *) echo '{\"approved\": true}' ;;\nesac\n",
    )?;
    let out = env.ok(&[
        "run",
        "solve-issue",
        "-p",
        "big",
        "--agent",
        &format!("command:{}", agent.display()),
    ])?;
    let thread = crate::thread_id_of(&out)?;
    let serve = Serve::start(&env, &["--no-schedules"], &[])?;
    let pid = serve.child.id();
    let addr = serve.addr.clone();
    let before = rss_mib(pid)?;
    let path = format!("/api/events?thread={thread}");
    let mut streams: Vec<TcpStream> = Vec::with_capacity(2000);
    for _ in 0..2000 {
        let mut stream = TcpStream::connect(&addr)?;
        write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n")?;
        streams.push(stream);
    }
    // Each stream hears the state of the thread once.
    for (i, stream) in streams.iter_mut().enumerate() {
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        let mut seen = Vec::new();
        let mut buf = [0u8; 1024];
        while !String::from_utf8_lossy(&seen).contains("event: change") {
            let n = stream.read(&mut buf).with_context(|| format!("stream {i}"))?;
            ensure!(n > 0, "stream {i} ended: {}", String::from_utf8_lossy(&seen));
            seen.extend_from_slice(&buf[..n]);
        }
    }
    let watching = rss_mib(pid)?;
    drop(streams);
    std::thread::sleep(Duration::from_secs(2));
    let after = rss_mib(pid)?;
    eprintln!(
        "serve figure: RSS {before} MiB before, {watching} MiB at 2,000 streams, {after} MiB after they closed"
    );
    ensure!(
        watching < before + 300,
        "2,000 streams took the server from {before} to {watching} MiB"
    );
    ensure!(after < before + 300, "{after} MiB stayed after the streams closed (from {before})");
    Ok(())
}

/// 2,000 clients follow the API's event stream of one thread holding 2 MiB of steps, each
/// reading its first bytes and then nothing more: every client is sent the feed's own frames,
/// serialized once, so the server stays under 200 MiB above where it started, while they
/// follow and after they close (at 4abdda5 each kept a copy of every event it had not sent:
/// 4 GB).
#[test]
fn two_thousand_event_streams_of_a_large_thread_share_one_copy_of_it() -> Result<()> {
    many_descriptors()?;
    let env = Env::new()?;
    env.add_solve_issue()?;
    let agent = env.write_script(
        "big.sh",
        "#!/bin/sh\ninput=$(cat)\nhead -c 700000 /dev/zero | tr '\\0' x\necho\ncase \"$input\" in\n  *'\"role\":{\"name\":\"planner\"'*) echo '{\"steps\": [\"a\"]}' ;;\n  *'\"role\":{\"name\":\"developer\"'*) echo '{\"summary\": \"b\"}' ;;\n  *) echo '{\"approved\": true}' ;;\nesac\n",
    )?;
    let agent = format!("command:{}", agent.display());
    let thread =
        crate::thread_id_of(&env.ok(&["run", "solve-issue", "-p", "big", "--agent", &agent])?)?;
    let token = env.ok(&["token", "create", "--name", "reader", "--read-only"])?.trim().to_string();
    let serve = Serve::start(&env, &["--no-schedules"], &[])?;
    let (pid, addr) = (serve.child.id(), serve.addr.clone());
    let before = rss_mib(pid)?;
    let request = format!(
        "GET /api/v1/threads/{thread}/events HTTP/1.1\r\nHost: {addr}\r\n\
         Authorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n"
    );
    let mut streams: Vec<TcpStream> = Vec::with_capacity(2000);
    for i in 0..2000 {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        // A slow reader's window: what the kernel holds for it stays small.
        socket.set_recv_buffer_size(16 << 10)?;
        socket.connect(&addr.parse::<std::net::SocketAddr>()?.into())?;
        let mut stream: TcpStream = socket.into();
        stream.write_all(request.as_bytes())?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        let mut seen = Vec::new();
        let mut buf = [0u8; 1024];
        while !String::from_utf8_lossy(&seen).contains("event: step") {
            let n = stream.read(&mut buf).with_context(|| format!("stream {i}"))?;
            ensure!(n > 0, "stream {i} ended: {}", String::from_utf8_lossy(&seen));
            seen.extend_from_slice(&buf[..n]);
        }
        streams.push(stream);
    }
    // What the server holds for them once it can send no more: measured when it settles.
    let mut following = rss_mib(pid)?;
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        let now = rss_mib(pid)?;
        let settled = now.abs_diff(following) < 2;
        following = now;
        if settled {
            break;
        }
    }
    drop(streams);
    std::thread::sleep(Duration::from_secs(2));
    let after = rss_mib(pid)?;
    eprintln!(
        "serve figure: RSS {before} MiB before, {following} MiB at 2,000 event streams, {after} MiB after they closed"
    );
    ensure!(
        following < before + 200,
        "2,000 event streams took the server from {before} to {following} MiB"
    );
    ensure!(after < before + 200, "{after} MiB stayed after the streams closed (from {before})");
    Ok(())
}

/// Hundreds of answers sent at once over HTTP to a waiting thread: exactly one is accepted, it
/// is the one the thread uses, and the only one journaled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_concurrent_answers_accept_exactly_one() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let serve = Serve::start(&env, &["--no-schedules"], &[])?;
    let base = format!("http://{}", serve.addr);
    let http = uncaged_workflow::http::client_builder().build()?;
    let html = http.get(format!("{base}/")).send().await?.text().await?;
    let csrf = crate::web::csrf_of(&html)?;
    let thread = env
        .ok(&["run", "solve-issue", "-p", "y", "--agent-for", "reviewer=human", "--detach"])?
        .trim()
        .to_string();
    wait_until("it waits", || Ok(status(&env, &thread)? == "waiting"))?;
    let answers = (0..200).map(|i| {
        let request = http
            .post(format!("{base}/api/v1/threads/{thread}/answer"))
            .header("x-uncaged-csrf", &csrf)
            .json(&json!({"text": format!("answer {i} {{\"approved\": true}}")}));
        async move {
            let response = request.send().await?;
            Ok::<_, anyhow::Error>((i, response.status().as_u16()))
        }
    });
    let results = futures::future::join_all(answers).await;
    let mut accepted = Vec::new();
    for result in results {
        let (i, code) = result?;
        match code {
            200 => accepted.push(i),
            409 => {}
            other => anyhow::bail!("answer {i}: {other}"),
        }
    }
    assert_eq!(accepted.len(), 1, "accepted: {accepted:?}");
    wait_until("it completes", || Ok(status(&env, &thread)? == "completed"))?;
    let used = format!("answer {} {{\"approved\": true}}", accepted[0]);
    let review = env.thread_lines(&hash, &thread)?.into_iter().find(|l| l["role"] == "reviewer");
    assert_eq!(review.map(|r| r["content"].clone()), Some(json!(used)));
    let journaled =
        env.calls(&hash, &thread)?.into_iter().filter(|c| c["role"] == "reviewer").count();
    assert_eq!(journaled, 1);
    Ok(())
}

/// A poll whose command fails is backed off, and a live view is sent events for changes only:
/// not one per pass.
#[test]
fn a_failing_poll_is_backed_off_and_live_views_hear_only_changes() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    env.ok(&[
        "schedule",
        "add",
        "solve-issue",
        "--poll",
        "false",
        "--every",
        "1s",
        "--diff",
        "any-change",
        "--name",
        "broken",
    ])?;
    let serve = Serve::start(&env, &[], &[])?;
    let addr = serve.addr.clone();
    wait_until("the poll failed once", || {
        Ok(env.json(&["schedule", "list"])?[0]["lastError"].is_string())
    })?;
    let mut stream = TcpStream::connect(&addr)?;
    write!(
        stream,
        "GET /api/events HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n"
    )?;
    stream.set_read_timeout(Some(Duration::from_millis(200)))?;
    let until = Instant::now() + Duration::from_secs(4);
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < until {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
    }
    let events = String::from_utf8_lossy(&seen).matches("event: change").count();
    // The state at once, and at most the backed-off check's (the next is 2 s, then 4 s away).
    ensure!(events <= 2, "{events} events in 4 s for a schedule that does not change");
    let listed = env.json(&["schedule", "list"])?;
    let failures = listed[0]["lastError"].as_str().unwrap_or_default().to_string();
    ensure!(failures.contains("false"), "{listed}");
    Ok(())
}

/// `--listen` takes any loopback address or a host name, and answers to it; a bad JSON body
/// gets the API's JSON error; the token's cookie is named for the port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn its_own_address_json_errors_and_a_cookie_per_port() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    let serve = Serve::start_on(&env, "127.0.0.2:0", &["--no-schedules"], &[])?;
    let (code, _) = get(&serve.addr, "/api/v1/health")?;
    assert_eq!(code, 200, "answers at its own address");
    drop(serve);
    let serve = Serve::start_on(&env, "localhost:0", &["--no-schedules"], &[])?;
    let port = serve.addr.rsplit(':').next().context("port")?.to_string();
    let mut stream = TcpStream::connect(&serve.addr)?;
    write!(
        stream,
        "GET /api/v1/health HTTP/1.1\r\nHost: localhost:{port}\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    ensure!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    drop(serve);

    let token = "abcdefghijklmnop0123";
    let serve = Serve::start(&env, &["--no-schedules", "--token", token], &[])?;
    let base = format!("http://{}", serve.addr);
    let http = uncaged_workflow::http::client_builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let visit = http.get(format!("{base}/?token={token}")).send().await?;
    let cookie = visit.headers()["set-cookie"].to_str()?.to_string();
    let port = serve.addr.rsplit(':').next().context("port")?;
    ensure!(cookie.starts_with(&format!("uncaged_workflow_token_{port}=")), "{cookie}");
    let html = http.get(format!("{base}/")).bearer_auth(token).send().await?.text().await?;
    let csrf = crate::web::csrf_of(&html)?;
    let thread = env.ok(&["thread", "start", "solve-issue", "-p", "x"])?.trim().to_string();
    let url = format!("{base}/api/v1/threads/{thread}/fork");
    for (body, content_type, want) in [
        ("{not json", "application/json", 400),
        ("{\"at\": 1}", "text/plain", 415),
        ("{\"at\": \"one\"}", "application/json", 422),
    ] {
        let response = http
            .post(&url)
            .bearer_auth(token)
            .header("x-uncaged-csrf", &csrf)
            .header("content-type", content_type)
            .body(body)
            .send()
            .await?;
        assert_eq!(response.status().as_u16(), want, "{body}");
        let kind = response.headers()["content-type"].to_str()?.to_string();
        ensure!(kind.starts_with("application/json"), "{body}: {kind}");
        let error: Value = response.json().await?;
        ensure!(
            error["error"]["code"].is_string() && error["error"]["message"].is_string(),
            "{error}"
        );
    }
    Ok(())
}
