//! What can be done to a thread, one way for everyone who does it: start a new thread, resume
//! one at rest, answer one that waits for a person, fork one. The CLI, the web view, the HTTP
//! API and schedules all call these; each returns the thread handed to a worker, to follow or
//! to leave running. (Stopping one — kill, pause — is [`control`](super::control).)

use crate::agents::AgentFlags;
use crate::error::{Error, Result};
use crate::ids::{BundleHash, ThreadId};
use crate::run::dispatch::{self, Accepted, Follower};
use crate::run::lifecycle::{self, ForkAt, StartRequest};
use crate::run::{answer, control};
use crate::store::Storage;
use crate::store::records::{Budget, PauseReason, Paused};
use crate::store::request_keys::{Claim, RequestKey};

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
    let checked = lifecycle::check_start(store, &request)?;
    start_checked(store, request, checked, hand).await
}

/// [`start`], for a request [`lifecycle::check_start`] has checked.
async fn start_checked(
    store: &Storage,
    request: StartRequest,
    checked: lifecycle::Checked,
    hand: Hand,
) -> Result<Handed> {
    let (writer, record) = lifecycle::start_checked(store, request, checked)?;
    drop(writer);
    hand_over(store, record.id(), record.start.hash, &AgentFlags::default(), hand).await
}

/// A key that makes a retried request start one thread: whose it is, the key, and a digest
/// of what the request asked.
#[derive(Debug, Clone)]
pub struct OnceKey {
    pub scope: String,
    pub key: String,
    pub fingerprint: String,
}

/// A thread started for a keyed request, or the one an earlier request with the key started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Once {
    Started(ThreadId),
    Replayed(ThreadId),
}

/// Starts a thread as [`start`] does (detached), once per `key`: a request that comes again
/// with the key gets the thread the first one started, and nothing starts twice — also when
/// the requests reach two processes at once, or the first died between claiming the key and
/// creating its thread (the thread is then created with the id the key holds). The key is
/// claimed only after the request is checked, so a bad request holds no key.
pub async fn start_once(
    store: &Storage,
    request: StartRequest,
    key: Option<OnceKey>,
) -> Result<Once> {
    let checked = lifecycle::check_start(store, &request)?;
    let Some(key) = key else {
        return Ok(Once::Started(start_checked(store, request, checked, Hand::Detach).await?.id));
    };
    let claim = RequestKey {
        scope: key.scope,
        key: key.key,
        fingerprint: key.fingerprint,
        thread: ThreadId::new(),
        created: crate::clock::now_ms(),
    };
    match store.request_keys().claim(&claim)? {
        Claim::New => {
            create_and_hand(store, request, checked, claim.thread).await?;
            Ok(Once::Started(claim.thread))
        }
        Claim::Taken(taken) if taken.fingerprint != claim.fingerprint => {
            Err(Error::KeyReused(crate::terminal::line(&claim.key).into_owned()))
        }
        Claim::Taken(taken) => {
            // The request that claimed the key creates its thread a moment later; if it died
            // first, the thread is created here, with the id the key holds.
            let deadline = tokio::time::Instant::now() + CLAIMER_WAIT;
            while !exists(store, taken.thread)? {
                if tokio::time::Instant::now() >= deadline {
                    create_and_hand(store, request, checked, taken.thread).await?;
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Ok(Once::Replayed(taken.thread))
        }
    }
}

/// How long a request that finds its key taken waits for the claimer to create the thread.
const CLAIMER_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

fn exists(store: &Storage, id: ThreadId) -> Result<bool> {
    match store.threads().read(id) {
        Ok(_) => Ok(true),
        Err(Error::UnknownThread(_)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Creates thread `id` for `request` and hands it over, unless another request created it
/// meanwhile (then whoever created it hands it over).
async fn create_and_hand(
    store: &Storage,
    mut request: StartRequest,
    checked: lifecycle::Checked,
    id: ThreadId,
) -> Result<()> {
    request.origin.thread_id = Some(id);
    match lifecycle::start_checked(store, request, checked) {
        Ok((writer, record)) => {
            drop(writer);
            hand_over(store, id, record.start.hash, &AgentFlags::default(), Hand::Detach).await?;
            Ok(())
        }
        Err(e) if exists(store, id)? => {
            tracing::debug!("thread {id} was created by another request with its key ({e})");
            Ok(())
        }
        Err(e) => Err(e),
    }
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

/// Raises the budget of thread `id`, at rest (paused, waiting, interrupted), by what `raise`
/// sets: recorded with a pause marker, in force from then on (a later crash, resume or fork
/// keeps it). Returns the budget now in force. [`resume`] then continues the thread.
pub fn raise_budget(store: &Storage, id: ThreadId, raise: &Budget) -> Result<Budget> {
    control::resumable(store, id)?;
    let (mut writer, record) = lifecycle::open(store, id)?;
    let budget = record.budget().raised(raise);
    let paused = record.paused.clone().unwrap_or_else(|| Paused::by(PauseReason::Pause));
    writer.append_pause(Paused { budget: Some(budget.clone()), ..paused })?;
    Ok(budget)
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
