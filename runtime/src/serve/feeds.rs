//! The event feeds of `GET /api/v1/threads/{id}/events`: each followed thread is read by one
//! task, however many clients follow it, into one shared log of its events; a client holds
//! only a receiver and its place in that log. Reading the store is bounded by the threads
//! followed, not by the clients following them, and a feed ends with its last follower.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;

use crate::error::Result;
use crate::ids::ThreadId;
use crate::run::events::Event;
use crate::run::watch::ThreadEvents;
use crate::store::Storage;

/// How often a followed thread is read for what it stored.
const INTERVAL: Duration = Duration::from_millis(200);

/// A thread's events so far, in order.
#[derive(Debug, Default)]
pub struct Log {
    pub events: Vec<Arc<Event>>,
    /// Set when the thread can say no more (it ended, or it can no longer be read).
    pub closed: bool,
}

type Feed = watch::Sender<Arc<Log>>;

/// The feeds being read, one per followed thread.
#[derive(Debug, Default)]
pub struct Feeds {
    followed: Arc<Mutex<HashMap<ThreadId, Feed>>>,
}

impl Feeds {
    /// The log of thread `id`, and each change of it; the thread is read once first (so a
    /// thread that does not read is an error here, not an empty stream), and a task reading it
    /// is started if none is.
    pub fn follow(
        &self,
        store: &Storage,
        id: ThreadId,
        stopping: watch::Receiver<bool>,
    ) -> Result<watch::Receiver<Arc<Log>>> {
        if let Some(feed) = self.followed.lock().get(&id) {
            return Ok(feed.subscribe());
        }
        let mut reader = ThreadEvents::new(store, id);
        let first = reader.poll()?;
        let closed = first.iter().any(|e| matches!(e, Event::Ended { .. }));
        let log = Log { events: first.into_iter().map(Arc::new).collect(), closed };
        let mut followed = self.followed.lock();
        // Another request may have started the feed meanwhile: one reader per thread.
        if let Some(feed) = followed.get(&id) {
            return Ok(feed.subscribe());
        }
        let (feed, receiver) = watch::channel(Arc::new(log));
        followed.insert(id, feed.clone());
        tokio::spawn(read(reader, id, feed, self.followed.clone(), stopping));
        Ok(receiver)
    }

    /// How many threads are followed.
    pub fn followed(&self) -> usize {
        self.followed.lock().len()
    }
}

/// Reads thread `id` every [`INTERVAL`] and publishes what it stored, until nobody follows it,
/// it ended, or the server stops.
async fn read(
    mut reader: ThreadEvents,
    id: ThreadId,
    feed: Feed,
    followed: Arc<Mutex<HashMap<ThreadId, Feed>>>,
    mut stopping: watch::Receiver<bool>,
) {
    loop {
        {
            // Under the map's lock: a new follower either finds this feed still there, or
            // starts another.
            let mut map = followed.lock();
            if feed.receiver_count() == 0 || *stopping.borrow() || feed.borrow().closed {
                map.remove(&id);
                return;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(INTERVAL) => {}
            _ = stopping.changed() => continue,
        }
        let (events, failed) = match reader.poll() {
            Ok(events) => (events, false),
            // A thread removed while followed, a store gone: the feed closes; a client that
            // reconnects is told why.
            Err(_) => (vec![], true),
        };
        if events.is_empty() && !failed {
            continue;
        }
        let last = feed.borrow().clone();
        let mut log = Log { events: last.events.clone(), closed: failed };
        for event in events {
            log.closed |= matches!(event, Event::Ended { .. });
            log.events.push(Arc::new(event));
        }
        feed.send_replace(Arc::new(log));
    }
}
