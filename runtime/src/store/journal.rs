//! The call journal (`<ULID>.calls.jsonl`): every host call a step makes — agent and
//! extract, request digest and response — recorded durably before the guest sees the answer.
//!
//! When a step runs again (resume after a crash or a pause), its calls are matched by
//! position: a call whose request digest equals the recorded one is answered from the
//! journal, so no agent is paid twice for work it already did; a call that differs is
//! refused, never silently mixed with the record.

use std::collections::HashMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::clock::now_ms;
use crate::error::Result;
use crate::ids::Digest;
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
    /// Every call recorded so far. Torn or unreadable entries are skipped: a call whose
    /// record was lost is simply made again.
    fn read(&self) -> Result<Vec<CallRecord>>;
    /// Appends one record; when `durable`, it is on disk (or committed) when this returns.
    fn append(&mut self, record: &CallRecord, durable: bool) -> Result<()>;
    /// Lets go of what the log holds open until its next append: called before the thread
    /// waits, so that thousands of waiting threads hold no descriptor for their journals.
    fn release(&mut self) {}
}

/// A thread's journal, with the calls recorded so far.
#[derive(Debug)]
pub struct Journal {
    /// `None`: records are kept in memory only (instances that are not threads).
    log: Option<Box<dyn CallLog>>,
    recorded: HashMap<(usize, usize), CallRecord>,
    step: usize,
    seq: usize,
    /// Only answers from what was recorded: a call it does not hold is a divergence (a replay
    /// of a thread through another bundle, which may call no agent).
    replaying: bool,
}

impl Journal {
    /// The journal kept in `log`, with what it holds.
    pub fn new(log: Box<dyn CallLog>) -> Result<Self> {
        let recorded =
            log.read()?.into_iter().map(|record| ((record.step, record.seq), record)).collect();
        Ok(Journal { log: Some(log), recorded, step: 0, seq: 0, replaying: false })
    }

    /// A journal that records nothing (instances that are not threads).
    pub fn disabled() -> Self {
        Journal { log: None, recorded: HashMap::new(), step: 0, seq: 0, replaying: false }
    }

    /// A journal that answers only from `calls` and writes nowhere: every call must be one of
    /// them (see [`Divergence::missing`]).
    pub fn replaying(calls: Vec<CallRecord>) -> Self {
        let recorded =
            calls.into_iter().map(|record| ((record.step, record.seq), record)).collect();
        Journal { log: None, recorded, step: 0, seq: 0, replaying: true }
    }

    /// Forgets the calls each of `retries` undid: those of its step and after, journaled
    /// before it (a failed step's calls are made again, not answered with their failure).
    pub fn forget_retried(&mut self, retries: &[crate::store::records::RetryRecord]) {
        self.recorded.retain(|_, call| !retried(call, retries));
    }

    /// Whether this journal only replays.
    pub fn is_replaying(&self) -> bool {
        self.replaying
    }

    /// The step being counted.
    pub fn step(&self) -> usize {
        self.step
    }

    /// Starts counting the calls of step `step` (0-based). Between steps the thread may wait
    /// (for a pause, for its turn), so the log is released here too.
    pub fn begin_step(&mut self, step: usize) {
        self.step = step;
        self.seq = 0;
        self.release();
    }

    /// Releases the log until the next record (see [`CallLog::release`]).
    pub fn release(&mut self) {
        if let Some(log) = &mut self.log {
            log.release();
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
        let record = CallRecord {
            step: self.step,
            seq,
            kind,
            role: role.to_string(),
            digest,
            response,
            timestamp: now_ms(),
        };
        if let Some(log) = &mut self.log {
            log.append(&record, durable)?;
        }
        self.recorded.insert((record.step, record.seq), record);
        Ok(())
    }

    /// Whether the journal holds an answer to `call` (a person's, recorded by another `answer`).
    pub fn answered(&self, call: &PendingCall) -> bool {
        self.recorded.contains_key(&(call.step, call.seq))
    }

    /// Records the answer to a call made elsewhere (a person's answer to a waiting thread).
    pub fn record_answer(&mut self, call: &PendingCall, role: &str, answer: String) -> Result<()> {
        self.record_response(
            call,
            role,
            CallResponse::Ok { value: answer, meta: None, usage: None },
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

    /// What the agent calls recorded so far cost: every call counted (a person's answer too),
    /// with the tokens each one's service reported.
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
        spent
    }

    /// The recorded calls of steps before `step` (what a fork keeps), in order.
    pub fn calls_before(&self, step: usize) -> Vec<CallRecord> {
        let mut calls: Vec<_> = self.recorded.values().filter(|c| c.step < step).cloned().collect();
        calls.sort_by_key(|c| (c.step, c.seq));
        calls
    }
}

/// XXH64 of a request's JSON, in Crockford Base32.
pub fn digest(request: &impl Serialize) -> String {
    let bytes = serde_json::to_vec(request).expect("requests serialize");
    Digest::of(&bytes).to_string()
}

/// Whether one of `retries` undid `call` (see [`Journal::forget_retried`]).
pub fn retried(call: &CallRecord, retries: &[crate::store::records::RetryRecord]) -> bool {
    retries.iter().any(|r| call.step >= r.retry.from_step && call.timestamp < r.timestamp)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use parking_lot::Mutex;

    use super::*;

    /// A log kept in memory, shared so a second journal can read what the first wrote.
    #[derive(Debug, Clone, Default)]
    struct MemoryLog(Arc<Mutex<Vec<CallRecord>>>);

    impl CallLog for MemoryLog {
        fn read(&self) -> Result<Vec<CallRecord>> {
            Ok(self.0.lock().clone())
        }

        fn append(&mut self, record: &CallRecord, _durable: bool) -> Result<()> {
            self.0.lock().push(record.clone());
            Ok(())
        }
    }

    #[test]
    fn recorded_calls_replay_and_divergent_ones_are_refused() -> Result<()> {
        let log = MemoryLog::default();
        let answer = CallResponse::Ok { value: "hi".into(), meta: None, usage: None };
        {
            let mut journal = Journal::new(Box::new(log.clone()))?;
            journal.begin_step(0);
            let (seq, replay) = journal.next_call(CallKind::Agent, "planner", "D1").unwrap();
            assert_eq!((seq, replay), (0, Replay::Fresh));
            journal.record(seq, CallKind::Agent, "planner", "D1".into(), answer.clone(), true)?;
        }
        let mut journal = Journal::new(Box::new(log.clone()))?;
        journal.begin_step(0);
        assert_eq!(
            journal.next_call(CallKind::Agent, "planner", "D1").unwrap(),
            (0, Replay::Recorded(answer))
        );
        assert_eq!(journal.next_call(CallKind::Extract, "", "D2").unwrap(), (1, Replay::Fresh));
        journal.begin_step(0);
        let divergence = journal.next_call(CallKind::Agent, "planner", "OTHER").unwrap_err();
        assert!(divergence.to_string().contains("call 0 of step 1"), "{divergence}");
        Ok(())
    }

    #[test]
    fn a_human_answer_is_replayed_to_the_call_that_waited_for_it() -> Result<()> {
        let log = MemoryLog::default();
        let call = PendingCall {
            step: 2,
            seq: 0,
            digest: "D9".into(),
            system_prompt: None,
            input: None,
            child: None,
        };
        Journal::new(Box::new(log.clone()))?.record_answer(&call, "reviewer", "yes".into())?;
        let mut journal = Journal::new(Box::new(log))?;
        journal.begin_step(2);
        assert_eq!(
            journal.next_call(CallKind::Agent, "reviewer", "D9").unwrap(),
            (
                0,
                Replay::Recorded(CallResponse::Ok { value: "yes".into(), meta: None, usage: None })
            )
        );
        assert!(journal.calls_before(2).is_empty());
        assert_eq!(journal.calls_before(3).len(), 1);
        Ok(())
    }
}
