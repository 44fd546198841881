//! A workflow drafted from a sentence (the DAG protocol's planner): the planner agent is asked
//! for a plan with the workflow's JSON Schema as the contract, the validator `add` uses checks
//! what it answers, and the errors go back to it until the plan validates or the attempts run
//! out. A person's changes go back the same way, with the plan they were shown.
//!
//! The conversation is kept as steps of the role [`PLANNER_ROLE`] and its two correspondents,
//! so every agent kind takes part as it does in a thread: a model gets it as chat messages
//! (with the schema as its structured output), a command reads it on stdin, the scripted agent
//! gives its n-th answer on the n-th ask.

use std::path::Path;
use std::sync::Arc;

use serde_json::{Value, json};

use super::openai::Message;
use super::{Agent, AgentContext, AgentSet, Bound, RoleRef, with_retries};
use crate::agent_spec::AgentSpec;
use crate::declarative::source::{self, TriggerSpec};
use crate::error::{Error, Result};
use crate::run_request::RunRequest;
use crate::store::config::Config;
use crate::store::debug_log::DebugLog;
use crate::store::descriptor::{Descriptor, RoleSpec};
use crate::store::records::{StepRecord, Usage};

/// The planner's role: bound like any role (`roles: {$planner: …}` in config.yaml), and named
/// so no workflow's role can be confused with it.
pub const PLANNER_ROLE: &str = "$planner";
/// Who sends a plan's validation errors back.
const VALIDATOR: &str = "$validator";
/// Who asks for a change to the plan.
const PERSON: &str = "$person";

/// How many plans that do not validate the planner may give before `plan` gives up.
pub const DEFAULT_ATTEMPTS: u32 = 3;

/// Where a plan's errors point: the file it will be written to is not chosen yet.
const PLAN_PATH: &str = "plan.yaml";

const INSTRUCTIONS: &str = "\
You design workflows for uncaged-workflow, a runtime of multi-role AI agent workflows. From the \
task the user describes, answer with ONE workflow in JSON that the JSON Schema below accepts, and \
nothing else. Prefer a DAG of `steps`: each step has a kebab-case `id`, a `description` of what \
its agent must do, an `expected_output`, `depends_on` (the ids it waits for) and `inputs`, whose \
values may be `$prompt`, `$trigger_data`, `$steps.<id>.output` (only of a step in its \
`depends_on`) or strings with `${steps.<id>.output}` inside. Give the workflow a `name` (letters, \
digits and `-`), a `description`, a `trigger` (`{\"type\": \"manual\"}` unless the task says when \
it runs: `cron` with an `expression`, or `poll` with a `check_script`), and a `failure_policy`. \
When the user asks for a change, answer with the whole changed workflow. When you are told the \
plan does not validate, answer with the whole corrected workflow.";

/// The plan the offline scripted agent gives (the planner role's schema example): it does not
/// read the sentence, so `plan` says so when it is the one answering.
fn example_plan() -> Value {
    json!({
        "name": "draft-and-review",
        "description": "Draft what the task asks for, then review the draft.",
        "schema_version": "1.0",
        "trigger": {"type": "manual"},
        "failure_policy": {"on_step_failure": "stop", "max_retries": 1, "retry_delay_ms": 1000},
        "steps": [
            {
                "id": "draft",
                "description": "Draft what the task asks for.",
                "expected_output": "The draft",
                "depends_on": [],
                "inputs": {"task": "$prompt"}
            },
            {
                "id": "review",
                "description": "Review the draft against the task.",
                "expected_output": "What to change, or that it is ready",
                "depends_on": ["draft"],
                "inputs": {"task": "$prompt", "draft": "$steps.draft.output"}
            }
        ]
    })
}

/// A plan that validates.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The workflow file's text (YAML): what is written, and what was validated.
    pub text: String,
    /// Its `name`, if it gives one.
    pub name: Option<String>,
    pub definition: uncaged_workflow_declarative::Definition,
    pub trigger: Option<TriggerSpec>,
}

/// A conversation with the planner agent about one workflow.
#[derive(Debug)]
pub struct Planner {
    bound: Bound,
    role: RoleRef,
    sentence: String,
    turns: Vec<StepRecord>,
    attempts: u32,
    info: DebugLog,
    /// What the planner's calls cost, as their services reported it.
    pub usage: Usage,
    /// The validation errors the planner was sent back, oldest first.
    pub repairs: Vec<String>,
}

impl Planner {
    /// Binds the planner for `sentence`: `agent`, else `roles: {$planner: …}` in `config`, else
    /// its `agent:`, else the built-in scripted agent (which answers [`example_plan`]). A
    /// person cannot be the planner.
    pub fn bind(
        config: &Config,
        agent: Option<AgentSpec>,
        cwd: &Path,
        sentence: &str,
        attempts: u32,
    ) -> Result<Self> {
        let mut schema: Value =
            serde_json::from_str(crate::declarative::SCHEMA).expect("the workflow schema is JSON");
        schema["examples"] = json!([example_plan()]);
        let role = RoleSpec {
            name: PLANNER_ROLE.into(),
            description: "Drafts a workflow from a sentence".into(),
            system_prompt: format!(
                "{INSTRUCTIONS}\n\nThe JSON Schema:\n{}",
                crate::declarative::SCHEMA
            ),
            extract_prompt: String::new(),
            schema,
        };
        let descriptor = Descriptor {
            description: "plan".into(),
            max_rounds: 1,
            roles: vec![role.clone()],
            input_schema: None,
            contract: String::new(),
        };
        let request = RunRequest { agent, ..Default::default() }.absolutize(cwd);
        let secrets = super::Secrets::from_env(config);
        let agents = AgentSet::resolve(config, &request, &secrets, &descriptor, None)?;
        let bound = agents.for_role(PLANNER_ROLE).expect("the planner role is declared").clone();
        if matches!(*bound.agent, Agent::Human) {
            return Err(Error::InvalidAgent {
                binding: bound.label,
                reason: "a person cannot be the planner: write the YAML and `add` it".into(),
                in_config: false,
            });
        }
        Ok(Planner {
            bound,
            role: RoleRef { name: role.name, system_prompt: role.system_prompt },
            sentence: sentence.to_string(),
            turns: Vec::new(),
            attempts: attempts.max(1),
            info: DebugLog::tracing(),
            usage: Usage::default(),
            repairs: Vec::new(),
        })
    }

    /// The planner's binding, as named.
    pub fn agent(&self) -> &str {
        &self.bound.label
    }

    /// Is the planner the built-in scripted agent answering from its example, which does not
    /// read the sentence?
    pub fn is_offline_example(&self) -> bool {
        self.bound.label == "scripted"
    }

    /// The first plan.
    pub async fn draft(&mut self) -> Result<Plan> {
        self.until_valid().await
    }

    /// A plan changed as `change` asks (the person's words, after the plan they were shown).
    pub async fn revise(&mut self, change: &str) -> Result<Plan> {
        self.turns.push(turn(PERSON, change));
        self.until_valid().await
    }

    async fn until_valid(&mut self) -> Result<Plan> {
        let mut last = String::new();
        for _ in 0..self.attempts {
            let answer = self.ask().await?;
            self.turns.push(turn(PLANNER_ROLE, &answer));
            match check(&answer) {
                Ok(plan) => return Ok(plan),
                Err(reason) => {
                    self.turns.push(turn(
                        VALIDATOR,
                        &format!(
                            "The plan does not validate: {reason}\nAnswer with the whole \
                             corrected workflow."
                        ),
                    ));
                    self.repairs.push(reason.clone());
                    last = reason;
                }
            }
        }
        Err(Error::PlanInvalid { attempts: self.attempts, reason: last })
    }

    /// One answer of the planner: a model through structured output, with the schema as the
    /// format it must answer in; any other agent as it answers a role.
    async fn ask(&mut self) -> Result<String> {
        let failed = |e: super::AgentFailure| Error::PlannerFailed {
            agent: self.bound.label.clone(),
            reason: e.to_string(),
        };
        let answer = match &*self.bound.agent {
            Agent::OpenAi(model) => {
                let messages = self.messages();
                let format = response_format();
                let what = format!("the planner: agent `{}`", self.bound.label);
                let answer = with_retries(self.bound.policy, &self.info, &what, || async {
                    let (content, usage) = model.chat_with_usage(&messages, Some(&format)).await?;
                    Ok::<_, super::AgentFailure>(super::AgentAnswer { content, meta: None, usage })
                })
                .await;
                self.bound.settle(answer).map_err(failed)?
            }
            _ => {
                let context = AgentContext {
                    thread_id: String::new(),
                    prompt: self.sentence.clone(),
                    steps: Arc::new(self.turns.clone()),
                    role: self.role.clone(),
                    input: None,
                };
                self.bound.answer(&context, &self.info, None).await.map_err(failed)?
            }
        };
        if let Some(usage) = &answer.usage {
            self.usage.add(usage);
        }
        Ok(answer.content)
    }

    /// The conversation as chat messages: the instructions, the sentence, then each answer of
    /// the planner and what came back to it.
    fn messages(&self) -> Vec<Message> {
        let mut messages = vec![
            Message { role: "system", content: INSTRUCTIONS.into() },
            Message { role: "user", content: self.sentence.clone() },
        ];
        for step in &self.turns {
            let role = if step.role == PLANNER_ROLE { "assistant" } else { "user" };
            messages.push(Message { role, content: step.content.clone() });
        }
        messages
    }
}

/// The structured-output format: the workflow schema, not strict (a strict schema may not use
/// `oneOf` or optional fields, and the validator checks more than any schema can).
fn response_format() -> Value {
    let mut schema: Value =
        serde_json::from_str(crate::declarative::SCHEMA).expect("the workflow schema is JSON");
    if let Some(object) = schema.as_object_mut() {
        object.remove("$schema");
        object.remove("$id");
    }
    json!({"type": "json_schema", "json_schema": {"name": "workflow", "schema": schema, "strict": false}})
}

fn turn(role: &str, content: &str) -> StepRecord {
    StepRecord {
        role: role.into(),
        content: content.into(),
        meta: Value::Null,
        timestamp: 0,
        group: None,
        agent: None,
        duration_ms: None,
        usage: None,
    }
}

/// Checks an answer of the planner with the validator `add` uses: the plan it holds (the whole
/// answer, or its first fenced block), as block YAML, or the one-line reason it is refused.
pub fn check(answer: &str) -> std::result::Result<Plan, String> {
    let text = unfenced(answer);
    if text.len() > source::MAX_SOURCE_BYTES {
        return Err(format!(
            "the plan is {} bytes, over the limit of {}",
            text.len(),
            source::MAX_SOURCE_BYTES
        ));
    }
    let path = Path::new(PLAN_PATH);
    let (definition, trigger) =
        source::parse_with_trigger(path, text).map_err(|e| crate::error::chain_line(&e))?;
    let document: serde_yaml::Value =
        serde_yaml::from_str(text).map_err(|e| crate::error::chain_line(&e))?;
    let name = match document.get("name") {
        None => None,
        Some(serde_yaml::Value::String(name)) => {
            crate::ids::validate_name("workflow name", name)
                .map_err(|e| format!("{PLAN_PATH}: `name`: {e}"))?;
            Some(name.clone())
        }
        Some(_) => return Err(format!("{PLAN_PATH}: `name` must be a string")),
    };
    // A plan given as JSON is written as block YAML, keys in its order; if that did not read
    // back the same, what was validated is written as it is.
    let text = match text.trim_start().starts_with('{') {
        true => serde_yaml::to_string(&in_reading_order(document))
            .ok()
            .filter(|yaml| source::parse_with_trigger(path, yaml).is_ok_and(|p| p.0 == definition))
            .unwrap_or_else(|| text.to_string()),
        false => text.to_string(),
    };
    Ok(Plan { text, name, definition, trigger })
}

/// Keys in the order a person reads a workflow (what it is, what starts it, what it does), each
/// step's likewise; keys this does not know keep their place after those.
fn in_reading_order(document: serde_yaml::Value) -> serde_yaml::Value {
    const TOP: &[&str] = &[
        "name",
        "description",
        "schema_version",
        "trigger",
        "failure_policy",
        "max_rounds",
        "reference_limit",
        "roles",
        "graph",
        "steps",
    ];
    const STEP: &[&str] = &[
        "id",
        "description",
        "expected_output",
        "agent",
        "depends_on",
        "when",
        "for_each",
        "max_parallel",
        "inputs",
        "retry",
        "on_failure",
        "timeout",
        "position",
    ];
    fn ordered(value: serde_yaml::Value, order: &[&str]) -> serde_yaml::Value {
        let serde_yaml::Value::Mapping(mut map) = value else { return value };
        let mut out = serde_yaml::Mapping::new();
        for key in order {
            if let Some((k, v)) = map.remove_entry(*key) {
                out.insert(k, v);
            }
        }
        out.extend(map);
        serde_yaml::Value::Mapping(out)
    }
    let mut document = ordered(document, TOP);
    if let Some(serde_yaml::Value::Sequence(steps)) = document.get_mut("steps") {
        for step in steps.iter_mut() {
            *step = ordered(std::mem::take(step), STEP);
        }
    }
    document
}

/// The plan in an answer: its first fenced block (```yaml, ```json or bare) when it has one,
/// else the whole answer.
fn unfenced(answer: &str) -> &str {
    let Some(open) = answer.find("```") else { return answer.trim() };
    let after = &answer[open + 3..];
    let body = after.find('\n').map_or(after, |n| &after[n + 1..]);
    match body.find("```") {
        Some(close) => body[..close].trim(),
        None => answer.trim(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_plan_is_checked_and_written_as_yaml_in_its_order() {
        let answer = format!("Here it is:\n```json\n{}\n```\nDone.", example_plan());
        let plan = check(&answer).unwrap();
        assert_eq!(plan.name.as_deref(), Some("draft-and-review"));
        assert!(plan.text.starts_with("name: draft-and-review\n"), "{}", plan.text);
        assert!(plan.trigger.is_none());
        assert_eq!(check(&plan.text).unwrap().definition, plan.definition);
    }

    #[test]
    fn what_add_refuses_comes_back_as_one_line_with_its_place() {
        let mut plan = example_plan();
        plan["steps"][1]["depends_on"] = json!(["nowhere"]);
        let reason = check(&plan.to_string()).unwrap_err();
        assert!(reason.starts_with("plan.yaml:"), "{reason}");
        assert!(reason.contains("nowhere"), "{reason}");
        assert!(!reason.contains('\n'), "{reason}");
        plan = example_plan();
        plan["name"] = json!("../etc");
        assert!(check(&plan.to_string()).unwrap_err().contains("`name`"));
        assert!(check("not a plan").is_err());
    }
}
