//! The interpreter of declarative workflows: a bundle that reads its workflow from the
//! `definition` import and routes it with `uncaged-workflow-declarative`, inside the sandbox
//! like any bundle's moderator.
//!
//! The host composes it with a component exporting the definition (`uncaged-workflow add`
//! and `build`), so the bundle a user holds is one component importing only `host`. Its build
//! ships inside the host binary (`runtime/src/declarative/interpreter.wasm`), which is why the
//! same YAML gives the same bundle bytes on every machine running the same host.

use std::cell::RefCell;
use std::sync::OnceLock;

use serde_json::{Value, json};
use uncaged_workflow_declarative::dag::{self, Action, Decision, Status};
use uncaged_workflow_declarative::graph::{self, Route};
use uncaged_workflow_declarative::reference::{self, Reference};
use uncaged_workflow_declarative::{
    DagStep, Definition, RETURN_FAILED, RETURN_MAX_ROUNDS, Retry, Role, Routing, STATUS_ROLE,
    StepView, USER_ROLE,
};

/// The generated bindings: the only unsafe code here, glue for the canonical ABI.
#[allow(unsafe_code)]
mod bindings {
    wit_bindgen::generate!({
        world: "declarative",
        path: "../../wit/workflow.wit",
    });

    use super::Interpreter;
    export!(Interpreter);
}

use bindings::definition;
use bindings::exports::uncaged::workflow::workflow::{Guest, GuestThread};
use bindings::uncaged::workflow::host;
use bindings::uncaged::workflow::types as wit;

/// The most times a person is asked about one failure in one step when their answer is not
/// `retry`, `skip` or `abort`.
const MAX_ASKS: usize = 5;

fn the_definition() -> &'static Definition {
    static DEFINITION: OnceLock<Definition> = OnceLock::new();
    DEFINITION.get_or_init(|| {
        serde_json::from_str(&definition())
            .expect("the host composed this bundle with a definition it validated")
    })
}

struct Interpreter;

impl Guest for Interpreter {
    type Thread = Thread;

    fn descriptor() -> wit::BundleDescriptor {
        let def = the_definition();
        let mut roles: Vec<wit::RoleDescriptor> = def.roles.iter().map(role_descriptor).collect();
        if let Routing::Steps { steps, failure_policy } = &def.routing {
            roles.push(wit::RoleDescriptor {
                name: STATUS_ROLE.into(),
                description: "Records a step that failed or was skipped".into(),
                system_prompt: String::new(),
                extract_prompt: String::new(),
                schema: dag::status_schema().to_string(),
            });
            let asks = |s: &DagStep| {
                s.on_failure(failure_policy) == uncaged_workflow_declarative::OnStepFailure::AskUser
            };
            if steps.iter().any(asks) {
                roles.push(wit::RoleDescriptor {
                    name: USER_ROLE.into(),
                    description: "A person deciding what to do about a failed step".into(),
                    system_prompt: "A step of this workflow failed. Answer `retry`, `skip` or \
                                    `abort`."
                        .into(),
                    extract_prompt: String::new(),
                    schema: dag::decision_schema().to_string(),
                });
            }
        }
        wit::BundleDescriptor {
            description: def.description.clone(),
            roles,
            default_max_rounds: def.max_rounds,
        }
    }
}

fn role_descriptor(role: &Role) -> wit::RoleDescriptor {
    wit::RoleDescriptor {
        name: role.name.clone(),
        description: role.description.clone(),
        system_prompt: role.system_prompt.clone(),
        extract_prompt: role.extract_prompt.clone(),
        schema: role.schema.to_string(),
    }
}

/// One recorded step, as routing needs it.
struct Recorded {
    role: String,
    meta: Value,
}

struct State {
    prompt: String,
    trigger_data: Value,
    steps: Vec<Recorded>,
    max_rounds: u32,
    finished: Option<wit::WorkflowResult>,
}

struct Thread(RefCell<State>);

impl GuestThread for Thread {
    fn new(input: wit::RunInput, options: wit::RunOptions) -> Self {
        let steps = input
            .steps
            .into_iter()
            .map(|s| Recorded { meta: parse_json(&s.meta), role: s.role })
            .collect();
        Thread(RefCell::new(State {
            prompt: input.prompt,
            trigger_data: input.trigger_data.as_deref().map_or(Value::Null, parse_json),
            steps,
            max_rounds: options.max_rounds,
            finished: None,
        }))
    }

    fn next(&self) -> wit::Step {
        let mut state = self.0.borrow_mut();
        if let Some(result) = &state.finished {
            return wit::Step::Done(result.clone());
        }
        let def = the_definition();
        let outcome = match &def.routing {
            Routing::Graph(nodes) => graph_step(def, nodes, &state),
            Routing::Steps { steps, failure_policy } => {
                dag_step(def, steps, failure_policy, &state)
            }
        };
        match outcome {
            Ok(outputs) => {
                state.steps.extend(
                    outputs
                        .iter()
                        .map(|o| Recorded { role: o.role.clone(), meta: parse_json(&o.meta) }),
                );
                wit::Step::Outputs(outputs)
            }
            Err(result) => {
                state.finished = Some(result.clone());
                wit::Step::Done(result)
            }
        }
    }
}

type Outcome = Result<Vec<wit::RoleOutput>, wit::WorkflowResult>;

fn end(return_code: i32, summary: impl Into<String>) -> wit::WorkflowResult {
    wit::WorkflowResult { return_code, summary: summary.into() }
}

fn views(state: &State) -> Vec<StepView<'_>> {
    state.steps.iter().map(|s| StepView { role: &s.role, meta: &s.meta }).collect()
}

/// Ends the thread if `more` steps would take it past its rounds.
fn check_rounds(state: &State, more: usize, next: &str) -> Result<(), wit::WorkflowResult> {
    if state.steps.len() + more > state.max_rounds as usize {
        return Err(end(
            RETURN_MAX_ROUNDS,
            format!(
                "reached max rounds ({}) before the workflow finished; next: {next}",
                state.max_rounds
            ),
        ));
    }
    Ok(())
}

fn graph_step(
    def: &Definition,
    nodes: &[uncaged_workflow_declarative::Node],
    state: &State,
) -> Outcome {
    let route = graph::route(nodes, &views(state)).map_err(|e| end(RETURN_FAILED, e))?;
    let name = match route {
        Route::End => {
            let after = state.steps.last().map_or("$START", |s| s.role.as_str());
            let n = state.steps.len();
            let steps = if n == 1 { "step" } else { "steps" };
            return Err(end(0, format!("reached $END after `{after}` ({n} {steps})")));
        }
        Route::Role(name) => name,
    };
    check_rounds(state, 1, &format!("`{name}`"))?;
    let role = def
        .roles
        .iter()
        .find(|r| r.name == name)
        .ok_or_else(|| end(RETURN_FAILED, format!("the graph names unknown role `{name}`")))?;
    let call = wit::AgentCall { role: name.clone(), input: None };
    let answer = host::agents(&[call]).pop().expect("one call, one answer");
    let content = answer.map_err(|e| {
        end(RETURN_FAILED, format!("agent for role `{name}` failed: {}", agent_error(e)))
    })?;
    let meta = extract(role, &content).map_err(|e| {
        end(RETURN_FAILED, format!("could not extract the meta of role `{name}`: {e}"))
    })?;
    Ok(vec![output(&name, content, meta)])
}

fn dag_step(
    def: &Definition,
    steps: &[DagStep],
    policy: &uncaged_workflow_declarative::FailurePolicy,
    state: &State,
) -> Outcome {
    let scope = dag::Scope { prompt: &state.prompt, trigger_data: &state.trigger_data };
    match dag::plan(steps, policy, &views(state), scope) {
        Action::End { return_code, summary } => Err(end(return_code, summary)),
        Action::Ask { step, error } => {
            check_rounds(state, 1, &format!("asking about `{step}`"))?;
            let question = format!(
                "Step `{step}` failed: {error}\nAnswer `retry` to run it again, `skip` to skip it \
                 (and the steps that depend on it), or `abort` to end the thread."
            );
            for _ in 0..MAX_ASKS {
                let call = wit::AgentCall { role: USER_ROLE.into(), input: Some(question.clone()) };
                let answer = host::agents(&[call]).pop().expect("one call, one answer");
                let content = answer.map_err(|e| {
                    end(
                        RETURN_FAILED,
                        format!(
                            "step `{step}` failed and nobody could be asked: {}",
                            agent_error(e)
                        ),
                    )
                })?;
                if let Some(decision) = Decision::parse(&content) {
                    let meta = dag::decision_meta(&step, decision).to_string();
                    return Ok(vec![output(USER_ROLE, content, meta)]);
                }
                host::log(
                    wit::LogLevel::Warn,
                    "DQ4SKAGN",
                    &format!(
                        "the answer about step `{step}` is not retry, skip or abort; asking again"
                    ),
                );
            }
            Err(end(RETURN_FAILED, format!("no usable answer about failed step `{step}`")))
        }
        Action::Stage { skip, fail, run } => {
            let names: Vec<&str> = skip
                .iter()
                .chain(&fail)
                .map(|s| s.0.as_str())
                .chain(run.iter().map(String::as_str))
                .collect();
            check_rounds(state, names.len(), &format!("`{}`", names.join("`, `")))?;
            let skipped = skip.iter().map(|(id, reason)| {
                let meta = dag::status_meta(id, &Status::Skipped(reason.clone())).to_string();
                output(STATUS_ROLE, format!("Skipped: {reason}."), meta)
            });
            let failed = fail.iter().map(|(id, error)| {
                let meta = dag::status_meta(id, &Status::Failed(error.clone())).to_string();
                output(STATUS_ROLE, format!("Failed: {error}"), meta)
            });
            let mut outputs: Vec<wit::RoleOutput> = skipped.chain(failed).collect();
            outputs.extend(run_stage(def, steps, policy, state, &run));
            Ok(outputs)
        }
    }
}

/// Runs `run` at once, retrying failed steps as each one's retry policy says; one output per
/// step: its role's on success, a failed [`STATUS_ROLE`] record otherwise.
fn run_stage(
    def: &Definition,
    steps: &[DagStep],
    policy: &uncaged_workflow_declarative::FailurePolicy,
    state: &State,
    run: &[String],
) -> Vec<wit::RoleOutput> {
    let statuses = dag::statuses(&views(state)).0;
    let planned: Vec<&DagStep> = run
        .iter()
        .map(|id| steps.iter().find(|s| &s.id == id).expect("planned steps exist"))
        .collect();
    let retries: Vec<Retry> = planned.iter().map(|s| s.retry(policy)).collect();
    let mut results: Vec<Option<Result<(String, String), String>>> = vec![None; run.len()];
    let mut pending: Vec<usize> = (0..run.len()).collect();
    let mut attempt = 0;
    loop {
        if attempt > 0 {
            // One wait for the round: as long as the longest any retried step asks for.
            let delay =
                pending.iter().map(|&i| retries[i].delay_before(attempt)).max().unwrap_or(0);
            host::log(
                wit::LogLevel::Info,
                "DR3TRY01",
                &format!("retry {attempt} in {delay} ms: {}", names_of(run, &pending)),
            );
            host::sleep(delay);
        }
        let calls: Vec<wit::AgentCall> = pending
            .iter()
            .map(|&i| wit::AgentCall {
                role: planned[i].id.clone(),
                input: Some(input_text(def, planned[i], state, &statuses)),
            })
            .collect();
        let answers = host::agents(&calls);
        for (&i, answer) in pending.iter().zip(answers) {
            let role =
                def.roles.iter().find(|r| r.name == run[i]).expect("a DAG step has its role");
            results[i] = Some(match answer {
                Err(e) => Err(format!("agent failed: {}", agent_error(e))),
                Ok(content) => match extract(role, &content) {
                    Ok(meta) => Ok((content, meta)),
                    Err(e) => Err(format!("no valid meta in the answer: {e}")),
                },
            });
        }
        attempt += 1;
        pending.retain(|&i| matches!(results[i], Some(Err(_))) && attempt <= retries[i].max);
        if pending.is_empty() {
            break;
        }
    }
    run.iter()
        .zip(results)
        .zip(&retries)
        .map(|((id, result), retry)| match result.expect("every step ran") {
            Ok((content, meta)) => output(id, content, meta),
            Err(error) => {
                let attempts = retry.max + 1;
                let error = if attempts > 1 {
                    format!("{error} (after {attempts} attempts)")
                } else {
                    error
                };
                let meta = dag::status_meta(id, &Status::Failed(error.clone())).to_string();
                output(STATUS_ROLE, format!("Failed: {error}"), meta)
            }
        })
        .collect()
}

fn names_of(run: &[String], indices: &[usize]) -> String {
    indices.iter().map(|&i| format!("`{}`", run[i])).collect::<Vec<_>>().join(", ")
}

/// The agent's input for a step: its id and its inputs, references resolved.
fn input_text(
    def: &Definition,
    step: &DagStep,
    state: &State,
    statuses: &std::collections::HashMap<&str, Status<'_>>,
) -> String {
    let limit = def.reference_limit.unwrap_or(reference::DEFAULT_LIMIT);
    let inputs: serde_json::Map<String, Value> = step
        .inputs
        .iter()
        .map(|(key, value)| (key.clone(), resolve(value, state, statuses, limit)))
        .collect();
    serde_json::to_string_pretty(&json!({ "step": step.id, "inputs": inputs }))
        .expect("JSON serializes")
}

/// An input value, references resolved: a whole-string reference gives the value it names
/// (a step's output cut at `limit`), `${…}` in a string the text of each.
fn resolve(
    value: &Value,
    state: &State,
    statuses: &std::collections::HashMap<&str, Status<'_>>,
    limit: u32,
) -> Value {
    let Value::String(text) = value else { return value.clone() };
    let named = |reference: &Reference<'_>| match reference {
        Reference::Prompt => Value::String(state.prompt.clone()),
        Reference::TriggerData => state.trigger_data.clone(),
        Reference::Step { id, path } => match statuses.get(id) {
            Some(Status::Succeeded(meta)) => {
                reference::bounded(reference::field(meta, path), limit)
            }
            _ => Value::Null,
        },
    };
    if let Ok(Some(whole)) = reference::parse(text) {
        return named(&whole);
    }
    // The host refuses malformed references; a plain string stays itself.
    match reference::template(text) {
        Ok(Some(parts)) => Value::String(
            parts
                .iter()
                .map(|part| match part {
                    reference::Part::Text(text) => text.clone(),
                    reference::Part::Ref(r) => reference::as_text(&named(r)),
                })
                .collect(),
        ),
        Ok(None) | Err(_) => value.clone(),
    }
}

fn extract(role: &Role, content: &str) -> Result<String, String> {
    host::extract(&wit::ExtractRequest {
        schema: role.schema.to_string(),
        prompt: role.extract_prompt.clone(),
        content: content.to_string(),
    })
    .map_err(|e| match e {
        wit::ExtractError::InvalidSchema(m) => format!("invalid schema: {m}"),
        wit::ExtractError::NoJson(m) | wit::ExtractError::SchemaMismatch(m) => m,
        wit::ExtractError::Unavailable(m) => format!("extractor unavailable: {m}"),
    })
}

fn agent_error(e: wit::AgentError) -> String {
    match e {
        wit::AgentError::Unavailable(m) => format!("unavailable: {m}"),
        wit::AgentError::Failed(m) => m,
        wit::AgentError::Timeout(m) => format!("timed out: {m}"),
    }
}

fn output(role: &str, content: String, meta: String) -> wit::RoleOutput {
    wit::RoleOutput { role: role.to_string(), content, meta, timestamp: host::now() }
}

/// Meta crosses the boundary as JSON text the host validated; anything else stays a string.
fn parse_json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()))
}
