//! What can be done to a thread, one way for everyone who does it: start a new thread, resume
//! one at rest, answer one that waits for a person, fork one. The CLI, the web view, the HTTP
//! API and schedules all call these; each returns the thread handed to a worker, to follow or
//! to leave running. (Stopping one — kill, pause — is [`control`](super::control).)

use crate::agents::AgentFlags;
use crate::error::Result;
use crate::ids::{BundleHash, ThreadId};
use crate::run::dispatch::{self, Accepted, Follower};
use crate::run::lifecycle::{self, ForkAt, StartRequest};
use crate::run::{answer, control};
use crate::store::Storage;

/// A thread handed to a worker.
pub struct Handed {
    pub id: ThreadId,
    pub hash: BundleHash,
    /// What the thread does, heard as it happens (when it was handed over to be followed).
    pub follower: Box<dyn Follower>,
    pub accepted: Accepted,
}

/// How a command wants the thread it hands over: followed (its events heard, and a person
/// following may answer its `human` agents), or left running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hand {
    Follow,
    Detach,
}

/// Hands thread `id` of bundle `hash` to a worker, `flags` overriding its recorded agents.
pub async fn hand_over(
    store: &Storage,
    id: ThreadId,
    hash: BundleHash,
    flags: &AgentFlags,
    hand: Hand,
) -> Result<Handed> {
    let (follower, accepted) =
        dispatch::of(store).hand_over(id, hash, flags, hand == Hand::Follow).await?;
    Ok(Handed { id, hash, follower, accepted })
}

/// Starts a new thread of a registered workflow, as `request` says, and hands it to a worker.
/// Its agent bindings are recorded in the thread: the worker reads them from there.
pub async fn start(store: &Storage, request: StartRequest, hand: Hand) -> Result<Handed> {
    let (writer, record) = lifecycle::start_new(store, request)?;
    drop(writer);
    hand_over(store, record.id(), record.start.hash, &AgentFlags::default(), hand).await
}

/// Continues thread `id` where it stopped (paused, interrupted, taken by a crash); `flags`
/// override its recorded agents for this run.
pub async fn resume(
    store: &Storage,
    id: ThreadId,
    flags: &AgentFlags,
    hand: Hand,
) -> Result<Handed> {
    let record = control::resumable(store, id)?;
    hand_over(store, id, record.start.hash, flags, hand).await
}

/// Records `text` as the answer thread `id` waits for (see [`answer::record`]) and hands the
/// thread to a worker, which continues with it.
pub async fn answer(store: &Storage, id: ThreadId, text: String, hand: Hand) -> Result<Handed> {
    let hash = answer::record(store, id, text)?;
    hand_over(store, id, hash, &AgentFlags::default(), hand).await
}

/// A fork, handed over: the new thread, and how many steps of the original it kept.
pub struct Forked {
    pub handed: Handed,
    pub kept: usize,
}

/// Forks thread `id` at `at` into a new thread (recorded with `flags` as its agents) and
/// hands the fork to a worker. The original is left as it is.
pub async fn fork(
    store: &Storage,
    id: ThreadId,
    at: &ForkAt,
    flags: AgentFlags,
    hand: Hand,
) -> Result<Forked> {
    let original = store.threads().read(id)?;
    let kept = lifecycle::fork_point(&original, at)?;
    let (writer, fork) = lifecycle::fork(store, &original, kept, flags)?;
    drop(writer);
    let handed =
        hand_over(store, fork.id(), original.start.hash, &AgentFlags::default(), hand).await?;
    Ok(Forked { handed, kept })
}
