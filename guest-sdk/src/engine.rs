//! The three-phase engine loop (moderator → agent → extract → yield) behind the export macro.

use std::cell::RefCell;
use std::fmt;
use std::marker::PhantomData;

use crate::bindings::exports::uncaged::workflow::workflow::{Guest, GuestThread};
use crate::bindings::uncaged::workflow::host;
use crate::bindings::uncaged::workflow::types as wit;
use crate::{Next, Outcome, RETURN_FAILED, RETURN_MAX_ROUNDS, Role, Step, ThreadContext};

/// A workflow: a description, roles, and a moderator that routes between them.
///
/// Implement it on a unit struct and export it with [`export_workflow!`](crate::export_workflow).
pub trait Workflow: 'static {
    /// One paragraph for humans: what the workflow does.
    const DESCRIPTION: &'static str;

    /// Steps a thread may take when the caller does not say (`run --max-rounds`).
    const MAX_ROUNDS: u32 = 10;

    /// The workflow's roles. Names must be unique.
    fn roles() -> Vec<Role>;

    /// JSON Schema of the data a thread starts with (what the moderator reads as
    /// [`ThreadContext::trigger_data`]): the host validates every start against it (`run
    /// --data`, the API, a webhook, an MCP tool call) and shows it to callers. `None` (the
    /// default) takes any data.
    fn input_schema() -> Option<serde_json::Value> {
        None
    }

    /// Picks the next role from the thread so far, or ends the thread.
    ///
    /// It must be pure: given the same thread it must decide the same, because resumed and
    /// forked threads replay it over recorded steps.
    fn moderator(thread: &ThreadContext) -> Next;

    /// Decides how the thread ends when a role could not produce its output (its agent
    /// failed, or its answer held no valid meta). By default the thread fails with the reason.
    fn on_role_error(thread: &ThreadContext, error: &RoleError) -> Outcome {
        let _ = thread;
        Outcome { return_code: RETURN_FAILED, summary: error.to_string() }
    }
}

/// Why a role produced no output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoleError {
    /// The agent bound to the role gave no answer.
    Agent {
        /// The role.
        role: String,
        /// What the host reported.
        reason: String,
    },
    /// The agent's answer held no meta valid against the role's schema.
    Extract {
        /// The role.
        role: String,
        /// What the host reported.
        reason: String,
    },
    /// The moderator named a role the workflow does not have.
    UnknownRole(String),
}

impl fmt::Display for RoleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RoleError::Agent { role, reason } => {
                write!(f, "agent for role `{role}` failed: {reason}")
            }
            RoleError::Extract { role, reason } => {
                write!(f, "could not extract the meta of role `{role}`: {reason}")
            }
            RoleError::UnknownRole(role) => write!(f, "moderator chose unknown role `{role}`"),
        }
    }
}

/// Adapts a [`Workflow`] to the generated `workflow` interface. Named by the export macro.
#[doc(hidden)]
pub struct Engine<W>(PhantomData<W>);

impl<W: Workflow> Guest for Engine<W> {
    type Thread = Generator<W>;

    fn descriptor() -> wit::BundleDescriptor {
        wit::BundleDescriptor {
            description: W::DESCRIPTION.to_string(),
            roles: W::roles()
                .into_iter()
                .map(|r| wit::RoleDescriptor {
                    name: r.name,
                    description: r.description,
                    system_prompt: r.system_prompt,
                    extract_prompt: r.extract_prompt,
                    schema: r.schema.to_string(),
                })
                .collect(),
            default_max_rounds: W::MAX_ROUNDS,
            input_schema: W::input_schema().map(|schema| schema.to_string()),
        }
    }
}

/// One thread's generator state. Resource methods take `&self`, hence the `RefCell`.
#[doc(hidden)]
pub struct Generator<W> {
    state: RefCell<State>,
    workflow: PhantomData<W>,
}

struct State {
    /// The thread: the steps the host handed over, then every one yielded since.
    thread: ThreadContext,
    /// Each role with its schema as the JSON text the extractor is sent, made once per thread
    /// rather than serialized again at every step.
    roles: Vec<(Role, String)>,
    /// Set once the thread is over; later `next()` calls repeat it.
    finished: Option<Outcome>,
}

impl<W: Workflow> GuestThread for Generator<W> {
    fn new(input: wit::RunInput, options: wit::RunOptions) -> Self {
        let roles = W::roles().into_iter().map(|r| {
            let schema = r.schema.to_string();
            (r, schema)
        });
        Generator {
            state: RefCell::new(State {
                thread: ThreadContext {
                    thread_id: options.thread_id,
                    prompt: input.prompt,
                    steps: input.steps.into_iter().map(step_from_wit).collect(),
                    max_rounds: options.max_rounds,
                    trigger_data: input.trigger_data.as_deref().map(parse_meta),
                },
                roles: roles.collect(),
                finished: None,
            }),
            workflow: PhantomData,
        }
    }

    fn next(&self) -> wit::Step {
        let mut state = self.state.borrow_mut();
        if let Some(outcome) = &state.finished {
            return done(outcome);
        }
        match advance::<W>(&state) {
            Ok(steps) => {
                let outputs = steps.iter().map(|(step, meta)| step_to_wit(step, meta)).collect();
                state.thread.steps.extend(steps.into_iter().map(|(step, _)| step));
                wit::Step::Outputs(outputs)
            }
            Err(outcome) => {
                let result = done(&outcome);
                state.finished = Some(outcome);
                result
            }
        }
    }
}

/// Runs one step: moderator, agents (at once), extract. `Err` ends the thread with that
/// outcome. Each step comes with its meta as the JSON text to yield: the extractor's own
/// text where it parsed, so that meta is not serialized again on its way back.
fn advance<W: Workflow>(state: &State) -> Result<Vec<(Step, String)>, Outcome> {
    let thread = &state.thread;
    let names = match W::moderator(thread) {
        Next::End(outcome) => return Err(outcome),
        Next::Role(name) => vec![name],
        Next::Parallel(names) if names.is_empty() => {
            return Err(W::on_role_error(thread, &RoleError::UnknownRole(String::new())));
        }
        Next::Parallel(names) => names,
    };
    // Checked after the moderator so that a thread which ends on its last allowed round
    // ends the way its moderator says, not as a round overrun.
    if thread.steps.len() + names.len() > thread.max_rounds as usize {
        return Err(Outcome {
            return_code: RETURN_MAX_ROUNDS,
            summary: format!(
                "reached max rounds ({}) before the workflow finished; next: `{}`",
                thread.max_rounds,
                names.join("`, `")
            ),
        });
    }
    let mut roles = Vec::with_capacity(names.len());
    for name in names {
        match state.roles.iter().find(|(r, _)| r.name == name) {
            Some((role, schema)) => roles.push((role, schema)),
            None => return Err(W::on_role_error(thread, &RoleError::UnknownRole(name))),
        }
    }
    let calls: Vec<wit::AgentCall> = roles
        .iter()
        .map(|(role, _)| wit::AgentCall { role: role.name.clone(), input: None })
        .collect();
    let answers = host::agents(&calls);
    let mut steps = Vec::with_capacity(roles.len());
    for ((role, schema), answer) in roles.into_iter().zip(answers) {
        let content = answer.map_err(|e| {
            let reason = match e {
                wit::AgentError::Unavailable(m) => format!("unavailable: {m}"),
                wit::AgentError::Failed(m) => m,
                wit::AgentError::Timeout(m) => format!("timed out: {m}"),
            };
            W::on_role_error(thread, &RoleError::Agent { role: role.name.clone(), reason })
        })?;
        let extracted = host::extract(&wit::ExtractRequest {
            schema: schema.clone(),
            prompt: role.extract_prompt.clone(),
            content: content.clone(),
        })
        .map_err(|e| {
            let reason = match e {
                wit::ExtractError::InvalidSchema(m) => format!("invalid schema: {m}"),
                wit::ExtractError::NoJson(m) => m,
                wit::ExtractError::SchemaMismatch(m) => m,
                wit::ExtractError::Unavailable(m) => format!("extractor unavailable: {m}"),
            };
            W::on_role_error(thread, &RoleError::Extract { role: role.name.clone(), reason })
        })?;
        let meta = parse_meta(&extracted);
        // Text that was not JSON is kept as a string, which is yielded as its JSON.
        let text = match &meta {
            serde_json::Value::String(kept) if *kept == extracted => meta.to_string(),
            _ => extracted,
        };
        steps.push((Step { role: role.name.clone(), content, meta, timestamp: host::now() }, text));
    }
    Ok(steps)
}

fn done(outcome: &Outcome) -> wit::Step {
    wit::Step::Done(wit::WorkflowResult {
        return_code: outcome.return_code,
        summary: outcome.summary.clone(),
    })
}

/// Meta crosses the boundary as JSON text the host has validated; anything else is kept as
/// a string rather than lost.
fn parse_meta(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|_| serde_json::Value::String(text.to_string()))
}

fn step_from_wit(output: wit::RoleOutput) -> Step {
    Step {
        meta: parse_meta(&output.meta),
        role: output.role,
        content: output.content,
        timestamp: output.timestamp,
    }
}

fn step_to_wit(step: &Step, meta: &str) -> wit::RoleOutput {
    wit::RoleOutput {
        role: step.role.clone(),
        content: step.content.clone(),
        meta: meta.to_string(),
        timestamp: step.timestamp,
    }
}
