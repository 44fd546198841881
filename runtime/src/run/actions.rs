//! What can be done to a thread, one way for everyone who does it: start a new thread, resume
//! one at rest, answer one that waits for a person, fork one. The CLI, the web view, the HTTP
//! API and schedules all call these; each returns the thread handed to a worker, to follow or
//! to leave running. (Stopping one — kill, pause — is [`control`](super::control).)

use crate::error::{Error, Result};
use crate::ids::{BundleHash, ThreadId};
use crate::run::dispatch::{self, Accepted, Follower};
use crate::run::lifecycle::{self, Checked, ForkAt, StartRequest};
use crate::run::{answer, control};
use crate::run_request::RunRequest;
use crate::store::Storage;
use crate::store::journal::{CallErrorKind, CallResponse};
use crate::store::pauses::DecidedBy;
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

/// Hands thread `id` of bundle `hash` to a worker, `over` laid over its recorded request
/// (`resume --agent …`; empty to run it as recorded).
pub async fn hand_over(
    store: &Storage,
    id: ThreadId,
    hash: BundleHash,
    over: &RunRequest,
    hand: Hand,
) -> Result<Handed> {
    let (follower, accepted) =
        dispatch::of(store).hand_over(id, hash, over, hand == Hand::Follow).await?;
    Ok(Handed { id, hash, follower, accepted })
}

/// Starts a new thread of a registered workflow, as `start` says, and hands it to a worker.
/// Its run request is recorded in the thread: the worker reads it from there.
pub async fn start(store: &Storage, start: StartRequest, hand: Hand) -> Result<Handed> {
    let checked = lifecycle::check_start(store, &start)?;
    let record = lifecycle::create(store, start, checked)?;
    hand_over(store, record.id(), record.version(), &RunRequest::default(), hand).await
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
/// request is checked, so a bad request holds no key. The keys are the store's request keys;
/// the start itself is [`start_reserved`], as for every other ledger of keys.
pub async fn start_once(
    store: &Storage,
    start: StartRequest,
    key: Option<OnceKey>,
) -> Result<Once> {
    let checked = lifecycle::check_start(store, &start)?;
    let Some(key) = key else {
        let record = lifecycle::start_record(start, checked);
        dispatch::of(store).start(&record).await?;
        return Ok(Once::Started(record.thread_id));
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
            start_claimed(store, start, checked, claim.thread).await?;
            Ok(Once::Started(claim.thread))
        }
        Claim::Taken(taken) if taken.fingerprint != claim.fingerprint => {
            Err(Error::KeyReused(crate::terminal::line(&claim.key).into_owned()))
        }
        Claim::Taken(taken) => {
            finish_claim(store, start, checked, &taken).await?;
            Ok(Once::Replayed(taken.thread))
        }
    }
}

/// Starts thread `id`, reserved for `start` by a key this request has just claimed: nothing of
/// it can exist yet, so it is created and handed over in one go ([`Dispatch::start`]: one
/// durable write on a database). Should it exist after all (a request that came again with the
/// key and found this one slow started it) or a hand-over fail after it was created, what is
/// left is done as for any reservation ([`start_reserved`]).
///
/// [`Dispatch::start`]: crate::run::dispatch::Dispatch::start
async fn start_claimed(
    store: &Storage,
    start: StartRequest,
    checked: Checked,
    id: ThreadId,
) -> Result<()> {
    let mut record = start.clone();
    record.origin.thread_id = Some(id);
    let record = lifecycle::start_record(record, checked.clone());
    match dispatch::of(store).start(&record).await {
        Ok(()) => Ok(()),
        Err(e) => match store.threads().read(id) {
            Ok(_) => start_reserved(store, start, Some(checked), id).await.map(drop),
            Err(_) => Err(e),
        },
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
    start: StartRequest,
    checked: Checked,
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
            // Queued, its claimer may have died before it made sure a worker takes it.
            Ok(record) if record.status() == ThreadStatus::Queued && claimer_had_its_time() => {
                return hand_over_reserved(store, id, record.version()).await;
            }
            Ok(record) if !record.never_ran() => return Ok(()),
            Ok(_) | Err(Error::UnknownThread(_)) if claimer_had_its_time() => {
                tracing::info!("thread {id} of a claimed key was left undone: starting it");
                return start_reserved(store, start, Some(checked), id).await.map(drop);
            }
            Ok(_) | Err(Error::UnknownThread(_)) => {}
            Err(e) => return Err(e),
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// What [`start_reserved`] found of the thread it was to make run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reserved {
    /// It was created now, or found created and never run: it is handed to a worker now.
    Started,
    /// It had run already (it was handed over before): nothing was done.
    Ran,
}

/// The one exactly-once start: makes thread `id` — an id reserved for `start` in a ledger of
/// keys (an API request's `Idempotency-Key`, a webhook delivery, a child workflow's call, a
/// schedule's firing log), which keeps it through any crash — exist and run, once: created at
/// rest if it does not exist ([`create_reserved`]), handed to a worker if it never ran
/// ([`hand_over_reserved`]), left alone if it ran. Two processes doing this at once for one id
/// create one thread and hand it over once. `checked` is `start` as [`lifecycle::check_start`]
/// found it, if it was checked already.
pub async fn start_reserved(
    store: &Storage,
    start: StartRequest,
    checked: Option<Checked>,
    id: ThreadId,
) -> Result<Reserved> {
    match create_reserved(store, start, checked, id)? {
        Some(hash) => {
            hand_over_reserved(store, id, hash).await?;
            Ok(Reserved::Started)
        }
        None => Ok(Reserved::Ran),
    }
}

/// The first half of [`start_reserved`]: thread `id` created for `start` (checked first, unless
/// `checked`), or found; the bundle to hand it to, or `None` if it ran already.
pub fn create_reserved(
    store: &Storage,
    mut start: StartRequest,
    checked: Option<Checked>,
    id: ThreadId,
) -> Result<Option<BundleHash>> {
    match store.threads().read(id) {
        Ok(record) if record.never_ran() => return Ok(Some(record.version())),
        Ok(_) => return Ok(None),
        Err(Error::UnknownThread(_)) => {}
        Err(e) => return Err(e),
    }
    let checked = match checked {
        Some(checked) => checked,
        None => lifecycle::check_start(store, &start)?,
    };
    start.origin.thread_id = Some(id);
    match lifecycle::create(store, start, checked) {
        Ok(record) => {
            crate::faults::crash_point("start-once-created");
            Ok(Some(record.version()))
        }
        // Created meanwhile by another process with the same reservation: whoever created
        // it may hand it over too, and one of the two does.
        Err(e) => match store.threads().read(id) {
            Ok(record) => {
                tracing::debug!("thread {id} was created by another process ({e})");
                Ok(record.never_ran().then(|| record.version()))
            }
            Err(_) => Err(e),
        },
    }
}

/// The second half of [`start_reserved`]: hands thread `id`, created at rest for a
/// reservation, to a worker — unless someone did so first (another process with its
/// reservation, or a `resume` of it, since at rest it lists as interrupted: then a worker has
/// it, or is about to, which is what was wanted).
pub async fn hand_over_reserved(store: &Storage, id: ThreadId, hash: BundleHash) -> Result<()> {
    match hand_over(store, id, hash, &RunRequest::default(), Hand::Detach).await {
        Ok(_) => Ok(()),
        Err(e) if e.is_busy() || !store.threads().read(id)?.never_ran() => {
            tracing::debug!("thread {id} was handed over by someone else meanwhile ({e})");
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Continues thread `id` where it stopped (paused, interrupted, taken by a crash), `over`
/// laid over its recorded request for this run.
///
/// A thread that waits on a child workflow's thread goes on with its result if the child has
/// ended (a result a crash kept from being passed on); otherwise its children at rest (paused,
/// interrupted) are resumed, and the thread is followed until it ends.
pub async fn resume(
    store: &Storage,
    id: ThreadId,
    over: &RunRequest,
    hand: Hand,
) -> Result<Handed> {
    let record = control::resumable(store, id)?;
    let Some((child, ..)) = record.waited_child() else {
        return hand_over(store, id, record.version(), over, hand).await;
    };
    if let Some(handed) = deliver(store, id, over, hand).await? {
        return Ok(handed);
    }
    let mut resumed = 0;
    for descendant in crate::run::query::live_descendants(store, &record)? {
        let at_rest = store.threads().read(descendant)?;
        if matches!(at_rest.status(), ThreadStatus::Paused | ThreadStatus::Interrupted) {
            hand_over(store, descendant, at_rest.version(), over, Hand::Detach).await?;
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
pub fn raise_budget(
    store: &Storage,
    id: ThreadId,
    raise: &Budget,
    by: &DecidedBy,
) -> Result<Budget> {
    control::resumable(store, id)?;
    let (mut writer, record) = lifecycle::open(store, id)?;
    let budget = record.budget().raised(raise);
    let paused = record.paused.clone().unwrap_or_else(|| Paused::by(PauseReason::Pause));
    writer.append_pause(Paused {
        budget: Some(budget.clone()),
        decided_by: Some(by.clone()),
        ..paused
    })?;
    Ok(budget)
}

/// Records `answer` for waiting thread `id` (see [`answer::record`]) and hands the thread to
/// a worker, which continues with it.
pub async fn answer(
    store: &Storage,
    id: ThreadId,
    answer: answer::Answer,
    by: &DecidedBy,
    hand: Hand,
) -> Result<Handed> {
    let hash = answer::record(store, id, answer, by)?;
    hand_over(store, id, hash, &RunRequest::default(), hand).await
}

/// A fork, handed over: the new thread, and how many steps of the original it kept.
pub struct Forked {
    pub handed: Handed,
    pub kept: usize,
}

/// Forks thread `id` at `at` into a new thread (recorded with `over` laid over its
/// original's request) and
/// hands the fork to a worker. The original is left as it is.
pub async fn fork(
    store: &Storage,
    id: ThreadId,
    at: &ForkAt,
    over: &RunRequest,
    hand: Hand,
) -> Result<Forked> {
    let original = store.threads().read(id)?;
    let kept = lifecycle::fork_point(&original, at)?;
    let (writer, fork) = lifecycle::fork(store, &original, kept, over)?;
    drop(writer);
    let handed =
        hand_over(store, fork.id(), original.version(), &RunRequest::default(), hand).await?;
    Ok(Forked { handed, kept })
}

/// If `parent` waits on a child workflow's thread that has ended, journals the child's result
/// as the answer to the call and hands the parent to a worker (see [`crate::run::children`]).
/// `None` if it does not wait on one, the child runs on, or another process holds the parent
/// (it is recording its wait, or being resumed: it checks after).
pub async fn deliver(
    store: &Storage,
    parent: ThreadId,
    over: &RunRequest,
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
    match hand_over(store, parent, hash, over, hand).await {
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
