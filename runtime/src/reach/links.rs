//! Signed one-time links, minted and used. A link decides one action about one wait: its token
//! is 256 random bits, kept only as a SHA-256; it expires; it is used once, and the use is kept
//! before the decision is applied (a crash between them leaves the use, which [`recover`]
//! applies — once, since the wait it was made for is checked again). Opening a link
//! ([`open`]) never decides anything: only [`decide`] does, and only if the thread still waits
//! on exactly what the link was sent about.

use crate::clock::now_ms;
use crate::error::{Error, Result};
use crate::ids::ThreadId;
use crate::run::actions::{self, Hand};
use crate::run::waits::{self, Action, Decision, Expected, Wait};
use crate::run_request::RunRequest;
use crate::store::Storage;
use crate::store::bundles::sha256_hex;
use crate::store::links::{Consumed, Link, LinkUse};
use crate::store::pauses::DecidedBy;

/// A link made for one action, and its address (holding the token: it goes into one message
/// and nowhere else).
#[derive(Debug, Clone)]
pub struct Minted {
    pub action: Action,
    pub url: String,
}

/// Where a link is sent from: the channel, and the address it goes to when the channel sends
/// to people by address.
#[derive(Debug, Clone, Copy)]
pub struct Sender<'a> {
    pub channel: &'a str,
    pub approver: Option<&'a str>,
}

/// Makes one link per action of `wait`, under `base_url`, that decide until `ttl_ms` from now.
pub fn mint(
    store: &Storage,
    wait: &Wait,
    sender: Sender<'_>,
    base_url: &str,
    ttl_ms: u64,
) -> Result<Vec<Minted>> {
    let now = now_ms();
    let mut minted = vec![];
    for &action in waits::actions(wait.kind) {
        let token = crate::ids::random_hex(32);
        let link = Link {
            hash: sha256_hex(token.as_bytes()),
            thread: wait.thread,
            wait_key: wait.key.clone(),
            digest: wait.digest.clone(),
            action: action.as_str().into(),
            channel: sender.channel.into(),
            approver: sender.approver.map(str::to_string),
            created: now,
            expires: now.saturating_add(ttl_ms),
            used: None,
        };
        store.links().create(&link)?;
        let base = base_url.trim_end_matches('/');
        minted.push(Minted { action, url: format!("{base}/links/{}/{token}", wait.thread) });
    }
    Ok(minted)
}

/// Why a link decides nothing: each says so to whoever opened it.
#[derive(Debug, Clone, PartialEq)]
pub enum Refused {
    /// No such link (never made, mistyped, tampered with, or forgotten long after it expired).
    Unknown,
    /// The link is another thread's.
    ForeignThread,
    Expired {
        at: u64,
    },
    /// Used before: when, and what came of it.
    Used {
        at: u64,
        outcome: Option<String>,
    },
    /// The thread no longer waits on what the link was sent about.
    Gone(String),
}

impl Refused {
    /// The HTTP status a page refusing it answers with.
    pub fn status(&self) -> u16 {
        match self {
            Refused::Unknown | Refused::ForeignThread => 404,
            Refused::Expired { .. } | Refused::Used { .. } => 410,
            Refused::Gone(_) => 409,
        }
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Unknown => write!(f, "this link is not known here: it decides nothing"),
            // Said apart from an unknown link: the token is a secret either way, and which
            // thread it is for is in the address already.
            Refused::ForeignThread => {
                write!(f, "this link is not one of this thread's: it decides nothing")
            }
            Refused::Expired { at } => write!(
                f,
                "this link expired at {}: it decides nothing; ask for the thread to be sent again, \
                 or decide with `uncaged-workflow answer`",
                crate::clock::rfc3339(*at)
            ),
            Refused::Used { at, outcome } => write!(
                f,
                "this link was used at {}{}: a link decides once",
                crate::clock::rfc3339(*at),
                outcome.as_deref().map(|o| format!(" ({o})")).unwrap_or_default()
            ),
            Refused::Gone(why) => write!(f, "this link decides nothing: {why}"),
        }
    }
}

/// A link that may decide, and the wait it decides about, as it is now.
#[derive(Debug, Clone)]
pub struct Open {
    pub link: Link,
    pub action: Action,
    pub wait: Wait,
}

/// The link of `token` for thread `thread`, if it may still decide: known, this thread's,
/// unexpired, unused, and the thread waiting on exactly what it was sent about. Decides
/// nothing.
pub fn open(
    store: &Storage,
    thread: &str,
    token: &str,
) -> Result<std::result::Result<Open, Refused>> {
    let Some(link) = store.links().get(&sha256_hex(token.as_bytes()))? else {
        return Ok(Err(Refused::Unknown));
    };
    if thread.parse::<ThreadId>().ok() != Some(link.thread) {
        return Ok(Err(Refused::ForeignThread));
    }
    if let Some(used) = &link.used {
        return Ok(Err(Refused::Used { at: used.at, outcome: used.outcome.clone() }));
    }
    if now_ms() >= link.expires {
        return Ok(Err(Refused::Expired { at: link.expires }));
    }
    let expected = Expected { key: link.wait_key.clone(), digest: link.digest.clone() };
    let wait = match waits::current(store, link.thread, &expected) {
        Ok(wait) => wait,
        Err(Error::ThreadState { reason, .. }) => return Ok(Err(Refused::Gone(reason))),
        Err(Error::UnknownThread(_)) => {
            return Ok(Err(Refused::Gone("its thread was deleted".into())));
        }
        Err(e) => return Err(e),
    };
    let Some(action) =
        waits::actions(wait.kind).iter().copied().find(|a| a.as_str() == link.action)
    else {
        return Ok(Err(Refused::Gone(format!("`{}` is not a decision it takes", link.action))));
    };
    Ok(Ok(Open { link, action, wait }))
}

/// Who decides through `link`: the address it was sent to, through its channel.
fn decided_by(link: &Link) -> DecidedBy {
    let who = link.approver.clone().unwrap_or_else(|| "the holder of a link".into());
    DecidedBy::new(who, format!("link:{}", link.channel))
}

/// What became of a decision made through a link.
#[derive(Debug)]
pub enum Decided {
    /// Applied: the thread goes on.
    Applied(Box<Open>),
    Refused(Refused),
}

/// Decides with the link of `token` for thread `thread`: `decision` must be its action. The
/// decision is checked against the wait first (a text that does not fit the role spends
/// nothing: the error says why); then the link is used, and the use kept, before the decision
/// is applied.
pub async fn decide(
    store: &Storage,
    thread: &str,
    token: &str,
    decision: Decision,
) -> Result<Decided> {
    let open = match open(store, thread, token)? {
        Ok(open) => open,
        Err(refused) => return Ok(Decided::Refused(refused)),
    };
    if decision.action() != open.action {
        return Err(Error::Usage(format!(
            "this link decides `{}`, not `{}`",
            open.action.as_str(),
            decision.action().as_str()
        )));
    }
    waits::check(store, &open.wait, &decision)?;
    let used = LinkUse {
        at: now_ms(),
        decision: serde_json::to_value(&decision).expect("a decision serializes"),
        applied: false,
        outcome: None,
    };
    let link = match store.links().consume(&open.link.hash, &used)? {
        Consumed::Taken(link) => link,
        Consumed::UsedBefore(link) => {
            let used = link.used.expect("a used link");
            return Ok(Decided::Refused(Refused::Used { at: used.at, outcome: used.outcome }));
        }
        Consumed::Unknown => return Ok(Decided::Refused(Refused::Unknown)),
    };
    crate::faults::crash_point("link-used");
    match apply(store, &link, &decision).await? {
        None => Ok(Decided::Applied(Box::new(Open { link, ..open }))),
        Some(why) => Ok(Decided::Refused(Refused::Gone(why))),
    }
}

/// Applies the decision kept with used link `link`, if the thread still waits on what it was
/// sent about, and marks the use applied; why it was not applied, if not.
async fn apply(store: &Storage, link: &Link, decision: &Decision) -> Result<Option<String>> {
    let expected = Expected { key: link.wait_key.clone(), digest: link.digest.clone() };
    let outcome =
        match waits::decide(store, link.thread, Some(&expected), decision, &decided_by(link)).await
        {
            Ok(_) => None,
            // Another decision won the race for the wait, or it was answered meanwhile.
            Err(Error::ThreadState { reason, .. }) => Some(reason),
            Err(Error::UnknownThread(_)) => Some("its thread was deleted".into()),
            Err(e) => return Err(e),
        };
    store.links().applied(&link.hash, outcome.as_deref().unwrap_or("applied"))?;
    Ok(outcome)
}

/// Applies the uses a process kept but died before applying: each once, and only to the wait
/// it was made for. A use whose decision was journaled before the crash but whose thread was
/// not handed on finds the wait still open with its decision recorded: the thread is resumed.
/// How many were applied.
pub async fn recover(store: &Storage) -> Result<usize> {
    let mut applied = 0;
    for link in store.links().unapplied()? {
        // One that cannot be applied now (a store that fails, a worker that will not start)
        // holds up none of the others, and is tried again next pass.
        match recover_one(store, &link).await {
            Ok(true) => applied += 1,
            Ok(false) => {}
            Err(e) => tracing::warn!(
                "a decision made through a link for thread {}: {}",
                link.thread,
                crate::error::chain_line(&e)
            ),
        }
    }
    Ok(applied)
}

/// Applies the kept use of `link`; whether it was applied.
async fn recover_one(store: &Storage, link: &Link) -> Result<bool> {
    let Some(used) = &link.used else { return Ok(false) };
    let decision: Decision = match serde_json::from_value(used.decision.clone()) {
        Ok(decision) => decision,
        Err(e) => {
            store.links().applied(&link.hash, &format!("not applied: {e}"))?;
            return Ok(false);
        }
    };
    let expected = Expected { key: link.wait_key.clone(), digest: link.digest.clone() };
    if waits::current(store, link.thread, &expected).is_ok() && journaled(store, link)? {
        actions::resume(store, link.thread, &RunRequest::default(), Hand::Detach).await?;
        store.links().applied(&link.hash, "applied")?;
        return Ok(true);
    }
    Ok(apply(store, link, &decision).await?.is_none())
}

/// Whether the thread of `link`'s journal already holds an answer or decision for the call
/// it waits on (the decision was journaled, the thread not yet handed on).
fn journaled(store: &Storage, link: &Link) -> Result<bool> {
    let record = store.threads().read(link.thread)?;
    let Some(call) = record.paused.as_ref().and_then(|p| p.call.as_ref()) else {
        return Ok(false);
    };
    let journal = store.threads().journal(record.start.hash, link.thread)?;
    Ok(match &call.tool {
        Some(tool) => journal.decided(call, &tool.call_id),
        None => journal.answered(call),
    })
}
