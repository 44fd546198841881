//! What a running thread shares with whoever controls or watches it (its worker, `ps`,
//! followers): a pause request, the role at work, the steps recorded, and where its `human`
//! agents' questions go.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use parking_lot::Mutex;
use tokio::sync::broadcast;

use crate::agents::human::HumanPort;

/// Shared between a running thread and whoever controls it (the worker, `ps`, followers).
#[derive(Debug)]
pub struct ThreadControl {
    pause: AtomicBool,
    /// Stop after the current step without a word in the thread: its worker hands it back to
    /// the queue (it is stopping), and another worker continues it.
    hand_back: AtomicBool,
    /// What the thread does now, and since when (for `ps`)…
    activity: Mutex<Option<(Activity, u64)>>,
    /// …and each change of it, in order (for followers).
    activity_events: broadcast::Sender<Activity>,
    steps: AtomicUsize,
    /// Where `human` agents put their questions.
    pub human: HumanPort,
}

/// What a thread is doing: which role is at work, with which agent.
#[derive(Debug, Clone, PartialEq)]
pub struct Activity {
    pub role: String,
    pub agent: String,
}

impl Default for ThreadControl {
    fn default() -> Self {
        ThreadControl {
            pause: AtomicBool::new(false),
            hand_back: AtomicBool::new(false),
            activity: Mutex::new(None),
            activity_events: broadcast::channel(64).0,
            steps: AtomicUsize::new(0),
            human: HumanPort::default(),
        }
    }
}

impl ThreadControl {
    /// Asks the thread to stop after its current step is persisted.
    pub fn request_pause(&self) {
        self.pause.store(true, Ordering::SeqCst);
    }

    /// The role being worked on, if an agent is at work.
    pub fn current_role(&self) -> Option<String> {
        self.activity.lock().as_ref().map(|(a, _)| a.role.clone())
    }

    /// What the thread does now, and since when (ms since the epoch), if an agent is at work.
    pub fn current_activity(&self) -> Option<(Activity, u64)> {
        self.activity.lock().clone()
    }

    /// Records what the thread is doing.
    pub fn set_activity(&self, activity: Option<Activity>) {
        if let Some(activity) = &activity {
            let _ = self.activity_events.send(activity.clone());
        }
        *self.activity.lock() = activity.map(|a| (a, crate::clock::now_ms()));
    }

    /// Follows what the thread starts doing from now on.
    pub fn watch(&self) -> broadcast::Receiver<Activity> {
        self.activity_events.subscribe()
    }

    /// Steps recorded so far.
    pub fn steps(&self) -> usize {
        self.steps.load(Ordering::SeqCst)
    }

    /// Records how many steps the thread has.
    pub fn set_steps(&self, steps: usize) {
        self.steps.store(steps, Ordering::SeqCst);
    }

    /// Has a pause been asked for?
    pub fn pause_requested(&self) -> bool {
        self.pause.load(Ordering::SeqCst)
    }

    /// Asks the thread to stop after its current step is persisted, recording nothing: its
    /// worker gives it to another.
    pub fn request_hand_back(&self) {
        self.hand_back.store(true, Ordering::SeqCst);
    }

    /// Has a hand-back been asked for?
    pub fn hand_back_requested(&self) -> bool {
        self.hand_back.load(Ordering::SeqCst)
    }
}
