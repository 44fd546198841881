//! A task's stream (`SendStreamingMessage`, `SubscribeToTask`): the task as it is, then a
//! status update for each step stored and each piece of its model's live text, until the
//! thread comes to rest — its result and final state when it ended, its question when it
//! waits on a person (A2A ends a stream there: the answer is the next message). Read from the
//! feed the API's event streams share ([`crate::serve::feeds`]): one reader per thread,
//! however many follow it.

use std::sync::Arc;

use a2a::{
    A2AError, StreamResponse, TaskArtifactUpdateEvent, TaskState, TaskStatus, TaskStatusUpdateEvent,
};
use futures::stream::BoxStream;
use serde_json::{Value, json};
use tokio::sync::broadcast::error::{RecvError, TryRecvError};

use super::a2a_error;
use super::tasks::{self, agent_message};
use crate::ids::ThreadId;
use crate::run::waits::Expected;
use crate::serve::app::App;
use crate::serve::feeds::{Following, LiveFrame, Log};
use crate::store::Storage;

/// What a stream holds between items.
struct Follow {
    store: Storage,
    id: ThreadId,
    before: Option<Expected>,
    following: Following,
    /// The next event of the log to look at.
    next: usize,
    /// The steps the thread had when the stream began: those after them are told.
    told_from: usize,
    /// Items ready to go, in order.
    queued: std::collections::VecDeque<StreamResponse>,
    /// Set once the final items are queued: the stream ends when they are sent.
    done: bool,
    stopping: tokio::sync::watch::Receiver<bool>,
}

/// The stream of thread `id`, which a message took up (`before`: the wait it answered) when it
/// had `told_from` steps: the steps after those are told.
pub fn of(
    app: &Arc<App>,
    id: ThreadId,
    before: Option<Expected>,
    told_from: usize,
) -> Result<BoxStream<'static, Result<StreamResponse, A2AError>>, A2AError> {
    let store = app.store.clone();
    let following = app.feeds.follow(&store, id, app.stopping.subscribe()).map_err(a2a_error)?;
    // The log is read from its start: steps at or before `told_from` are skipped by their
    // index, and a rest it tells is checked against the thread as it is now.
    let next = 0;
    let record = store.threads().read(id).map_err(a2a_error)?;
    let follow = Follow {
        store,
        id,
        before,
        following,
        next,
        told_from,
        queued: [StreamResponse::Task(tasks::task(&record))].into(),
        done: false,
        stopping: app.stopping.subscribe(),
    };
    // A thread already at rest says so through its log's rest event, after its steps.
    Ok(Box::pin(futures::stream::unfold(follow, |mut follow| async move {
        loop {
            if let Some(item) = follow.queued.pop_front() {
                return Some((Ok(item), follow));
            }
            if follow.done || *follow.stopping.borrow() {
                return None;
            }
            match follow.hear().await {
                Ok(()) => {}
                Err(e) => {
                    follow.done = true;
                    return Some((Err(e), follow));
                }
            }
        }
    })))
}

impl Follow {
    /// Waits for the next thing to tell, and queues it.
    async fn hear(&mut self) -> Result<(), A2AError> {
        match self.following.live.try_recv() {
            Ok(frame) => return self.live(&frame),
            Err(TryRecvError::Empty | TryRecvError::Lagged(_) | TryRecvError::Closed) => {}
        }
        let log: Arc<Log> = self.following.log.borrow_and_update().clone();
        if self.next < log.events.len() {
            let told = log.events[self.next].clone();
            self.next += 1;
            let Some(event) = data_of(&told.frame) else { return Ok(()) };
            return match event["type"].as_str() {
                Some("step")
                    if event["index"].as_u64().is_some_and(|i| i as usize <= self.told_from) =>
                {
                    Ok(())
                }
                Some("step") => {
                    let role = event["step"]["role"].as_str().unwrap_or("?");
                    let content = event["step"]["content"].as_str().unwrap_or_default();
                    let meta = json!({"step": event["index"], "role": role});
                    self.update(TaskState::Working, Some(format!("{role}: {content}")), meta);
                    Ok(())
                }
                Some("waiting" | "paused" | "ended") => self.rest_if_done(),
                _ => Ok(()),
            };
        }
        if log.closed {
            // The thread said all it will: what it is now is the end of the stream.
            self.rest_if_done()?;
            if !self.done {
                self.done = true;
            }
            return Ok(());
        }
        tokio::select! {
            changed = self.following.log.changed() => {
                if changed.is_err() {
                    self.done = true;
                }
            }
            heard = self.following.live.recv() => match heard {
                Ok(frame) => return self.live(&frame),
                Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => {
                    // The feed ends with its last follower: read the thread as it is.
                    self.rest_if_done()?;
                    self.done = true;
                }
            },
            _ = self.stopping.changed() => self.done = true,
            // A feed that hears nothing for a while: the record says whether it came to rest.
            _ = tokio::time::sleep(std::time::Duration::from_secs(2)) => self.rest_if_done()?,
        }
        Ok(())
    }

    /// A piece of live text, told as a working update.
    fn live(&mut self, frame: &LiveFrame) -> Result<(), A2AError> {
        let Ok(event) = serde_json::from_str::<Value>(&frame.json) else { return Ok(()) };
        let text = event["text"].as_str().unwrap_or_default().to_string();
        let meta = json!({"live": true, "role": event["role"], "turn": event["turn"]});
        self.update(TaskState::Working, Some(text), meta);
        Ok(())
    }

    /// If the thread is at rest past the wait the message answered, queues its result and
    /// final state, and ends the stream.
    fn rest_if_done(&mut self) -> Result<(), A2AError> {
        let record = self.store.threads().read(self.id).map_err(a2a_error)?;
        let (state, said) = tasks::state(&record);
        let resting = matches!(
            state,
            TaskState::Completed
                | TaskState::Failed
                | TaskState::Canceled
                | TaskState::InputRequired
                | TaskState::AuthRequired
        );
        let past = match (&self.before, crate::run::waits::of(&record)) {
            (Some(b), Some(wait)) => wait.key != b.key || wait.digest != b.digest,
            _ => true,
        };
        if !resting || !past || self.done {
            return Ok(());
        }
        if let Some(artifact) = tasks::result(&record) {
            self.queued.push_back(StreamResponse::ArtifactUpdate(TaskArtifactUpdateEvent {
                task_id: self.id.to_string(),
                context_id: self.id.to_string(),
                artifact,
                append: None,
                last_chunk: Some(true),
                metadata: None,
            }));
        }
        self.update(state, said, json!({"final": true}));
        self.done = true;
        Ok(())
    }

    fn update(&mut self, state: TaskState, said: Option<String>, meta: Value) {
        let metadata = meta.as_object().map(|m| m.clone().into_iter().collect());
        self.queued.push_back(StreamResponse::StatusUpdate(TaskStatusUpdateEvent {
            task_id: self.id.to_string(),
            context_id: self.id.to_string(),
            status: TaskStatus {
                state,
                message: said.map(|text| agent_message(self.id, text)),
                timestamp: Some(chrono::Utc::now()),
            },
            metadata,
        }));
    }
}

/// The JSON of a feed frame's `data:` line.
fn data_of(frame: &[u8]) -> Option<Value> {
    let text = std::str::from_utf8(frame).ok()?;
    let data = text.lines().find_map(|l| l.strip_prefix("data: "))?;
    serde_json::from_str(data).ok()
}
