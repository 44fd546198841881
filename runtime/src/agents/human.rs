//! The `human` agent: a person answers for a role. A foreground `run` attached to the thread
//! puts the question to its user; with nobody attached, the thread stops in the `waiting`
//! state and `answer` supplies the text later (it is journaled like any agent answer, so the
//! resumed thread replays it).
//!
//! A person's typo must not fail a thread: an answer is checked against the role's schema as
//! the extractor will read it ([`AnswerShape`]), and one that does not fit is refused with the
//! reason in one line — asked again at a terminal, refused by `answer` — before it is kept.

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

use super::{AgentContext, RoleRef};
use crate::store::journal::Decision;
use crate::store::pauses::{ToolWait, ToolWaitReason};
use crate::store::records::ThreadRecord;

/// What a role's answer must hold: JSON its schema accepts, found where the extractor looks
/// (the whole text, a fenced block, the last JSON object). `None` when anything goes: the
/// role's meta is not extracted from the answer (a DAG's `$user`, which reads its own words),
/// or an LLM extractor will turn prose into the JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct AnswerShape {
    schema: serde_json::Value,
}

impl AnswerShape {
    /// The shape of role `role`'s answers under `schema`, when they must have one.
    pub fn of(role: &str, schema: &serde_json::Value, llm_extractor: bool) -> Option<Self> {
        let extracted = role != uncaged_workflow_declarative::USER_ROLE;
        (extracted && !llm_extractor).then(|| AnswerShape { schema: schema.clone() })
    }

    /// Why `answer` does not fit, in one line; `None` if it does.
    pub fn mismatch(&self, answer: &str) -> Option<String> {
        let schema = self.schema.to_string();
        match super::extract::Extractor.extract(&schema, answer, None) {
            Ok(_) => None,
            Err(super::extract::ExtractFailure::NoJson) => {
                Some("the answer holds no JSON, and the role's output is JSON".into())
            }
            Err(failure) => Some(crate::error::chain_line(&failure)),
        }
    }

    /// A JSON value that fits, to show a person what to write.
    pub fn example(&self) -> String {
        super::scripted::example_of(&self.schema).to_string()
    }
}

/// A question for the person attached to a thread.
#[derive(Debug)]
pub struct HumanQuestion {
    pub role: String,
    pub system_prompt: String,
    /// The thread rendered for reading.
    pub context: String,
    /// A JSON value of the shape the answer must have, if it must have one.
    pub expected: Option<String>,
    /// Why the last answer was refused, when this is the question asked again.
    pub error: Option<String>,
    /// For a durable agent's tool call: the call a person decides about (the answer is a
    /// decision, see [`parse_decision`]), instead of the role's answer.
    pub tool: Option<ToolWait>,
    /// The answer, or `None` if the person declined (end of input).
    pub reply: oneshot::Sender<Option<String>>,
}

/// Where a thread's human questions go: to the attached client, if any.
#[derive(Debug, Clone, Default)]
pub struct HumanPort(Arc<Mutex<Option<mpsc::UnboundedSender<HumanQuestion>>>>);

impl HumanPort {
    /// Attaches a client; questions arrive on the returned receiver until it is dropped.
    pub fn attach(&self) -> mpsc::UnboundedReceiver<HumanQuestion> {
        let (sender, receiver) = mpsc::unbounded_channel();
        *self.0.lock() = Some(sender);
        receiver
    }

    /// Asks the attached person, again with the reason while the answer does not fit
    /// `shape`; `None` when nobody is attached or they gave no answer.
    pub async fn ask(&self, context: &AgentContext, shape: Option<&AnswerShape>) -> Option<String> {
        let sender = self.0.lock().clone()?;
        let mut error = None;
        loop {
            let (reply, answer) = oneshot::channel();
            let question = HumanQuestion {
                role: context.role.name.clone(),
                system_prompt: context.role.system_prompt.clone(),
                context: context.render(),
                expected: shape.map(AnswerShape::example),
                error: error.take(),
                tool: None,
                reply,
            };
            sender.send(question).ok()?;
            let text = answer.await.ok().flatten()?;
            match shape.and_then(|shape| shape.mismatch(&text)) {
                Some(why) => error = Some(why),
                None => return Some(text),
            }
        }
    }

    /// Asks the attached person to decide about tool call `wait` of a call for `role`, again
    /// with the reason while the reply is not a decision; `None` when nobody is attached or
    /// they declined.
    pub async fn decide(&self, role: &str, wait: &ToolWait) -> Option<Decision> {
        let sender = self.0.lock().clone()?;
        let mut error = None;
        loop {
            let (reply, answer) = oneshot::channel();
            let question = HumanQuestion {
                role: role.to_string(),
                system_prompt: String::new(),
                context: String::new(),
                expected: None,
                error: error.take(),
                tool: Some(wait.clone()),
                reply,
            };
            sender.send(question).ok()?;
            let text = answer.await.ok().flatten()?;
            match parse_decision(wait.why, &text) {
                Ok(decision) => return Some(decision),
                Err(why) => error = Some(why),
            }
        }
    }
}

/// A person's reply about a tool call, typed at a terminal: `yes` or `no WHY` for a call to
/// approve, `redo` or `skip TEXT` for a call a crash cut.
pub fn parse_decision(why: ToolWaitReason, text: &str) -> Result<Decision, String> {
    let text = text.trim();
    let (word, rest) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
    let rest = rest.trim().to_string();
    match (why, word.to_ascii_lowercase().as_str()) {
        (ToolWaitReason::Approve, "y" | "yes" | "approve") => Ok(Decision::Approve),
        (ToolWaitReason::Approve, "n" | "no" | "deny") if !rest.is_empty() => {
            Ok(Decision::Deny { reason: rest })
        }
        (ToolWaitReason::Approve, "n" | "no" | "deny") => {
            Ok(Decision::Deny { reason: "no reason given".into() })
        }
        (ToolWaitReason::Approve, _) => {
            Err("answer `yes`, or `no` and why (the model is told)".into())
        }
        (ToolWaitReason::Cut, "r" | "redo") => Ok(Decision::Redo),
        (ToolWaitReason::Cut, "s" | "skip") if !rest.is_empty() => {
            Ok(Decision::Skip { text: rest })
        }
        (ToolWaitReason::Cut, _) => Err(
            "answer `redo` (the call is made again), or `skip` and the text the model is given \
             instead of its result"
                .into(),
        ),
    }
}

/// What a thread waiting for a human answer asks, rebuilt from its record (for a person who
/// was not attached when it was asked: a terminal following the thread from the shared
/// store). The context is the thread as the agent call saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct WaitingQuestion {
    pub role: String,
    pub system_prompt: String,
    pub context: String,
    /// The tool call a durable agent waits on a decision about, if that is the question.
    pub tool: Option<ToolWait>,
}

impl WaitingQuestion {
    /// The question thread `record` waits on, if it waits on one.
    pub fn of(record: &ThreadRecord) -> Option<Self> {
        let paused = record.paused.as_ref()?;
        // A call a child workflow's thread answers asks no person.
        let call = paused.call.as_ref().filter(|c| c.child.is_none())?;
        let role = paused.role.clone().unwrap_or_default();
        let system_prompt = call.system_prompt.clone().unwrap_or_default();
        let context = AgentContext {
            thread_id: record.id().to_string(),
            prompt: record.start.parameters.prompt.clone(),
            steps: Arc::new(record.steps.clone()),
            role: RoleRef { name: role.clone(), system_prompt: system_prompt.clone() },
            input: call.input.clone(),
        };
        Some(WaitingQuestion {
            role,
            system_prompt,
            context: context.render(),
            tool: call.tool.clone(),
        })
    }
}
