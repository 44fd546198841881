//! A person's answer for a thread that waits on a `human` agent, or their decision about a
//! durable agent's tool call: whether the thread waits on one, what the answer must hold, and
//! recording it — the first of answers sent at once, under the thread's run lock, and only one
//! that fits. `answer`, the API, the web view and a follower at a terminal all record answers
//! here.

use crate::agents::human::AnswerShape;
use crate::error::{Error, Result};
use crate::ids::{BundleHash, ThreadId};
use crate::store::Storage;
use crate::store::journal::Decision;
use crate::store::pauses::{DecidedBy, ToolWait, ToolWaitReason};
use crate::store::records::{PauseReason, Paused, PendingCall, ThreadRecord, ThreadStatus};

/// What a person sends a waiting thread.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The answer for a `human` agent's role.
    Text(String),
    /// A decision about the tool call a durable agent waits on.
    Decision(Decision),
}

/// Records `answer` for waiting thread `id`; the thread's bundle is returned, to hand the
/// thread over to its worker, which continues with the answer.
///
/// Answers sent at once are settled under the thread's run lock: the first is checked (against
/// the role's schema, or the kind of decision the call needs) and journaled, and it is the one
/// the thread goes on with; every other is refused ([`Error::ThreadBusy`] while the first holds
/// the lock, [`Error::ThreadState`] once it is recorded) and leaves no trace. An answer that
/// does not fit the role is refused with the reason ([`Error::InvalidAnswer`]), and the thread
/// waits on.
pub fn record(store: &Storage, id: ThreadId, answer: Answer, by: &DecidedBy) -> Result<BundleHash> {
    check(store, id, &answer)?;
    let (writer, record) = store.threads().open(id)?;
    let (role, call) = waited_call(&record)?;
    let mut journal = store.threads().journal(record.start.hash, id)?;
    match (answer, &call.tool) {
        (Answer::Decision(decision), Some(tool)) => {
            fits(id, tool, &decision)?;
            if journal.decided(call, &tool.call_id) {
                return Err(Error::ThreadState {
                    id: id.to_string(),
                    status: "answered",
                    reason: "another decision about its tool call was recorded first".into(),
                });
            }
            journal.record_decision(call, &tool.call_id, decision, by)?;
        }
        (Answer::Text(text), None) => {
            if journal.answered(call) {
                return Err(Error::ThreadState {
                    id: id.to_string(),
                    status: "answered",
                    reason: "another answer to its question was recorded first".into(),
                });
            }
            journal.record_answer(call, role, text, by)?;
        }
        // `check` refused these, and the call waited on is the one it checked against: the
        // thread is held (a wait only changes under this lock) from here on.
        (_, tool) => return Err(Error::Usage(mismatch(id, role, tool.as_ref()))),
    }
    drop(writer);
    Ok(record.version())
}

/// Whether `answer` is one waiting thread `id` can take now — the kind its wait asks for, a
/// text that fits its role's schema, a decision with its reason — without recording it: what
/// a channel that must spend something first (a one-time link) checks before it does.
pub fn check(store: &Storage, id: ThreadId, answer: &Answer) -> Result<()> {
    if let Answer::Text(text) = answer
        && text.trim().is_empty()
    {
        return Err(Error::Usage("the answer is empty; give the text the thread waits for".into()));
    }
    let record = answerable(store, id)?;
    let (role, call) = waited_call(&record)?;
    match (answer, &call.tool) {
        (Answer::Decision(decision), Some(tool)) => fits(id, tool, decision),
        (Answer::Text(text), None) => {
            if let Some(shape) = answer_shape(store, &record)?
                && let Some(reason) = shape.mismatch(text)
            {
                return Err(Error::InvalidAnswer {
                    id: id.to_string(),
                    role: role.to_string(),
                    reason,
                    expected: shape.example(),
                });
            }
            Ok(())
        }
        (_, tool) => Err(Error::Usage(mismatch(id, role, tool.as_ref()))),
    }
}

/// Why an answer of the wrong kind does not fit what thread `id` waits for.
fn mismatch(id: ThreadId, role: &str, tool: Option<&ToolWait>) -> String {
    match tool {
        Some(tool) => asked_of(id, tool),
        None => format!(
            "thread {id} waits for an answer for role `{role}`, not a decision about a tool \
             call; give the answer's text"
        ),
    }
}

/// What a thread waiting on tool call `tool` must be sent, in a line.
pub fn asked_of(id: ThreadId, tool: &ToolWait) -> String {
    let name = crate::terminal::line(&tool.tool);
    match tool.why {
        ToolWaitReason::Approve => format!(
            "thread {id} waits for a decision about tool call `{name}`: approve it \
             (`answer {id} --approve`) or deny it (`answer {id} --deny WHY`)"
        ),
        ToolWaitReason::Cut => format!(
            "thread {id} waits for a decision about tool call `{name}`, which a crash cut in the \
             middle: make it again (`answer {id} --redo`) or give the model a text instead of its \
             result (`answer {id} --skip TEXT`)"
        ),
    }
}

/// Whether `decision` is one the call waited on can take.
fn fits(id: ThreadId, tool: &ToolWait, decision: &Decision) -> Result<()> {
    let fits = matches!(
        (tool.why, decision),
        (ToolWaitReason::Approve, Decision::Approve | Decision::Deny { .. })
            | (ToolWaitReason::Cut, Decision::Redo | Decision::Skip { .. })
    );
    match decision {
        Decision::Deny { reason: text } | Decision::Skip { text } if text.trim().is_empty() => {
            Err(Error::Usage(
                "the decision's text is empty; say why, or what the model is given".into(),
            ))
        }
        _ if fits => Ok(()),
        _ => Err(Error::Usage(asked_of(id, tool))),
    }
}

/// The role and the call waiting thread `record` needs answered.
fn waited_call(record: &ThreadRecord) -> Result<(&str, &PendingCall)> {
    match &record.paused {
        Some(Paused { by: PauseReason::Waiting, role, call: Some(call), .. }) => {
            Ok((role.as_deref().unwrap_or_default(), call))
        }
        _ => Err(Error::ThreadState {
            id: record.id().to_string(),
            status: record.status_at_rest().as_str(),
            reason: "it is not waiting for a human answer".into(),
        }),
    }
}

/// What the answer thread `record` waits for must hold, if anything: the waited role's schema
/// (see [`AnswerShape`]).
pub fn answer_shape(store: &Storage, record: &ThreadRecord) -> Result<Option<AnswerShape>> {
    let Some(Paused { role: Some(role), .. }) = &record.paused else { return Ok(None) };
    let descriptor = store.bundles().descriptor(record.version())?;
    let llm_extractor = store.config()?.extractor.is_some();
    Ok(descriptor.role(role).and_then(|spec| AnswerShape::of(role, &spec.schema, llm_extractor)))
}

/// Thread `id`, if it waits for a human answer.
pub fn answerable(store: &Storage, id: ThreadId) -> Result<ThreadRecord> {
    let record = store.threads().read(id)?;
    let status = record.status();
    let waiting =
        status == ThreadStatus::Waiting && record.paused.as_ref().is_some_and(|p| p.call.is_some());
    if !waiting {
        return Err(Error::ThreadState {
            id: id.to_string(),
            status: status.as_str(),
            reason: "it is not waiting for a human answer".into(),
        });
    }
    if let Some(child) = record.paused.as_ref().and_then(|p| p.call.as_ref()?.child) {
        return Err(Error::ThreadState {
            id: id.to_string(),
            status: status.as_str(),
            reason: format!(
                "it waits for its child thread {child}, not a person; it continues when the \
                 child ends"
            ),
        });
    }
    Ok(record)
}
