//! Traces: the spans a thread's runs export over OTLP, received by a collector this test runs
//! on loopback, which decodes the protobuf the way a real one does (opentelemetry-proto); the
//! trace context handed to agents; a resumed thread in the same trace; a collector that never
//! answers, which costs the thread nothing.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use prost::Message;
use serde_json::{Value, json};

use crate::llm::{MockLlm, by_role, config, json_events};
use crate::{Env, status, wait_until};

/// A span as the collector received it.
#[derive(Debug, Clone)]
struct Span {
    name: String,
    trace_id: String,
    span_id: String,
    /// Empty for a root.
    parent: String,
    kind: i32,
    /// 2 is `ERROR`.
    status: i32,
    attributes: BTreeMap<String, Value>,
    service: Option<Value>,
    /// When it started and ended (ns since the epoch).
    start: u64,
    end: u64,
}

impl Span {
    fn attr(&self, key: &str) -> Value {
        self.attributes.get(key).cloned().unwrap_or(Value::Null)
    }
}

/// An OTLP/HTTP trace receiver on 127.0.0.1 with an ephemeral port, stopped on drop.
struct Collector {
    endpoint: String,
    spans: Arc<Mutex<Vec<Span>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Collector {
    fn start() -> Result<Self> {
        let server = tiny_http::Server::http("127.0.0.1:0").map_err(|e| anyhow::anyhow!("{e}"))?;
        let port = server.server_addr().to_ip().context("port")?.port();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (spans_in, stop_in) = (spans.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !stop_in.load(Ordering::SeqCst) {
                let Ok(Some(mut request)) = server.recv_timeout(Duration::from_millis(20)) else {
                    continue;
                };
                let mut body = Vec::new();
                let _ = request.as_reader().read_to_end(&mut body);
                let decoded = (request.url() == "/v1/traces")
                    .then(|| ExportTraceServiceRequest::decode(body.as_slice()).ok())
                    .flatten();
                let status = match decoded {
                    Some(export) => {
                        spans_in.lock().unwrap().extend(spans_of(export));
                        200
                    }
                    None => 400,
                };
                let response = tiny_http::Response::from_data(Vec::new())
                    .with_status_code(status)
                    .with_header(
                        "Content-Type: application/x-protobuf"
                            .parse::<tiny_http::Header>()
                            .unwrap(),
                    );
                let _ = request.respond(response);
            }
        });
        Ok(Collector {
            endpoint: format!("http://127.0.0.1:{port}"),
            spans,
            stop,
            thread: Some(thread),
        })
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }

    /// Waits for the span of a thread of `workflow` (exported when the thread ends) and
    /// returns every span received by then.
    fn wait_for_thread(&self, workflow: &str, count: usize) -> Result<Vec<Span>> {
        let name = format!("thread {workflow}");
        wait_until(&format!("{count} `{name}` span(s) arrive"), || {
            Ok(self.spans().iter().filter(|s| s.name == name).count() >= count)
        })?;
        Ok(self.spans())
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn spans_of(export: ExportTraceServiceRequest) -> Vec<Span> {
    let mut spans = Vec::new();
    for resource in export.resource_spans {
        let service = resource
            .resource
            .as_ref()
            .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
            .map(|kv| value_of(kv.value.as_ref().and_then(|v| v.value.clone())));
        for scope in resource.scope_spans {
            for span in scope.spans {
                spans.push(Span {
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent: hex(&span.parent_span_id),
                    kind: span.kind,
                    status: span.status.map_or(0, |s| s.code),
                    attributes: span
                        .attributes
                        .into_iter()
                        .map(|kv| (kv.key, value_of(kv.value.and_then(|v| v.value))))
                        .collect(),
                    service: service.clone(),
                    start: span.start_time_unix_nano,
                    end: span.end_time_unix_nano,
                });
            }
        }
    }
    spans
}

fn value_of(value: Option<any_value::Value>) -> Value {
    match value {
        Some(any_value::Value::StringValue(s)) => json!(s),
        Some(any_value::Value::IntValue(n)) => json!(n),
        Some(any_value::Value::DoubleValue(n)) => json!(n),
        Some(any_value::Value::BoolValue(b)) => json!(b),
        other => json!(format!("{other:?}")),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A thread's trace id: its ULID's 128 bits, in hex.
fn trace_of(thread: &str) -> String {
    const CROCKFORD: &str = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    let bits = thread.chars().fold(0u128, |acc, c| {
        (acc << 5) | CROCKFORD.find(c.to_ascii_uppercase()).expect("a ULID character") as u128
    });
    format!("{bits:032x}")
}

fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

const SPAN_KIND_CLIENT: i32 = 3;
const STATUS_ERROR: i32 = 2;

// Each runs twice, on a home directory (`…::files`) and on a fresh PostgreSQL database
// (`…::postgres`): spans are made where threads run, whichever store hands them out.
on_both_stores! {
/// One thread on an OpenAI-compatible endpoint and a command agent, traced to a collector
/// named in config.yaml: one trace (the thread's id), the thread's span at its root, its run,
/// a span per step and per agent call with the GenAI attributes and the tokens the endpoint
/// and the command reported; each agent got the trace context of its own call.
#[test]
fn a_threads_spans_reach_the_collector_with_genai_attributes() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let collector = Collector::start()?;
    let llm = MockLlm::start(Box::new(|_, body| {
        let mut reply = by_role(body);
        reply["model"] = json!("mock-model-2025-01-01");
        reply["usage"] = json!({"prompt_tokens": 1000, "completion_tokens": 200});
        (200, reply, Duration::ZERO)
    }))?;
    let handed = env.dir.path().join("traceparent");
    let reviewer = env.write_script(
        "reviewer.sh",
        format!(
            "#!/bin/sh\ncat >/dev/null\nprintf '%s' \"$TRACEPARENT\" > {}\n\
             echo '{{\"content\": \"LGTM\", \"meta\": {{\"approved\": true}}, \"usage\": {{\"input_tokens\": 50, \"output_tokens\": 5}}}}'\n",
            handed.display()
        ),
    )?;
    config(
        &env,
        &format!(
            "agent: local\nagents:\n  local:\n    kind: openai\n    base_url: {}\n    model: mock-model\n  \
             review:\n    kind: command\n    command: {}\nroles:\n  reviewer: review\n\
             telemetry:\n  otlp_endpoint: {}\n",
            llm.base_url,
            reviewer.display(),
            collector.endpoint
        ),
    )?;
    let run = env.run_with(
        &["run", "solve-issue", "-p", "Fix the crash", "--json"],
        &[("OTEL_BSP_SCHEDULE_DELAY", "20")],
    )?;
    assert_eq!(run.code, 0, "{run:?}");
    let id = json_events(&run.stdout)[0]["thread"].as_str().context("thread id")?.to_string();
    let spans = collector.wait_for_thread("solve-issue", 1)?;
    let trace = trace_of(&id);
    assert!(spans.iter().all(|s| s.trace_id == trace), "one trace, the thread's: {spans:#?}");
    assert!(spans.iter().all(|s| s.service == Some(json!("uncaged-workflow"))));

    let thread = named(&spans, "thread solve-issue")[0];
    assert_eq!(thread.parent, "", "the thread's span is the root");
    assert_eq!(thread.attr("uncaged.thread.id"), json!(id));
    assert_eq!(thread.attr("uncaged.workflow.hash"), json!(hash));
    assert_eq!(thread.attr("uncaged.thread.status"), json!("completed"));
    assert_eq!(thread.attr("uncaged.thread.steps"), json!(3));
    assert_eq!(thread.attr("gen_ai.usage.input_tokens"), json!(2050));
    assert_eq!(thread.attr("gen_ai.usage.output_tokens"), json!(405));

    let runs = named(&spans, "run solve-issue");
    assert_eq!(runs.len(), 1, "{spans:#?}");
    assert_eq!(runs[0].parent, thread.span_id);
    assert_eq!(runs[0].attr("uncaged.run.outcome"), json!("ended"));
    let steps: Vec<&Span> = (1..=3).map(|i| named(&spans, &format!("step {i}"))[0]).collect();
    assert!(steps.iter().all(|s| s.parent == runs[0].span_id));
    assert_eq!(steps[2].attr("uncaged.step.roles"), json!("reviewer"));
    assert_eq!(steps[2].attr("uncaged.step.agents"), json!("review"));

    let chats = named(&spans, "chat mock-model");
    assert_eq!(chats.len(), 2, "{spans:#?}");
    for (chat, step) in chats.iter().zip(&steps) {
        assert_eq!(chat.parent, step.span_id, "an agent call is under its step");
        assert_eq!(chat.kind, SPAN_KIND_CLIENT);
        assert_eq!(chat.attr("gen_ai.operation.name"), json!("chat"));
        assert_eq!(chat.attr("gen_ai.provider.name"), json!("openai"));
        assert_eq!(chat.attr("gen_ai.request.model"), json!("mock-model"));
        assert_eq!(chat.attr("gen_ai.usage.input_tokens"), json!(1000));
        assert_eq!(chat.attr("gen_ai.usage.output_tokens"), json!(200));
        assert_eq!(chat.attr("error.type"), Value::Null);
    }
    let command = named(&spans, "invoke_agent review")[0];
    assert_eq!(command.parent, steps[2].span_id);
    assert_eq!(command.attr("gen_ai.provider.name"), json!("command"));
    assert_eq!(command.attr("gen_ai.usage.input_tokens"), json!(50));

    // Each agent was handed its own call's context.
    let mut sent: Vec<String> = llm.seen().into_iter().filter_map(|s| s.traceparent).collect();
    sent.sort();
    let mut expected: Vec<String> =
        chats.iter().map(|c| format!("00-{trace}-{}-01", c.span_id)).collect();
    expected.sort();
    assert_eq!(sent, expected);
    assert_eq!(std::fs::read_to_string(&handed)?, format!("00-{trace}-{}-01", command.span_id));
    Ok(())
}

/// A durable agent's call is an `invoke_agent` span, with a `chat` span per model turn and an
/// `execute_tool` span per tool call under it, carrying the GenAI attributes (the tool's name
/// and the call's id; each turn's tokens).
#[test]
fn a_durable_agents_turns_and_tool_calls_are_spans() -> Result<()> {
    use crate::mock_model::{MockModel, Turn, turn_of};
    let collector = Collector::start()?;
    let model = MockModel::start(|body| match turn_of(body) {
        1 => Turn::calls(&[
            ("ledger__append", json!({"entry": "a"})),
            ("ledger__read", json!({})),
        ]),
        _ => Turn::answer(crate::tools::DONE),
    })?;
    let env = crate::tools::workbench(&model, "", &crate::tools::ledger_server("")?)?;
    let config = env.home().join("config.yaml");
    let text = std::fs::read_to_string(&config)?;
    std::fs::write(&config, format!("{text}telemetry:\n  otlp_endpoint: {}\n", collector.endpoint))?;
    let ledger = env.dir.path().join("ledger");
    let run = env.run_with(
        &["run", "dev", "-p", "Trace me"],
        &[("OTEL_BSP_SCHEDULE_DELAY", "20"), ("LEDGER_FILE", ledger.to_str().context("path")?)],
    )?;
    assert_eq!(run.code, 0, "{run:?}");
    let spans = collector.wait_for_thread("dev", 1)?;
    let agent = named(&spans, "invoke_agent m");
    assert_eq!(agent.len(), 1, "{spans:#?}");
    let agent = agent[0];
    assert_eq!(agent.attr("gen_ai.operation.name"), json!("invoke_agent"));
    assert_eq!(agent.attr("gen_ai.usage.input_tokens"), json!(200), "the turns' tokens, added up");
    let chats = named(&spans, "chat m");
    assert_eq!(chats.len(), 2, "a span per turn: {spans:#?}");
    for (turn, chat) in chats.iter().enumerate() {
        assert_eq!(chat.parent, agent.span_id, "a turn is under its agent call");
        assert_eq!(chat.kind, SPAN_KIND_CLIENT);
        assert_eq!(chat.attr("gen_ai.operation.name"), json!("chat"));
        assert_eq!(chat.attr("uncaged.turn"), json!(turn + 1));
        assert_eq!(chat.attr("gen_ai.usage.input_tokens"), json!(100));
    }
    for (name, id) in [("ledger.append", "call_1_0"), ("ledger.read", "call_1_1")] {
        let tool = named(&spans, &format!("execute_tool {name}"));
        assert_eq!(tool.len(), 1, "{spans:#?}");
        assert_eq!(tool[0].parent, agent.span_id, "a tool call is under its agent call");
        assert_eq!(tool[0].attr("gen_ai.operation.name"), json!("execute_tool"));
        assert_eq!(tool[0].attr("gen_ai.tool.name"), json!(name));
        assert_eq!(tool[0].attr("gen_ai.tool.call.id"), json!(id));
        assert_eq!(tool[0].status, 0, "it returned");
    }
    // The call's span ends with the call, though the thread keeps its tool server: before the
    // thread's end is written, not when its run lets the server go.
    let end = named(&spans, "end");
    assert_eq!(end.len(), 1, "{spans:#?}");
    assert!(agent.end <= end[0].start, "the agent call's span ended after the thread's end began");
    Ok(())
}

/// A thread paused by its budget and resumed is one trace: two runs under the thread's one
/// span. A failing agent's call is marked with `error.type`, and the failed thread's span with
/// an error status. The collector is named by the standard variable here.
#[test]
fn a_resumed_thread_continues_its_trace_and_a_failure_is_marked() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    let collector = Collector::start()?;
    let vars = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "20"),
    ];
    let agent = env.write_script(
        "agent.sh",
        "#!/bin/sh\ninput=$(cat)\n\
         case \"$input\" in\n  *'\"name\":\"reviewer\"'*) meta='{\"approved\": true}' ;;\n  \
         *'\"name\":\"planner\"'*) meta='{\"steps\": [\"a\"]}' ;;\n  *) meta='{\"summary\": \"s\"}' ;;\nesac\n\
         echo \"{\\\"content\\\": \\\"ok\\\", \\\"meta\\\": $meta}\"\n",
    )?;
    let agent = format!("command:{}", agent.display());
    let run = env.run_with(
        &["run", "solve-issue", "-p", "x", "--agent", &agent, "--max-agent-calls", "1", "--json"],
        &vars,
    )?;
    let id = json_events(&run.stdout)[0]["thread"].as_str().context("thread id")?.to_string();
    assert_eq!(status(&env, &id)?, "paused", "{run:?}");
    let resumed = env.run_with(&["resume", &id, "--raise-budget", "agent-calls=9"], &vars)?;
    assert_eq!(resumed.code, 0, "{resumed:?}");
    let spans = collector.wait_for_thread("solve-issue", 1)?;
    let trace = trace_of(&id);
    let ours: Vec<Span> = spans.into_iter().filter(|s| s.trace_id == trace).collect();
    let thread = named(&ours, "thread solve-issue")[0];
    let runs = named(&ours, "run solve-issue");
    assert_eq!(runs.len(), 2, "{:?}", ours.iter().map(|s| &s.name).collect::<Vec<_>>());
    assert!(runs.iter().all(|r| r.parent == thread.span_id));
    let outcomes: Vec<Value> = runs.iter().map(|r| r.attr("uncaged.run.outcome")).collect();
    assert!(outcomes.contains(&json!("paused")) && outcomes.contains(&json!("ended")));
    let calls: Vec<&Span> =
        ours.iter().filter(|s| s.attr("gen_ai.provider.name") == json!("command")).collect();
    assert_eq!(calls.len(), 3, "no call is made twice: {ours:#?}");
    assert_eq!(named(&ours, "over budget").len(), 1, "the run that paused says why");
    assert_eq!(named(&ours, "end").len(), 1);

    let failing =
        env.write_script("failing.sh", "#!/bin/sh\necho 'model overloaded' >&2\nexit 3\n")?;
    let run = env.run_with(
        &[
            "run",
            "solve-issue",
            "-p",
            "y",
            "--agent",
            &format!("command:{}", failing.display()),
            "--json",
        ],
        &vars,
    )?;
    let failed = json_events(&run.stdout)[0]["thread"].as_str().context("thread id")?.to_string();
    assert_eq!(status(&env, &failed)?, "failed", "{run:?}");
    let spans = collector.wait_for_thread("solve-issue", 2)?;
    let trace = trace_of(&failed);
    let ours: Vec<Span> = spans.into_iter().filter(|s| s.trace_id == trace).collect();
    let call = ours
        .iter()
        .find(|s| s.attr("gen_ai.provider.name") == json!("command"))
        .context("the failed call's span")?;
    assert_eq!(call.attr("error.type"), json!("failed"));
    assert_eq!(call.status, STATUS_ERROR);
    assert_eq!(named(&ours, "thread solve-issue")[0].status, STATUS_ERROR);
    Ok(())
}

/// A thread an MCP client started says so on its runs' spans (`uncaged.thread.started_by`): who
/// called, and which client.
#[test]
fn a_thread_started_over_mcp_names_its_starter_in_its_trace() -> Result<()> {
    let env = Env::new()?;
    env.add_solve_issue()?;
    let collector = Collector::start()?;
    let plan = json!([{"op": "call", "tool": "solve-issue", "args": {"prompt": "traced"}}]);
    let out = crate::mcp::client(&env, crate::mcp::Via::Stdio, "auto", &plan)?
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "20")
        .output()?;
    let stdout = String::from_utf8(out.stdout)?;
    let line: Value = serde_json::from_str(stdout.trim()).context(stdout.clone())?;
    let id = line["result"]["_meta"]["uncaged-workflow/thread"].as_str().context("a thread")?;
    let spans = collector.wait_for_thread("solve-issue", 1)?;
    let trace = trace_of(id);
    let ours: Vec<Span> = spans.into_iter().filter(|s| s.trace_id == trace).collect();
    let runs = named(&ours, "run solve-issue");
    ensure!(!runs.is_empty(), "{ours:#?}");
    assert!(runs.iter().all(|r| r.attr("uncaged.thread.started_by") == json!("mcp stdio (mcp)")));
    Ok(())
}

/// A collector that takes connections and never answers: the thread runs to its end as it
/// would with none, the worker's queue of spans stays bounded (it drops), and the worker says
/// at exit how many spans it dropped.
#[test]
fn a_collector_that_never_answers_costs_the_thread_nothing() -> Result<()> {
    let env = Env::new()?;
    let hash = env.add_solve_issue()?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let endpoint = format!("http://{}", listener.local_addr()?);
    // Holds every connection open, reading nothing.
    std::thread::spawn(move || {
        let held: Vec<_> = listener.incoming().map_while(Result::ok).collect();
        drop(held);
    });
    let vars = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "10"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "2"),
    ];
    let run = env.run_with(&["run", "solve-issue", "-p", "Fix the crash", "--json"], &vars)?;
    assert_eq!(run.code, 0, "{run:?}");
    let id = json_events(&run.stdout)[0]["thread"].as_str().context("thread id")?.to_string();
    assert_eq!(status(&env, &id)?, "completed");
    // The worker's log: the bundle's (a home directory) or the machine's (a database).
    let logs = [format!("{hash}.log"), "pool-worker.log".to_string()]
        .map(|name| env.home().join("run").join(name));
    wait_until("the worker says how many spans it dropped", || {
        Ok(logs.iter().any(|log| {
            std::fs::read_to_string(log).unwrap_or_default().contains("dropped_span_count")
        }))
    })?;
    Ok(())
}
}
