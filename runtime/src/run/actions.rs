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
use crate::store::journal::{CallErrorKind, CallResponse};
use crate::store::records::{Budget, EndStatus, PauseReason, Paused, ThreadRecord, ThreadStatus};
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
    let record = lifecycle::start_at_rest(store, request, checked)?;
    hand_over(store, record.id(), record.version(), &AgentFlags::default(), hand).await
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
/// creating its thread (the thread is then created with the id the key holds), or between
/// creating it and handing it over (it is then handed over). The key is claimed only after the
/// request is checked, so a bad request holds no key.
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
            finish_claim(store, request, checked, &taken).await?;
            Ok(Once::Replayed(taken.thread))
        }
    }
}

/// How long the request that claimed a key has to create its thread and hand it over before
/// a request that comes again with the key does it instead.
const CLAIMER_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Makes sure the thread of a key another request claimed exists and was handed to a worker.
/// The claimer creates it (at rest) and hands it over a moment later; if it died or failed
/// before either, this does what it left undone — once the claimer has had [`CLAIMER_WAIT`],
/// counted on the clock from its claim or waited out here (a clock held still by a test must
/// not make this wait for ever).
async fn finish_claim(
    store: &Storage,
    request: StartRequest,
    checked: lifecycle::Checked,
    taken: &RequestKey,
) -> Result<()> {
    let id = taken.thread;
    let waited_out = tokio::time::Instant::now() + CLAIMER_WAIT;
    let claimer_had_its_time = || {
        crate::clock::now_ms() >= taken.created.saturating_add(CLAIMER_WAIT.as_millis() as u64)
            || tokio::time::Instant::now() >= waited_out
    };
    loop {
        match store.threads().read(id) {
            Ok(record) if !record.never_ran() => return Ok(()),
            Ok(record) if claimer_had_its_time() => {
                return hand_over_left(store, id, record.version()).await;
            }
            Err(Error::UnknownThread(_)) if claimer_had_its_time() => {
                return create_and_hand(store, request, checked, id).await;
            }
            Ok(_) | Err(Error::UnknownThread(_)) => {}
            Err(e) => return Err(e),
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Hands over thread `id`, created and left at rest by a request that died.
async fn hand_over_left(store: &Storage, id: ThreadId, hash: BundleHash) -> Result<()> {
    tracing::info!("thread {id} was created for its key but never handed over: handing it over");
    hand_over_keyed(store, id, hash).await
}

/// Hands over thread `id`, created at rest for a key, unless someone did so first — another
/// request with its key, or a `resume` of it, since at rest it lists as interrupted — (then a
/// worker has it, or is about to: the thread is busy, and that is what was wanted).
async fn hand_over_keyed(store: &Storage, id: ThreadId, hash: BundleHash) -> Result<()> {
    match hand_over(store, id, hash, &AgentFlags::default(), Hand::Detach).await {
        Ok(_) => Ok(()),
        Err(e) if e.is_busy() || !store.threads().read(id)?.never_ran() => {
            tracing::debug!("thread {id} was handed over by someone else meanwhile ({e})");
            Ok(())
        }
        Err(e) => Err(e),
    }
}

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
    match lifecycle::start_at_rest(store, request, checked) {
        Ok(record) => {
            crate::faults::crash_point("start-once-created");
            hand_over_keyed(store, id, record.version()).await
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
///
/// A thread that waits on a child workflow's thread goes on with its result if the child has
/// ended (a result a crash kept from being passed on); otherwise its children at rest (paused,
/// interrupted) are resumed, and the thread is followed until it ends.
pub async fn resume(
    store: &Storage,
    id: ThreadId,
    flags: &AgentFlags,
    hand: Hand,
) -> Result<Handed> {
    let record = control::resumable(store, id)?;
    let Some((child, ..)) = record.waited_child() else {
        return hand_over(store, id, record.version(), flags, hand).await;
    };
    if let Some(handed) = deliver(store, id, flags, hand).await? {
        return Ok(handed);
    }
    let mut resumed = 0;
    for descendant in crate::run::query::live_descendants(store, &record)? {
        let at_rest = store.threads().read(descendant)?;
        if matches!(at_rest.status(), ThreadStatus::Paused | ThreadStatus::Interrupted) {
            hand_over(store, descendant, at_rest.version(), flags, Hand::Detach).await?;
            resumed += 1;
        }
    }
    if resumed == 0 {
        return Err(Error::ThreadState {
            id: id.to_string(),
            status: "waiting",
            reason: format!("it waits for its child thread {child}, which runs"),
        });
    }
    let accepted = Accepted { pid: None, cache_hit: false, steps: record.steps.len() };
    let follower = dispatch::shared::follow_stored(store, &record, record.steps.len());
    Ok(Handed { id, hash: record.version(), follower, accepted })
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
        hand_over(store, fork.id(), original.version(), &AgentFlags::default(), hand).await?;
    Ok(Forked { handed, kept })
}

/// If `parent` waits on a child workflow's thread that has ended, journals the child's result
/// as the answer to the call and hands the parent to a worker (see [`crate::run::children`]).
/// `None` if it does not wait on one, the child runs on, or another process holds the parent
/// (it is recording its wait, or being resumed: it checks after).
pub async fn deliver(
    store: &Storage,
    parent: ThreadId,
    flags: &AgentFlags,
    hand: Hand,
) -> Result<Option<Handed>> {
    let record = store.threads().read(parent)?;
    let Some((child, _, _)) = record.waited_child() else { return Ok(None) };
    let child = store.threads().read(child)?;
    if child.end.is_none() {
        return Ok(None);
    }
    let hash = {
        let (writer, record) = match store.threads().open(parent) {
            Ok(open) => open,
            Err(Error::ThreadBusy(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        let Some((waited, role, call)) = record.waited_child() else { return Ok(None) };
        if waited != child.id() {
            return Ok(None);
        }
        let mut journal = store.threads().journal(record.start.hash, parent)?;
        if !journal.answered(call) {
            let response = match child_result(&child) {
                Ok(value) => CallResponse::Ok { value, meta: None, usage: None },
                Err(message) => CallResponse::Error { kind: CallErrorKind::Failed, message },
            };
            journal.record_response(call, role, response)?;
            crate::faults::crash_point("child-delivered");
        }
        drop(writer);
        record.version()
    };
    match hand_over(store, parent, hash, flags, hand).await {
        Ok(handed) => Ok(Some(handed)),
        // Another process handed it over first (its worker may say so as a remote error).
        Err(e) if e.is_busy() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Roles whose records are the interpreter's, not a step's output.
const NOT_OUTPUTS: &[&str] =
    &[uncaged_workflow_declarative::STATUS_ROLE, uncaged_workflow_declarative::USER_ROLE];

/// What an ended child answers its parent's call with: the output of its last step (the meta
/// its step recorded, as JSON text) when it completed; else why it did not.
pub fn child_result(child: &ThreadRecord) -> std::result::Result<String, String> {
    let end = child.end.as_ref().expect("an ended child");
    let id = child.id();
    let name = &child.start.name;
    if end.end.status != EndStatus::Completed {
        return Err(format!(
            "child thread {id} of workflow `{name}` {} ({}): {}",
            end.end.status.as_str(),
            end.end.return_code,
            end.end.summary
        ));
    }
    let last = child.steps.iter().rev().find(|s| !NOT_OUTPUTS.contains(&s.role.as_str()));
    let output = last.map_or(serde_json::Value::Null, |s| s.meta.clone());
    Ok(output.to_string())
}
