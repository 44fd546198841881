//! The notifier `serve` runs: every poll it looks for threads that wait on a person, and sends
//! each wait, once, to the channels `notify:` rules choose for it — claiming each delivery in
//! the store first, so that of the `serve`s on one store (one database) one sends it, and a
//! delivery survives a restart. A failed send is tried again with backoff (5 s, doubling, at
//! most 10 minutes apart) until `notify.attempts` is spent; every attempt's outcome is kept on
//! the delivery, which `thread` and the API show. Uses of links a crash left unapplied are
//! applied first thing each pass.

use std::collections::HashMap;

use super::channels;
use super::links::{self, Sender};
use super::message::Message;
use crate::clock::now_ms;
use crate::error::Result;
use crate::ids::ThreadId;
use crate::run::query::{self, ThreadQuery};
use crate::run::waits::{self, Wait};
use crate::store::Storage;
use crate::store::notices::{Attempt, Notice};
use crate::store::notify_config::{Channel, NotifyConfig};
use crate::store::records::ThreadStatus;

/// How long a claim holds a delivery: a sender that dies is replaced this much later.
const LEASE_MS: u64 = 60_000;

/// How long a delivery another process holds (or that is settled) is not looked at again.
const RECHECK_MS: u64 = 30_000;

/// How long a thread whose every delivery was sent is not read again while it rests as it
/// did (a wait that changes changes its summary, and is read at once).
const SENT_MS: u64 = 10 * 60_000;

/// How often links that expired are forgotten.
const FORGET_EVERY_MS: u64 = 10 * 60_000;

/// How long an expired link is kept: opened meanwhile, it says it expired, rather than that it
/// is not known.
const KEEP_EXPIRED_MS: u64 = 30 * 24 * 3600 * 1000;

/// What a pass did.
#[derive(Debug, Default)]
pub struct Pass {
    /// Deliveries sent: thread, channel, recipient.
    pub sent: Vec<(ThreadId, String, Option<String>)>,
    /// Deliveries that failed: thread, channel, why (tried again later unless given up).
    pub failed: Vec<(ThreadId, String, String)>,
    /// Decisions through links a crash left unapplied, applied now.
    pub recovered: usize,
}

/// The notifier of one process.
pub struct Notifier {
    store: Storage,
    /// Its name as a claimer of deliveries.
    owner: String,
    /// Where links point when `serve.public_url` does not say.
    base_url: String,
    /// Deliveries not to look at before a time: settled, or held by another process.
    quiet: HashMap<String, u64>,
    /// Threads not to read again before a time while their summary says they rest as they did
    /// (status, steps, when they paused): a pass reads only the threads whose rest is new, or
    /// whose deliveries are due again — not every waiting thread every poll.
    rested: HashMap<ThreadId, (Rest, u64)>,
    /// `notify:` as the last pass read it: when it changes, every thread is looked at again.
    config: Option<NotifyConfig>,
    forgot_at: u64,
}

/// How a listing tells a thread's rest.
type Rest = (ThreadStatus, usize, Option<u64>);

/// Where a delivery goes: a channel, its recipient, and the server's public address.
struct Target<'a> {
    name: &'a str,
    channel: &'a Channel,
    recipient: Option<String>,
    public: Option<&'a str>,
}

impl Notifier {
    pub fn new(store: Storage, base_url: String) -> Self {
        let owner = format!("serve {}:{}", std::process::id(), ThreadId::new());
        Notifier {
            store,
            owner,
            base_url,
            quiet: HashMap::new(),
            rested: HashMap::new(),
            config: None,
            forgot_at: 0,
        }
    }

    /// One pass: recover, then send what is due.
    pub async fn pass(&mut self) -> Result<Pass> {
        let whole = self.store.config()?;
        let (config, public) = (whole.notify, whole.serve.public_url);
        let mut pass = Pass { recovered: links::recover(&self.store).await?, ..Pass::default() };
        let now = now_ms();
        if self.config.as_ref() != Some(&config) {
            self.rested.clear();
            self.config = Some(config.clone());
        }
        self.quiet.retain(|_, until| *until > now);
        if now.saturating_sub(self.forgot_at) >= FORGET_EVERY_MS {
            self.store.links().forget_expired(now.saturating_sub(KEEP_EXPIRED_MS))?;
            self.forgot_at = now;
        }
        self.push(&config, &mut pass).await?;
        let at_rest = ThreadQuery {
            statuses: vec![ThreadStatus::Waiting, ThreadStatus::Paused],
            ..ThreadQuery::default()
        };
        let summaries = match config.is_on() {
            true => query::threads(&self.store, &at_rest)?.threads,
            false => vec![],
        };
        let listed: std::collections::HashSet<ThreadId> =
            summaries.iter().map(|s| s.thread_id).collect();
        self.rested.retain(|id, (_, until)| listed.contains(id) && *until > now);
        for summary in summaries {
            let rest = (summary.status, summary.steps, summary.paused_at);
            if self.rested.get(&summary.thread_id).is_some_and(|(seen, _)| *seen == rest) {
                continue;
            }
            let record = match self.store.threads().read(summary.thread_id) {
                Ok(record) => record,
                Err(e) => {
                    tracing::debug!("notify: thread {}: {e}", summary.thread_id);
                    continue;
                }
            };
            let mut next = now_ms() + SENT_MS;
            if let Some(wait) = waits::of(&record) {
                for (name, channel) in config.channels_for(&wait.workflow, wait.kind) {
                    for recipient in channels::recipients(channel) {
                        let to = Target { name, channel, recipient, public: public.as_deref() };
                        next = next.min(self.deliver(&config, &wait, to, &mut pass).await?);
                    }
                }
            }
            self.rested.insert(summary.thread_id, (rest, next));
        }
        Ok(pass)
    }

    /// Sends `wait` through channel `name` to `recipient`, if this process claims the delivery;
    /// when it is to be looked at again (sent: never, but the thread is re-read in a while).
    async fn deliver(
        &mut self,
        config: &NotifyConfig,
        wait: &Wait,
        to: Target<'_>,
        pass: &mut Pass,
    ) -> Result<u64> {
        let Target { name, channel, recipient, public } = to;
        let key = format!(
            "{}/{}/{}/{name}/{}",
            wait.thread,
            wait.key,
            &wait.digest[..16],
            recipient.as_deref().unwrap_or_default()
        );
        if let Some(until) = self.quiet.get(&key) {
            return Ok(*until);
        }
        let now = now_ms();
        let fresh = Notice::fresh(
            key.clone(),
            wait.thread,
            wait.key.clone(),
            wait.kind.as_str(),
            name.into(),
            recipient.clone(),
        );
        let Some(claimed) = self.store.notices().claim(&fresh, &self.owner, now, LEASE_MS)? else {
            self.quiet.insert(key, now + RECHECK_MS);
            return Ok(now + RECHECK_MS);
        };
        crate::faults::crash_point("notice-claimed");
        let base = public.unwrap_or(&self.base_url).trim_end_matches('/');
        let sender = Sender { channel: name, approver: recipient.as_deref() };
        let ttl = config.link_ttl_ms();
        let minted = links::mint(&self.store, wait, sender, base, ttl)?;
        let message = Message {
            wait: wait.clone(),
            links: minted,
            thread_url: format!("{base}/#/thread/{}", wait.thread),
            expires: now.saturating_add(ttl),
        };
        // The delivery's id is the same on every attempt: a receiver tells a repeat by it.
        let id =
            format!("{}-{}", wait.thread, &crate::store::bundles::sha256_hex(key.as_bytes())[..16]);
        let sent = channels::send(name, channel, recipient.as_deref(), &message, &id).await;
        let attempt = attempted(config, &claimed, sent, pass);
        self.store.notices().settle(&claimed, &attempt)?;
        let (until, again) = match attempt {
            Attempt::Failed { retry_at: Some(at), .. } => (at, at),
            _ => (now_ms() + RECHECK_MS, now_ms() + SENT_MS),
        };
        self.quiet.insert(key, until);
        Ok(again)
    }

    /// The A2A push notifications due: each push config's task, told once per rest.
    async fn push(&mut self, config: &NotifyConfig, pass: &mut Pass) -> Result<()> {
        for push in self.store.push_configs().all()? {
            let prefix = format!("{}/push/{}/", push.thread, push.id);
            if self.quiet.keys().any(|k| k.starts_with(&prefix) && k.ends_with("/end")) {
                continue;
            }
            let Ok(record) = self.store.threads().read(push.thread) else { continue };
            let Some((rest, task)) = super::push::due(&record) else { continue };
            let key = format!("{prefix}{rest}");
            if self.quiet.contains_key(&key) {
                continue;
            }
            let now = now_ms();
            let channel = format!("a2a:{}", push.id);
            let fresh = Notice::fresh(key.clone(), push.thread, rest, "a2a-push", channel, None);
            let Some(claimed) = self.store.notices().claim(&fresh, &self.owner, now, LEASE_MS)?
            else {
                self.quiet.insert(key, now + RECHECK_MS);
                continue;
            };
            let sent = super::push::send(&push, task, config.a2a_push_private).await;
            let attempt = attempted(config, &claimed, sent, pass);
            self.store.notices().settle(&claimed, &attempt)?;
            let until = match attempt {
                Attempt::Failed { retry_at: Some(at), .. } => at,
                // A task that ended is told no more: its config is not looked at again.
                _ if key.ends_with("/end") => u64::MAX,
                _ => now_ms() + RECHECK_MS,
            };
            self.quiet.insert(key, until);
        }
        Ok(())
    }
}

/// What sending delivery `claimed` came to (`sent`), told in `pass`: sent, or failed and tried
/// again after its backoff until `notify.attempts` are spent.
fn attempted(
    config: &NotifyConfig,
    claimed: &Notice,
    sent: std::result::Result<(), String>,
    pass: &mut Pass,
) -> Attempt {
    match sent {
        Ok(()) => {
            pass.sent.push((claimed.thread, claimed.channel.clone(), claimed.recipient.clone()));
            Attempt::Sent { at: now_ms() }
        }
        Err(error) => {
            let retry_at = (claimed.attempts < config.attempts())
                .then(|| now_ms() + backoff_ms(claimed.attempts));
            pass.failed.push((claimed.thread, claimed.channel.clone(), error.clone()));
            Attempt::Failed { error, retry_at }
        }
    }
}

/// How long after attempt `attempts` failed the next is made: 5 s, doubling, 10 minutes at most.
fn backoff_ms(attempts: u32) -> u64 {
    (5_000u64 << attempts.saturating_sub(1).min(16)).min(600_000)
}

/// The deliveries of thread `id`, as `thread` and the API show them.
pub fn deliveries(store: &Storage, id: ThreadId) -> Result<Vec<Notice>> {
    store.notices().of_thread(id)
}

#[cfg(test)]
mod tests {
    #[test]
    fn backoff_doubles_to_a_bound() {
        assert_eq!(super::backoff_ms(1), 5_000);
        assert_eq!(super::backoff_ms(2), 10_000);
        assert_eq!(super::backoff_ms(30), 600_000);
    }
}
