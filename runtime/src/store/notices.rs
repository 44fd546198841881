//! Notifications of waits: one delivery per wait, `notify:` channel and recipient, sent once
//! by whichever `serve` claims it first — claims are leases in the store every `serve` on it
//! shares, so two servers on one database send one message, and a server that dies while
//! sending leaves a lease that runs out and another takes up. A failed send is retried with
//! backoff until it gives up; every attempt's outcome is kept, shown on the thread.
//!
//! In a home: `notices/<thread>/<sha256 of the key>.json`, changed under one `flock`; in a
//! database: the `notices` table, claimed with one conditional upsert.

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::ids::ThreadId;

/// A delivery of one wait to one channel (and recipient).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Notice {
    /// What makes it one: the thread, the wait's key and digest, the channel and recipient.
    pub key: String,
    pub thread: ThreadId,
    pub wait_key: String,
    /// The kind of wait (`answer`, `approve`, …).
    pub kind: String,
    pub channel: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipient: Option<String>,
    pub created: u64,
    pub state: NoticeState,
    /// Attempts made (the one under way included).
    pub attempts: u32,
    /// While sending: when the sender's lease runs out; while retrying: when the next attempt
    /// is due (ms since the epoch).
    pub next_at: u64,
    /// The process sending it (its lease owner).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Why the last attempt failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_at: Option<u64>,
}

impl Notice {
    /// A delivery not yet claimed: of thread `thread`'s rest `wait_key` (a wait of `kind`),
    /// through `channel` to `recipient`, keyed `key`.
    pub fn fresh(
        key: String,
        thread: ThreadId,
        wait_key: String,
        kind: &str,
        channel: String,
        recipient: Option<String>,
    ) -> Notice {
        Notice {
            key,
            thread,
            wait_key,
            kind: kind.to_string(),
            channel,
            recipient,
            created: crate::clock::now_ms(),
            state: NoticeState::Sending,
            attempts: 0,
            next_at: 0,
            owner: None,
            last_error: None,
            sent_at: None,
        }
    }
}

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NoticeState {
    Sending,
    Retrying,
    Sent,
    /// It gave up after its last attempt.
    Failed,
}

impl NoticeState {
    pub fn as_str(self) -> &'static str {
        match self {
            NoticeState::Sending => "sending",
            NoticeState::Retrying => "retrying",
            NoticeState::Sent => "sent",
            NoticeState::Failed => "failed",
        }
    }
}

/// How an attempt came out.
#[derive(Debug, Clone, PartialEq)]
pub enum Attempt {
    Sent {
        at: u64,
    },
    /// It failed; tried again at `retry_at`, or given up when none.
    Failed {
        error: String,
        retry_at: Option<u64>,
    },
}

/// Where deliveries are kept.
pub trait NoticeBackend: Send + Sync + std::fmt::Debug {
    /// Claims delivery `fresh.key` for `owner` until `now + lease_ms`: made (from `fresh`) if
    /// it is new, taken if it is due again or its sender's lease ran out; `None` if another
    /// holds it or it is settled. The claimed delivery is returned, its attempts counted.
    fn claim(&self, fresh: &Notice, owner: &str, now: u64, lease_ms: u64)
    -> Result<Option<Notice>>;
    /// Settles the attempt of delivery `claimed` (as [`claim`](Self::claim) returned it):
    /// nothing, if its claimer's lease was lost to another meanwhile.
    fn settle(&self, claimed: &Notice, attempt: &Attempt) -> Result<()>;
    /// The deliveries of thread `thread`, oldest first.
    fn of_thread(&self, thread: ThreadId) -> Result<Vec<Notice>>;
}

/// Delivery `fresh` as claiming it by `owner` at `now` makes it, given what is kept of it
/// (`kept`): made if new, taken if due again or its sender's lease ran out; `None` if another
/// holds it or it is settled. The one rule both backends apply under their lock.
pub fn claim(
    kept: Option<Notice>,
    fresh: &Notice,
    owner: &str,
    now: u64,
    lease_ms: u64,
) -> Option<Notice> {
    let notice = match kept {
        None => fresh.clone(),
        Some(kept)
            if matches!(kept.state, NoticeState::Retrying | NoticeState::Sending)
                && kept.next_at <= now =>
        {
            kept
        }
        Some(_) => return None,
    };
    Some(Notice {
        state: NoticeState::Sending,
        attempts: notice.attempts + 1,
        next_at: now + lease_ms,
        owner: Some(owner.to_string()),
        ..notice
    })
}

/// What is kept of a delivery (`kept`) once the attempt it was claimed for (`claimed`) came to
/// `attempt`;
/// `None` if its claimer lost it meanwhile (another took it when its lease ran out).
pub fn settle(kept: &Notice, claimed: &Notice, attempt: &Attempt) -> Option<Notice> {
    let held = kept.state == NoticeState::Sending
        && kept.attempts == claimed.attempts
        && kept.owner.is_some()
        && kept.owner == claimed.owner;
    if !held {
        return None;
    }
    Some(match attempt {
        Attempt::Sent { at } => Notice {
            state: NoticeState::Sent,
            sent_at: Some(*at),
            last_error: None,
            ..kept.clone()
        },
        Attempt::Failed { error, retry_at } => Notice {
            state: if retry_at.is_some() { NoticeState::Retrying } else { NoticeState::Failed },
            next_at: retry_at.unwrap_or(kept.next_at),
            last_error: Some(error.clone()),
            ..kept.clone()
        },
    })
}
