//! A worker's agent calls that outlive the instance that made them: a batch of fresh calls
//! runs on a task of its own, so that a thread waiting on it can give its instance up (see
//! [`crate::run::runner`]) and be rebuilt from its journal; the rebuilt instance asks the same
//! calls again and takes the answers of the batch instead of asking anyone twice.

use std::collections::VecDeque;
use std::future::Future;
use std::time::Duration;

use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::agents::{AgentAnswer, AgentContext, AgentFailure, Bound, CallTurns};
use crate::ids::ThreadId;

/// A call to make now (the journal has no answer for it), with what it needs.
pub(super) struct Fresh {
    pub index: usize,
    pub seq: usize,
    pub bound: Bound,
    pub digest: String,
    pub context: AgentContext,
    /// For an `openai` binding: where its turns are journaled, and the thread's say between
    /// them.
    pub turns: Option<CallTurns>,
}

/// What a fresh call came to: its answer, how long it took, and the child thread it waits on
/// (a step that runs a child workflow still running).
pub(super) struct Done {
    pub fresh: Fresh,
    pub answer: Result<AgentAnswer, AgentFailure>,
    pub elapsed: Duration,
    pub child: Option<ThreadId>,
}

/// A thread's batch of calls out, if one is (at most one: a bundle waits on a batch before it
/// asks again).
#[derive(Debug)]
pub struct CallsOut {
    batch: Option<Batch>,
    /// Since when a batch has been out (`None`: none is), for [`OutSince::overdue`].
    since: watch::Sender<Option<Instant>>,
}

struct Batch {
    step: usize,
    /// The calls (journal seq and digest) whose answers no instance took yet.
    left: Vec<(usize, String)>,
    /// Where the task sends the answers of the calls that did not answer at once.
    answers: Option<mpsc::UnboundedReceiver<Done>>,
    /// Answers no instance took yet: those that came at once, and those that came while the
    /// thread held no instance.
    kept: VecDeque<Done>,
    /// The calls that did not answer at once (none, if all did).
    task: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch").field("step", &self.step).field("left", &self.left).finish()
    }
}

/// A batch dropped unanswered (the thread was killed, or stopped) stops its calls, and with
/// them the process group of each command agent.
impl Drop for Batch {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

impl Default for CallsOut {
    fn default() -> Self {
        CallsOut { batch: None, since: watch::channel(None).0 }
    }
}

impl CallsOut {
    /// Whether the batch out is `step`'s calls `keys` (seq, digest), as a rebuilt instance
    /// asks them again. Anything else is not the batch: it is dropped when another is sent.
    pub(super) fn holds(&self, step: usize, keys: &[(usize, &str)]) -> bool {
        let Some(batch) = &self.batch else { return false };
        batch.step == step
            && batch.left.len() == keys.len()
            && keys
                .iter()
                .all(|(seq, digest)| batch.left.iter().any(|(s, d)| s == seq && d == digest))
    }

    /// Sends `calls` out: those that answer at once (a scripted agent, an answer the journal
    /// of turns holds) are taken here, and the others go on on a task of their own, each answer
    /// kept until an instance takes it. A task for a call that is already answered would cost
    /// more than the call: its spawn and wake-ups on another of the runtime's threads.
    pub(super) fn send<F>(&mut self, step: usize, keys: Vec<(usize, String)>, calls: Vec<F>)
    where
        F: Future<Output = Done> + Send + 'static,
    {
        let mut running: FuturesUnordered<F> = calls.into_iter().collect();
        let mut kept = VecDeque::new();
        while let Some(Some(done)) = running.next().now_or_never() {
            kept.push_back(done);
        }
        let (answers, task) = match running.is_empty() {
            true => (None, None),
            false => {
                let (sender, answers) = mpsc::unbounded_channel();
                self.since.send_replace(Some(Instant::now()));
                let task = tokio::spawn(async move {
                    while let Some(done) = running.next().await {
                        if sender.send(done).is_err() {
                            return;
                        }
                    }
                });
                (Some(answers), Some(task))
            }
        };
        self.batch = Some(Batch { step, left: keys, answers, kept, task });
    }

    /// Whether calls of the batch out are still making their way (on their task): the
    /// thread is about to wait on them.
    pub(super) fn waiting(&self) -> bool {
        self.batch.as_ref().is_some_and(|b| b.answers.is_some())
    }

    /// The batch's next answer for an instance to take, `None` once every one was taken.
    pub(super) async fn next(&mut self) -> Option<Done> {
        let batch = self.batch.as_mut()?;
        let done = match (batch.kept.pop_front(), &mut batch.answers) {
            (Some(done), _) => Some(done),
            (None, Some(answers)) => answers.recv().await,
            (None, None) => None,
        };
        let Some(done) = done else {
            // The task ended with calls unanswered: it panicked.
            self.stop();
            return None;
        };
        let batch = self.batch.as_mut().expect("a batch is out");
        batch.left.retain(|(seq, _)| *seq != done.fresh.seq);
        if batch.left.is_empty() {
            self.stop();
        }
        Some(done)
    }

    /// Waits until every call of the batch out has answered (at once if none is out): the
    /// answers are kept for the instance rebuilt to take them.
    pub async fn answered(&mut self) {
        let Some(batch) = self.batch.as_mut() else { return };
        while let Some(answers) = batch.answers.as_mut()
            && batch.kept.len() < batch.left.len()
        {
            match answers.recv().await {
                Some(done) => batch.kept.push_back(done),
                None => break,
            }
        }
        // Nothing is out any more: the instance rebuilt to take the answers is not overdue.
        self.since.send_replace(None);
    }

    /// Drops the batch out, if any, stopping the calls still running.
    pub(super) fn stop(&mut self) {
        self.batch = None;
        self.since.send_replace(None);
    }

    /// Where the runner sees how long the thread has waited on its calls out.
    pub fn since(&self) -> OutSince {
        OutSince(self.since.subscribe())
    }
}

/// How long a thread has had calls out, seen from outside its instance.
pub struct OutSince(watch::Receiver<Option<Instant>>);

impl OutSince {
    /// Resolves once a batch has been out for `after` (never while none is).
    pub async fn overdue(&mut self, after: Duration) {
        loop {
            let since = *self.0.borrow_and_update();
            let changed = self.0.changed();
            match since {
                Some(since) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(since + after) => return,
                        changed = changed => if changed.is_err() { std::future::pending::<()>().await },
                    }
                }
                None => {
                    if changed.await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
            }
        }
    }
}
