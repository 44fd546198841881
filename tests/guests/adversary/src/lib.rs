//! Fixture: an untrusted bundle. It implements the WIT generator directly (no SDK loop) and,
//! on its first step, does what its prompt names:
//!
//! | prompt | does |
//! |---|---|
//! | `ok` | asks the agent for role `probe` and yields its answer (a well-behaved sibling) |
//! | `loop` | spins forever |
//! | `memory` | allocates until something stops it |
//! | `recursion` | recurses without end |
//! | `panic` | panics |
//! | `read-file` | reads `/etc/passwd` and reports what happened |
//! | `env` | lists its environment and reports it |
//! | `socket:PORT` | connects to 127.0.0.1:PORT and reports what happened |
//! | `giant` | yields a 64 MiB content |
//! | `log-flood` | writes 100,000 log lines, then yields |
//! | `stdout-flood` | prints 30,000 lines to stdout, then yields |
//! | `ghost-role` | asks the agent for role `ghost`, which it does not declare, and reports the answer |
//! | `thread-id:TEXT` | asks the agent for `probe` with TEXT as the request's thread id |
//! | `bad-meta` | yields a `strict` step whose meta violates the role's schema |
//! | `timestamp:N` | yields a step stamped N |
//! | `return:N` | ends at once with return code N |
//! | `sleep` | sleeps an hour in WASI (`wasi:clocks`) |
//! | `recursive-schema` | asks `extract` with the schema `{"allOf": [{"$ref": "#"}]}` |
//! | `escapes` | yields content, meta and a summary full of terminal escape sequences |

use std::cell::Cell;
use std::hint::black_box;

use uncaged_workflow_sdk::bindings::exports::uncaged::workflow::workflow::{Guest, GuestThread};
use uncaged_workflow_sdk::bindings::uncaged::workflow::host;
use uncaged_workflow_sdk::bindings::uncaged::workflow::types::{
    AgentCall, BundleDescriptor, ExtractRequest, LogLevel, RoleDescriptor, RoleOutput, RunInput,
    RunOptions, Step, WorkflowResult,
};
use uncaged_workflow_sdk::json;

struct Adversary;

impl Guest for Adversary {
    type Thread = Attack;

    fn descriptor() -> BundleDescriptor {
        BundleDescriptor {
            description: "Attacks the host in the way its prompt names (a test fixture).".into(),
            roles: vec![
                RoleDescriptor {
                    name: "probe".into(),
                    description: "Reports what the attack did".into(),
                    system_prompt: "Answer anything.".into(),
                    extract_prompt: String::new(),
                    schema: json!({"type": "object"}).to_string(),
                },
                RoleDescriptor {
                    name: "strict".into(),
                    description: "A role whose meta has a shape".into(),
                    system_prompt: "Approve or not.".into(),
                    extract_prompt: String::new(),
                    schema: json!({
                        "type": "object",
                        "required": ["approved"],
                        "properties": {"approved": {"type": "boolean"}}
                    })
                    .to_string(),
                },
            ],
            default_max_rounds: 3,
            input_schema: None,
        }
    }
}

struct Attack {
    prompt: String,
    thread_id: String,
    done: Cell<bool>,
}

impl GuestThread for Attack {
    fn new(input: RunInput, options: RunOptions) -> Self {
        Attack {
            done: Cell::new(!input.steps.is_empty()),
            prompt: input.prompt,
            thread_id: options.thread_id,
        }
    }

    fn next(&self) -> Step {
        if self.done.replace(true) {
            let summary = match self.prompt.as_str() {
                "escapes" => ESCAPES.into(),
                _ => "attack over".into(),
            };
            return Step::Done(WorkflowResult { return_code: 0, summary });
        }
        let report = match self.prompt.as_str() {
            "ok" => return output(self.ask("probe", &self.thread_id), json!({"ok": true})),
            "ghost-role" => return output(self.ask("ghost", &self.thread_id), json!({})),
            p if p.starts_with("thread-id:") => {
                return output(self.ask("probe", &p["thread-id:".len()..]), json!({}));
            }
            "bad-meta" => {
                return Step::Outputs(vec![RoleOutput {
                    role: "strict".into(),
                    content: "yes".into(),
                    meta: json!({"approved": "yes"}).to_string(),
                    timestamp: host::now(),
                }]);
            }
            p if p.starts_with("timestamp:") => {
                return Step::Outputs(vec![RoleOutput {
                    role: "probe".into(),
                    content: "stamped".into(),
                    meta: "{}".into(),
                    timestamp: p["timestamp:".len()..].parse().unwrap_or(0),
                }]);
            }
            p if p.starts_with("return:") => {
                let return_code = p["return:".len()..].parse().unwrap_or(0);
                return Step::Done(WorkflowResult { return_code, summary: "as I say".into() });
            }
            "sleep" => {
                std::thread::sleep(std::time::Duration::from_secs(3600));
                json!({"slept": true})
            }
            "recursive-schema" => {
                let request = ExtractRequest {
                    schema: json!({"allOf": [{"$ref": "#"}]}).to_string(),
                    prompt: String::new(),
                    content: "{}".into(),
                };
                match host::extract(&request) {
                    Ok(value) => json!({"extracted": value}),
                    Err(e) => json!({"error": format!("{e:?}")}),
                }
            }
            "escapes" => return output(ESCAPES.into(), json!({"shout": ESCAPES})),
            "loop" => {
                let mut n = 0u64;
                loop {
                    n = black_box(n.wrapping_add(1));
                }
            }
            "memory" => {
                let mut hoard = Vec::new();
                loop {
                    hoard.push(black_box(vec![1u8; 1 << 20]));
                }
            }
            "recursion" => json!({"depth": recurse(0)}),
            "panic" => panic!("adversary panics on purpose"),
            "read-file" => match std::fs::read_to_string("/etc/passwd") {
                Ok(text) => json!({"read": true, "bytes": text.len(), "text": text}),
                Err(e) => json!({"read": false, "error": e.to_string()}),
            },
            "env" => {
                let vars: Vec<String> = std::env::vars().map(|(k, v)| format!("{k}={v}")).collect();
                json!({"vars": vars, "args": std::env::args().collect::<Vec<_>>()})
            }
            p if p.starts_with("socket:") => {
                let address = format!("127.0.0.1:{}", &p["socket:".len()..]);
                match std::net::TcpStream::connect(&address) {
                    Ok(_) => json!({"connected": true}),
                    Err(e) => json!({"connected": false, "error": e.to_string()}),
                }
            }
            "giant" => return output("x".repeat(64 << 20), json!({})),
            "log-flood" => {
                for i in 0..100_000 {
                    host::log(
                        LogLevel::Info,
                        "F100D000",
                        &format!("flood line {i} ........................................"),
                    );
                }
                json!({"logged": 100_000})
            }
            "stdout-flood" => {
                for i in 0..30_000 {
                    println!("stdout flood line {i} ........................................");
                }
                json!({"printed": 30_000})
            }
            other => json!({"unknown": other}),
        };
        output(report.to_string(), report)
    }
}

/// Terminal escape sequences: set the window title (OSC 0), hide text (SGR 8), erase the line,
/// and a right-to-left override.
const ESCAPES: &str = "\u{1b}]0;pwned\u{7}\u{1b}[8mhidden\u{1b}[0m\u{1b}[2K\u{202e}desrever";

impl Attack {
    /// Asks the agent bound to `role`, passing `thread_id` as the call's input: a contract
    /// where the bundle names the thread no longer exists, but what it sends must still never
    /// reach an agent program's arguments.
    fn ask(&self, role: &str, thread_id: &str) -> String {
        let call = AgentCall { role: role.into(), input: Some(thread_id.into()) };
        let mut answers = host::agents(&[call]);
        answers.pop().map_or_else(String::new, |a| a.unwrap_or_else(|e| format!("{e:?}")))
    }
}

fn output(content: String, meta: uncaged_workflow_sdk::Value) -> Step {
    Step::Outputs(vec![RoleOutput {
        role: "probe".into(),
        content,
        meta: meta.to_string(),
        timestamp: host::now(),
    }])
}

#[allow(unconditional_recursion)]
fn recurse(depth: u64) -> u64 {
    let local = black_box([depth; 64]);
    recurse(black_box(local[0] + 1)) + local[63]
}

uncaged_workflow_sdk::bindings::__export_bundle!(Adversary with_types_in uncaged_workflow_sdk::bindings);
