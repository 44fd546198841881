//! A recorded thread's journal answering a thread of an eval: a call the eval's thread makes
//! is answered with what the recorded thread's agent answered when its request is the one the
//! recorded thread made at the same step — the same role, system prompt, prompt, steps before
//! it and input — and its role is not one the eval asks live. Any other call goes to its agent.

use std::collections::{BTreeSet, HashMap, HashSet};

use parking_lot::Mutex;

use crate::agents::{AgentContext, ToolReplay};
use crate::ids::ThreadId;
use crate::store::journal::{CallKind, CallRecord, CallResponse, JournalLine, LoopEntry};
use crate::store::records::{EvalTools, StepRecord};

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
    /// The results its durable agents' tool calls got, by tool and arguments (as JSON with
    /// its keys in order): the first result of each.
    tool_results: HashMap<(String, String), (String, bool)>,
    /// What a tool call it never made gets.
    tools: EvalTools,
    /// The recorded calls already given as answers (step, seq): each answers once.
    taken: Mutex<HashSet<(usize, usize)>>,
}

impl Baseline {
    /// The baseline of recorded thread `thread`: its prompt, steps and journal (`lines`), the
    /// system prompts of the version it ran, the roles an eval asks `live`, and what a tool
    /// call it never made gets (`tools`).
    pub fn new(
        thread: ThreadId,
        prompt: String,
        steps: Vec<StepRecord>,
        system_prompts: HashMap<String, String>,
        lines: impl IntoIterator<Item = JournalLine>,
        live: BTreeSet<String>,
        tools: EvalTools,
    ) -> Self {
        let mut calls = Vec::new();
        let mut asked: HashMap<(usize, usize, String), (String, String)> = HashMap::new();
        let mut tool_results = HashMap::new();
        for line in lines {
            match line {
                JournalLine::Call(call) => {
                    if call.kind == CallKind::Agent
                        && matches!(call.response, CallResponse::Ok { .. })
                    {
                        calls.push(call);
                    }
                }
                JournalLine::Loop(record) => match record.entry {
                    LoopEntry::Model { tool_calls, .. } => {
                        for call in tool_calls {
                            let key = (record.step, record.seq, call.id);
                            asked.insert(key, (call.name, canonical(&call.arguments)));
                        }
                    }
                    LoopEntry::ToolResult { call_id, content, is_error, .. } => {
                        if let Some(tool) = asked.get(&(record.step, record.seq, call_id)) {
                            tool_results.entry(tool.clone()).or_insert((content, is_error));
                        }
                    }
                    _ => {}
                },
            }
        }
        calls.sort_by_key(|c| (c.step, c.seq));
        Baseline {
            thread,
            prompt,
            steps,
            system_prompts,
            calls,
            live,
            tool_results,
            tools,
            taken: Mutex::default(),
        }
    }

    /// What a durable agent's call asked live does with its tool call of `tool` (as the model
    /// names it) with `arguments`.
    pub fn replayed_tool(&self, tool: &str, arguments: &str) -> ToolReplay {
        let key = (tool.to_string(), canonical(arguments));
        if let Some((content, is_error)) = self.tool_results.get(&key) {
            return ToolReplay::Answer { content: content.clone(), is_error: *is_error };
        }
        let shown: String = crate::terminal::line(arguments).chars().take(200).collect();
        match self.tools {
            EvalTools::Live => ToolReplay::Make,
            EvalTools::Deny => ToolReplay::Deny(format!(
                "refused: the recorded thread {} never called `{tool}` with these arguments, and \
                 this eval makes no tool call it did not (--tools deny)",
                self.thread
            )),
            EvalTools::Journal => ToolReplay::Diverged(format!(
                "diverged from recorded thread {}: it never called `{tool}` with {shown} \
                 (--tools journal; --tools live makes such calls, --tools deny refuses them)",
                self.thread
            )),
        }
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
        if self.live.contains(role) {
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

/// Tool arguments as one text whatever the order of their keys (JSON objects read into
/// sorted maps), or as written when they are not JSON.
fn canonical(arguments: &str) -> String {
    serde_json::from_str::<serde_json::Value>(arguments)
        .map_or_else(|_| arguments.to_string(), |value| value.to_string())
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
            decided_by: None,
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
            [call(0, 0, "planner", "plan"), call(1, 0, "reviewer", "ok")].map(JournalLine::Call),
            live.iter().map(|r| r.to_string()).collect(),
            EvalTools::Journal,
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
            [JournalLine::Call(recorded)],
            BTreeSet::new(),
            EvalTools::Journal,
        );
        let reviewer = context("reviewer", "anything", vec![]);
        assert_eq!(b.answer(0, "D", "R2", &reviewer), None);
        assert!(b.answer(0, "D", "R1", &reviewer).is_some());
    }

    #[test]
    fn a_tool_call_made_with_the_same_arguments_takes_its_recorded_result() {
        use crate::store::journal::{LoopRecord, ToolCall};
        let entry = |entry| JournalLine::Loop(LoopRecord { step: 0, seq: 0, entry, timestamp: 0 });
        let call = ToolCall {
            id: "c1".into(),
            name: "ledger__append".into(),
            arguments: r#"{"entry": "one", "at": 1}"#.into(),
        };
        let lines = [
            entry(LoopEntry::Model {
                content: None,
                tool_calls: vec![call],
                usage: None,
                duration_ms: 0,
            }),
            entry(LoopEntry::ToolResult {
                call_id: "c1".into(),
                content: "appended".into(),
                is_error: false,
                duration_ms: 0,
                cut_from: None,
            }),
        ];
        let baseline = |tools| {
            Baseline::new(
                ThreadId::default(),
                "t".into(),
                vec![],
                HashMap::new(),
                lines.clone(),
                BTreeSet::new(),
                tools,
            )
        };
        let b = baseline(EvalTools::Journal);
        // The keys in another order are the same arguments.
        assert_eq!(
            b.replayed_tool("ledger__append", r#"{"at": 1, "entry": "one"}"#),
            ToolReplay::Answer { content: "appended".into(), is_error: false }
        );
        assert!(matches!(
            b.replayed_tool("ledger__append", r#"{"entry": "two"}"#),
            ToolReplay::Diverged(_)
        ));
        let b = baseline(EvalTools::Live);
        assert_eq!(b.replayed_tool("ledger__append", r#"{"entry": "two"}"#), ToolReplay::Make);
        let b = baseline(EvalTools::Deny);
        assert!(matches!(b.replayed_tool("ledger__append", "{}"), ToolReplay::Deny(_)));
    }
}
