//! Watching a thread through its store, on any store and from any process: what was stored
//! since the last look, read incrementally (never the whole thread again), as the library's
//! [`Event`]s. A follower of a queued thread and the HTTP API's event streams both read a
//! thread this way.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::ids::ThreadId;
use crate::run::events::Event;
use crate::store::Storage;
use crate::store::records::{Rest, RestKind, ThreadLines, ThreadRecord, ThreadStatus};

/// A thread's records as read so far.
#[derive(Debug)]
pub struct ThreadReader {
    store: Storage,
    id: ThreadId,
    lines: ThreadLines,
    /// The last record's position (-1: none read).
    read_to: i64,
    /// Whether a worker held it, and whether it was queued, at the last read.
    live: Option<(bool, bool)>,
    /// The thread as those records make it (rebuilt only when they change).
    current: Option<Arc<ThreadRecord>>,
}

impl ThreadReader {
    pub fn new(store: &Storage, id: ThreadId) -> Self {
        ThreadReader {
            store: store.clone(),
            id,
            lines: ThreadLines::default(),
            read_to: -1,
            live: None,
            current: None,
        }
    }

    /// The thread as of the last [`catch_up`](Self::catch_up), if there was one.
    pub fn current(&self) -> Option<&Arc<ThreadRecord>> {
        self.current.as_ref()
    }

    /// The thread as it is now, reading only the records stored since the last call.
    pub fn catch_up(&mut self) -> Result<Arc<ThreadRecord>> {
        let changes = self
            .store
            .threads()
            .changes(self.id, self.read_to)?
            .ok_or_else(|| Error::UnknownThread(self.id.to_string()))?;
        let live = (changes.held, changes.queued);
        if let Some(current) = &self.current
            && changes.lines.is_empty()
            && self.live == Some(live)
        {
            return Ok(current.clone());
        }
        if let Some(last) = changes.add_to(&mut self.lines) {
            self.read_to = last;
        }
        self.live = Some(live);
        let record = self
            .lines
            .clone()
            .record(live.0, live.1)
            .ok_or_else(|| Error::Host(format!("thread {} has no start record", self.id)))?;
        let record = Arc::new(record);
        self.current = Some(record.clone());
        Ok(record)
    }
}

/// A thread's events: each step as it is stored, then each time the thread comes to rest
/// (waiting, paused, ended), in the order of its records, not sampled from its status: a
/// thread that waits, is answered and waits again between two looks is told waiting twice.
#[derive(Debug)]
pub struct ThreadEvents {
    reader: ThreadReader,
    /// Steps already told.
    told: usize,
    /// Rests already told (of the record's [`rests`](ThreadRecord::rests)); none before the
    /// first look.
    rests_told: Option<usize>,
}

impl ThreadEvents {
    /// Watches thread `id` from its first step.
    pub fn new(store: &Storage, id: ThreadId) -> Self {
        ThreadEvents { reader: ThreadReader::new(store, id), told: 0, rests_told: None }
    }

    /// What happened since the last call; empty if nothing did. The first call tells the
    /// steps so far and the rest the thread is in, if it is at rest (not every rest it had),
    /// by its records: also while its worker still holds it, letting it go.
    pub fn poll(&mut self) -> Result<Vec<Event>> {
        let record = self.reader.catch_up()?;
        let thread = record.id();
        let mut events = Vec::new();
        let rests = match self.rests_told {
            Some(told) => record.rests.get(told..).unwrap_or_default(),
            None => match record.status() {
                ThreadStatus::Waiting | ThreadStatus::Paused => last_rest(&record),
                status if status.is_ended() => last_rest(&record),
                // Held a moment after it came to rest, while its worker lets it go (a lease, a
                // lock): at rest by its records, which say when a worker takes it up again.
                ThreadStatus::Running if record.resting => last_rest(&record),
                _ => &[],
            },
        };
        for rest in rests {
            self.tell_steps(&record, rest.steps, &mut events);
            events.push(match &rest.kind {
                RestKind::Waiting { role } => Event::Waiting { thread, role: role.clone() },
                RestKind::Paused => Event::Paused { thread, steps: rest.steps },
                RestKind::Ended(end) => Event::Ended { thread, end: end.clone() },
            });
        }
        self.rests_told = Some(record.rests.len());
        self.tell_steps(&record, record.steps.len(), &mut events);
        Ok(events)
    }

    /// The thread as the last [`poll`](Self::poll) saw it: every step of it has been told.
    pub fn seen(&self) -> Option<&Arc<ThreadRecord>> {
        self.reader.current()
    }

    /// Tells the steps of `record` not told yet, up to its first `upto`.
    fn tell_steps(&mut self, record: &ThreadRecord, upto: usize, events: &mut Vec<Event>) {
        let thread = record.id();
        let upto = upto.min(record.steps.len());
        for (offset, step) in record.steps.iter().enumerate().take(upto).skip(self.told) {
            events.push(Event::Step { thread, index: offset + 1, step: step.clone() });
        }
        self.told = self.told.max(upto);
    }
}

/// The last rest of `record`, as a slice.
fn last_rest(record: &ThreadRecord) -> &[Rest] {
    let len = record.rests.len();
    &record.rests[len.saturating_sub(1)..]
}
