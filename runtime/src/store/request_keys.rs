//! Request keys: what makes a retried request start one thread, not two. An API client's
//! `Idempotency-Key` (and, later, a webhook's delivery id) is claimed for a thread id before
//! the thread is created; a second request with the key gets the thread the first claimed.
//!
//! A claim is one atomic insert-if-absent — a file created with no-clobber in a home
//! (`api/requests/<scope>/<sha256 of the key>.json`), a row with a primary key in a database
//! (`request_keys`) — so two processes, on two machines sharing a database, cannot both win.

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::ids::ThreadId;

/// A key and what it was claimed for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestKey {
    /// Whose keys these are (a token's name): two clients' keys never meet.
    pub scope: String,
    pub key: String,
    /// A digest of what the request asked: the same key with another request is refused.
    pub fingerprint: String,
    /// The thread the key stands for.
    pub thread: ThreadId,
    /// When it was claimed (ms since the epoch).
    pub created: u64,
}

/// How a claim went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The key is now this request's.
    New,
    /// Another request had it: what it claimed.
    Taken(RequestKey),
}

/// Where request keys are kept.
pub trait RequestKeys: Send + Sync + std::fmt::Debug {
    /// Claims `key` unless it is taken.
    fn claim(&self, key: &RequestKey) -> Result<Claim>;

    /// Forgets the keys claimed before `cutoff` (ms since the epoch): a request retried with
    /// one of them later starts a thread of its own. Returns how many were forgotten.
    fn forget_before(&self, cutoff: u64) -> Result<usize>;
}

/// The longest key taken: keys are ids a client makes (a UUID is 36 characters).
pub const MAX_KEY_LEN: usize = 255;
