//! Live views: what a page watches (the lists, or one thread) is watched once, by one task,
//! however many pages watch it; each page's event stream holds only a receiver of the latest
//! state, and is sent an event only when that state changed. Memory is bounded by what is
//! watched, not by how many watch it, and the task ends with its last watcher.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;

use super::views::{self, SharedHistories};
use crate::ids::{Digest, ThreadId};
use crate::run::control;
use crate::store::Storage;

/// How often a watched view is looked at for changes.
const INTERVAL: Duration = Duration::from_millis(300);

/// What a page watches: the lists of the home page, or one thread.
pub type Subject = Option<ThreadId>;

/// The views being watched, each by one task.
#[derive(Debug, Default)]
pub struct LiveViews {
    watched: Arc<Mutex<HashMap<Subject, watch::Sender<String>>>>,
}

impl LiveViews {
    /// The latest state of `subject` (a digest of what its page shows), and each change of it;
    /// a task watching it is started if none is.
    pub fn subscribe(
        &self,
        store: &Storage,
        histories: &SharedHistories,
        stopping: watch::Receiver<bool>,
        subject: Subject,
    ) -> watch::Receiver<String> {
        let mut watched = self.watched.lock();
        if let Some(sender) = watched.get(&subject) {
            return sender.subscribe();
        }
        let (sender, receiver) = watch::channel(String::new());
        watched.insert(subject, sender.clone());
        let watcher = Watcher {
            store: store.clone(),
            histories: histories.clone(),
            watched: self.watched.clone(),
            stopping,
        };
        tokio::spawn(watcher.run(subject, sender));
        receiver
    }

    /// How many subjects are watched (for tests and `/metrics`).
    pub fn watched(&self) -> usize {
        self.watched.lock().len()
    }
}

/// What a watching task needs.
struct Watcher {
    store: Storage,
    histories: SharedHistories,
    watched: Arc<Mutex<HashMap<Subject, watch::Sender<String>>>>,
    stopping: watch::Receiver<bool>,
}

impl Watcher {
    /// Looks at `subject` every [`INTERVAL`] and publishes its state when it changed, until
    /// nobody watches it or the server stops.
    async fn run(mut self, subject: Subject, sender: watch::Sender<String>) {
        loop {
            {
                // Under the map's lock: a new watcher either finds this task still there, or
                // starts another.
                let mut watched = self.watched.lock();
                if sender.receiver_count() == 0 || *self.stopping.borrow() {
                    watched.remove(&subject);
                    return;
                }
            }
            let now = fingerprint(&self.store, &self.histories, subject).await;
            sender.send_if_modified(|last| {
                let changed = *last != now;
                if changed {
                    *last = now;
                }
                changed
            });
            tokio::select! {
                _ = tokio::time::sleep(INTERVAL) => {}
                _ = self.stopping.changed() => {}
            }
        }
    }
}

/// A digest of what a view shows: it changes when the view should be fetched again.
async fn fingerprint(
    store: &Storage,
    histories: &SharedHistories,
    thread: Option<ThreadId>,
) -> String {
    let mut parts = Vec::new();
    // A thread's page changes with its thread only: another thread's step must not redraw it
    // (and wipe an answer being typed).
    if thread.is_none()
        && let Ok(list) = store.threads().summaries()
    {
        for t in list {
            parts.push(format!("{} {} {}", t.thread_id, t.status.as_str(), t.steps));
        }
    }
    if thread.is_none()
        && let Ok(list) = views::schedules(store, histories)
    {
        for s in list {
            parts.push(format!(
                "{} {} {} {:?}",
                s.schedule.name, s.fired, s.schedule.paused, s.next
            ));
        }
    }
    if let Some(id) = thread
        && let Ok(record) = store.threads().read(id)
    {
        // Each rest counts: a thread that waits, is answered and waits again between two
        // looks has the same steps and status, and its page must still be fetched again.
        parts.push(format!("{} {:?} {}", record.steps.len(), record.status(), record.rests.len()));
        if let Ok(log) = store.threads().debug_tail(record.start.hash, id, 1) {
            parts.push(format!("{:?}", log.first().map(|l| l.timestamp)));
        }
        if let Ok(ps) = control::ps(store).await {
            let at_work = ps.into_iter().find(|p| p.thread_id == id);
            parts.push(format!("{:?}", at_work.map(|p| (p.role, p.since))));
        }
    }
    Digest::of(parts.join("\n").as_bytes()).to_string()
}
