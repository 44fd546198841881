//! The event feeds of `GET /api/v1/threads/{id}/events`: each followed thread is read by one
//! task, however many clients follow it, into one shared log of its events, each serialized
//! once as its server-sent-event frame; a client holds only a receiver and its place in that
//! log, and is sent the shared bytes (never a copy of its own). Reading the store is bounded
//! by the threads followed, memory by their events, not by the clients following them, and a
//! feed ends with its last follower.
//!
//! A model's live text (`delta` events) is not kept in the log: the feed's task follows it
//! from the thread's worker (see [`Dispatch::live`](crate::run::dispatch::Dispatch::live)) and
//! hands each piece to the clients following at that moment; one who comes later sees the
//! turns so far in the thread, and the text from then on.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use parking_lot::Mutex;
use tokio::sync::{broadcast, watch};

use crate::error::Result;
use crate::ids::ThreadId;
use crate::run::dispatch::{Dispatch, LiveNews};
use crate::run::events::Event;
use crate::run::watch::ThreadEvents;
use crate::store::Storage;
use crate::store::queue::Live;

/// How often a followed thread is read for what it stored.
const INTERVAL: Duration = Duration::from_millis(200);

/// An event as every follower is sent it.
#[derive(Debug)]
pub struct Told {
    /// The step it tells, if it tells one (where a client that heard step N starts again).
    pub step: Option<usize>,
    /// Its frame: `event: TYPE`, `id: LAST-STEP`, `data: JSON`, and a blank line.
    pub frame: Bytes,
}

impl Told {
    /// `event`, with `last_step` (the last step told at or before it) as its id.
    fn of(event: &Event, last_step: usize) -> Told {
        let json = serde_json::to_string(event).expect("events serialize");
        let name = match event {
            Event::Started { .. } => "started",
            Event::Working { .. } => "working",
            Event::Step { .. } => "step",
            Event::Delta { .. } => "delta",
            Event::Waiting { .. } => "waiting",
            Event::Paused { .. } => "paused",
            Event::Ended { .. } => "ended",
        };
        // JSON text holds no newline (serde_json escapes them), so it is one `data` line. Live
        // text carries no id: a client that reconnects starts from its last step.
        let frame = match event {
            Event::Delta { .. } => format!("event: {name}\ndata: {json}\n\n"),
            _ => format!("event: {name}\nid: {last_step}\ndata: {json}\n\n"),
        };
        let step = match event {
            Event::Step { index, .. } => Some(*index),
            _ => None,
        };
        Told { step, frame: Bytes::from(frame) }
    }
}

/// A thread's events so far, in order.
#[derive(Debug, Default)]
pub struct Log {
    pub events: Vec<Arc<Told>>,
    /// Set when the thread can say no more (it ended, or it can no longer be read).
    pub closed: bool,
    /// Set when it can no longer be read (removed, or its store is gone): the feed is not kept
    /// for those who come later, who are told why when they read it themselves.
    pub unreadable: bool,
}

impl Log {
    /// The log with `events` added after the ones it has.
    fn extended(&self, events: Vec<Event>, failed: bool) -> Log {
        let mut last_step = self.events.iter().rev().find_map(|t| t.step).unwrap_or(0);
        let mut log = Log {
            events: self.events.clone(),
            closed: self.closed || failed,
            unreadable: self.unreadable || failed,
        };
        for event in events {
            log.closed |= matches!(event, Event::Ended { .. });
            if let Event::Step { index, .. } = &event {
                last_step = *index;
            }
            log.events.push(Arc::new(Told::of(&event, last_step)));
        }
        log
    }

    /// Where a client that heard step `after` starts (0: from the first event); past the end
    /// if the log does not hold that step yet.
    pub fn start_of(&self, after: usize) -> usize {
        if after == 0 {
            return 0;
        }
        self.events
            .iter()
            .position(|t| t.step == Some(after))
            .map_or(self.events.len(), |at| at + 1)
    }
}

/// A followed thread: its log, and its live text as it comes.
#[derive(Debug, Clone)]
struct Feed {
    log: watch::Sender<Arc<Log>>,
    live: broadcast::Sender<Arc<LiveFrame>>,
}

/// A piece of live text as every client is sent it: the API's frame, and the event's JSON (the
/// web view's pages are sent it as their own event).
#[derive(Debug)]
pub struct LiveFrame {
    pub frame: Bytes,
    pub json: String,
}

/// How many pieces of live text a slow client may fall behind by before it misses some.
const LIVE_LAG: usize = 256;

/// How often a feed without live text asks for it again (a worker that starts the thread
/// later, a run that ended and another that began).
const LIVE_RETRY: Duration = Duration::from_secs(1);

/// What a client of a feed holds: the log and each change of it, and the live text.
pub struct Following {
    pub log: watch::Receiver<Arc<Log>>,
    pub live: broadcast::Receiver<Arc<LiveFrame>>,
}

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
    ) -> Result<Following> {
        let joined =
            |feed: &Feed| Following { log: feed.log.subscribe(), live: feed.live.subscribe() };
        if let Some(feed) = self.followed.lock().get(&id) {
            return Ok(joined(feed));
        }
        let mut reader = ThreadEvents::new(store, id);
        let first = reader.poll()?;
        let log = Log::default().extended(first, false);
        let mut followed = self.followed.lock();
        // Another request may have started the feed meanwhile: one reader per thread.
        if let Some(feed) = followed.get(&id) {
            return Ok(joined(feed));
        }
        let feed =
            Feed { log: watch::channel(Arc::new(log)).0, live: broadcast::channel(LIVE_LAG).0 };
        let following = joined(&feed);
        followed.insert(id, feed.clone());
        let dispatch = crate::run::dispatch::of(store);
        tokio::spawn(read(reader, id, feed, dispatch, self.followed.clone(), stopping));
        Ok(following)
    }

    /// How many threads are followed.
    pub fn followed(&self) -> usize {
        self.followed.lock().len()
    }
}

/// Reads thread `id` every [`INTERVAL`] and publishes what it stored, until nobody follows it,
/// it can no longer be read, or the server stops. Once it has ended there is nothing more to
/// read, but the feed stays while anyone follows it: those who come then share its log too,
/// rather than each reading the thread (and holding its events) for itself.
async fn read(
    mut reader: ThreadEvents,
    id: ThreadId,
    feed: Feed,
    dispatch: Arc<dyn Dispatch>,
    followed: Arc<Mutex<HashMap<ThreadId, Feed>>>,
    mut stopping: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut live: Option<LiveNews> = None;
    let mut asked_live: Option<tokio::time::Instant> = None;
    loop {
        {
            // Under the map's lock: a new follower either finds this feed still there, or
            // starts another.
            let mut map = followed.lock();
            if feed.log.receiver_count() == 0 || *stopping.borrow() || feed.log.borrow().unreadable
            {
                map.remove(&id);
                return;
            }
        }
        if feed.log.borrow().closed {
            tokio::select! {
                _ = feed.log.closed() => {}
                _ = stopping.changed() => {}
            }
            continue;
        }
        if live.is_none() && asked_live.is_none_or(|at| at.elapsed() >= LIVE_RETRY) {
            asked_live = Some(tokio::time::Instant::now());
            live = dispatch.live(id).await.ok().flatten();
        }
        let text = async {
            match &mut live {
                Some(live) => live.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tick.tick() => {}
            _ = stopping.changed() => continue,
            heard = text => {
                match heard {
                    Some(Live::Text(text)) => {
                        publish_text(&feed, id, text);
                        continue;
                    }
                    // Something was stored: read it now.
                    Some(Live::Stored) => {}
                    // Its run there ended: what it stored last is read now.
                    None => live = None,
                }
            }
        }
        // Text the worker sent before it stored what is read now goes out first: a client is
        // told a model's text before the step that holds it.
        while let Some(Ok(Live::Text(text))) = live.as_mut().map(|live| live.try_recv()) {
            publish_text(&feed, id, text);
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
        let log = feed.log.borrow().extended(events, failed);
        feed.log.send_replace(Arc::new(log));
    }
}

/// Hands a piece of thread `id`'s live text to the clients following it now.
fn publish_text(feed: &Feed, id: ThreadId, text: crate::store::queue::LiveText) {
    let event = Event::Delta { thread: id, text };
    let json = serde_json::to_string(&event).expect("events serialize");
    let frame = Told::of(&event, 0).frame;
    let _ = feed.live.send(Arc::new(LiveFrame { frame, json }));
}
