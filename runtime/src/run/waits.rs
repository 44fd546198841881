//! A wait is one concept: a thread at rest for a reason a person ends — an answer for a
//! `human` role, a yes or no for a tool call, a decision about a call a crash cut, a budget to
//! raise, a sign-in — and the decisions that end it. Every channel that carries a decision (the
//! CLI, the API and web view, MCP, a signed link) brings it here or to [`actions`], which this
//! calls: what a wait is, which decisions fit it, and whether it is still the one a decision was
//! made for live in this module.
//!
//! A wait is named by its thread and a key (where in the thread it waits: a call's step and
//! position, a tool call's id, the step a budget stopped before), and pinned by a digest of
//! exactly what it asks: a decision made for a question that has since changed — answered and
//! asked again, another tool call, another budget — is refused, not applied to the new one.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::ids::ThreadId;
use crate::run::actions::{self, Hand, Handed};
use crate::run::answer::{self, Answer};
use crate::run_request::RunRequest;
use crate::spending::Budget;
use crate::store::Storage;
use crate::store::journal::Decision as ToolDecision;
pub use crate::store::pauses::WaitKind;
use crate::store::pauses::{DecidedBy, ToolWait, ToolWaitReason};
use crate::store::records::{PauseReason, Paused, ThreadRecord, ThreadStatus};

/// The decisions that end a wait of `kind`, each a separate action (a one-time link is made
/// for one action). A sign-in is renewed where its credentials are, not decided.
pub fn actions(kind: WaitKind) -> &'static [Action] {
    match kind {
        WaitKind::Answer => &[Action::Answer],
        WaitKind::Approve => &[Action::Approve, Action::Deny],
        WaitKind::Cut => &[Action::Redo, Action::Skip],
        WaitKind::Budget => &[Action::Raise],
        WaitKind::SignIn => &[],
    }
}

/// One decision a wait may take, without what it carries (the answer's text, the reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Answer,
    Approve,
    Deny,
    Redo,
    Skip,
    Raise,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Answer => "answer",
            Action::Approve => "approve",
            Action::Deny => "deny",
            Action::Redo => "redo",
            Action::Skip => "skip",
            Action::Raise => "raise",
        }
    }

    /// What a button deciding it says.
    pub fn label(self) -> &'static str {
        match self {
            Action::Answer => "Answer",
            Action::Approve => "Approve",
            Action::Deny => "Deny",
            Action::Redo => "Make it again",
            Action::Skip => "Skip it",
            Action::Raise => "Raise the budget",
        }
    }

    /// Whether the decision carries a text a person writes (the answer, why a call is denied,
    /// what the model is given instead of a skipped call's result).
    pub fn takes_text(self) -> bool {
        matches!(self, Action::Answer | Action::Deny | Action::Skip)
    }
}

/// A decision that ends a wait.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "lowercase")]
pub enum Decision {
    Answer { text: String },
    Approve,
    Deny { reason: String },
    Redo,
    Skip { text: String },
    Raise { budget: Budget },
}

impl Decision {
    pub fn action(&self) -> Action {
        match self {
            Decision::Answer { .. } => Action::Answer,
            Decision::Approve => Action::Approve,
            Decision::Deny { .. } => Action::Deny,
            Decision::Redo => Action::Redo,
            Decision::Skip { .. } => Action::Skip,
            Decision::Raise { .. } => Action::Raise,
        }
    }

    /// The answer [`answer::record`] takes for it (none for a budget).
    fn answer(&self) -> Option<Answer> {
        Some(match self {
            Decision::Answer { text } => Answer::Text(text.clone()),
            Decision::Approve => Answer::Decision(ToolDecision::Approve),
            Decision::Deny { reason } => {
                Answer::Decision(ToolDecision::Deny { reason: reason.clone() })
            }
            Decision::Redo => Answer::Decision(ToolDecision::Redo),
            Decision::Skip { text } => Answer::Decision(ToolDecision::Skip { text: text.clone() }),
            Decision::Raise { .. } => return None,
        })
    }
}

/// What a thread at rest waits on a person for.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Wait {
    pub thread: ThreadId,
    /// The thread's workflow.
    pub workflow: String,
    pub kind: WaitKind,
    /// Where in the thread it waits (see the module documentation).
    pub key: String,
    /// SHA-256 of exactly what it asks (hex).
    pub digest: String,
    /// The role asked (an answer, a tool call of a durable agent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// What a person is asked, in words: the role's input or system prompt, the tool and its
    /// arguments, what would go over the budget.
    pub question: String,
    /// The tool call, for a tool call's wait.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<ToolWait>,
    /// The budget in force, for a budget's wait.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
}

/// The longest question a wait carries to a channel; the rest is on the thread's page.
const MAX_QUESTION: usize = 4000;

/// What thread `record` waits on a person for, if it waits on one: a thread that runs, ended,
/// or rests for another reason (paused by a user, a child workflow's thread, a provider's
/// capacity) does not.
pub fn of(record: &ThreadRecord) -> Option<Wait> {
    if record.end.is_some() {
        return None;
    }
    let paused = record.paused.as_ref()?;
    let status = record.status();
    let steps = record.steps.len();
    let (kind, key, role, question, tool, budget) = match paused {
        Paused { by: PauseReason::Waiting, role, call: Some(call), .. }
            if status == ThreadStatus::Waiting && call.child.is_none() =>
        {
            match &call.tool {
                Some(tool) => {
                    let kind = match tool.why {
                        ToolWaitReason::Approve => WaitKind::Approve,
                        ToolWaitReason::Cut => WaitKind::Cut,
                    };
                    let key = format!("{}.{}.{}", call.step, call.seq, tool.call_id);
                    let question = format!("{} {}", tool.tool, tool.arguments);
                    (kind, key, role.clone(), question, Some(tool.clone()), None)
                }
                None => {
                    let key = format!("{}.{}", call.step, call.seq);
                    let question = [call.input.as_deref(), call.system_prompt.as_deref()]
                        .into_iter()
                        .flatten()
                        .find(|q| !q.trim().is_empty())
                        .unwrap_or(&record.start.parameters.prompt)
                        .to_string();
                    let question = format!("{question}\n\u{0}{}", call.digest);
                    (WaitKind::Answer, key, role.clone(), question, None, None)
                }
            }
        }
        Paused { by: PauseReason::Budget, reason, .. } if status == ThreadStatus::Paused => {
            let question = reason.clone().unwrap_or_else(|| "its budget is spent".into());
            (
                WaitKind::Budget,
                format!("budget.{steps}"),
                None,
                question,
                None,
                Some(record.budget()),
            )
        }
        Paused { by: PauseReason::SignIn, reason, .. } if status == ThreadStatus::Paused => {
            let question = reason.clone().unwrap_or_else(|| "a tool server's sign-in".into());
            (WaitKind::SignIn, format!("signin.{steps}"), None, question, None, None)
        }
        _ => return None,
    };
    let digest = digest_of(kind, &key, role.as_deref(), &question, tool.as_ref());
    // The call's own digest is part of what is pinned, not of what is shown.
    let question = question.split('\u{0}').next().unwrap_or_default().trim_end().to_string();
    let question = crate::terminal::cut(&question, MAX_QUESTION).into_owned();
    Some(Wait {
        thread: record.id(),
        workflow: record.start.name.clone(),
        kind,
        key,
        digest,
        role,
        question,
        tool,
        budget,
    })
}

fn digest_of(
    kind: WaitKind,
    key: &str,
    role: Option<&str>,
    question: &str,
    tool: Option<&ToolWait>,
) -> String {
    let pinned = serde_json::json!({
        "kind": kind, "key": key, "role": role, "question": question, "tool": tool,
    });
    crate::store::bundles::sha256_hex(pinned.to_string().as_bytes())
}

/// The wait a decision was made for: it is applied only if the thread still waits on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    pub key: String,
    pub digest: String,
}

/// Why a decision found no wait to end.
pub fn not_waiting(record: &ThreadRecord, expected: &Expected) -> Error {
    let reason = match of(record) {
        None if record.end.is_some() => "it has ended".to_string(),
        None => "it no longer waits on a person (answered, or resumed)".to_string(),
        Some(wait) if wait.key == expected.key => {
            "what it waits for has changed since (the question or the call is another)".into()
        }
        Some(wait) => {
            format!("it was answered; it now waits for something else ({})", wait.kind.as_str())
        }
    };
    Error::ThreadState {
        id: record.id().to_string(),
        status: record.status_at_rest().as_str(),
        reason,
    }
}

/// The wait of thread `id`, if it is still `expected` (else why not, as
/// [`Error::ThreadState`]).
pub fn current(store: &Storage, id: ThreadId, expected: &Expected) -> Result<Wait> {
    let record = store.threads().read(id)?;
    match of(&record) {
        Some(wait) if wait.key == expected.key && wait.digest == expected.digest => Ok(wait),
        _ => Err(not_waiting(&record, expected)),
    }
}

/// Whether `decision` is one `wait` can take now, recording nothing: checked before a channel
/// spends what it cannot get back (a one-time link).
pub fn check(store: &Storage, wait: &Wait, decision: &Decision) -> Result<()> {
    if !actions(wait.kind).contains(&decision.action()) {
        let actions: Vec<&str> = actions(wait.kind).iter().map(|a| a.as_str()).collect();
        return Err(Error::Usage(format!(
            "thread {} waits for {} (decisions: {}), not `{}`",
            wait.thread,
            wait.kind.as_str(),
            if actions.is_empty() { "none here".into() } else { actions.join(", ") },
            decision.action().as_str()
        )));
    }
    match (decision, decision.answer()) {
        (_, Some(answer)) => answer::check(store, wait.thread, &answer),
        (Decision::Raise { budget }, None) => check_raise(wait, budget),
        _ => Ok(()),
    }
}

/// A raise must raise something, and not below what is in force (a raise that lowers the
/// budget would stop the thread again at once).
fn check_raise(wait: &Wait, raise: &Budget) -> Result<()> {
    if *raise == Budget::default() {
        return Err(Error::Usage(
            "the raise sets no limit: give tokens, cost, calls or time".into(),
        ));
    }
    let now = wait.budget.clone().unwrap_or_default();
    let lower =
        |new: Option<f64>, old: Option<f64>| matches!((new, old), (Some(n), Some(o)) if n < o);
    let as_f = |v: Option<u64>| v.map(|v| v as f64);
    if lower(raise.max_cost_usd, now.max_cost_usd)
        || lower(as_f(raise.max_tokens), as_f(now.max_tokens))
        || lower(as_f(raise.max_agent_calls), as_f(now.max_agent_calls))
        || lower(as_f(raise.max_duration_ms), as_f(now.max_duration_ms))
    {
        return Err(Error::Usage("a raise may not set a limit below the one in force".into()));
    }
    Ok(())
}

/// Ends the wait of thread `id` with `decision`, made by `by`, and hands the thread to a
/// worker to go on. With `expected`, only if the thread still waits on that wait.
pub async fn decide(
    store: &Storage,
    id: ThreadId,
    expected: Option<&Expected>,
    decision: &Decision,
    by: &DecidedBy,
) -> Result<Handed> {
    let record = store.threads().read(id)?;
    let wait = match (of(&record), expected) {
        (Some(wait), Some(e)) if wait.key == e.key && wait.digest == e.digest => wait,
        (_, Some(e)) => return Err(not_waiting(&record, e)),
        (Some(wait), None) => wait,
        (None, None) => {
            return Err(Error::ThreadState {
                id: id.to_string(),
                status: record.status_at_rest().as_str(),
                reason: "it does not wait on a person".into(),
            });
        }
    };
    check(store, &wait, decision)?;
    match (decision, decision.answer()) {
        (_, Some(answer)) => actions::answer(store, id, answer, by, Hand::Detach).await,
        (Decision::Raise { budget }, None) => {
            actions::raise_budget(store, id, budget, by)?;
            actions::resume(store, id, &RunRequest::default(), Hand::Detach).await
        }
        _ => unreachable!("every decision but a raise is an answer"),
    }
}

/// A decision a person made for thread, as its journal keeps it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DecisionView {
    /// The step and the call in it it answered.
    pub step: usize,
    pub seq: usize,
    /// `answer`, or the decision about a tool call (`approve`, `deny`, `redo`, `skip`).
    pub decision: String,
    /// The tool call decided about.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    pub by: DecidedBy,
    pub timestamp: u64,
}

/// The decisions people made for thread `record` that its journal says who made (the journal
/// kept no name before it did), oldest first; budget raises are in its pause markers.
pub fn decisions(store: &Storage, record: &ThreadRecord) -> Result<Vec<DecisionView>> {
    use crate::store::call_loop::LoopEntry;
    use crate::store::journal::JournalLine;
    let journal = store.threads().journal(record.start.hash, record.id())?;
    let mut found = vec![];
    for line in journal.calls_before(usize::MAX) {
        match line {
            JournalLine::Call(call) => {
                if let Some(by) = call.decided_by {
                    found.push(DecisionView {
                        step: call.step,
                        seq: call.seq,
                        decision: "answer".into(),
                        call_id: None,
                        by,
                        timestamp: call.timestamp,
                    });
                }
            }
            JournalLine::Loop(entry) => {
                if let LoopEntry::Decision { call_id, decision, by: Some(by) } = entry.entry {
                    let decision = serde_json::to_value(&decision).unwrap_or_default();
                    found.push(DecisionView {
                        step: entry.step,
                        seq: entry.seq,
                        decision: decision["decision"].as_str().unwrap_or_default().to_string(),
                        call_id: Some(call_id),
                        by,
                        timestamp: entry.timestamp,
                    });
                }
            }
        }
    }
    found.sort_by_key(|d| d.timestamp);
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_reads_back_and_decisions_name_their_action() {
        for kind in WaitKind::ALL {
            assert_eq!(WaitKind::parse(kind.as_str()), Ok(kind));
        }
        assert!(WaitKind::parse("approval").unwrap_err().contains("approve"));
        let raise = Decision::Raise { budget: Budget { max_tokens: Some(9), ..Budget::default() } };
        let json = serde_json::to_string(&raise).unwrap();
        assert_eq!(serde_json::from_str::<Decision>(&json).unwrap(), raise);
        assert_eq!(raise.action(), Action::Raise);
        assert!(actions(WaitKind::Budget).contains(&Action::Raise));
        assert!(actions(WaitKind::SignIn).is_empty());
    }

    #[test]
    fn the_digest_pins_what_is_asked() {
        let a = digest_of(WaitKind::Approve, "1.0.c", None, "fs.write {\"p\":1}", None);
        let b = digest_of(WaitKind::Approve, "1.0.c", None, "fs.write {\"p\":2}", None);
        let c = digest_of(WaitKind::Cut, "1.0.c", None, "fs.write {\"p\":1}", None);
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_eq!(a, digest_of(WaitKind::Approve, "1.0.c", None, "fs.write {\"p\":1}", None));
    }
}
