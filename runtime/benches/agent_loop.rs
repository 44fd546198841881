//! What durability costs a durable agent: the same loop of model turns and tool calls, its
//! entries journaled on disk (a synced write per turn, with the marks of the calls it starts;
//! the read-only tool's result unsynced, landing with the next turn's) and not journaled at all, on the same model — an endpoint on
//! loopback that answers after 1 ms — and the same MCP server (the test ledger server, over
//! stdio, from `target/mcp-venv`: `make mcp-servers`). Prints one JSON object per measurement;
//! `make bench` puts them in BENCHMARKS.md.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use uncaged_workflow::agents::{
    AgentContext, AgentFailure, CallTurns, OpenAiAgent, RoleRef, Secrets, TurnHost, tool_loop,
};
use uncaged_workflow::store::config::{AgentConfig, AgentKind, Config};
use uncaged_workflow::store::files::journal::FileCalls;
use uncaged_workflow::store::journal::{CallLoop, Journal};
use uncaged_workflow::store::tool_servers::ToolServer;

/// Model turns per call: each calls one read-only tool; then one answers.
const TURNS: usize = 50;
/// How long the model takes to answer.
const MODEL_MS: u64 = 1;

fn main() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = repo.join("target/mcp-venv/bin/python");
    if !python.exists() {
        eprintln!("agent_loop: {} is missing: run `make mcp-servers`", python.display());
        std::process::exit(2);
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let model = model_server().await;
        let dir = tempfile::tempdir_in(disk_dir()).unwrap();
        let ledger = dir.path().join("ledger");
        std::fs::write(&ledger, "one line\n").unwrap();
        // SAFETY: set before any thread of this program reads the environment.
        #[allow(unsafe_code)]
        unsafe {
            std::env::set_var("LEDGER_FILE", &ledger);
        }
        let server = ToolServer {
            command: Some(python.display().to_string()),
            args: vec![repo.join("tests/mcp/ledger_server.py").display().to_string()],
            env: vec!["LEDGER_FILE".into()],
            url: None,
            headers: BTreeMap::new(),
            oauth: None,
            allow: Some(vec!["read".into()]),
            approve: vec![],
            safe_to_repeat: vec![],
            timeout: None,
            max_result_bytes: None,
        };
        let kind = AgentKind::OpenAi {
            base_url: format!("http://{model}/v1"),
            model: "bench".into(),
            api_key_env: None,
            temperature: None,
            max_tokens: None,
            stream: false,
            max_turns: Some(TURNS as u32 + 1),
            tools: BTreeMap::from([("ledger".to_string(), server)]),
            limit: None,
        };
        let mut config = Config::default();
        let binding =
            AgentConfig { kind: kind.clone(), timeout: None, retries: None, retry_delay: None };
        config.agents.insert("coder".into(), binding);
        let secrets = Secrets::from_env(&config);
        let agent =
            OpenAiAgent::from_config(&kind, None, &secrets, None, &BTreeMap::new(), None).unwrap();
        // The journal on tmpfs too: what journaling costs besides the disk's syncs.
        let memory =
            tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap());
        let (mut journaled, mut in_memory, mut unjournaled) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..7 {
            for (dir, times) in [(dir.path(), &mut journaled), (memory.path(), &mut in_memory)] {
                let log = dir.join(format!("{round}.calls.jsonl"));
                let journal = Journal::new(Box::new(FileCalls::open(&log).unwrap())).unwrap();
                times.push(per_turn(&agent, &secrets, journal.loop_of(0)).await);
            }
            unjournaled.push(per_turn(&agent, &secrets, CallLoop::unjournaled()).await);
        }
        println!(
            "{}",
            json!({"bench": "agent_loop", "turns": TURNS, "model_ms": MODEL_MS,
                "journaled_us": journaled, "journaled_in_memory_us": in_memory,
                "unjournaled_us": unjournaled})
        );
    });
}

/// A directory on the disk the home usually lives on (fsync is real).
fn disk_dir() -> std::path::PathBuf {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    std::fs::create_dir_all(&base).unwrap();
    base
}

/// Microseconds per turn (a model turn and its tool call) of one agent call journaled in
/// `journal`: from the first turn, after the server started and listed its tools.
async fn per_turn(agent: &OpenAiAgent, secrets: &Secrets, journal: CallLoop) -> f64 {
    let host = Arc::new(Clock::default());
    let turns = CallTurns { journal, host: host.clone(), secrets: Arc::new(secrets.clone()) };
    let context = AgentContext {
        thread_id: "bench".into(),
        prompt: "Read the ledger again and again".into(),
        steps: Arc::new(Vec::new()),
        role: RoleRef { name: "developer".into(), system_prompt: "You are the developer.".into() },
        input: None,
    };
    let answer = tool_loop::answer(agent, &context, None, Some(&turns)).await.unwrap();
    let ended = Instant::now();
    assert_eq!(answer.content, "done");
    let began = host.first_turn.lock().expect("a turn was asked");
    ended.duration_since(began).as_secs_f64() * 1e6 / (TURNS + 1) as f64
}

/// The thread's side of the loop: no budget, nobody to ask; when the first turn began.
#[derive(Default)]
struct Clock {
    first_turn: Mutex<Option<Instant>>,
}

impl TurnHost for Clock {
    fn before_turn(&self) -> Result<(), AgentFailure> {
        self.first_turn.lock().get_or_insert_with(Instant::now);
        Ok(())
    }
}

/// A chat-completions endpoint on loopback that answers each request after [`MODEL_MS`]: a
/// call of `ledger__read` for each of [`TURNS`] turns, then `done`. Its address.
async fn model_server() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut read = BufReader::new(read);
                // Keep-alive: one request after another on the connection.
                loop {
                    let mut length = 0usize;
                    loop {
                        let mut line = String::new();
                        if read.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        let line = line.trim_end();
                        if line.is_empty() {
                            break;
                        }
                        if let Some((name, value)) = line.split_once(':')
                            && name.eq_ignore_ascii_case("content-length")
                        {
                            length = value.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut body = vec![0; length];
                    if read.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    let turn = body["messages"]
                        .as_array()
                        .map_or(0, |m| m.iter().filter(|m| m["role"] == "assistant").count());
                    tokio::time::sleep(Duration::from_millis(MODEL_MS)).await;
                    let message = if turn < TURNS {
                        json!({"role": "assistant", "content": null, "tool_calls": [{
                            "id": format!("call_{turn}"), "type": "function",
                            "function": {"name": "ledger__read", "arguments": "{}"}}]})
                    } else {
                        json!({"role": "assistant", "content": "done"})
                    };
                    let reply = json!({"choices": [{"index": 0, "message": message}],
                        "usage": {"prompt_tokens": 100, "completion_tokens": 10}})
                    .to_string();
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                         Content-Length: {}\r\n\r\n",
                        reply.len()
                    );
                    if write.write_all(format!("{head}{reply}").as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    address
}
