//! What a running thread shares with whoever controls or watches it (its worker, `ps`,
//! followers): a pause request, the role at work, the steps recorded, and where its `human`
//! agents' questions go.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use tokio::sync::broadcast;

use crate::agents::human::HumanPort;
use crate::store::queue::{LivePublisher, LiveText};
use crate::store::records::StepRecord;

/// Shared between a running thread and whoever controls it (the worker, `ps`, followers).
#[derive(Debug)]
pub struct ThreadControl {
    pause: AtomicBool,
    /// Stop after the current step without a word in the thread: its worker hands it back to
    /// the queue (it is stopping), and another worker continues it.
    hand_back: AtomicBool,
    /// What the thread does now, and since when (for `ps`)…
    activity: Mutex<Option<(Activity, u64)>>,
    /// …and the provider limits its requests wait for their turn in (a name for each request
    /// waiting: the calls of a step may wait at once).
    limits: Mutex<Vec<String>>,
    /// …and, in the order they happen, each change of it and each step stored (for
    /// followers: a role is seen at work before its step lands). Made when the first follower
    /// comes: its buffer holds [`FOLLOWER_LAG`] events, a few hundred KiB that a worker's
    /// thousands of unwatched waiting threads would otherwise each keep.
    progress: OnceLock<broadcast::Sender<Progress>>,
    steps: AtomicUsize,
    /// Where `human` agents put their questions.
    pub human: HumanPort,
    /// Where a model's live text goes for followers in other processes, when the store
    /// carries it (a database's worker).
    live: OnceLock<LiveSink>,
    /// A budget the thread shares with others (an eval's), beside its own.
    shared_budget: Option<Arc<super::shared_budget::SharedBudget>>,
}

/// A thread's live-text publisher (see [`ThreadControl::set_live`]).
struct LiveSink(LivePublisher);

impl std::fmt::Debug for LiveSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LiveSink")
    }
}

/// What a follower of a running thread hears, in order.
#[derive(Debug, Clone)]
pub enum Progress {
    /// Roles began work.
    Working(Activity),
    /// A step was stored; `index` is its position in the thread, from 1.
    Step { index: usize, step: StepRecord },
    /// Text a model is writing, as it comes (not kept: the turn's whole message is journaled
    /// when it ends).
    Delta(Arc<LiveText>),
}

/// How many events a follower may fall behind by before it misses some.
const FOLLOWER_LAG: usize = 1024;

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
            limits: Mutex::new(Vec::new()),
            progress: OnceLock::new(),
            steps: AtomicUsize::new(0),
            human: HumanPort::default(),
            live: OnceLock::new(),
            shared_budget: None,
        }
    }
}

impl ThreadControl {
    /// The control of a thread that also draws from `budget`, shared with other threads.
    pub fn sharing(budget: Arc<super::shared_budget::SharedBudget>) -> Self {
        ThreadControl { shared_budget: Some(budget), ..Default::default() }
    }

    /// The budget the thread shares with others, if it shares one.
    pub fn shared_budget(&self) -> Option<&super::shared_budget::SharedBudget> {
        self.shared_budget.as_deref()
    }

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

    /// The provider limit a request of the thread waits for, if one does.
    pub fn waiting_for(&self) -> Option<String> {
        self.limits.lock().first().cloned()
    }

    /// A request of the thread waits for its turn in provider limit `limit`…
    pub fn waits_for(&self, limit: &str) {
        self.limits.lock().push(limit.to_string());
    }

    /// …and no longer does.
    pub fn waited_for(&self, limit: &str) {
        let mut limits = self.limits.lock();
        if let Some(at) = limits.iter().position(|l| l == limit) {
            limits.remove(at);
        }
    }

    /// Records what the thread is doing.
    pub fn set_activity(&self, activity: Option<Activity>) {
        if let Some(activity) = &activity {
            self.publish(|| Progress::Working(activity.clone()));
        }
        *self.activity.lock() = activity.map(|a| (a, crate::clock::now_ms()));
    }

    /// Follows what the thread does from now on: roles at work and steps stored, in order.
    pub fn watch(&self) -> broadcast::Receiver<Progress> {
        self.progress.get_or_init(|| broadcast::channel(FOLLOWER_LAG).0).subscribe()
    }

    /// Tells followers that step `index` was stored (nothing, if nobody follows).
    pub fn publish_step(&self, index: usize, step: &StepRecord) {
        self.publish(|| Progress::Step { index, step: step.clone() });
    }

    /// Tells followers what a model wrote: those of this process (nothing, if nobody
    /// follows), and those elsewhere through the store, if it carries it.
    pub fn publish_delta(&self, text: LiveText) {
        if let Some(LiveSink(live)) = self.live.get() {
            live(text.clone());
        }
        self.publish(|| Progress::Delta(Arc::new(text)));
    }

    /// Sends the thread's live text to `publisher` too (once: a thread has one store).
    pub fn set_live(&self, publisher: LivePublisher) {
        let _ = self.live.set(LiveSink(publisher));
    }

    /// Sends what `event` makes to the followers, if there are any.
    fn publish(&self, event: impl FnOnce() -> Progress) {
        if let Some(progress) = self.progress.get().filter(|p| p.receiver_count() > 0) {
            let _ = progress.send(event());
        }
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
