//! Signed one-time links: each decides one action about one wait of one thread, for whoever
//! holds it (a person a `notify:` channel sent it to). The token itself is 256 random bits that
//! only the message carries; the store keeps its SHA-256, what it is bound to (the thread, the
//! wait and a digest of exactly what it decides, the action, optionally the approver's
//! address), when it expires, and — once used — when, by whom and what was decided. Using one
//! is a compare-and-set: of two uses at once, on any machine, one wins ([`LinkBackend::consume`]).
//!
//! A use is kept before its decision is applied, and marked applied after: a process that dies
//! between the two leaves a use that [`LinkBackend::unapplied`] finds, so the decision is
//! applied once, later, rather than lost. In a home: `links/<hash>.json`; in a database: the
//! `links` table.

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::ids::ThreadId;

/// A link as the store keeps it (never the token).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Link {
    /// SHA-256 of the token (hex): the key the link is found by.
    pub hash: String,
    pub thread: ThreadId,
    /// The wait it decides about, and the digest of what that wait asked when it was sent.
    pub wait_key: String,
    pub digest: String,
    /// The one action it takes (`approve`, `deny`, `answer`, …).
    pub action: String,
    /// The `notify:` channel that sent it.
    pub channel: String,
    /// The address it was sent to, when the channel sends to people by address: who decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approver: Option<String>,
    /// When it was made and when it stops deciding anything (ms since the epoch).
    pub created: u64,
    pub expires: u64,
    /// Its one use, once used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used: Option<LinkUse>,
}

/// A link's use: what was decided through it, and whether the decision has been applied.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkUse {
    pub at: u64,
    /// The decision as the wait's module keeps it (JSON).
    pub decision: serde_json::Value,
    /// Set once the decision was applied, or found to have nothing left to apply to.
    #[serde(default)]
    pub applied: bool,
    /// What came of it (`applied`, or why not), once applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
}

/// What trying to use a link found.
#[derive(Debug, Clone, PartialEq)]
pub enum Consumed {
    /// This use took it: the link, now with its use.
    Taken(Link),
    /// It was used before (by this use's twin, another tab, a scanner's POST): as kept.
    UsedBefore(Link),
    /// No link has that hash.
    Unknown,
}

/// Where links are kept.
pub trait LinkBackend: Send + Sync + std::fmt::Debug {
    /// Keeps a new link (durably: the message holding its token is sent after).
    fn create(&self, link: &Link) -> Result<()>;
    /// The link with token hash `hash`.
    fn get(&self, hash: &str) -> Result<Option<Link>>;
    /// Uses link `hash` for `used`, if nobody did: durable when this returns.
    fn consume(&self, hash: &str, used: &LinkUse) -> Result<Consumed>;
    /// Marks the use of link `hash` applied, with what came of it.
    fn applied(&self, hash: &str, outcome: &str) -> Result<()>;
    /// The links used whose decision was not marked applied (a process died between).
    fn unapplied(&self) -> Result<Vec<Link>>;
    /// The links of thread `thread`, oldest first.
    fn of_thread(&self, thread: ThreadId) -> Result<Vec<Link>>;
    /// Forgets links that expired before `cutoff` (ms) and have nothing left to apply.
    fn forget_expired(&self, cutoff: u64) -> Result<usize>;
}
