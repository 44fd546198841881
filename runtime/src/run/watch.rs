//! Watching a thread through its store, on any store and from any process: what was stored
//! since the last look, read incrementally (never the whole thread again), as the library's
//! [`Event`]s. A follower of a queued thread and the HTTP API's event streams both read a
//! thread this way.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::ids::ThreadId;
use crate::run::events::Event;
use crate::store::Storage;
use crate::store::records::{ThreadLines, ThreadRecord, ThreadStatus};

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

/// A thread's events: each step as it is stored, then how the thread rests each time it comes
/// to rest (waiting, paused, ended).
#[derive(Debug)]
pub struct ThreadEvents {
    reader: ThreadReader,
    /// Steps already told.
    told: usize,
    /// The status last told, so a rest is told once.
    rest: Option<ThreadStatus>,
}

impl ThreadEvents {
    /// Watches thread `id` from its first step.
    pub fn new(store: &Storage, id: ThreadId) -> Self {
        ThreadEvents { reader: ThreadReader::new(store, id), told: 0, rest: None }
    }

    /// What happened since the last call; empty if nothing did.
    pub fn poll(&mut self) -> Result<Vec<Event>> {
        let record = self.reader.catch_up()?;
        let thread = record.id();
        let mut events = Vec::new();
        for (offset, step) in record.steps.iter().enumerate().skip(self.told) {
            events.push(Event::Step { thread, index: offset + 1, step: step.clone() });
        }
        self.told = self.told.max(record.steps.len());
        let status = record.status();
        if self.rest != Some(status) {
            let rest = match status {
                _ if record.end.is_some() => {
                    let end = record.end.clone().expect("an ended thread").end;
                    Some(Event::Ended { thread, end })
                }
                ThreadStatus::Waiting => Some(Event::Waiting {
                    thread,
                    role: record.paused.as_ref().and_then(|p| p.role.clone()).unwrap_or_default(),
                }),
                ThreadStatus::Paused => Some(Event::Paused { thread, steps: record.steps.len() }),
                _ => None,
            };
            events.extend(rest);
            self.rest = Some(status);
        }
        Ok(events)
    }
}
