//! Live views: what a page watches (the lists, or one thread) is watched once, by one task,
//! however many pages watch it; each page's event stream holds only a receiver of the latest
//! state, and is sent an event only when that state changed. Memory is bounded by what is
//! watched, not by how many watch it, and the task ends with its last watcher.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;

use super::http::App;
use crate::ids::ThreadId;

/// How often a watched view is looked at for changes.
const INTERVAL: Duration = Duration::from_millis(300);

/// What a page watches: the lists of the home page, or one thread.
pub type Subject = Option<ThreadId>;

/// The views being watched, each by one task.
#[derive(Debug, Default)]
pub struct LiveViews {
    watched: Mutex<HashMap<Subject, watch::Sender<String>>>,
}

impl LiveViews {
    /// The latest state of `subject` (a digest of what its page shows), and each change of it;
    /// a task watching it is started if none is.
    pub fn subscribe(&self, app: &Arc<App>, subject: Subject) -> watch::Receiver<String> {
        let mut watched = self.watched.lock();
        if let Some(sender) = watched.get(&subject) {
            return sender.subscribe();
        }
        let (sender, receiver) = watch::channel(String::new());
        watched.insert(subject, sender.clone());
        tokio::spawn(watch_subject(app.clone(), subject, sender));
        receiver
    }

    /// How many subjects are watched (for tests and `/metrics`).
    pub fn watched(&self) -> usize {
        self.watched.lock().len()
    }
}

/// Looks at `subject` every [`INTERVAL`] and publishes its state when it changed, until
/// nobody watches it or the server stops.
async fn watch_subject(app: Arc<App>, subject: Subject, sender: watch::Sender<String>) {
    let mut stopping = app.stopping.subscribe();
    loop {
        {
            // Under the map's lock: a new watcher either finds this task still there, or
            // starts another.
            let mut watched = app.live.watched.lock();
            if sender.receiver_count() == 0 || *stopping.borrow() {
                watched.remove(&subject);
                return;
            }
        }
        let now = super::http::fingerprint(&app, subject).await;
        sender.send_if_modified(|last| {
            let changed = *last != now;
            if changed {
                *last = now;
            }
            changed
        });
        tokio::select! {
            _ = tokio::time::sleep(INTERVAL) => {}
            _ = stopping.changed() => {}
        }
    }
}
