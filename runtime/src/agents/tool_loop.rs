//! A durable agent's call: model turns and tool calls in a loop until the model answers
//! without tools, each turn and each tool result journaled before the loop acts on it, so that
//! a call that runs again (after a crash, a pause, a person's decision) goes on from its last
//! journaled point — no turn asked twice, no tool call that returned made again.
//!
//! A tool call is marked started in the journal before it is made (with its turn, in one
//! write); one that has a start and no result was cut by a crash. It is made again only when
//! its tool is safe to repeat; otherwise the call waits for a person to say `redo` or `skip`.
//! A call to a tool its binding wants approved waits for a person's yes before it starts.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};
use tracing::Instrument;

use super::host::{ToolReplay, TurnHost, Unhosted};
use super::openai::{OpenAiAgent, Reply};
use super::tools::{Offered, ToolBox, ToolOutcome};
use super::{AgentAnswer, AgentContext, AgentFailure, AgentProcesses, Secrets};
use crate::faults::crash_point;
use crate::store::journal::{CallLoop, Decision, LoopEntry, ToolCall, loop_spent};
use crate::store::pauses::{ToolWait, ToolWaitReason};
use crate::store::records::Usage;
use crate::telemetry;

/// How much of a call's arguments, and of the model's text before it, a person is shown.
const SHOWN_BYTES: usize = 4096;

/// Where a durable agent's call is journaled, and the thread it runs in.
#[derive(Clone)]
pub struct CallTurns {
    pub journal: CallLoop,
    pub host: Arc<dyn TurnHost>,
    pub secrets: Arc<Secrets>,
}

impl std::fmt::Debug for CallTurns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallTurns").finish_non_exhaustive()
    }
}

/// Asks an `openai` binding: one turn when it has no tools, else the loop.
pub async fn answer(
    agent: &OpenAiAgent,
    context: &AgentContext,
    processes: Option<&Arc<AgentProcesses>>,
    turns: Option<&CallTurns>,
) -> Result<AgentAnswer, AgentFailure> {
    let messages = vec![
        json!({"role": "system", "content": context.role.system_prompt}),
        json!({"role": "user", "content": context.render()}),
    ];
    let host: &dyn TurnHost = match turns {
        Some(turns) => turns.host.as_ref(),
        None => &Unhosted,
    };
    let Some(tools) = agent.tools() else {
        let reply = agent.turn(&messages, &[], host, 1).await?;
        let content = agent.content_of(&reply)?;
        return Ok(AgentAnswer { content, meta: None, usage: reply.usage });
    };
    let journal = turns.map_or_else(CallLoop::unjournaled, |t| t.journal.clone());
    let entries = journal.entries();
    let offered = entries.iter().find_map(|e| match e {
        LoopEntry::Offered { tools } => Some(tools.clone()),
        _ => None,
    });
    let toolbox = tools.connect(processes, offered.as_deref(), host.credentials()).await?;
    let secrets = turns.map_or_else(Default::default, |t| t.secrets.clone());
    let mut run = Loop {
        agent,
        toolbox: &toolbox,
        journal,
        host,
        secrets: &secrets,
        state: State::new(messages),
    };
    if offered.is_none() {
        // Batched with the first turn's write: lost with it, the tools are listed again.
        run.journal
            .record(LoopEntry::Offered { tools: toolbox.offered() }, false)
            .map_err(store)?;
    }
    for entry in &entries {
        run.state.apply(entry, &toolbox);
    }
    let answer = run.drive().await;
    toolbox.close().await;
    answer
}

/// A journal that cannot be written: the call stops, its thread interrupted by the store.
fn store(e: crate::Error) -> AgentFailure {
    AgentFailure::Failed { message: format!("the call journal: {e}"), transient: false }
}

/// Where a tool call of the last turn stands.
#[derive(Debug, Clone, PartialEq)]
enum CallState {
    /// Its tool wants a person's yes first.
    AwaitingApproval,
    /// To be made.
    Pending,
    /// Marked started, with no result: made now, or cut by a crash if the loop is only now
    /// reading it back.
    Started,
    /// Its result (or what a person said instead).
    Done(String),
}

/// The loop as its journal has it so far.
struct State {
    /// The conversation, up to the last turn whose tool calls are all done.
    messages: Vec<Value>,
    /// Model turns taken.
    turns: u32,
    /// The last turn's tool calls, while some are not done.
    last: Vec<(ToolCall, CallState)>,
    /// What the model said before asking for them.
    reasoning: Option<String>,
    /// The model's answer, once it gave one without asking for tools.
    answer: Option<String>,
    /// Every entry taken in (what the turns cost is added up from them).
    entries: Vec<LoopEntry>,
}

impl State {
    fn new(messages: Vec<Value>) -> Self {
        State {
            messages,
            turns: 0,
            last: Vec::new(),
            reasoning: None,
            answer: None,
            entries: Vec::new(),
        }
    }

    /// Takes in one journaled entry.
    fn apply(&mut self, entry: &LoopEntry, toolbox: &ToolBox) {
        fn state<'a>(id: &str, last: &'a mut [(ToolCall, CallState)]) -> Option<&'a mut CallState> {
            last.iter_mut().find(|(call, _)| call.id == id).map(|(_, state)| state)
        }
        match entry {
            LoopEntry::Offered { .. } => {}
            LoopEntry::Model { content, tool_calls, .. } => {
                self.settle();
                self.turns += 1;
                let mut message = json!({"role": "assistant", "content": content});
                if !tool_calls.is_empty() {
                    message["tool_calls"] = tool_calls
                        .iter()
                        .map(|c| {
                            json!({"id": c.id, "type": "function",
                                "function": {"name": c.name, "arguments": c.arguments}})
                        })
                        .collect();
                }
                self.messages.push(message);
                if tool_calls.is_empty() {
                    self.answer = Some(content.clone().unwrap_or_default());
                }
                self.reasoning = content.clone();
                self.last = tool_calls
                    .iter()
                    .map(|call| {
                        let gated = toolbox.find(&call.name).is_some_and(|t| t.approve);
                        let state =
                            if gated { CallState::AwaitingApproval } else { CallState::Pending };
                        (call.clone(), state)
                    })
                    .collect();
            }
            LoopEntry::ToolStarted { call_id } => {
                if let Some(state) = state(call_id, &mut self.last) {
                    *state = CallState::Started;
                }
            }
            LoopEntry::ToolResult { call_id, content, .. } => {
                if let Some(state) = state(call_id, &mut self.last) {
                    *state = CallState::Done(content.clone());
                }
            }
            LoopEntry::Decision { call_id, decision, .. } => {
                if let Some(state) = state(call_id, &mut self.last) {
                    *state = match decision {
                        Decision::Approve | Decision::Redo => CallState::Pending,
                        Decision::Deny { reason } => {
                            CallState::Done(format!("A person did not allow this call: {reason}"))
                        }
                        Decision::Skip { text } => CallState::Done(text.clone()),
                    };
                }
            }
        }
        self.entries.push(entry.clone());
        self.settle();
    }

    /// Once every call of the last turn is done, their results join the conversation.
    fn settle(&mut self) {
        if self.last.is_empty() || !self.last.iter().all(|(_, s)| matches!(s, CallState::Done(_))) {
            return;
        }
        for (call, state) in self.last.drain(..) {
            let CallState::Done(content) = state else { unreachable!("all done") };
            self.messages
                .push(json!({"role": "tool", "tool_call_id": call.id, "content": content}));
        }
    }
}

/// One run of the loop.
struct Loop<'a> {
    agent: &'a OpenAiAgent,
    toolbox: &'a ToolBox,
    journal: CallLoop,
    host: &'a dyn TurnHost,
    secrets: &'a Secrets,
    state: State,
}

impl Loop<'_> {
    /// Turns and tool calls until the model answers without tools.
    async fn drive(&mut self) -> Result<AgentAnswer, AgentFailure> {
        // What was read back from the journal: a call marked started there was cut.
        let mut resumed = true;
        loop {
            if let Some(content) = self.state.answer.clone() {
                return Ok(self.answer(content));
            }
            if !self.state.last.is_empty() {
                self.calls(Vec::new(), resumed).await?;
                resumed = false;
                continue;
            }
            resumed = false;
            let max = self.agent.max_turns();
            if self.state.turns >= max {
                return Err(AgentFailure::failed(format!(
                    "the model still asked for tools after {max} turns (max_turns: {max})"
                )));
            }
            self.host.before_turn()?;
            let entry = self.turn().await?;
            crash_point("model-turn");
            if let LoopEntry::Model { usage: Some(usage), .. } = &entry {
                self.host.spent(usage);
            }
            match &entry {
                LoopEntry::Model { tool_calls, .. } if tool_calls.is_empty() => {
                    self.state.apply(&entry, self.toolbox);
                    self.journal.record(entry, true).map_err(store)?;
                }
                // Written with the marks of the calls it starts, in one durable write.
                _ => self.calls(vec![entry], false).await?,
            }
        }
    }

    /// The call's answer: the model's last text, and what all its turns cost.
    fn answer(&self, content: String) -> AgentAnswer {
        let spent = loop_spent(&self.state.entries);
        let usage = (spent.tokens() > 0).then(|| Usage {
            calls: 1,
            model: Some(self.agent.model().to_string()),
            ..spent
        });
        AgentAnswer { content, meta: None, usage }
    }

    /// Asks the model for its next turn: the entry to journal.
    async fn turn(&mut self) -> Result<LoopEntry, AgentFailure> {
        let span = telemetry::chat_span("openai", self.agent.model(), self.state.turns + 1);
        let started = Instant::now();
        let definitions = self.toolbox.definitions();
        let turn = self.state.turns + 1;
        let reply = self
            .agent
            .turn(&self.state.messages, &definitions, self.host, turn)
            .instrument(span.clone())
            .await;
        let Reply { content, mut tool_calls, mut usage } = match reply {
            Ok(reply) => reply,
            Err(failure) => {
                telemetry::record_failure(&span, failure.kind(), &failure.to_string());
                return Err(failure);
            }
        };
        if let Some(usage) = &mut usage {
            self.host.price(usage);
            usage.trace(&span);
        }
        // Every call of a turn needs an id of its own: its result is sent back under it.
        let turn = self.state.turns + 1;
        let mut seen = std::collections::HashSet::new();
        for (i, call) in tool_calls.iter_mut().enumerate() {
            if call.id.is_empty() || !seen.insert(call.id.clone()) {
                call.id = format!("call_{turn}_{i}");
                seen.insert(call.id.clone());
            }
        }
        Ok(LoopEntry::Model {
            content: content.map(|c| self.secrets.redact(&c)),
            tool_calls,
            usage,
            duration_ms: started.elapsed().as_millis() as u64,
        })
    }

    /// Makes the last turn's calls that may be made, journals each result as it comes, and
    /// asks a person about the first one that needs it. `batch` is journaled first, with the
    /// start of each call, in one durable write. `resumed`: the turn was read back from the
    /// journal, and a call marked started there was cut by a crash.
    async fn calls(
        &mut self,
        mut batch: Vec<LoopEntry>,
        resumed: bool,
    ) -> Result<(), AgentFailure> {
        for entry in &batch {
            self.state.apply(entry, self.toolbox);
        }
        let mut runnable: Vec<(ToolCall, &Offered, serde_json::Map<String, Value>)> = Vec::new();
        let mut wait: Option<ToolWait> = None;
        for (call, state) in self.state.last.clone() {
            let checked = || match self.toolbox.find(&call.name) {
                None => Err(format!(
                    "there is no tool `{}` offered to this call (the tools offered: {})",
                    call.name,
                    self.toolbox.offered().join(", ")
                )),
                Some(tool) => {
                    self.toolbox.arguments(tool, &call.arguments).map(|args| (tool, args))
                }
            };
            match state {
                CallState::Done(_) => {}
                CallState::AwaitingApproval => {
                    wait.get_or_insert_with(|| self.wait(&call, ToolWaitReason::Approve));
                }
                CallState::Started
                    if !self.toolbox.find(&call.name).is_some_and(|t| t.safe_to_repeat) =>
                {
                    debug_assert!(resumed, "a call is only left started by a crash");
                    wait.get_or_insert_with(|| self.wait(&call, ToolWaitReason::Cut));
                }
                CallState::Started | CallState::Pending => match checked() {
                    Ok((tool, args)) => {
                        match self.host.replayed_tool(&call.name, &call.arguments) {
                            ToolReplay::Make => runnable.push((call, tool, args)),
                            ToolReplay::Answer { content, is_error } => {
                                let entry = unmade(&call, content, is_error);
                                self.state.apply(&entry, self.toolbox);
                                batch.push(entry);
                            }
                            ToolReplay::Deny(content) => {
                                let entry = unmade(&call, content, true);
                                self.state.apply(&entry, self.toolbox);
                                batch.push(entry);
                            }
                            ToolReplay::Diverged(message) => {
                                // What was journaled so far stays: the turn that asked for it.
                                let count = batch.len();
                                for (i, entry) in batch.into_iter().enumerate() {
                                    self.journal.record(entry, i + 1 == count).map_err(store)?;
                                }
                                return Err(AgentFailure::Failed { message, transient: false });
                            }
                        }
                    }
                    Err(message) => {
                        let entry = unmade(&call, message, true);
                        self.state.apply(&entry, self.toolbox);
                        batch.push(entry);
                    }
                },
            }
        }
        for (call, _, _) in &runnable {
            let entry = LoopEntry::ToolStarted { call_id: call.id.clone() };
            self.state.apply(&entry, self.toolbox);
            batch.push(entry);
        }
        let count = batch.len();
        for (i, entry) in batch.into_iter().enumerate() {
            self.journal.record(entry, i + 1 == count).map_err(store)?;
        }
        let (toolbox, secrets) = (self.toolbox, self.secrets);
        let mut running: futures::stream::FuturesUnordered<_> = runnable
            .into_iter()
            .map(|(call, tool, args)| async move {
                let span = telemetry::tool_span(&tool.label, &call.id);
                let started = Instant::now();
                let read_only = tool.read_only;
                let outcome = toolbox.call(tool, args, secrets).instrument(span.clone()).await;
                if outcome.is_error {
                    telemetry::record_failure(&span, "tool_error", &head(&outcome.content, 200));
                }
                (call.id, outcome, started.elapsed().as_millis() as u64, read_only)
            })
            .collect();
        while let Some((call_id, outcome, duration_ms, read_only)) =
            futures::StreamExt::next(&mut running).await
        {
            crash_point("tool-called");
            let ToolOutcome { content, is_error, cut_from } = outcome;
            let entry = LoopEntry::ToolResult { call_id, content, is_error, duration_ms, cut_from };
            self.state.apply(&entry, self.toolbox);
            // A read-only call's result is not synced alone: it lands with the next synced
            // write (the next turn's, the call's answer). Lost to a crash before, the call is
            // left started and made again, which changes nothing. Any other call's result is
            // synced now: an idempotent call made again after something else changed what it
            // wrote would change it again, and any other would have to ask a person.
            self.journal.record(entry, !read_only).map_err(store)?;
            crash_point("tool-result-written");
        }
        let Some(wait) = wait else { return Ok(()) };
        match self.host.decide(&wait).await {
            Some(decision) => {
                let entry =
                    LoopEntry::Decision { call_id: wait.call_id.clone(), decision, by: None };
                self.state.apply(&entry, self.toolbox);
                self.journal.record(entry, true).map_err(store)?;
                Ok(())
            }
            None => Err(AgentFailure::Decide(Box::new(wait))),
        }
    }

    /// What a person is shown of `call`, and asked.
    fn wait(&self, call: &ToolCall, why: ToolWaitReason) -> ToolWait {
        let tool =
            self.toolbox.find(&call.name).map_or_else(|| call.name.clone(), |t| t.label.clone());
        ToolWait {
            why,
            call_id: call.id.clone(),
            tool,
            arguments: head(&call.arguments, SHOWN_BYTES),
            reasoning: self.state.reasoning.as_deref().map(|r| head(r, SHOWN_BYTES)),
        }
    }
}

/// The result of tool call `call` that was not made: why not (an error), or the result a
/// recorded thread got.
fn unmade(call: &ToolCall, content: String, is_error: bool) -> LoopEntry {
    LoopEntry::ToolResult {
        call_id: call.id.clone(),
        content,
        is_error,
        duration_ms: 0,
        cut_from: None,
    }
}

/// At most the first `max` bytes of `text` (at a character boundary), marked when cut.
fn head(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let end = (0..=max).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
    format!("{}…", &text[..end])
}
