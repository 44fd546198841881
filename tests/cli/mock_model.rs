//! A chat-completions endpoint on loopback that plans tool calls, for the durable-agent tests:
//! each request is answered with the turn a plan makes of what the model was sent so far, as
//! one JSON body or, when the request asks for a stream, as server-sent events written piece by
//! piece (HTTP/1.1 over a plain socket, flushed after each event, so a client sees each piece
//! as it is written).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use serde_json::{Value, json};

/// What the model says in one turn.
#[derive(Debug, Clone, Default)]
pub struct Turn {
    /// Its text; streamed in pieces of [`Turn::piece`] characters.
    pub content: Option<String>,
    /// The tools it calls: name, arguments.
    pub calls: Vec<(String, Value)>,
    /// Tokens in and out it reports.
    pub usage: (u64, u64),
    /// The pause before each streamed piece.
    pub pace: Duration,
    /// A file whose appearance the stream waits for before its text (none: at once).
    pub gate: Option<std::path::PathBuf>,
}

impl Turn {
    /// A turn that answers `text`, asking for no tool.
    pub fn answer(text: &str) -> Turn {
        Turn { content: Some(text.to_string()), usage: (100, 10), ..Turn::default() }
    }

    /// A turn that calls tool `name` with `arguments`.
    pub fn call(name: &str, arguments: Value) -> Turn {
        Turn::calls(&[(name, arguments)])
    }

    /// A turn that calls several tools at once.
    pub fn calls(calls: &[(&str, Value)]) -> Turn {
        Turn {
            calls: calls.iter().map(|(n, a)| (n.to_string(), a.clone())).collect(),
            usage: (100, 10),
            ..Turn::default()
        }
    }

    /// The same turn, saying `text` before its calls.
    pub fn saying(mut self, text: &str) -> Turn {
        self.content = Some(text.to_string());
        self
    }

    /// The same turn, streaming its text only once `gate` exists.
    pub fn gated(mut self, gate: &std::path::Path) -> Turn {
        self.gate = Some(gate.to_path_buf());
        self
    }

    /// The same turn, its streamed pieces `pace` apart.
    pub fn paced(mut self, pace: Duration) -> Turn {
        self.pace = pace;
        self
    }
}

/// Which turn a request asks for: 1 for the first, as many as the model has answered plus one.
pub fn turn_of(body: &Value) -> usize {
    messages(body).iter().filter(|m| m["role"] == "assistant").count() + 1
}

/// The messages a request sends.
pub fn messages(body: &Value) -> Vec<Value> {
    body["messages"].as_array().cloned().unwrap_or_default()
}

/// The tool results a request sends, in order: (call id, content).
pub fn tool_results(body: &Value) -> Vec<(String, String)> {
    messages(body)
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            let id = m["tool_call_id"].as_str().unwrap_or_default().to_string();
            (id, m["content"].as_str().unwrap_or_default().to_string())
        })
        .collect()
}

/// The names of the tools a request offers.
pub fn offered(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["function"]["name"].as_str().map(str::to_string))
        .collect()
}

type Plan = dyn Fn(&Value) -> Turn + Send + Sync;

/// The endpoint, stopped on drop.
pub struct MockModel {
    pub base_url: String,
    seen: Arc<Mutex<Vec<Value>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MockModel {
    /// Answers each request with `plan`'s turn for it.
    pub fn start(plan: impl Fn(&Value) -> Turn + Send + Sync + 'static) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let plan: Arc<Plan> = Arc::new(plan);
        let (seen_in, stop_in) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut calls = 0u64;
            while !stop_in.load(Ordering::SeqCst) {
                let stream = match listener.accept() {
                    Ok((stream, _)) => stream,
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                };
                let (seen, plan) = (seen_in.clone(), plan.clone());
                calls += 1;
                let id = calls;
                std::thread::spawn(move || {
                    let _ = serve(stream, &seen, &*plan, id);
                });
            }
        });
        Ok(MockModel {
            base_url: format!("http://127.0.0.1:{port}/v1"),
            seen,
            stop,
            thread: Some(thread),
        })
    }

    /// The bodies of the requests answered so far.
    pub fn seen(&self) -> Vec<Value> {
        self.seen.lock().unwrap().clone()
    }

    /// How many times turn `turn` was asked for.
    pub fn asked(&self, turn: usize) -> usize {
        self.seen().iter().filter(|b| turn_of(b) == turn).count()
    }
}

impl Drop for MockModel {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Reads one request, answers it, and closes the connection.
fn serve(stream: TcpStream, seen: &Mutex<Vec<Value>>, plan: &Plan, id: u64) -> Result<()> {
    stream.set_nonblocking(false)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse()?;
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    seen.lock().unwrap().push(body.clone());
    let turn = plan(&body);
    let mut out = stream;
    let calls: Vec<Value> = turn
        .calls
        .iter()
        .enumerate()
        .map(|(i, (name, arguments))| {
            json!({"id": format!("call_{id}_{i}"), "type": "function",
                "function": {"name": name, "arguments": arguments.to_string()}})
        })
        .collect();
    let usage = json!({"prompt_tokens": turn.usage.0, "completion_tokens": turn.usage.1});
    if body["stream"] != true {
        let mut message = json!({"role": "assistant", "content": turn.content});
        if !calls.is_empty() {
            message["tool_calls"] = json!(calls);
        }
        let reply = json!({"id": "x", "object": "chat.completion", "usage": usage,
            "choices": [{"index": 0, "message": message,
                "finish_reason": if calls.is_empty() { "stop" } else { "tool_calls" }}]})
        .to_string();
        write!(
            out,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{reply}",
            reply.len()
        )?;
        return Ok(out.flush()?);
    }
    // Server-sent events, each flushed; the body ends when the connection closes.
    write!(
        out,
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\
         Connection: close\r\n\r\n"
    )?;
    out.flush()?;
    let mut event = |chunk: Value| -> Result<()> {
        write!(out, "data: {chunk}\n\n")?;
        Ok(out.flush()?)
    };
    let delta = |delta: Value, finish: Value| {
        json!({"id": "x", "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    event(delta(json!({"role": "assistant"}), Value::Null))?;
    while let Some(gate) = turn.gate.as_ref().filter(|g| !g.exists()) {
        if !gate.parent().is_some_and(|dir| dir.exists()) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if let Some(content) = &turn.content {
        let chars: Vec<char> = content.chars().collect();
        for piece in chars.chunks(4) {
            std::thread::sleep(turn.pace);
            event(delta(json!({"content": piece.iter().collect::<String>()}), Value::Null))?;
        }
    }
    for (i, call) in calls.iter().enumerate() {
        // A call in two pieces: its id and name, then its arguments.
        let arguments = call["function"]["arguments"].as_str().unwrap_or_default();
        let (head, tail) = arguments.split_at(arguments.len() / 2);
        let first = json!({"index": i, "id": call["id"], "type": "function",
            "function": {"name": call["function"]["name"], "arguments": head}});
        event(delta(json!({"tool_calls": [first]}), Value::Null))?;
        let rest = json!({"index": i, "function": {"arguments": tail}});
        event(delta(json!({"tool_calls": [rest]}), Value::Null))?;
    }
    let finish = if calls.is_empty() { "stop" } else { "tool_calls" };
    event(delta(json!({}), json!(finish)))?;
    event(json!({"id": "x", "object": "chat.completion.chunk", "choices": [], "usage": usage}))?;
    write!(out, "data: [DONE]\n\n")?;
    Ok(out.flush()?)
}
