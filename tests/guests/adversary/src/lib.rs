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

use std::cell::Cell;
use std::hint::black_box;

use uncaged_workflow_sdk::bindings::exports::uncaged::workflow::workflow::{Guest, GuestThread};
use uncaged_workflow_sdk::bindings::uncaged::workflow::host;
use uncaged_workflow_sdk::bindings::uncaged::workflow::types::{
    AgentRequest, BundleDescriptor, LogLevel, RoleDescriptor, RoleOutput, RunInput, RunOptions,
    Step, ThreadContext, WorkflowResult,
};
use uncaged_workflow_sdk::json;

struct Adversary;

impl Guest for Adversary {
    type Thread = Attack;

    fn descriptor() -> BundleDescriptor {
        BundleDescriptor {
            description: "Attacks the host in the way its prompt names (a test fixture).".into(),
            roles: vec![RoleDescriptor {
                name: "probe".into(),
                description: "Reports what the attack did".into(),
                system_prompt: "Answer anything.".into(),
                extract_prompt: String::new(),
                schema: json!({"type": "object"}).to_string(),
            }],
            default_max_rounds: 3,
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
            return Step::Done(WorkflowResult { return_code: 0, summary: "attack over".into() });
        }
        let report = match self.prompt.as_str() {
            "ok" => {
                let request = AgentRequest {
                    context: ThreadContext {
                        thread_id: self.thread_id.clone(),
                        prompt: self.prompt.clone(),
                        steps: vec![],
                    },
                    role: "probe".into(),
                    system_prompt: "Answer anything.".into(),
                };
                let answer = host::agent(&request).unwrap_or_else(|e| format!("{e:?}"));
                return output(answer, json!({"ok": true}));
            }
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

fn output(content: String, meta: uncaged_workflow_sdk::Value) -> Step {
    Step::Output(RoleOutput {
        role: "probe".into(),
        content,
        meta: meta.to_string(),
        timestamp: host::now(),
    })
}

#[allow(unconditional_recursion)]
fn recurse(depth: u64) -> u64 {
    let local = black_box([depth; 64]);
    recurse(black_box(local[0] + 1)) + local[63]
}

uncaged_workflow_sdk::bindings::__export_bundle!(Adversary with_types_in uncaged_workflow_sdk::bindings);
