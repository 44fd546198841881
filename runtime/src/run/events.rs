//! What happens to a thread as the library tells it: taken by a worker, a role at work, a step
//! stored, waiting for a person, paused, ended; and what is at work now, as `ps` lists it. One
//! typed event; a CLI line, a `--json` line, the web view and the worker protocol are
//! renderings of it, none of them the event.
//!
//! `--json` prints each as one line of JSON whose `type` names it (docs/json.md has the
//! format): `started`, `working`, `step`, `waiting`, `paused`, `ended`.

use serde::{Deserialize, Serialize};

use crate::ids::{BundleHash, ThreadId};
use crate::store::records::{End, EndRecord, StepRecord};

/// Something that happened to thread `thread`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", rename_all_fields = "camelCase")]
pub enum Event {
    /// The thread was handed to a worker, or queued for one.
    Started {
        thread: ThreadId,
        hash: BundleHash,
        /// The worker's process id; none when the thread was queued for any worker.
        worker: Option<u32>,
        /// Whether the worker had the bundle precompiled (none when queued).
        precompiled: Option<bool>,
        /// How many steps the thread had: it continues after them.
        resumed_after: usize,
    },
    /// Roles began work, with these agents (several at once in a parallel group).
    Working { thread: ThreadId, roles: Vec<String>, agents: Vec<String> },
    /// A step was stored; `index` is its position in the thread, from 1.
    Step { thread: ThreadId, index: usize, step: StepRecord },
    /// A model wrote some text for a role, in a turn of its call (`stream: true` bindings): the
    /// pieces of a turn's text as they come, not kept (its whole message is, when the turn
    /// ends).
    Delta {
        thread: ThreadId,
        #[serde(flatten)]
        text: crate::store::queue::LiveText,
    },
    /// The thread stopped to wait for a person's answer for `role` (`answer` continues it).
    Waiting { thread: ThreadId, role: String },
    /// The thread paused after its step `steps` (`resume` continues it).
    Paused { thread: ThreadId, steps: usize },
    /// The thread ended.
    Ended {
        thread: ThreadId,
        #[serde(flatten)]
        end: End,
    },
}

impl Event {
    /// Whether nothing follows this event in the thread's run.
    pub fn is_last(&self) -> bool {
        matches!(self, Event::Waiting { .. } | Event::Paused { .. } | Event::Ended { .. })
    }

    /// The `working` event of an activity as the sandbox reports it (roles and agents joined
    /// by `, `).
    pub fn working(thread: ThreadId, roles: &str, agents: &str) -> Event {
        let split = |s: &str| s.split(", ").map(str::to_string).collect();
        Event::Working { thread, roles: split(roles), agents: split(agents) }
    }

    /// `role is working (agent)`, `a and b are working (x, y)`, as a person reads it.
    pub fn working_phrase(roles: &[String], agents: &[String]) -> String {
        let agents = agents.join(", ");
        match roles {
            [] => format!("working ({agents})"),
            [one] => format!("{one} is working ({agents})"),
            [rest @ .., last] => format!("{} and {last} are working ({agents})", rest.join(", ")),
        }
    }
}

/// A thread at work, as `ps` lists it: run by a live worker, queued for one, or waiting for a
/// person. A worker's socket sends these as they are.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PsEntry {
    pub thread_id: ThreadId,
    pub name: String,
    pub hash: BundleHash,
    /// The role being worked on, if any.
    pub role: Option<String>,
    /// The agent answering it (absent from workers older than this field).
    #[serde(default)]
    pub agent: Option<String>,
    /// Since when that agent works (ms since the epoch).
    #[serde(default)]
    pub working_since: Option<u64>,
    pub steps: usize,
    /// When its worker started running it, or since when it waits (ms since the epoch).
    pub since: u64,
    /// The worker running it; none for a thread queued, or waiting for a human answer.
    pub pid: Option<u32>,
    /// The machine of that worker, on a shared store (a local worker's is this one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    pub state: PsState,
    /// The provider limit one of its requests waits for its turn in (`ps`: `waiting for
    /// NAME`), if one does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
}

/// Where a thread `ps` lists is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PsState {
    /// A worker runs it.
    Running,
    /// It waits in a shared store's queue for a worker.
    Queued,
    /// It waits for a person's answer, or for a child workflow's thread.
    Waiting,
}

impl PsState {
    /// Its name, as `ps` prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            PsState::Running => "running",
            PsState::Queued => "queued",
            PsState::Waiting => "waiting",
        }
    }
}

/// A thread's end record as views show it: the end's fields and when it was written, at one
/// level (`thread --json`, the web view).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndView<'a> {
    #[serde(flatten)]
    pub end: &'a End,
    pub timestamp: u64,
}

impl<'a> From<&'a EndRecord> for EndView<'a> {
    fn from(record: &'a EndRecord) -> Self {
        EndView { end: &record.end, timestamp: record.timestamp }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_name_their_type_and_read_back() {
        let thread: ThreadId = "01KQXKW18CT8G75T53R8F4G7YG".parse().unwrap();
        let end = End::by_workflow(0, "done".into());
        let event = Event::Ended { thread, end };
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(json["type"], "ended");
        assert_eq!(json["returnCode"], 0);
        assert_eq!(json["endedBy"], "workflow");
        assert_eq!(serde_json::from_value::<Event>(json).unwrap(), event);
        let started = Event::Started {
            thread,
            hash: BundleHash::of(b"x"),
            worker: None,
            precompiled: None,
            resumed_after: 2,
        };
        assert_eq!(serde_json::to_value(&started).unwrap()["resumedAfter"], 2);
    }

    #[test]
    fn several_roles_at_work_read_as_english() {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(Event::working_phrase(&s(&["a"]), &s(&["x"])), "a is working (x)");
        assert_eq!(
            Event::working_phrase(&s(&["research", "examples"]), &s(&["x", "y"])),
            "research and examples are working (x, y)"
        );
        assert_eq!(
            Event::working_phrase(&s(&["a", "b", "c"]), &s(&["x"])),
            "a, b and c are working (x)"
        );
    }
}
