//! What a thread is made of on any store: its start record, one record per role output, pause
//! markers and its end record, and the thread as read back with its status. The JSON of these
//! types is the line format of `.data.jsonl` and of `thread --json`.

pub use super::pauses::{
    ContinueRecord, Continued, PauseReason, PauseRecord, Paused, PendingCall, ToolWait,
    ToolWaitReason,
};
pub use super::started_by::StartedBy;
pub use super::steps::{StepGroup, StepRecord};
pub use super::summaries::{SUMMARY_PROMPT_CHARS, ThreadStatus, ThreadSummary};
pub use super::upgrades::{Retry, RetryRecord, Upgrade, UpgradeRecord};
use crate::ids::{BundleHash, ThreadId};
use crate::run_request::RunRequest;
pub use crate::spending::{Budget, Usage};
use serde::{Deserialize, Serialize};

/// Line 1 of a thread: what the thread runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StartRecord {
    /// The workflow name it was started under.
    pub name: String,
    pub hash: BundleHash,
    pub thread_id: ThreadId,
    pub parameters: Parameters,
    pub timestamp: u64,
    /// Set when the thread is a fork of another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<ForkedFrom>,
    /// What the trigger that started the thread passed (a poll's item), if one did; the
    /// bundle gets it as `run-input.trigger-data`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger_data: Option<serde_json::Value>,
    /// Set when a schedule started the thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<ScheduledBy>,
    /// Set when a step of another thread started this one as its child workflow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentLink>,
    /// Who asked for the thread from outside, when a request did (an MCP client, an API
    /// caller): what `threads`, `thread`, the web view and traces name as its starter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_by: Option<StartedBy>,
    /// Set on a thread of an eval: the recorded thread it re-runs, whose journal answers its
    /// calls that ask what that thread asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval: Option<EvalOf>,
}

impl StartRecord {
    /// The most steps the thread may take, as it was given when created (a start record
    /// always holds it; one that did not would get the hard cap's default).
    pub fn max_rounds(&self) -> u32 {
        self.parameters.options.max_rounds.unwrap_or(crate::limits::Limits::default().max_rounds)
    }
}

/// The step of a parent thread a child workflow's thread runs for: its end answers that
/// step's call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentLink {
    pub thread_id: ThreadId,
    /// The parent's step (its role) that runs this workflow.
    pub role: String,
    /// How deep in a chain of children this thread is: 1 under a thread nobody started.
    pub depth: u32,
}

/// The schedule firing that started a thread.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScheduledBy {
    /// The schedule's name.
    pub name: String,
    /// What fired, as its firing log records it (`cron:…`, `item:…`, `change:…`).
    pub firing: String,
}

/// A thread's parameters: its prompt, and the run request it was started with, as checked
/// when it was created (its agents, directory, max rounds, limits and budget), so that a thread
/// resumed in another process runs with the same.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Parameters {
    pub prompt: String,
    pub options: RunRequest,
}

/// The recorded thread a thread of an eval re-runs, and in which experiment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EvalOf {
    /// The experiment (eval) id.
    pub experiment: String,
    /// The recorded thread.
    pub baseline: ThreadId,
    /// The roles asked live, whatever their request; the others are asked live only when
    /// their request is not one the recorded thread made.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub live: Vec<String>,
    /// What a durable agent's tool call the recorded thread never made gets.
    #[serde(default)]
    pub tools: EvalTools,
}

/// What a thread of an eval does with a durable agent's tool call: one the recorded thread
/// made with the same arguments takes its recorded result; any other is made, refused, or
/// ends the call, as the eval says (`eval --tools`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EvalTools {
    /// The call fails, saying where the thread diverged from the recorded one: nothing an
    /// eval does reaches the world unless asked.
    #[default]
    Journal,
    /// The call is made (approvals still apply).
    Live,
    /// The model is told the call was refused, and goes on.
    Deny,
}

/// Where a fork came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ForkedFrom {
    pub thread_id: ThreadId,
    /// Number of steps taken over from the original.
    pub step: usize,
}

/// The last line of a finished thread.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndRecord {
    pub end: End,
    pub timestamp: u64,
}

/// How a thread ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct End {
    pub return_code: i32,
    pub summary: String,
    pub status: EndStatus,
    /// Who ended it: the workflow (its own result) or the host (a trap, a limit, a broken
    /// contract, `kill`). Absent in records written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_by: Option<EndedBy>,
}

/// Who ended a thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EndedBy {
    /// The workflow returned its result.
    Workflow,
    /// The host stopped it.
    Host,
}

/// The return codes a workflow's own result passes through as the CLI's exit code. The rest
/// of the range is the host's (see [`crate::error::exit`]); a workflow code outside this one
/// exits with [`WORKFLOW_CODE_OUT_OF_RANGE`], so no bundle can exit like the host does.
pub const WORKFLOW_CODES: std::ops::RangeInclusive<i32> = 0..=63;

/// The exit code of a workflow result outside [`WORKFLOW_CODES`].
pub const WORKFLOW_CODE_OUT_OF_RANGE: i32 = 1;

impl End {
    /// The ending a workflow gave itself: completed on 0, failed otherwise.
    pub fn by_workflow(return_code: i32, summary: String) -> Self {
        let status = if return_code == 0 { EndStatus::Completed } else { EndStatus::Failed };
        End { return_code, summary, status, ended_by: Some(EndedBy::Workflow) }
    }

    /// An ending the host imposed.
    pub fn by_host(return_code: i32, summary: String, status: EndStatus) -> Self {
        End { return_code, summary, status, ended_by: Some(EndedBy::Host) }
    }

    /// The exit code of a command that followed the thread to this end: a workflow's own code
    /// if it is in [`WORKFLOW_CODES`], else [`WORKFLOW_CODE_OUT_OF_RANGE`]; the host's codes
    /// as they are.
    pub fn exit_code(&self) -> i32 {
        match self.ended_by {
            Some(EndedBy::Workflow) if !WORKFLOW_CODES.contains(&self.return_code) => {
                WORKFLOW_CODE_OUT_OF_RANGE
            }
            _ => self.return_code,
        }
    }
}

/// The host's view of how a thread ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EndStatus {
    /// The workflow returned code 0.
    Completed,
    /// The workflow returned a non-zero code, trapped, or hit a limit.
    Failed,
    /// Stopped by `kill`.
    Killed,
}

impl EndStatus {
    /// Lower-case name, as in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            EndStatus::Completed => "completed",
            EndStatus::Failed => "failed",
            EndStatus::Killed => "killed",
        }
    }
}

/// A thread as read back from its store.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThreadRecord {
    pub start: StartRecord,
    pub steps: Vec<StepRecord>,
    pub end: Option<EndRecord>,
    /// The pause the thread is in: the last control line, if no step came after it.
    pub paused: Option<Paused>,
    /// When that pause was recorded.
    #[serde(skip)]
    pub paused_at: Option<u64>,
    /// Lines that did not parse (a torn last line after a crash, or damage) and were skipped.
    #[serde(skip)]
    pub skipped_lines: Vec<usize>,
    /// Where each step is in the store (its line in a thread file), for messages.
    #[serde(skip)]
    pub step_lines: Vec<usize>,
    /// The budget last raised (by a pause marker), if one was: see [`ThreadRecord::budget`].
    #[serde(skip)]
    pub raised_budget: Option<Budget>,
    /// Its moves to other versions of its workflow, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub upgrades: Vec<Upgrade>,
    /// Its retries after failing, oldest first (each with when it was made).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retries: Vec<RetryRecord>,
    /// Each time the thread came to rest, in the order of its records: what its followers
    /// are told, so that a rest between two looks at it is not missed.
    #[serde(skip)]
    pub rests: Vec<Rest>,
    /// Whether its records end in its last rest: nothing (no step, no
    /// [`ContinueRecord`]) says a worker took it up since. A thread held a moment after it
    /// came to rest (while its worker lets it go) is at rest by its records, one held after
    /// it was taken up again is not: a follower's first look tells the two apart by this.
    #[serde(skip)]
    pub resting: bool,
    /// Whether a process held the thread's run lock when it was read.
    #[serde(skip)]
    pub running: bool,
    /// Whether it waited in a shared store's queue for a worker to take it (and none held it).
    #[serde(skip)]
    pub queued: bool,
}

/// A time a thread came to rest (waited for a person or a child, paused, ended), as its
/// records tell it.
#[derive(Debug, Clone, PartialEq)]
pub struct Rest {
    /// How many steps it had then.
    pub steps: usize,
    pub kind: RestKind,
}

/// How a thread came to rest.
#[derive(Debug, Clone, PartialEq)]
pub enum RestKind {
    /// It waits for an answer for `role` (a person's, or a child workflow's end).
    Waiting {
        role: String,
    },
    /// It paused (asked to, over its budget, created or stepped and not run on, retried).
    Paused,
    Ended(End),
}

impl ThreadRecord {
    /// What the thread may spend: the budget it started with, or the one last raised.
    pub fn budget(&self) -> Budget {
        self.raised_budget.clone().unwrap_or_else(|| self.start.parameters.options.budget.clone())
    }

    /// What the thread's agent calls cost, added up over its steps; `None` if no agent
    /// reported any usage.
    pub fn usage(&self) -> Option<Usage> {
        Usage::sum(self.steps.iter().filter_map(|s| s.usage.as_ref()))
    }

    /// A thread just created with `steps` (a fork's prefix), held by its creator.
    pub fn created(start: &StartRecord, steps: &[StepRecord]) -> Self {
        ThreadRecord {
            start: start.clone(),
            steps: steps.to_vec(),
            end: None,
            paused: None,
            paused_at: None,
            skipped_lines: vec![],
            step_lines: (2..steps.len() + 2).collect(),
            raised_budget: None,
            upgrades: Vec::new(),
            retries: Vec::new(),
            rests: Vec::new(),
            resting: false,
            running: true,
            queued: false,
        }
    }

    /// The version of its workflow the thread runs: the one it last moved to, or the one it
    /// started on (under which its records stay stored).
    pub fn version(&self) -> BundleHash {
        self.upgrades.last().map_or(self.start.hash, |u| u.to)
    }

    /// The child workflow's thread this thread waits on, with the role and the call its end
    /// answers.
    pub fn waited_child(&self) -> Option<(ThreadId, &str, &PendingCall)> {
        match &self.paused {
            Some(Paused {
                by: PauseReason::Waiting, role: Some(role), call: Some(call), ..
            }) if self.end.is_none() => call.child.map(|child| (child, role.as_str(), call)),
            _ => None,
        }
    }

    /// This thread as listings show it.
    pub fn summary(&self) -> ThreadSummary {
        let usage = self.usage();
        ThreadSummary {
            thread_id: self.start.thread_id,
            name: self.start.name.clone(),
            hash: self.start.hash,
            status: self.status(),
            steps: self.steps.len(),
            timestamp: self.start.timestamp,
            prompt: self.start.parameters.prompt.chars().take(SUMMARY_PROMPT_CHARS).collect(),
            return_code: self.end.as_ref().map(|e| e.end.return_code),
            ended: self.end.as_ref().map(|e| e.timestamp),
            waiting_role: self.paused.as_ref().and_then(|p| p.role.clone()),
            paused_at: self.paused_at,
            schedule: self.start.schedule.as_ref().map(|s| s.name.clone()),
            tokens: usage.as_ref().map_or(0, |u| u.input_tokens + u.output_tokens),
            cost_usd: usage.and_then(|u| u.cost_usd),
            parent: self.start.parent.as_ref().map(|p| p.thread_id),
            started_by: self.start.started_by.as_ref().map(StartedBy::line),
        }
    }
}

/// What a status says of a thread's end (with [`EndStatus`], which is a record's).
impl ThreadStatus {
    /// How the thread ended, if it has ended for good.
    pub fn end_status(self) -> Option<EndStatus> {
        match self {
            ThreadStatus::Completed => Some(EndStatus::Completed),
            ThreadStatus::Failed => Some(EndStatus::Failed),
            ThreadStatus::Killed => Some(EndStatus::Killed),
            _ => None,
        }
    }

    /// Has the thread ended for good?
    pub fn is_ended(self) -> bool {
        self.end_status().is_some()
    }
}

impl ThreadRecord {
    /// The thread's status. A thread being run holds its run lock, so "running" is known
    /// without asking any process, and a crashed run's lock is gone with it.
    pub fn status(&self) -> ThreadStatus {
        match self.end {
            None if self.running => ThreadStatus::Running,
            None if self.queued => ThreadStatus::Queued,
            _ => self.status_at_rest(),
        }
    }

    /// Whether a worker runs the thread or is about to: running, or queued for one.
    pub fn is_live(&self) -> bool {
        matches!(self.status(), ThreadStatus::Running | ThreadStatus::Queued)
    }

    /// Whether the thread never ran: no step, no end, no pause, and no worker runs it or has
    /// it queued. What its creator leaves when it dies between creating a thread (at rest) and
    /// handing it to a worker; whoever finishes that creator's work hands it over.
    pub fn never_ran(&self) -> bool {
        self.steps.is_empty() && self.end.is_none() && self.paused.is_none() && !self.is_live()
    }

    /// When the thread last changed: its end, its last step, or its start (ms).
    pub fn last_changed(&self) -> u64 {
        self.end
            .as_ref()
            .map(|e| e.timestamp)
            .or(self.steps.last().map(|s| s.timestamp))
            .unwrap_or(self.start.timestamp)
    }

    /// The status the thread has when no process runs it: ended, paused, waiting, or
    /// interrupted (its process died mid-run).
    pub fn status_at_rest(&self) -> ThreadStatus {
        if let Some(end) = &self.end {
            return match end.end.status {
                EndStatus::Completed => ThreadStatus::Completed,
                EndStatus::Failed => ThreadStatus::Failed,
                EndStatus::Killed => ThreadStatus::Killed,
            };
        }
        if let Some(paused) = &self.paused {
            match paused.by {
                PauseReason::Waiting => ThreadStatus::Waiting,
                PauseReason::Pause
                | PauseReason::Start
                | PauseReason::Step
                | PauseReason::Budget
                | PauseReason::SignIn => ThreadStatus::Paused,
            }
        } else {
            ThreadStatus::Interrupted
        }
    }

    /// The thread's id.
    pub fn id(&self) -> ThreadId {
        self.start.thread_id
    }
}

/// A thread read back line by line, the same from a file and from database rows: the first
/// record is the start, then steps, pause markers and the end. Lines that are not text or do
/// not parse are skipped and counted (a torn write); empty lines are ignored.
#[derive(Debug, Default, Clone)]
pub struct ThreadLines {
    start: Option<StartRecord>,
    steps: Vec<StepRecord>,
    step_lines: Vec<usize>,
    end: Option<EndRecord>,
    paused: Option<PauseRecord>,
    /// The budget the last pause marker that raised one set.
    raised_budget: Option<Budget>,
    upgrades: Vec<Upgrade>,
    retries: Vec<RetryRecord>,
    rests: Vec<Rest>,
    /// Whether the lines so far end in a rest (see [`ThreadRecord::resting`]).
    resting: bool,
    skipped_lines: Vec<usize>,
}

impl ThreadLines {
    /// Adds line `number` (1-based).
    pub fn push(&mut self, number: usize, bytes: &[u8]) {
        let Ok(line) = std::str::from_utf8(bytes) else {
            self.skipped_lines.push(number);
            return;
        };
        if line.trim().is_empty() {
            return;
        }
        let Ok(value) = serde_json::from_str::<serde_json::Value>(line) else {
            self.skipped_lines.push(number);
            return;
        };
        let parsed = if self.start.is_none() {
            serde_json::from_value(value).map(|s| self.start = Some(s))
        } else if value.get("end").is_some() {
            serde_json::from_value::<EndRecord>(value).map(|e| {
                self.rested(RestKind::Ended(e.end.clone()));
                self.end = Some(e)
            })
        } else if value.get("upgrade").is_some() {
            serde_json::from_value::<UpgradeRecord>(value).map(|u| self.upgrades.push(u.upgrade))
        } else if value.get("retry").is_some() {
            serde_json::from_value::<RetryRecord>(value).map(|r| self.retried(number, r))
        } else if value.get("continued").is_some() {
            serde_json::from_value::<ContinueRecord>(value).map(|_| self.resting = false)
        } else if value.get("paused").is_some() {
            serde_json::from_value::<PauseRecord>(value).map(|p| {
                match &p.paused.budget {
                    // A budget raised while at rest: the rest goes on.
                    Some(budget) => self.raised_budget = Some(budget.clone()),
                    None => self.rested(match p.paused.by {
                        PauseReason::Waiting => {
                            RestKind::Waiting { role: p.paused.role.clone().unwrap_or_default() }
                        }
                        _ => RestKind::Paused,
                    }),
                }
                self.paused = Some(p)
            })
        } else {
            serde_json::from_value(value).map(|s| {
                self.steps.push(s);
                self.step_lines.push(number);
                self.paused = None;
                self.resting = false;
            })
        };
        if parsed.is_err() {
            self.skipped_lines.push(number);
        }
    }

    /// The thread came to rest, after the steps read so far.
    fn rested(&mut self, kind: RestKind) {
        self.rests.push(Rest { steps: self.steps.len(), kind });
        self.resting = true;
    }

    /// A retry: the thread's end is undone, the steps it carries are the thread's, and it is
    /// at rest, paused, for `resume` to continue.
    fn retried(&mut self, number: usize, record: RetryRecord) {
        self.end = None;
        // From an earlier step: the steps after it are history, not the thread's.
        self.steps.truncate(record.retry.from_step);
        self.step_lines.truncate(record.retry.from_step);
        for step in &record.retry.steps {
            self.steps.push(step.clone());
            self.step_lines.push(number);
        }
        let paused = Paused::by(PauseReason::Pause);
        self.paused = Some(PauseRecord { paused, timestamp: record.timestamp });
        self.retries.push(record);
        self.rested(RestKind::Paused);
    }

    /// The thread as these lines make it (held by a process if `held`, waiting in a queue if
    /// `queued`); `None` without a start record.
    pub fn record(self, held: bool, queued: bool) -> Option<ThreadRecord> {
        let (mut record, _) = self.finish(held)?;
        record.queued = queued;
        Some(record)
    }

    /// The thread, and the line where a parallel group cut short by a crash starts if it
    /// ends with one (its steps are left out: a group is stored whole or not at all).
    /// `None` without a start record.
    pub fn finish(mut self, running: bool) -> Option<(ThreadRecord, Option<usize>)> {
        let start = self.start?;
        let mut cut_group = None;
        if let Some(group) = self.steps.last().and_then(|s| s.group) {
            let held = self.steps.iter().rev().take_while(|s| s.group == Some(group)).count();
            if held < group.size {
                let keep = self.steps.len() - held;
                cut_group = Some(self.step_lines[keep]);
                self.skipped_lines.extend(self.step_lines.drain(keep..));
                self.steps.truncate(keep);
            }
        }
        // A cut group's steps dropped, the rest after them is no rest of these steps.
        let resting =
            self.resting && self.rests.last().is_some_and(|r| r.steps == self.steps.len());
        let (paused, paused_at) = match self.paused {
            Some(PauseRecord { paused, timestamp }) => (Some(paused), Some(timestamp)),
            None => (None, None),
        };
        let record = ThreadRecord {
            start,
            steps: self.steps,
            end: self.end,
            paused,
            paused_at,
            skipped_lines: self.skipped_lines,
            step_lines: self.step_lines,
            raised_budget: self.raised_budget,
            upgrades: self.upgrades,
            retries: self.retries,
            rests: self.rests,
            resting,
            running,
            queued: false,
        };
        Some((record, cut_group))
    }
}
