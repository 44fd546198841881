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
    DagStep, Definition, FanOut, MAX_PARALLEL, RETURN_FAILED, RETURN_MAX_ROUNDS, Retry, Role,
    Routing, STATUS_ROLE, StepView, USER_ROLE, expr,
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
        // A fan-out step's output is the array of its items' metas; each call answers one item
        // (and an agent answering from the schema, the scripted one, answers with an item).
        if let Routing::Steps { steps, .. } = &def.routing {
            for role in &mut roles {
                if steps.iter().any(|s| s.id == role.name && s.for_each.is_some()) {
                    let item: Value = serde_json::from_str(&role.schema).unwrap_or(json!({}));
                    let mut both = json!({ "anyOf": [item, { "type": "array", "items": item }] });
                    if let Some(examples) = item.get("examples") {
                        both["examples"] = examples.clone();
                    }
                    role.schema = both.to_string();
                }
            }
        }
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
            input_schema: def.inputs.as_ref().map(Value::to_string),
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
    let meta = extract(role, &role.extract_prompt, &content).map_err(|e| {
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

/// One agent call of a stage: a step's, or one item's of a fan-out step.
struct Unit {
    /// The step, by its place in the stage.
    step: usize,
    /// The item (and its index), for a fan-out.
    item: Option<(usize, Value)>,
    result: Option<Result<(String, String), String>>,
}

/// Runs `run` at once — a fan-out step's items at most `max_parallel` at a time, and no more
/// than [`MAX_PARALLEL`] calls in all — retrying failed calls as each step's retry policy says;
/// one output per step: its role's on success, a failed [`STATUS_ROLE`] record otherwise.
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
    // Each step's calls: one, or one per item; a fan-out without its items fails at once.
    let mut units = Vec::new();
    let mut unrunnable: Vec<Option<String>> = vec![None; planned.len()];
    let mut items_of: Vec<usize> = vec![0; planned.len()];
    let scope = dag::Scope { prompt: &state.prompt, trigger_data: &state.trigger_data };
    let mut variables = None;
    for (k, step) in planned.iter().enumerate() {
        let Some(fan_out) = &step.for_each else {
            units.push(Unit { step: k, item: None, result: None });
            continue;
        };
        let input = variables.get_or_insert_with(|| dag::condition_input(&statuses, scope));
        match items(fan_out, input) {
            Ok(items) => {
                items_of[k] = items.len();
                units.extend(items.into_iter().enumerate().map(|(i, v)| Unit {
                    step: k,
                    item: Some((i, v)),
                    result: None,
                }));
            }
            Err(e) => unrunnable[k] = Some(e),
        }
    }
    let limit = def.reference_limit.unwrap_or(reference::DEFAULT_LIMIT);
    let mut pending: Vec<usize> = (0..units.len()).collect();
    let mut attempt = 0;
    while !pending.is_empty() {
        if attempt > 0 {
            // One wait for the round: as long as the longest any retried call asks for.
            let delay = pending
                .iter()
                .map(|&u| retries[units[u].step].delay_before(attempt))
                .max()
                .unwrap_or(0);
            host::log(
                wit::LogLevel::Info,
                "DR3TRY01",
                &format!("retry {attempt} of {} call(s) in {delay} ms", pending.len()),
            );
            host::sleep(delay);
        }
        let mut queue = pending.clone();
        while !queue.is_empty() {
            let mut wave = Vec::new();
            let mut asked = vec![0u32; planned.len()];
            queue.retain(|&u| {
                let k = units[u].step;
                let cap = planned[k].for_each.as_ref().map_or(1, |f| f.max_parallel.max(1));
                if asked[k] < cap && wave.len() < MAX_PARALLEL {
                    asked[k] += 1;
                    wave.push(u);
                    false
                } else {
                    true
                }
            });
            let context = |u: usize| {
                let item = units[u].item.as_ref().map(|(i, v)| (*i, v, items_of[units[u].step]));
                Inputs { state, statuses: &statuses, limit, item }
            };
            let role_of = |step: &DagStep| {
                def.roles.iter().find(|r| r.name == step.id).expect("a step has its role")
            };
            let (calls, prompts): (Vec<wit::AgentCall>, Vec<String>) = wave
                .iter()
                .map(|&u| {
                    let step = planned[units[u].step];
                    let input = Some(context(u).text(step));
                    let prompt = context(u).extract_prompt(step, role_of(step));
                    (wit::AgentCall { role: step.id.clone(), input }, prompt)
                })
                .unzip();
            let answers = host::agents(&calls);
            for ((&u, answer), prompt) in wave.iter().zip(answers).zip(prompts) {
                let role = role_of(planned[units[u].step]);
                units[u].result = Some(match answer {
                    Err(e) => Err(format!("agent failed: {}", agent_error(e))),
                    Ok(content) => match extract(role, &prompt, &content) {
                        Ok(meta) => Ok((content, meta)),
                        Err(e) => Err(format!("no valid meta in the answer: {e}")),
                    },
                });
            }
        }
        attempt += 1;
        pending.retain(|&u| {
            matches!(units[u].result, Some(Err(_))) && attempt <= retries[units[u].step].max
        });
    }
    planned
        .iter()
        .enumerate()
        .map(|(k, step)| {
            let id = &step.id;
            let outcome = match unrunnable[k].take() {
                Some(error) => Err(error),
                None => {
                    let mine = units.iter_mut().filter(|u| u.step == k);
                    let results = mine.map(|u| u.result.take().expect("every call ran"));
                    settle(step.for_each.is_some(), results.collect(), retries[k].max + 1)
                }
            };
            match outcome {
                Ok((content, meta)) => output(id, content, meta),
                Err(error) => {
                    let meta = dag::status_meta(id, &Status::Failed(error.clone())).to_string();
                    output(STATUS_ROLE, format!("Failed: {error}"), meta)
                }
            }
        })
        .collect()
}

/// A fan-out's items: its expression's array, within [`FanOut::MAX_ITEMS`].
fn items(fan_out: &FanOut, variables: &Value) -> Result<Vec<Value>, String> {
    let value = expr::value_with_variables(&fan_out.items, variables)
        .map_err(|e| format!("its `for_each` `{}` could not be evaluated: {e}", fan_out.items))?;
    let items = match value {
        Value::Array(items) => items,
        Value::Null => Vec::new(),
        // JSONata gives a lone value for a one-item sequence.
        other => vec![other],
    };
    if items.len() > FanOut::MAX_ITEMS {
        return Err(format!(
            "its `for_each` gave {} items, over the limit of {}",
            items.len(),
            FanOut::MAX_ITEMS
        ));
    }
    Ok(items)
}

/// A step's outcome from its calls' results: a step's own, or for a fan-out the array of its
/// items' metas (all must succeed; the first that did not is the step's error).
fn settle(
    fan_out: bool,
    results: Vec<Result<(String, String), String>>,
    attempts: u32,
) -> Result<(String, String), String> {
    let tried = |error: String| {
        if attempts > 1 { format!("{error} (after {attempts} attempts)") } else { error }
    };
    if !fan_out {
        return results.into_iter().next().expect("a step makes one call").map_err(tried);
    }
    let n = results.len();
    let mut contents = Vec::with_capacity(n);
    let mut metas = Vec::with_capacity(n);
    for (i, result) in results.into_iter().enumerate() {
        let (content, meta) = result.map_err(|e| tried(format!("item {i} of {n}: {e}")))?;
        contents.push(format!("[item {i}]\n{content}"));
        metas.push(parse_json(&meta));
    }
    let content = if n == 0 { "No items.".to_string() } else { contents.join("\n\n") };
    Ok((content, Value::Array(metas).to_string()))
}

/// What a call's inputs are resolved from.
struct Inputs<'a> {
    state: &'a State,
    statuses: &'a std::collections::HashMap<&'a str, Status<'a>>,
    /// Bytes of a step's output a reference hands on.
    limit: u32,
    /// In a fan-out: the item's index, the item, and how many there are.
    item: Option<(usize, &'a Value, usize)>,
}

impl Inputs<'_> {
    /// The agent's input for a step: its id, its item in a fan-out, and its inputs with their
    /// references resolved.
    fn text(&self, step: &DagStep) -> String {
        let inputs: serde_json::Map<String, Value> =
            step.inputs.iter().map(|(key, value)| (key.clone(), self.resolve(value))).collect();
        let mut input = json!({ "step": step.id, "inputs": inputs });
        if let Some((index, _, of)) = self.item {
            input["item"] = json!({ "index": index, "of": of });
        }
        // A description or expected output with references, resolved for this call (the
        // role's prompt points here).
        if let Some(instructions) = &step.instructions {
            input["instructions"] = self.resolve(&Value::String(instructions.clone()));
        }
        if let Some(expected) = &step.expected_output {
            input["expected_output"] = self.resolve(&Value::String(expected.clone()));
        }
        serde_json::to_string_pretty(&input).expect("JSON serializes")
    }

    /// The extractor's prompt for a call of `step` as `role`: its `expected_output` resolved
    /// for the call, where that is the role's extract prompt.
    fn extract_prompt(&self, step: &DagStep, role: &Role) -> String {
        match &step.expected_output {
            Some(expected) if *expected == role.extract_prompt => {
                reference::as_text(&self.resolve(&Value::String(expected.clone())))
            }
            _ => role.extract_prompt.clone(),
        }
    }

    /// The value a reference names.
    fn named(&self, reference: &Reference<'_>) -> Value {
        match reference {
            Reference::Prompt => Value::String(self.state.prompt.clone()),
            Reference::TriggerData => self.state.trigger_data.clone(),
            Reference::Step { id, path } => match self.statuses.get(id) {
                Some(Status::Succeeded(meta)) => {
                    reference::bounded(reference::field(meta, path), self.limit)
                }
                _ => Value::Null,
            },
            Reference::Item { path } => {
                self.item.map_or(Value::Null, |(_, item, _)| reference::field(item, path))
            }
            Reference::Index => self.item.map_or(Value::Null, |(index, _, _)| json!(index)),
        }
    }

    /// An input value, references resolved: a whole-string reference gives the value it names
    /// (a step's output cut at the limit), `${…}` in a string the text of each.
    fn resolve(&self, value: &Value) -> Value {
        let Value::String(text) = value else { return value.clone() };
        if let Ok(Some(whole)) = reference::parse(text) {
            return self.named(&whole);
        }
        // The host refuses malformed references; a plain string stays itself.
        match reference::template(text) {
            Ok(Some(parts)) => Value::String(
                parts
                    .iter()
                    .map(|part| match part {
                        reference::Part::Text(text) => text.clone(),
                        reference::Part::Ref(r) => reference::as_text(&self.named(r)),
                    })
                    .collect(),
            ),
            Ok(None) | Err(_) => value.clone(),
        }
    }
}

fn extract(role: &Role, prompt: &str, content: &str) -> Result<String, String> {
    host::extract(&wit::ExtractRequest {
        schema: role.schema.to_string(),
        prompt: prompt.to_string(),
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
