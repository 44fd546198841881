//! This process's side of the provider limits: its calls wait their turn through one task per
//! limit, which asks the store for all of them at once — joins, renewals, leaves, settlements
//! and admission in one [`CapacityBackend::update`] per wake — so that a worker with two hundred
//! threads waiting on a limit makes a few transactions a second, not two hundred.
//!
//! A [`Place`] is a call in line; dropped before its turn (the thread was paused or killed),
//! it leaves the line. A [`Reserved`] is a call let through; settled with what the provider
//! says it used, or dropped (its estimate stays counted for the minute). The task renews the
//! places and calls of this process while it lives, and stops when it has none; a process that
//! dies gives them back by lease (see [`crate::store::capacity`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{Notify, oneshot};

use crate::store::capacity::{Ask, CapacityBackend, LEASE_MS, LimitUse, ProviderLimit};

/// How often a line with calls waiting looks again at a limit that another process may have
/// freed (its calls answered, their places left).
const POLL: Duration = Duration::from_millis(250);

/// How often calls in flight have their leases renewed.
const RENEW: Duration = Duration::from_millis(LEASE_MS / 3);

/// Store failures in a row after which the waiting calls are told, rather than kept waiting.
const FAILURES_TOLD: u32 = 3;

/// Who draws on the provider limits for a thread's calls: this process's limiter, and the
/// workflow and thread the calls are made for (turns go round the workflows).
#[derive(Debug, Clone)]
pub struct Caller {
    pub limiter: Arc<Limiter>,
    pub workflow: String,
    pub thread: String,
}

/// The lines of this process, one per limit it has calls for.
#[derive(Debug)]
pub struct Limiter {
    backend: Arc<dyn CapacityBackend>,
    lines: Mutex<HashMap<String, Arc<Line>>>,
}

/// One limit's calls of this process.
#[derive(Debug)]
struct Line {
    name: String,
    limit: ProviderLimit,
    backend: Arc<dyn CapacityBackend>,
    local: Mutex<Local>,
    wake: Notify,
}

/// What a line's task has still to tell the store, and whom it has to answer.
#[derive(Debug, Default)]
struct Local {
    next_place: u64,
    /// Places not yet in the store's line.
    joining: Vec<u64>,
    asks: HashMap<u64, Ask>,
    /// Places in the store's line, by ticket.
    tickets: HashMap<u64, u64>,
    /// Who waits for each place's turn.
    waiting: HashMap<u64, oneshot::Sender<Result<u64, String>>>,
    /// Tickets to take out of the store's line.
    leaving: Vec<u64>,
    /// Calls in flight, by grant.
    in_flight: Vec<u64>,
    /// Calls answered, with what they used if the provider said.
    settling: Vec<(u64, Option<u64>)>,
    /// A provider's `Retry-After`, to close the limit until then.
    closing: u64,
    /// Whether the task runs.
    running: bool,
}

impl Local {
    fn idle(&self) -> bool {
        self.joining.is_empty()
            && self.asks.is_empty()
            && self.leaving.is_empty()
            && self.in_flight.is_empty()
            && self.settling.is_empty()
            && self.closing == 0
    }
}

impl Limiter {
    pub fn new(backend: Arc<dyn CapacityBackend>) -> Self {
        Limiter { backend, lines: Mutex::new(HashMap::new()) }
    }

    fn line(&self, name: &str, limit: ProviderLimit) -> Arc<Line> {
        let mut lines = self.lines.lock();
        let fresh = || {
            Arc::new(Line {
                name: name.to_string(),
                limit,
                backend: self.backend.clone(),
                local: Mutex::new(Local::default()),
                wake: Notify::new(),
            })
        };
        let line = lines.entry(name.to_string()).or_insert_with(fresh);
        // A configuration read again may have changed the limit: the newest one counts.
        if line.limit != limit {
            *line = fresh();
        }
        line.clone()
    }

    /// Puts a call in line for limit `name`; [`Place::turn`] waits for its turn.
    pub fn join(&self, name: &str, limit: ProviderLimit, ask: Ask) -> Place {
        let line = self.line(name, limit);
        let (tx, rx) = oneshot::channel();
        let place = {
            let mut local = line.local.lock();
            local.next_place += 1;
            let place = local.next_place;
            local.joining.push(place);
            local.asks.insert(place, ask);
            local.waiting.insert(place, tx);
            place
        };
        line.poke();
        Place { line, place, turn: Some(rx) }
    }

    /// A provider asked every caller of limit `name` to wait until `until` (ms since the epoch).
    pub fn close(&self, name: &str, limit: ProviderLimit, until: u64) {
        let line = self.line(name, limit);
        {
            let mut local = line.local.lock();
            local.closing = local.closing.max(until);
        }
        line.poke();
    }

    /// How far limit `name` is used now, as the store has it.
    pub fn usage(&self, name: &str) -> crate::Result<LimitUse> {
        let mut state = self.backend.read(name)?;
        let now = crate::clock::now_ms();
        state.prune(now);
        Ok(state.usage(now))
    }
}

impl Line {
    /// Tells the task there is something to do, starting it if it does not run.
    fn poke(self: &Arc<Self>) {
        let start = {
            let mut local = self.local.lock();
            !std::mem::replace(&mut local.running, true)
        };
        if start {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    let line = self.clone();
                    runtime.spawn(async move { line.serve().await });
                }
                // Outside a runtime (a process ending): what is left returns by lease.
                Err(_) => self.local.lock().running = false,
            }
        }
        self.wake.notify_one();
    }

    /// The task: one round with the store per wake, until nothing is left to do.
    async fn serve(self: Arc<Self>) {
        let mut failures = 0;
        loop {
            let round = {
                let mut local = self.local.lock();
                if local.idle() {
                    local.running = false;
                    return;
                }
                Round {
                    joining: std::mem::take(&mut local.joining)
                        .into_iter()
                        .filter_map(|place| Some((place, local.asks.get(&place)?.clone())))
                        .collect(),
                    tickets: local.tickets.clone(),
                    leaving: std::mem::take(&mut local.leaving),
                    settling: std::mem::take(&mut local.settling),
                    closing: std::mem::take(&mut local.closing),
                    in_flight: local.in_flight.clone(),
                }
            };
            let line = self.clone();
            let outcome = match tokio::task::spawn_blocking(move || line.round(&round)).await {
                Ok(outcome) => outcome.map_err(|e| e.to_string()),
                Err(panicked) => Err(panicked.to_string()),
            };
            let next = match outcome {
                Ok(outcome) => {
                    failures = 0;
                    self.deliver(outcome)
                }
                Err(e) => {
                    failures += 1;
                    tracing::warn!(limit = %self.name, "provider limit: {e}");
                    self.retry_later(failures, &e);
                    Some(crate::clock::now_ms() + 1_000)
                }
            };
            // Calls waiting look again by the next time one may fit, and at least every poll
            // (another process may free the limit at any time); calls in flight only renew.
            let wait = {
                let local = self.local.lock();
                let now = crate::clock::now_ms();
                if !local.asks.is_empty() {
                    Some((next.unwrap_or(now + POLL.as_millis() as u64), POLL))
                } else if !local.in_flight.is_empty() {
                    Some((now + RENEW.as_millis() as u64, RENEW))
                } else {
                    None
                }
            };
            if let Some((at, at_most)) = wait {
                tokio::select! {
                    _ = crate::clock::sleep_until(at, at_most) => {}
                    _ = self.wake.notified() => {}
                }
            }
        }
    }

    /// One round with the store, on a blocking thread.
    fn round(&self, round: &Round) -> crate::Result<Outcome> {
        let mut outcome = Outcome::default();
        self.backend.update(&self.name, &mut |state| {
            let now = crate::clock::now_ms();
            outcome = Outcome::default();
            // This process is alive: its places and calls are renewed before anything whose
            // lease ran out is forgotten (a stalled round must not drop its own waiters).
            let mine: Vec<u64> = round.tickets.values().copied().collect();
            state.renew(&mine, &round.in_flight, now);
            state.prune(now);
            if round.closing > 0 {
                state.close(round.closing);
            }
            state.leave(&round.leaving);
            for (grant, used) in &round.settling {
                state.settle(*grant, *used);
            }
            let mut tickets = round.tickets.clone();
            for (place, ask) in &round.joining {
                let ticket = state.join(ask, now);
                tickets.insert(place.to_owned(), ticket);
                outcome.joined.push((*place, ticket));
            }
            let mine: Vec<u64> = tickets.values().copied().collect();
            // A place whose lease ran out (this process stalled) is no longer in line: it
            // joins again rather than waiting for a turn that will not come.
            outcome.lost = tickets
                .iter()
                .filter(|(_, t)| !state.waiters.iter().any(|w| w.ticket == **t))
                .map(|(place, _)| *place)
                .collect();
            let admitted = state.admit(&self.limit, &mine, now);
            outcome.granted = admitted.granted;
            outcome.next = admitted.next;
        })?;
        Ok(outcome)
    }

    /// Hands each granted call its turn; when the line should look again.
    fn deliver(&self, outcome: Outcome) -> Option<u64> {
        let mut local = self.local.lock();
        for (place, ticket) in &outcome.joined {
            // A place dropped while it was joining leaves at the next round.
            match local.asks.contains_key(place) {
                true => {
                    local.tickets.insert(*place, *ticket);
                }
                false => local.leaving.push(*ticket),
            }
        }
        let granted: HashMap<u64, u64> = outcome.granted.iter().copied().collect();
        for place in outcome.lost {
            if local.asks.contains_key(&place)
                && let Some(ticket) = local.tickets.get(&place).copied()
                && !granted.contains_key(&ticket)
            {
                local.tickets.remove(&place);
                local.joining.push(place);
            }
        }
        for (ticket, grant) in granted {
            let Some(place) = local.tickets.iter().find(|(_, t)| **t == ticket).map(|(p, _)| *p)
            else {
                // Its place was dropped during the round: the call is not made.
                local.settling.push((grant, Some(0)));
                continue;
            };
            local.tickets.remove(&place);
            local.asks.remove(&place);
            match local.waiting.remove(&place).map(|tx| tx.send(Ok(grant))) {
                Some(Ok(())) => local.in_flight.push(grant),
                _ => local.settling.push((grant, Some(0))),
            }
        }
        outcome.next
    }

    /// A round failed: its changes are tried again; after a few failures in a row, the calls
    /// waiting are told (their agents' retries take over).
    fn retry_later(&self, failures: u32, error: &str) {
        let mut local = self.local.lock();
        // The round's joins did not happen (its transaction, or its file, was not written).
        let joined: Vec<u64> = local.asks.keys().copied().collect();
        for place in joined {
            if !local.tickets.contains_key(&place) && !local.joining.contains(&place) {
                local.joining.push(place);
            }
        }
        if failures >= FAILURES_TOLD {
            let places: Vec<u64> = local.waiting.keys().copied().collect();
            for place in places {
                if let Some(tx) = local.waiting.remove(&place) {
                    let _ = tx.send(Err(format!("the store cannot be asked for a turn: {error}")));
                }
                local.asks.remove(&place);
                local.joining.retain(|p| *p != place);
                if let Some(ticket) = local.tickets.remove(&place) {
                    local.leaving.push(ticket);
                }
            }
        }
    }
}

/// What one round tells the store.
#[derive(Debug)]
struct Round {
    joining: Vec<(u64, Ask)>,
    tickets: HashMap<u64, u64>,
    leaving: Vec<u64>,
    settling: Vec<(u64, Option<u64>)>,
    closing: u64,
    in_flight: Vec<u64>,
}

/// What one round decided.
#[derive(Debug, Default)]
struct Outcome {
    joined: Vec<(u64, u64)>,
    lost: Vec<u64>,
    granted: Vec<(u64, u64)>,
    next: Option<u64>,
}

/// A call in line for a limit.
#[derive(Debug)]
pub struct Place {
    line: Arc<Line>,
    place: u64,
    turn: Option<oneshot::Receiver<Result<u64, String>>>,
}

impl Place {
    /// Waits for the call's turn (cancel-safe: a `select!` may give up on it and ask again).
    pub async fn turn(&mut self) -> Result<Reserved, String> {
        let receiver = self.turn.as_mut().expect("a place's turn is taken once");
        let grant = match receiver.await {
            Ok(result) => result?,
            Err(_) => return Err("the limit's line stopped".into()),
        };
        self.turn = None;
        Ok(Reserved { line: self.line.clone(), grant, settled: false })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if self.turn.is_none() {
            return;
        }
        let mut local = self.line.local.lock();
        local.asks.remove(&self.place);
        local.waiting.remove(&self.place);
        local.joining.retain(|p| *p != self.place);
        if let Some(ticket) = local.tickets.remove(&self.place) {
            local.leaving.push(ticket);
        }
        drop(local);
        self.line.wake.notify_one();
    }
}

/// A call let through a limit, in flight until it is settled or dropped.
#[derive(Debug)]
pub struct Reserved {
    line: Arc<Line>,
    grant: u64,
    settled: bool,
}

impl Reserved {
    /// The call answered, having used `tokens` if the provider said.
    pub fn settle(mut self, tokens: Option<u64>) {
        self.finish(tokens);
    }

    fn finish(&mut self, tokens: Option<u64>) {
        if std::mem::replace(&mut self.settled, true) {
            return;
        }
        {
            let mut local = self.line.local.lock();
            local.in_flight.retain(|g| *g != self.grant);
            local.settling.push((self.grant, tokens));
        }
        self.line.poke();
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        // A call cut short may have been sent: what it was estimated at stays counted.
        self.finish(None);
    }
}
