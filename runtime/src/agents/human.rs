//! The `human` agent: a person answers for a role. A foreground `run` attached to the thread
//! puts the question to its user; with nobody attached, the thread stops in the `waiting`
//! state and `answer` supplies the text later (it is journaled like any agent answer, so the
//! resumed thread replays it).

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

use super::{AgentContext, RoleRef};
use crate::store::records::ThreadRecord;

/// A question for the person attached to a thread.
#[derive(Debug)]
pub struct HumanQuestion {
    pub role: String,
    pub system_prompt: String,
    /// The thread rendered for reading.
    pub context: String,
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

    /// Asks the attached person; `None` when nobody is attached or they gave no answer.
    pub async fn ask(&self, context: &AgentContext) -> Option<String> {
        let sender = self.0.lock().clone()?;
        let (reply, answer) = oneshot::channel();
        let question = HumanQuestion {
            role: context.role.name.clone(),
            system_prompt: context.role.system_prompt.clone(),
            context: context.render(),
            reply,
        };
        sender.send(question).ok()?;
        answer.await.ok().flatten()
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
}

impl WaitingQuestion {
    /// The question thread `record` waits on, if it waits on one.
    pub fn of(record: &ThreadRecord) -> Option<Self> {
        let paused = record.paused.as_ref()?;
        let call = paused.call.as_ref()?;
        let role = paused.role.clone().unwrap_or_default();
        let system_prompt = call.system_prompt.clone().unwrap_or_default();
        let context = AgentContext {
            thread_id: record.id().to_string(),
            prompt: record.start.parameters.prompt.clone(),
            steps: Arc::new(record.steps.clone()),
            role: RoleRef { name: role.clone(), system_prompt: system_prompt.clone() },
            input: call.input.clone(),
        };
        Some(WaitingQuestion { role, system_prompt, context: context.render() })
    }
}
