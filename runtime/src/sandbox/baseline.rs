//! A recorded thread's journal answering a thread of an eval: a call the eval's thread makes
//! is answered with what the recorded thread's agent answered when its request is the one the
//! recorded thread made at the same step — the same role, system prompt, prompt, steps before
//! it and input — and its role is not one the eval asks live. Any other call goes to its agent.

use std::collections::{BTreeSet, HashMap, HashSet};

use parking_lot::Mutex;

use crate::agents::AgentContext;
use crate::ids::ThreadId;
use crate::store::journal::{CallKind, CallRecord, CallResponse};
use crate::store::records::StepRecord;

/// The answers of one recorded thread, for one thread of an eval.
#[derive(Debug)]
pub struct Baseline {
    /// The recorded thread.
    pub thread: ThreadId,
    prompt: String,
    steps: Vec<StepRecord>,
    /// Each role's system prompt in the version the recorded thread ran: what its calls were
    /// asked with, for those journaled before calls kept a digest of their whole request.
    system_prompts: HashMap<String, String>,
    /// Its agent calls that were answered (a failure is asked again), in step and call order.
    calls: Vec<CallRecord>,
    /// The roles asked live whatever their request.
    live: BTreeSet<String>,
    /// The recorded calls already given as answers (step, seq): each answers once.
    taken: Mutex<HashSet<(usize, usize)>>,
}

impl Baseline {
    /// The baseline of recorded thread `thread`: its prompt, steps and journaled `calls`, the
    /// system prompts of the version it ran, and the roles an eval asks `live`.
    pub fn new(
        thread: ThreadId,
        prompt: String,
        steps: Vec<StepRecord>,
        system_prompts: HashMap<String, String>,
        calls: impl IntoIterator<Item = CallRecord>,
        live: BTreeSet<String>,
    ) -> Self {
        let mut calls: Vec<CallRecord> = calls
            .into_iter()
            .filter(|c| c.kind == CallKind::Agent && matches!(c.response, CallResponse::Ok { .. }))
            .collect();
        calls.sort_by_key(|c| (c.step, c.seq));
        Baseline { thread, prompt, steps, system_prompts, calls, live, taken: Mutex::default() }
    }

    /// Whether `role` is asked live, whatever its request.
    pub fn is_live(&self, role: &str) -> bool {
        self.live.contains(role)
    }

    /// The recorded answer to a call made at `step` (0-based: the steps before it) with
    /// `context`, keyed `digest` by the bundle, and the digest of its whole request
    /// (`request`); `None` when it is to be asked live.
    pub fn answer(
        &self,
        step: usize,
        digest: &str,
        request: &str,
        context: &AgentContext,
    ) -> Option<CallResponse> {
        let role = context.role.name.as_str();
        if self.is_live(role) {
            return None;
        }
        let mut taken = self.taken.lock();
        let call = self.calls.iter().find(|c| {
            c.step == step
                && c.role == role
                && c.digest == digest
                && !taken.contains(&(c.step, c.seq))
                && match &c.request {
                    Some(recorded) => recorded == request,
                    None => self.same_request(step, context),
                }
        })?;
        taken.insert((call.step, call.seq));
        Some(call.response.clone())
    }

    /// Whether `context` is what the recorded thread's agent was given at `step`, for a call
    /// journaled without the digest of its request: the same prompt, system prompt and steps
    /// before it (the input is in the bundle's digest of the call).
    fn same_request(&self, step: usize, context: &AgentContext) -> bool {
        let Some(before) = self.steps.get(..step) else { return false };
        context.prompt == self.prompt
            && self.system_prompts.get(&context.role.name).map(String::as_str)
                == Some(context.role.system_prompt.as_str())
            && context.steps.len() == before.len()
            && context.steps.iter().zip(before).all(|(now, then)| {
                now.role == then.role && now.content == then.content && now.meta == then.meta
            })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::agents::RoleRef;

    fn step(role: &str, content: &str) -> StepRecord {
        StepRecord {
            role: role.into(),
            content: content.into(),
            meta: serde_json::json!({}),
            timestamp: 0,
            group: None,
            agent: None,
            duration_ms: None,
            usage: None,
        }
    }

    fn call(step: usize, seq: usize, role: &str, answer: &str) -> CallRecord {
        CallRecord {
            step,
            seq,
            kind: CallKind::Agent,
            role: role.into(),
            digest: "D".into(),
            response: CallResponse::Ok { value: answer.into(), meta: None, usage: None },
            timestamp: 0,
            request: None,
            recorded_in: None,
        }
    }

    fn context(role: &str, system: &str, steps: Vec<StepRecord>) -> AgentContext {
        AgentContext {
            thread_id: "T".into(),
            prompt: "task".into(),
            steps: Arc::new(steps),
            role: RoleRef { name: role.into(), system_prompt: system.into() },
            input: None,
        }
    }

    fn baseline(live: &[&str]) -> Baseline {
        Baseline::new(
            ThreadId::default(),
            "task".into(),
            vec![step("planner", "plan"), step("reviewer", "ok")],
            [("planner", "Plan."), ("reviewer", "Review.")]
                .into_iter()
                .map(|(r, p)| (r.to_string(), p.to_string()))
                .collect(),
            [call(0, 0, "planner", "plan"), call(1, 0, "reviewer", "ok")],
            live.iter().map(|r| r.to_string()).collect(),
        )
    }

    fn answered(response: Option<CallResponse>) -> Option<String> {
        match response? {
            CallResponse::Ok { value, .. } => Some(value),
            CallResponse::Error { .. } => None,
        }
    }

    #[test]
    fn the_same_request_is_answered_once_and_a_changed_one_not_at_all() {
        let b = baseline(&[]);
        let planner = context("planner", "Plan.", vec![]);
        assert_eq!(answered(b.answer(0, "D", "-", &planner)).as_deref(), Some("plan"));
        assert_eq!(b.answer(0, "D", "-", &planner), None, "each recorded call answers once");
        // Another system prompt, another step before it, another digest: asked live.
        let reviewer =
            |system: &str, before: &str| context("reviewer", system, vec![step("planner", before)]);
        assert_eq!(b.answer(1, "D", "-", &reviewer("Review harder.", "plan")), None);
        assert_eq!(b.answer(1, "D", "-", &reviewer("Review.", "another plan")), None);
        assert_eq!(b.answer(1, "E", "-", &reviewer("Review.", "plan")), None);
        assert_eq!(b.answer(1, "D", "-", &reviewer("Review.", "plan")).map(|_| ()), Some(()));
    }

    #[test]
    fn a_live_role_is_never_answered_and_a_request_digest_decides_when_recorded() {
        let b = baseline(&["planner"]);
        assert_eq!(b.answer(0, "D", "-", &context("planner", "Plan.", vec![])), None);
        let mut recorded = call(0, 0, "reviewer", "ok");
        recorded.request = Some("R1".into());
        let b = Baseline::new(
            ThreadId::default(),
            "task".into(),
            vec![],
            HashMap::new(),
            [recorded],
            BTreeSet::new(),
        );
        let reviewer = context("reviewer", "anything", vec![]);
        assert_eq!(b.answer(0, "D", "R2", &reviewer), None);
        assert!(b.answer(0, "D", "R1", &reviewer).is_some());
    }
}
