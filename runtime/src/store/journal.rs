//! The call journal (`<ULID>.calls.jsonl`): every host call a step makes — agent and
//! extract, request digest and response — recorded durably before the guest sees the answer.
//!
//! When a step runs again (resume after a crash or a pause), its calls are matched by
//! position: a call whose request digest equals the recorded one is answered from the
//! journal, so no agent is paid twice for work it already did; a call that differs is
//! refused, never silently mixed with the record.
//!
//! A durable agent journals more within one call: the entries of its loop
//! ([`super::call_loop`]), under the call's step and position, read back with the calls.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;

use serde::{Deserialize, Serialize};

pub use super::call_loop::{Decision, LoopEntry, LoopRecord, LoopView, ToolCall, loop_spent};

use crate::clock::now_ms;
use crate::error::Result;
use crate::ids::Digest;
use crate::store::pauses::DecidedBy;
use crate::store::records::PendingCall;

/// Which host import a call went to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CallKind {
    Agent,
    Extract,
    /// A wait (`host.sleep`): journaled so that a replayed step does not wait again.
    Sleep,
}

/// One recorded call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallRecord {
    /// Index of the step the call belongs to (0-based: the number of steps before it).
    pub step: usize,
    /// Position of the call within its step.
    pub seq: usize,
    pub kind: CallKind,
    /// For agent calls, the role asked; for extract calls, empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub role: String,
    /// XXH64 of the request's canonical JSON: enough to tell "same request" without storing
    /// the whole thread context again for every call.
    pub digest: String,
    pub response: CallResponse,
    pub timestamp: u64,
    /// XXH64 of the whole request an agent was given (its role's system prompt, the thread's
    /// prompt and steps, the input): what an eval tells a changed request by, where `digest`
    /// (the bundle's own key of the call) may stay the same. Absent from calls journaled
    /// before it was kept, and from extract calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// For a thread of an eval: the recorded thread whose journal answered this call (none
    /// for a call its agent answered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded_in: Option<crate::ids::ThreadId>,
    /// For a person's answer: who gave it, and through which channel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<DecidedBy>,
}

/// Where a journaled call's answer came from, beside the call itself.
#[derive(Debug, Clone, Default)]
pub struct CallOrigin {
    /// See [`CallRecord::request`].
    pub request: Option<String>,
    /// See [`CallRecord::recorded_in`].
    pub recorded_in: Option<crate::ids::ThreadId>,
    /// See [`CallRecord::decided_by`].
    pub decided_by: Option<DecidedBy>,
}

/// A line of the journal: a call's answer, or an entry of an agent call's loop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum JournalLine {
    Loop(LoopRecord),
    Call(CallRecord),
}

/// What the call returned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CallResponse {
    /// The answer text (agent content, or extracted JSON text).
    Ok {
        value: String,
        /// Meta an agent supplied with its answer.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        meta: Option<serde_json::Value>,
        /// What the call cost, as its service reported it: a replayed call still counts.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<crate::store::records::Usage>,
    },
    /// A typed error the guest received.
    Error { kind: CallErrorKind, message: String },
}

/// The WIT error case a recorded call failed with (`agent-error` or `extract-error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CallErrorKind {
    /// `agent-error.unavailable` / `extract-error.unavailable`.
    Unavailable,
    /// `agent-error.timeout`.
    Timeout,
    /// `agent-error.failed`.
    Failed,
    /// `extract-error.invalid-schema`.
    InvalidSchema,
    /// `extract-error.no-json`.
    NoJson,
    /// `extract-error.schema-mismatch`.
    SchemaMismatch,
}

/// The outcome of looking a call up.
#[derive(Debug, PartialEq)]
pub enum Replay {
    /// Recorded with the same request: answer with this.
    Recorded(CallResponse),
    /// Not recorded yet: make the call and record it.
    Fresh,
}

/// A call that does not match the journal: a different request where one was recorded, or
/// (when the journal only replays) a call it does not hold.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "call {seq} of step {} ({kind:?}{role}) {}",
    step + 1,
    if *missing {
        "is not in the journal: the thread never made it"
    } else {
        "differs from the one recorded in the journal: the bundle's requests are not \
         deterministic, or its input changed; refusing to mix them"
    }
)]
pub struct Divergence {
    pub step: usize,
    pub seq: usize,
    pub kind: CallKind,
    pub role: String,
    /// Not recorded at all (a journal that only replays), rather than recorded differently.
    pub missing: bool,
    /// The digest of the request made.
    pub digest: String,
}

/// Where a thread's journal is kept. The home-directory store keeps it in
/// `<ULID>.calls.jsonl`; another store keeps the same records its own way.
pub trait CallLog: Send + fmt::Debug {
    /// Every line recorded so far. Torn or unreadable entries are skipped: a call whose
    /// record was lost is simply made again.
    fn read(&self) -> Result<Vec<JournalLine>>;
    /// Appends one line; when `durable`, it is on disk (or committed) when this returns.
    fn append(&mut self, line: &JournalLine, durable: bool) -> Result<()>;
    /// Lets go of what the log holds open until its next append: called before the thread
    /// waits, so that thousands of waiting threads hold no descriptor for their journals.
    fn release(&mut self) {}
}

/// A thread's journal, with the calls recorded so far.
#[derive(Debug)]
pub struct Journal {
    /// `None`: records are kept in memory only (instances that are not threads). Shared with
    /// the loops of the agent calls in flight, which append to it as they go.
    log: Option<SharedLog>,
    recorded: HashMap<(usize, usize), CallRecord>,
    /// The loop entries of agent calls, by call (step and position).
    loops: HashMap<(usize, usize), Vec<LoopRecord>>,
    step: usize,
    seq: usize,
    /// Only answers from what was recorded: a call it does not hold is a divergence (a replay
    /// of a thread through another bundle, which may call no agent).
    replaying: bool,
}

/// A journal's log, shared by the journal and the loops of its calls in flight.
type SharedLog = Arc<Mutex<Box<dyn CallLog>>>;

impl Journal {
    /// The journal kept in `log`, with what it holds.
    pub fn new(log: Box<dyn CallLog>) -> Result<Self> {
        let mut journal = Journal::of_lines(log.read()?, false);
        journal.log = Some(Arc::new(Mutex::new(log)));
        Ok(journal)
    }

    /// A journal of `lines`, keeping them in memory.
    fn of_lines(lines: Vec<JournalLine>, replaying: bool) -> Self {
        let mut recorded = HashMap::new();
        let mut loops: HashMap<(usize, usize), Vec<LoopRecord>> = HashMap::new();
        for line in lines {
            match line {
                JournalLine::Call(record) => {
                    recorded.insert((record.step, record.seq), record);
                }
                JournalLine::Loop(record) => {
                    loops.entry((record.step, record.seq)).or_default().push(record);
                }
            }
        }
        Journal { log: None, recorded, loops, step: 0, seq: 0, replaying }
    }

    /// A journal that records nothing (instances that are not threads).
    pub fn disabled() -> Self {
        Journal::of_lines(Vec::new(), false)
    }

    /// A journal that answers only from `lines` and writes nowhere: every call must be one of
    /// them (see [`Divergence::missing`]).
    pub fn replaying(lines: Vec<JournalLine>) -> Self {
        Journal::of_lines(lines, true)
    }

    /// Forgets the calls each of `retries` undid: those of its step and after, journaled
    /// before it (a failed step's calls are made again, not answered with their failure).
    pub fn forget_retried(&mut self, retries: &[crate::store::records::RetryRecord]) {
        self.recorded.retain(|_, call| !retried(call.step, call.timestamp, retries));
        for entries in self.loops.values_mut() {
            entries.retain(|e| !retried(e.step, e.timestamp, retries));
        }
        self.loops.retain(|_, entries| !entries.is_empty());
    }

    /// Whether this journal only replays.
    pub fn is_replaying(&self) -> bool {
        self.replaying
    }

    /// The step being counted.
    pub fn step(&self) -> usize {
        self.step
    }

    /// Starts counting the calls of step `step` (0-based). The log stays open from one step
    /// to the next while the thread runs: whatever makes the thread wait (a call that does
    /// not answer at once, a sleep, giving its instance up) releases it first.
    pub fn begin_step(&mut self, step: usize) {
        self.step = step;
        self.seq = 0;
    }

    /// Releases the log until the next record (see [`CallLog::release`]).
    pub fn release(&mut self) {
        if let Some(log) = &self.log {
            log.lock().release();
        }
    }

    /// Looks up the next call of the current step.
    pub fn next_call(
        &mut self,
        kind: CallKind,
        role: &str,
        digest: &str,
    ) -> Result<(usize, Replay), Divergence> {
        let seq = self.seq;
        self.seq += 1;
        let divergence = |missing| Divergence {
            step: self.step,
            seq,
            kind,
            role: if role.is_empty() { String::new() } else { format!(", role `{role}`") },
            missing,
            digest: digest.to_string(),
        };
        match self.recorded.get(&(self.step, seq)) {
            None if self.replaying => Err(divergence(true)),
            None => Ok((seq, Replay::Fresh)),
            Some(record) if record.kind == kind && record.digest == digest => {
                Ok((seq, Replay::Recorded(record.response.clone())))
            }
            Some(_) => Err(divergence(false)),
        }
    }

    /// Records a fresh call; a `durable` record is on disk before this returns, and only then
    /// may its answer reach the guest. Calls that are free and deterministic to make again
    /// (the scripted agent, the local extractor) are recorded without an fsync: if a crash
    /// loses the record, the call is made again with the same answer, at no cost.
    pub fn record(
        &mut self,
        seq: usize,
        kind: CallKind,
        role: &str,
        digest: String,
        response: CallResponse,
        durable: bool,
    ) -> Result<()> {
        self.record_from(seq, kind, role, digest, response, durable, CallOrigin::default())
    }

    /// [`record`](Self::record), saying where the answer came from (`origin`).
    #[allow(clippy::too_many_arguments)]
    pub fn record_from(
        &mut self,
        seq: usize,
        kind: CallKind,
        role: &str,
        digest: String,
        response: CallResponse,
        durable: bool,
        origin: CallOrigin,
    ) -> Result<()> {
        let record = CallRecord {
            step: self.step,
            seq,
            kind,
            role: role.to_string(),
            digest,
            response,
            timestamp: now_ms(),
            request: origin.request,
            recorded_in: origin.recorded_in,
            decided_by: origin.decided_by,
        };
        if let Some(log) = &self.log {
            log.lock().append(&JournalLine::Call(record.clone()), durable)?;
        }
        self.recorded.insert((record.step, record.seq), record);
        Ok(())
    }

    /// The loop of call `seq` of the current step: what its agent journaled of it so far,
    /// and where it journals what it does next.
    pub fn loop_of(&self, seq: usize) -> CallLoop {
        let entries = self.loops.get(&(self.step, seq)).into_iter().flatten();
        CallLoop::new(self.log.clone(), self.step, seq, entries.map(|r| r.entry.clone()).collect())
    }

    /// The loops of the agent calls journaled, in order, for views: each call's step and
    /// position, the role it answered once its answer is recorded, and its turns.
    pub fn loop_views(&self) -> Vec<LoopView> {
        let mut keys: Vec<_> = self.loops.keys().copied().collect();
        keys.sort_unstable();
        keys.into_iter()
            .map(|(step, seq)| {
                let entries: Vec<LoopEntry> =
                    self.loops[&(step, seq)].iter().map(|r| r.entry.clone()).collect();
                let role = self.recorded.get(&(step, seq)).map(|c| c.role.clone());
                LoopView { step, seq, role, turns: super::call_loop::turns(&entries) }
            })
            .collect()
    }

    /// Whether the journal holds an answer to `call` (a person's, recorded by another `answer`).
    pub fn answered(&self, call: &PendingCall) -> bool {
        self.recorded.contains_key(&(call.step, call.seq))
    }

    /// Records the answer to a call made elsewhere (a person's answer to a waiting thread).
    pub fn record_answer(
        &mut self,
        call: &PendingCall,
        role: &str,
        answer: String,
        by: &DecidedBy,
    ) -> Result<()> {
        self.begin_step(call.step);
        let response = CallResponse::Ok { value: answer, meta: None, usage: None };
        let origin = CallOrigin { decided_by: Some(by.clone()), ..CallOrigin::default() };
        self.record_from(
            call.seq,
            CallKind::Agent,
            role,
            call.digest.clone(),
            response,
            true,
            origin,
        )
    }

    /// Records how a call made elsewhere came out (a child workflow's result, or its failure).
    pub fn record_response(
        &mut self,
        call: &PendingCall,
        role: &str,
        response: CallResponse,
    ) -> Result<()> {
        self.begin_step(call.step);
        self.record(call.seq, CallKind::Agent, role, call.digest.clone(), response, true)
    }

    /// Whether a person's decision about tool call `call_id` of agent call `call` is journaled
    /// since the call last started (a call approved, then cut by a crash, waits on a decision
    /// about the cut: the approval does not answer it).
    pub fn decided(&self, call: &PendingCall, call_id: &str) -> bool {
        let mut decided = false;
        for record in self.loops.get(&(call.step, call.seq)).into_iter().flatten() {
            match &record.entry {
                LoopEntry::ToolStarted { call_id: id } if id == call_id => decided = false,
                LoopEntry::Decision { call_id: id, .. } if id == call_id => decided = true,
                _ => {}
            }
        }
        decided
    }

    /// Records a person's decision about tool call `call_id` of agent call `call` (made
    /// elsewhere: the thread waits for it), durably.
    pub fn record_decision(
        &mut self,
        call: &PendingCall,
        call_id: &str,
        decision: Decision,
        by: &DecidedBy,
    ) -> Result<()> {
        let entry =
            LoopEntry::Decision { call_id: call_id.to_string(), decision, by: Some(by.clone()) };
        let record = LoopRecord { step: call.step, seq: call.seq, entry, timestamp: now_ms() };
        if let Some(log) = &self.log {
            log.lock().append(&JournalLine::Loop(record.clone()), true)?;
        }
        self.loops.entry((call.step, call.seq)).or_default().push(record);
        Ok(())
    }

    /// The calls recorded so far, in no order.
    pub fn calls(&self) -> impl Iterator<Item = &CallRecord> {
        self.recorded.values()
    }

    /// What the agent calls recorded so far cost: every call counted (a person's answer too),
    /// with the tokens each one's service reported, and the turns of an agent call whose
    /// answer is not recorded yet (it went on after a crash or a pause: they were spent).
    pub fn spent(&self) -> crate::store::records::Usage {
        let mut spent = crate::store::records::Usage::default();
        for record in self.recorded.values() {
            match (record.kind, &record.response) {
                (CallKind::Agent, CallResponse::Ok { usage: Some(usage), .. }) => spent.add(usage),
                (CallKind::Agent, _) => spent.calls += 1,
                // The LLM extractor's tokens and cost count (its usage counts no calls).
                (CallKind::Extract, CallResponse::Ok { usage: Some(usage), .. }) => {
                    spent.add(usage)
                }
                (CallKind::Extract | CallKind::Sleep, _) => {}
            }
        }
        for (key, entries) in &self.loops {
            if !self.recorded.contains_key(key) {
                spent.add(&loop_spent(entries.iter().map(|r| &r.entry)));
            }
        }
        spent
    }

    /// The journal's lines of steps before `step` (what a fork keeps), in order: each call's
    /// loop entries, then its answer.
    pub fn calls_before(&self, step: usize) -> Vec<JournalLine> {
        let mut keys: Vec<(usize, usize)> = self
            .recorded
            .keys()
            .chain(self.loops.keys())
            .filter(|(s, _)| *s < step)
            .copied()
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let mut lines = Vec::new();
        for key in keys {
            for record in self.loops.get(&key).into_iter().flatten() {
                lines.push(JournalLine::Loop(record.clone()));
            }
            if let Some(record) = self.recorded.get(&key) {
                lines.push(JournalLine::Call(record.clone()));
            }
        }
        lines
    }
}

/// An agent call's loop: the entries it journaled, shared by every attempt at the call, and
/// where the next go (durably: each is on disk, or committed, before the agent acts on it).
#[derive(Debug, Clone)]
pub struct CallLoop {
    log: Option<SharedLog>,
    step: usize,
    seq: usize,
    entries: Arc<Mutex<Vec<LoopEntry>>>,
}

impl CallLoop {
    /// The loop of call `seq` of step `step`, journaled in `log`, with what it holds so far.
    fn new(log: Option<SharedLog>, step: usize, seq: usize, entries: Vec<LoopEntry>) -> Self {
        CallLoop { log, step, seq, entries: Arc::new(Mutex::new(entries)) }
    }

    /// A loop journaled nowhere (an agent asked outside a thread: the planner, a test).
    pub fn unjournaled() -> Self {
        CallLoop { log: None, step: 0, seq: 0, entries: Default::default() }
    }

    /// What was journaled so far, in order.
    pub fn entries(&self) -> Vec<LoopEntry> {
        self.entries.lock().clone()
    }

    /// Journals `entry`; when `durable`, it and every entry before it are on disk (or
    /// committed) when this returns.
    pub fn record(&self, entry: LoopEntry, durable: bool) -> Result<()> {
        if let Some(log) = &self.log {
            let record = LoopRecord {
                step: self.step,
                seq: self.seq,
                entry: entry.clone(),
                timestamp: now_ms(),
            };
            log.lock().append(&JournalLine::Loop(record), durable)?;
        }
        self.entries.lock().push(entry);
        Ok(())
    }
}

/// XXH64 of a request's JSON, in Crockford Base32.
pub fn digest(request: &impl Serialize) -> String {
    let bytes = serde_json::to_vec(request).expect("requests serialize");
    Digest::of(&bytes).to_string()
}

/// Whether one of `retries` undid what was journaled at `timestamp` for step `step` (see
/// [`Journal::forget_retried`]).
pub fn retried(
    step: usize,
    timestamp: u64,
    retries: &[crate::store::records::RetryRecord],
) -> bool {
    retries.iter().any(|r| step >= r.retry.from_step && timestamp < r.timestamp)
}

// The journal's unit tests, beside it: a log in memory, replay and answers.
#[cfg(test)]
#[path = "journal_tests.rs"]
mod tests;
