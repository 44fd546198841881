//! Why a thread stopped without ending: its pause markers, and the agent call a waiting thread
//! needs answered (by a person, or by the end of a child workflow's thread).

use serde::{Deserialize, Serialize};

use crate::ids::ThreadId;
use crate::spending::Budget;

/// A control line: the thread stopped without ending and waits for `resume` or `step`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PauseRecord {
    pub paused: Paused,
    pub timestamp: u64,
}

/// A control line: a worker took the thread up again after a rest (a person answered, it was
/// resumed or stepped). Written first thing when it runs on, so that the records of a thread
/// held by a worker tell one still letting go of its rest from one continuing after it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContinueRecord {
    pub continued: Continued,
    pub timestamp: u64,
}

impl ContinueRecord {
    /// The marker of `by` taking the thread up now.
    pub fn by(by: &str) -> Self {
        ContinueRecord { continued: Continued { by: by.into() }, timestamp: crate::clock::now_ms() }
    }
}

/// Who took a thread up again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Continued {
    /// The process that runs it on, as its queue names it: `worker 1234` on a home
    /// directory, `HOST:PID:ULID` (its lease owner) on a database.
    pub by: String,
}

/// Why a thread is paused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Paused {
    pub by: PauseReason,
    /// For `waiting`: the role whose human answer is needed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// For `waiting`: the agent call to answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<PendingCall>,
    /// A budget raised while paused (`resume --raise-budget`): the thread's from then on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    /// For `budget`: what would have gone over; for `signin`: which server, and what to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Who raised the budget this marker records, and through which channel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<DecidedBy>,
}

/// Who decided what a waiting thread waited for (answered it, decided about its tool call,
/// raised its budget), and through which channel: kept with the decision in the journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecidedBy {
    /// A person or a token as the channel knows them: a user name, an API token's name, the
    /// e-mail address a link was sent to.
    pub who: String,
    /// The channel: `cli`, `terminal`, `api`, `mcp`, `link:<channel>` (a signed link sent
    /// through a `notify:` channel).
    pub via: String,
}

impl DecidedBy {
    pub fn new(who: impl Into<String>, via: impl Into<String>) -> Self {
        DecidedBy { who: who.into(), via: via.into() }
    }

    /// Whoever runs this process, through `via` (the CLI, a terminal following a thread).
    pub fn local(via: &str) -> Self {
        let who = std::env::var("USER").or_else(|_| std::env::var("LOGNAME"));
        DecidedBy::new(who.unwrap_or_else(|_| "local user".into()), via)
    }
}

impl Paused {
    /// A pause of `reason` that waits on no call.
    pub fn by(reason: PauseReason) -> Self {
        Paused { by: reason, role: None, call: None, budget: None, reason: None, decided_by: None }
    }
}

/// Who or what paused a thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PauseReason {
    /// A user asked (`pause`, Ctrl-C of `run`).
    Pause,
    /// Created by `thread start` and not run yet.
    Start,
    /// `step` ran one step and stopped; `step` or `resume` continues it.
    Step,
    /// A `human` agent must answer (see `answer`).
    Waiting,
    /// The next agent call would go over the thread's budget (`resume --raise-budget`).
    Budget,
    /// A tool server's sign-in ran out and could not be renewed: a person signs in again
    /// (`tools login SERVER`), then resumes the thread.
    SignIn,
}

/// The agent call a waiting thread needs answered: recorded in its pause marker, so `answer`
/// can journal the text under it, and so whoever answers — a terminal following the thread
/// from another machine, the web view — can be shown what is asked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingCall {
    /// Index of the step (0-based) and position of the call in it.
    pub step: usize,
    pub seq: usize,
    /// Digest of the agent request.
    pub digest: String,
    /// The role's system prompt the person answers under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    /// The input the bundle gave this call, if any (the thread itself is in the record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    /// For a step that runs another workflow: the child thread whose end answers the call (a
    /// person does not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child: Option<ThreadId>,
    /// For a durable agent's call: the tool call a person must decide about (the call goes on
    /// from its journal once the decision is journaled; the call itself is not answered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<ToolWait>,
}

/// A tool call a durable agent waits on a person for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolWait {
    /// Why a person is asked.
    pub why: ToolWaitReason,
    /// The call, as the model made it.
    pub call_id: String,
    /// The tool (`server.tool`, as config.yaml names them).
    pub tool: String,
    /// Its arguments (JSON text, cut to a few kilobytes).
    pub arguments: String,
    /// What the model said before it asked for the call (cut to a few kilobytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
}

/// Why a durable agent asks a person about a tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolWaitReason {
    /// Its binding wants a person's yes before each call of the tool: approve or deny.
    Approve,
    /// A crash cut the call in the middle, and the tool is not safe to call again: redo it,
    /// or skip it with a text the model is given instead.
    Cut,
}

/// What a thread at rest waits on a person for (see `run::waits`, which tells it from the
/// thread's records, and `notify:` rules, which name it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WaitKind {
    /// An answer for a `human` agent's role.
    Answer,
    /// A yes or no for a tool call its binding wants approved.
    Approve,
    /// A decision about a tool call a crash cut in the middle: make it again or skip it.
    Cut,
    /// A budget raised: the next agent call would go over it.
    Budget,
    /// A tool server's sign-in renewed (`tools login`), on the machine that holds it.
    SignIn,
}

impl WaitKind {
    /// Every kind, in the order docs and errors list them.
    pub const ALL: [WaitKind; 5] =
        [WaitKind::Answer, WaitKind::Approve, WaitKind::Cut, WaitKind::Budget, WaitKind::SignIn];

    pub fn as_str(self) -> &'static str {
        match self {
            WaitKind::Answer => "answer",
            WaitKind::Approve => "approve",
            WaitKind::Cut => "cut",
            WaitKind::Budget => "budget",
            WaitKind::SignIn => "signin",
        }
    }

    /// The kind named `name`, or why there is none.
    pub fn parse(name: &str) -> std::result::Result<Self, String> {
        WaitKind::ALL.into_iter().find(|k| k.as_str() == name).ok_or_else(|| {
            let names: Vec<&str> = WaitKind::ALL.iter().map(|k| k.as_str()).collect();
            format!("unknown kind of wait `{name}` (known: {})", names.join(", "))
        })
    }
}
