//! The call journal (`<ULID>.calls.jsonl`): every host call a step makes — agent and
//! extract, request digest and response — recorded durably before the guest sees the answer.
//!
//! When a step runs again (resume after a crash or a pause), its calls are matched by
//! position: a call whose request digest equals the recorded one is answered from the
//! journal, so no agent is paid twice for work it already did; a call that differs is
//! refused, never silently mixed with the record.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::durable::AppendFile;
use crate::error::{Error, Result};
use crate::ids::BundleHash;
use crate::thread_log::now_ms;

/// Which host import a call went to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CallKind {
    Agent,
    Extract,
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
    },
    /// A typed error the guest received: `kind` is the WIT error case.
    Error { kind: String, message: String },
}

/// The outcome of looking a call up.
#[derive(Debug, PartialEq)]
pub enum Replay {
    /// Recorded with the same request: answer with this.
    Recorded(CallResponse),
    /// Not recorded yet: make the call and record it.
    Fresh,
}

/// A call that does not match the journal.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "call {seq} of step {} ({kind:?}{role}) differs from the one recorded in the journal: the \
     bundle's requests are not deterministic, or its input changed; refusing to mix them",
    step + 1
)]
pub struct Divergence {
    pub step: usize,
    pub seq: usize,
    pub kind: CallKind,
    pub role: String,
}

/// A thread's journal, with the calls recorded so far. The file is opened for each record
/// rather than held open: a worker holds thousands of waiting threads, and file descriptors
/// are a per-process budget.
#[derive(Debug)]
pub struct Journal {
    /// `None`: records are kept in memory only (instances that are not threads).
    path: Option<PathBuf>,
    /// The journal file, kept open from one record to the next while the thread runs and
    /// closed before it waits (see `release`), so that thousands of waiting threads hold no
    /// descriptor for it and a running one does not reopen it for every call.
    file: Option<AppendFile>,
    recorded: HashMap<(usize, usize), CallRecord>,
    step: usize,
    seq: usize,
}

impl Journal {
    /// Opens (creating) the journal at `path` and loads what it holds. Torn or unreadable
    /// lines are skipped: a call whose record was lost is simply made again.
    pub fn open(path: &Path) -> Result<Self> {
        let recorded = read_calls(path)?
            .into_iter()
            .map(|record| ((record.step, record.seq), record))
            .collect();
        // Opening once now repairs a torn last line before anything is appended.
        AppendFile::open(path, true)?;
        Ok(Journal { path: Some(path.to_path_buf()), file: None, recorded, step: 0, seq: 0 })
    }

    /// A journal that records nothing (instances that are not threads).
    pub fn disabled() -> Self {
        Journal { path: None, file: None, recorded: HashMap::new(), step: 0, seq: 0 }
    }

    /// The step being counted.
    pub fn step(&self) -> usize {
        self.step
    }

    /// Starts counting the calls of step `step` (0-based). Between steps the thread may wait
    /// (for a pause, for its turn), so the file is closed here too.
    pub fn begin_step(&mut self, step: usize) {
        self.step = step;
        self.seq = 0;
        self.release();
    }

    /// Closes the journal file until the next record: called before the thread waits (on an
    /// agent, on the LLM extractor) so that a waiting thread holds no descriptor for it.
    pub fn release(&mut self) {
        self.file = None;
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
        match self.recorded.get(&(self.step, seq)) {
            None => Ok((seq, Replay::Fresh)),
            Some(record) if record.kind == kind && record.digest == digest => {
                Ok((seq, Replay::Recorded(record.response.clone())))
            }
            Some(_) => Err(Divergence {
                step: self.step,
                seq,
                kind,
                role: if role.is_empty() { String::new() } else { format!(", role `{role}`") },
            }),
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
        if let Some(path) = &self.path {
            let line = serde_json::to_vec(&record).expect("call records serialize");
            let file = match &mut self.file {
                Some(file) => file,
                // `open` repaired a torn tail already.
                None => self.file.insert(AppendFile::reopen(path, false)?),
            };
            file.append_synced(&line, durable)
                .map_err(Error::io("append to call journal", path))?;
        }
        self.recorded.insert((record.step, record.seq), record);
        Ok(())
    }
}

/// Records the answer to a call made elsewhere (a person's answer to a waiting thread).
pub fn record_answer(
    path: &Path,
    call: &crate::human::PendingCall,
    role: &str,
    answer: String,
) -> Result<()> {
    let mut journal = Journal::open(path)?;
    journal.begin_step(call.step);
    journal.record(
        call.seq,
        CallKind::Agent,
        role,
        call.digest.clone(),
        CallResponse::Ok { value: answer, meta: None },
        true,
    )
}

/// The calls recorded in a journal file (none if it does not exist).
pub fn read_calls(path: &Path) -> Result<Vec<CallRecord>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(Error::io("read call journal", path)(e)),
    };
    Ok(text.lines().filter_map(|line| serde_json::from_str(line).ok()).collect())
}

/// XXH64 of a request's JSON, in Crockford Base32.
pub fn digest(request: &impl Serialize) -> String {
    let bytes = serde_json::to_vec(request).expect("requests serialize");
    BundleHash::of(&bytes).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_calls_replay_and_divergent_ones_are_refused() -> Result<()> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.calls.jsonl");
        let answer = CallResponse::Ok { value: "hi".into(), meta: None };
        {
            let mut journal = Journal::open(&path)?;
            journal.begin_step(0);
            let (seq, replay) = journal.next_call(CallKind::Agent, "planner", "D1").unwrap();
            assert_eq!((seq, replay), (0, Replay::Fresh));
            journal.record(seq, CallKind::Agent, "planner", "D1".into(), answer.clone(), true)?;
        }
        let mut journal = Journal::open(&path)?;
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
}
