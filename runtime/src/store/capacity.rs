//! Provider limits shared by every thread of every worker on a store: a named limit's last
//! minute of calls (what each reserved, then what it really used), the calls waiting their
//! turn, and when a provider's 429 or `Retry-After` closed it. A home keeps a limit in
//! `limits/<name>.json` under a lock its processes share; a database in a row of
//! `provider_limits` that a transaction locks, one budget for every machine.
//!
//! The rules are here, once, on [`LimitState`]; a backend only loads a state, lets a change
//! run on it under its lock, and stores it again ([`CapacityBackend::update`]).
//!
//! - **Reserve, then settle.** A call is granted with its estimate (its prompt's size and its
//!   `max_tokens`) counted; when it answers, the provider's reported usage replaces the
//!   estimate, so the minute's count is what was used.
//! - **Fair.** Waiting calls are served in turn: each workflow's oldest waiter before any
//!   workflow's second, and so on (round-robin over workflows, first come first served within
//!   one), so a workflow with a thousand threads waiting delays another's one thread by at most
//!   one call of each. Nobody is served past a waiter ahead that does not fit yet: a large
//!   call is never starved by small ones.
//! - **Leases.** A waiter and a call in flight hold their place for [`LEASE_MS`] unless their
//!   process renews it: a process that dies (kill -9) gives back its places and its calls'
//!   concurrency, while what those calls may have spent stays counted for the minute.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::Result;

/// The window of a per-minute limit…
pub const WINDOW_MS: u64 = 60_000;

/// …and how long a call let through counts in it: a second more, since the provider counts a
/// request from when it arrives, a moment after it was let through here (without it, at the
/// minute's edge a slot was freed here a few milliseconds before the provider freed it, and
/// the provider answered 429: two of 600 calls in `make bench-fleet`).
pub const COUNTED_MS: u64 = WINDOW_MS + 1_000;

/// How long a waiter or a call in flight keeps its place without its process renewing it.
pub const LEASE_MS: u64 = 15_000;

/// A named limit as `config.yaml` sets it (`limits: {openai-main: {…}}`): any of the three.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderLimit {
    /// Requests sent in any minute.
    #[serde(default)]
    pub requests_per_minute: Option<u64>,
    /// Tokens (in and out) used in any minute.
    #[serde(default)]
    pub tokens_per_minute: Option<u64>,
    /// Requests in flight at once.
    #[serde(default)]
    pub concurrent: Option<u64>,
}

/// The keys of a named limit, for messages.
pub const LIMIT_KEYS: &[&str] = &["requests_per_minute", "tokens_per_minute", "concurrent"];

impl ProviderLimit {
    /// Refuses a limit that limits nothing or could never let a call through.
    pub fn check(&self) -> std::result::Result<(), String> {
        let values = [self.requests_per_minute, self.tokens_per_minute, self.concurrent];
        if values.iter().all(Option::is_none) {
            return Err(format!("a limit needs at least one of {}", LIMIT_KEYS.join(", ")));
        }
        if values.contains(&Some(0)) {
            return Err("must be more than zero (a zero would stop every call)".into());
        }
        Ok(())
    }
}

/// A limit's name: 1–64 of `A-Z a-z 0-9 - _ .`, not starting with a dot (it names a file).
pub fn check_name(name: &str) -> std::result::Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    match ok {
        true => Ok(()),
        false => Err("a limit's name is 1 to 64 of A-Z a-z 0-9 - _ . (not starting with .)".into()),
    }
}

/// The provider limits of `limits:` (its entries whose values are mappings), each checked,
/// and every limit the `bindings` name (binding, limit) one of them; read with the rest of
/// config.yaml.
pub fn configured<'a>(
    limits: &BTreeMap<String, serde_yaml::Value>,
    bindings: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> std::result::Result<BTreeMap<String, ProviderLimit>, String> {
    let mut found = BTreeMap::new();
    for (name, value) in limits.iter().filter(|(_, v)| v.is_mapping()) {
        check_name(name).map_err(|e| format!("limits.{}: {e}", crate::terminal::line(name)))?;
        if crate::limits::KEYS.split(", ").any(|key| key == name) {
            return Err(format!(
                "limits.{name}: a sandbox limit, not a provider limit (give it a value, not a mapping)"
            ));
        }
        let limit: ProviderLimit = serde_yaml::from_value(value.clone())
            .map_err(|e| format!("limits.{name}: {}", crate::store::registry::yaml_reason(&e)))?;
        limit.check().map_err(|e| format!("limits.{name}: {e}"))?;
        found.insert(name.clone(), limit);
    }
    for (binding, limit) in bindings {
        if !found.contains_key(limit) {
            let known: Vec<&str> = found.keys().map(String::as_str).collect();
            return Err(format!(
                "agents.{binding}.limit: no provider limit `{}` under `limits:` ({})",
                crate::terminal::line(limit),
                match known.is_empty() {
                    true =>
                        "there is none; add one like `limits: {NAME: {requests_per_minute: 500}}`"
                            .to_string(),
                    false => format!("limits: {}", known.join(", ")),
                }
            ));
        }
    }
    Ok(found)
}

/// A call that asks for its turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    /// The workflow of its thread: turns go round the workflows.
    pub workflow: String,
    /// Its thread, for whoever reads the limit.
    pub thread: String,
    /// Its estimate of the tokens it will use.
    pub tokens: u64,
}

/// A call waiting its turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waiter {
    pub ticket: u64,
    pub workflow: String,
    pub thread: String,
    pub tokens: u64,
    /// Since when it waits (ms since the epoch).
    pub since: u64,
    pub lease_until: u64,
}

/// A call let through in the last minute, or still in flight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub id: u64,
    /// When it was let through.
    pub at: u64,
    /// Its estimate until it is settled, then what it used.
    pub tokens: u64,
    /// Sent and not yet answered (counts against `concurrent`).
    pub in_flight: bool,
    pub lease_until: u64,
    pub thread: String,
}

/// A limit's state as its store keeps it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitState {
    /// No call is let through before this time (a provider's `Retry-After`).
    #[serde(default)]
    pub closed_until: u64,
    /// The last ticket or grant number given.
    #[serde(default)]
    pub last: u64,
    #[serde(default)]
    pub waiters: Vec<Waiter>,
    #[serde(default)]
    pub grants: Vec<Grant>,
    /// Calls let through since the limit was first used, and the time they waited for their
    /// turn, added up (ms): counters every process adds to, for `/metrics`.
    #[serde(default)]
    pub served: u64,
    #[serde(default)]
    pub waited_ms: u64,
}

/// How far a limit is used, as `/metrics` and `limits` show it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LimitUse {
    /// Requests let through in the last minute.
    pub requests: u64,
    /// Tokens counted in the last minute (estimates of calls not yet settled among them).
    pub tokens: u64,
    pub in_flight: u64,
    pub waiting: u64,
    /// Closed by a provider until then (ms since the epoch), if it still is.
    pub closed_until: Option<u64>,
    /// Calls let through since the limit was first used, and the time they waited (ms).
    pub served: u64,
    pub waited_ms: u64,
}

/// What one round of admission decided for the waiters of the process that ran it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Admitted {
    /// Tickets let through, each with its grant.
    pub granted: Vec<(u64, u64)>,
    /// When the first waiter still waiting may fit (a closed limit reopens, a minute's old
    /// calls leave the window); `None`: when a call in flight ends.
    pub next: Option<u64>,
}

impl LimitState {
    /// Forgets what no longer counts at `now`: waiters and calls in flight whose process
    /// stopped renewing them (a call's concurrency comes back; what it may have used stays
    /// for the minute), and calls older than the window.
    pub fn prune(&mut self, now: u64) {
        self.waiters.retain(|w| w.lease_until >= now);
        for grant in &mut self.grants {
            if grant.in_flight && grant.lease_until < now {
                grant.in_flight = false;
            }
        }
        self.grants.retain(|g| g.in_flight || g.at + COUNTED_MS > now);
    }

    /// Puts `ask` in line; its ticket.
    pub fn join(&mut self, ask: &Ask, now: u64) -> u64 {
        self.last += 1;
        self.waiters.push(Waiter {
            ticket: self.last,
            workflow: ask.workflow.clone(),
            thread: ask.thread.clone(),
            tokens: ask.tokens,
            since: now,
            lease_until: now + LEASE_MS,
        });
        self.last
    }

    /// Keeps the places of `tickets` and `grants` (a live process's) for another lease.
    pub fn renew(&mut self, tickets: &[u64], grants: &[u64], now: u64) {
        for waiter in self.waiters.iter_mut().filter(|w| tickets.contains(&w.ticket)) {
            waiter.lease_until = now + LEASE_MS;
        }
        for grant in self.grants.iter_mut().filter(|g| grants.contains(&g.id) && g.in_flight) {
            grant.lease_until = now + LEASE_MS;
        }
    }

    /// Takes `tickets` out of line (their calls stopped waiting: paused, killed).
    pub fn leave(&mut self, tickets: &[u64]) {
        self.waiters.retain(|w| !tickets.contains(&w.ticket));
    }

    /// A call answered: no longer in flight, and counted at what it used, if the provider said.
    pub fn settle(&mut self, grant: u64, used: Option<u64>) {
        if let Some(grant) = self.grants.iter_mut().find(|g| g.id == grant) {
            grant.in_flight = false;
            if let Some(used) = used {
                grant.tokens = used;
            }
        }
    }

    /// A provider asked every caller to wait until `until`.
    pub fn close(&mut self, until: u64) {
        self.closed_until = self.closed_until.max(until);
    }

    /// Lets through, in turn, every waiter that fits at `now`, as far as the first that does
    /// not; grants are made only for `mine` (the waiters of the process deciding: the others'
    /// processes take theirs when they next look, and what they need is kept for them).
    pub fn admit(&mut self, limit: &ProviderLimit, mine: &[u64], now: u64) -> Admitted {
        self.prune(now);
        let mut admitted = Admitted::default();
        if self.closed_until > now {
            admitted.next = Some(self.closed_until);
            return admitted;
        }
        let mut used = self.usage(now);
        for ticket in self.turns() {
            let waiter = self.waiters.iter().find(|w| w.ticket == ticket).expect("in line");
            let tokens = waiter.tokens;
            if let Some(blocked) = self.blocked(limit, &used, tokens) {
                admitted.next = blocked;
                break;
            }
            used.requests += 1;
            used.tokens += tokens;
            used.in_flight += 1;
            if mine.contains(&ticket) {
                let thread = waiter.thread.clone();
                self.served += 1;
                self.waited_ms += now.saturating_sub(waiter.since);
                self.last += 1;
                let id = self.last;
                self.grants.push(Grant {
                    id,
                    at: now,
                    tokens,
                    in_flight: true,
                    lease_until: now + LEASE_MS,
                    thread,
                });
                self.waiters.retain(|w| w.ticket != ticket);
                admitted.granted.push((ticket, id));
            }
        }
        admitted
    }

    /// The tickets in the order they are served: each workflow's first waiter, by ticket,
    /// then each one's second, and so on.
    fn turns(&self) -> Vec<u64> {
        let mut by_ticket: Vec<&Waiter> = self.waiters.iter().collect();
        by_ticket.sort_by_key(|w| w.ticket);
        let mut seen: std::collections::HashMap<&str, usize> = Default::default();
        let mut ranked: Vec<(usize, u64)> = by_ticket
            .into_iter()
            .map(|w| {
                let rank = seen.entry(w.workflow.as_str()).or_insert(0);
                *rank += 1;
                (*rank, w.ticket)
            })
            .collect();
        ranked.sort();
        ranked.into_iter().map(|(_, ticket)| ticket).collect()
    }

    /// Why a call of `tokens` does not fit beside `used`: `Some(when)` it may, `Some(None)`
    /// when a call in flight ends; `None` if it fits.
    fn blocked(&self, limit: &ProviderLimit, used: &LimitUse, tokens: u64) -> Option<Option<u64>> {
        if limit.concurrent.is_some_and(|max| used.in_flight + 1 > max) {
            return Some(None);
        }
        let mut when = None::<u64>;
        let mut later = |at: Option<u64>| when = Some(when.unwrap_or(0).max(at.unwrap_or(0)));
        if let Some(max) = limit.requests_per_minute
            && used.requests + 1 > max
        {
            later(self.freed_after(used.requests + 1 - max, |_| 1));
        }
        if let Some(max) = limit.tokens_per_minute
            && used.tokens + tokens > max
        {
            later(self.freed_after(used.tokens + tokens - max, |g| g.tokens));
        }
        when.map(|at| Some(at).filter(|at| *at > 0))
    }

    /// When the window's oldest calls will have left it so that `excess` (of what `amount`
    /// counts) is freed; `None` if the calls in the window cannot free it (it waits for one
    /// that is still to be let through).
    fn freed_after(&self, excess: u64, amount: impl Fn(&Grant) -> u64) -> Option<u64> {
        let mut grants: Vec<&Grant> = self.grants.iter().collect();
        grants.sort_by_key(|g| g.at);
        let mut freed = 0;
        for grant in grants {
            freed += amount(grant);
            if freed >= excess {
                return Some(grant.at + COUNTED_MS);
            }
        }
        None
    }

    /// What the window holds at `now` (call [`prune`](Self::prune) first).
    pub fn usage(&self, now: u64) -> LimitUse {
        let window = self.grants.iter().filter(|g| g.at + COUNTED_MS > now);
        LimitUse {
            requests: window.clone().count() as u64,
            tokens: window.map(|g| g.tokens).sum(),
            in_flight: self.grants.iter().filter(|g| g.in_flight).count() as u64,
            waiting: self.waiters.len() as u64,
            closed_until: Some(self.closed_until).filter(|until| *until > now),
            served: self.served,
            waited_ms: self.waited_ms,
        }
    }
}

/// Where limits' states are kept.
pub trait CapacityBackend: Send + Sync + std::fmt::Debug {
    /// Runs `change` on limit `name`'s state (a new limit's is empty) under a lock every
    /// process sharing the store respects, and keeps what it leaves.
    fn update(&self, name: &str, change: &mut dyn FnMut(&mut LimitState)) -> Result<()>;

    /// Limit `name`'s state as it is kept, without a lock (for whoever only reads it).
    fn read(&self, name: &str) -> Result<LimitState>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(workflow: &str, tokens: u64) -> Ask {
        Ask { workflow: workflow.into(), thread: "t".into(), tokens }
    }

    const RPM: ProviderLimit =
        ProviderLimit { requests_per_minute: Some(2), tokens_per_minute: None, concurrent: None };

    #[test]
    fn requests_past_the_minute_wait_for_the_oldest_to_leave_it() {
        let mut state = LimitState::default();
        let tickets: Vec<u64> = (0..3).map(|_| state.join(&ask("w", 10), 1_000)).collect();
        let admitted = state.admit(&RPM, &tickets, 1_000);
        assert_eq!(admitted.granted.len(), 2);
        assert_eq!(admitted.next, Some(1_000 + COUNTED_MS));
        state.renew(&tickets, &[], 30_000);
        assert!(state.admit(&RPM, &tickets, 30_000).granted.is_empty());
        // Its process renews its place before each round, as a live one does.
        state.renew(&tickets, &[], 1_000 + WINDOW_MS);
        assert!(state.admit(&RPM, &tickets, 1_000 + WINDOW_MS).granted.is_empty(), "no slack");
        state.renew(&tickets, &[], 1_000 + COUNTED_MS);
        assert_eq!(state.admit(&RPM, &tickets, 1_000 + COUNTED_MS).granted.len(), 1);
    }

    #[test]
    fn a_settled_call_counts_what_it_used_and_frees_its_place() {
        let limit = ProviderLimit {
            requests_per_minute: None,
            tokens_per_minute: Some(1_000),
            concurrent: Some(1),
        };
        let mut state = LimitState::default();
        let first = state.join(&ask("w", 900), 0);
        let second = state.join(&ask("w", 900), 0);
        let admitted = state.admit(&limit, &[first, second], 0);
        assert_eq!(admitted.granted.len(), 1);
        assert_eq!(admitted.next, None, "waits for the call in flight");
        state.settle(admitted.granted[0].1, Some(50));
        assert_eq!(state.admit(&limit, &[second], 10).granted.len(), 1);
        assert_eq!(state.usage(10).tokens, 950);
    }

    #[test]
    fn workflows_take_turns_and_nobody_passes_a_waiter_that_does_not_fit() {
        let mut state = LimitState::default();
        let a: Vec<u64> = (0..3).map(|_| state.join(&ask("a", 1), 0)).collect();
        let b = state.join(&ask("b", 1), 0);
        let limit = ProviderLimit { requests_per_minute: Some(2), ..Default::default() };
        let all: Vec<u64> = a.iter().copied().chain([b]).collect();
        let granted: Vec<u64> = state.admit(&limit, &all, 0).granted.iter().map(|g| g.0).collect();
        assert_eq!(granted, vec![a[0], b], "b's first call goes before a's second");

        let mut state = LimitState::default();
        let big = state.join(&ask("a", 900), 0);
        let small = state.join(&ask("b", 10), 0);
        let limit = ProviderLimit { tokens_per_minute: Some(1_000), ..Default::default() };
        state.grants.push(Grant {
            id: 99,
            at: 0,
            tokens: 500,
            in_flight: false,
            lease_until: 0,
            thread: "t".into(),
        });
        let admitted = state.admit(&limit, &[big, small], 1);
        assert!(admitted.granted.is_empty(), "the small call does not pass the big one");
        assert_eq!(admitted.next, Some(COUNTED_MS));
    }

    #[test]
    fn a_closed_limit_lets_nobody_through_and_a_dead_process_gives_its_places_back() {
        let mut state = LimitState::default();
        let limit = ProviderLimit { concurrent: Some(1), ..Default::default() };
        let mine = state.join(&ask("w", 1), 0);
        state.close(5_000);
        assert_eq!(state.admit(&limit, &[mine], 100).next, Some(5_000));
        // Another process's call in flight, never renewed: its place comes back by lease.
        let theirs = state.join(&ask("w", 1), 0);
        state.leave(&[mine]);
        let grant = state.admit(&limit, &[theirs], 5_000).granted[0].1;
        let mine = state.join(&ask("w", 1), 5_000);
        assert!(state.admit(&limit, &[mine], 5_001).granted.is_empty());
        state.renew(&[mine], &[], 5_000 + LEASE_MS);
        let admitted = state.admit(&limit, &[mine], 5_001 + LEASE_MS);
        assert_eq!(admitted.granted.len(), 1);
        assert!(!state.grants.iter().find(|g| g.id == grant).unwrap().in_flight);
    }
}
