//! Child workflows: a DAG step with `workflow:` runs another registered workflow as a thread of
//! its own. The child is started once per call of the step (keyed like an API request with an
//! `Idempotency-Key`, so a crash on either side starts no second one); the parent waits with
//! no worker busy, its call recorded as waiting on the child; and whoever sees the child end —
//! the worker that ran it, the parent's worker, `resume` — journals the child's result as the
//! call's answer and hands the parent back to a worker.
//!
//! Both sides check after they write (the child its end, the parent its wait), so whichever
//! writes second delivers; the journal takes one answer per call, and a thread already handed
//! over is not handed twice.

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::Value;

use crate::agents::{AgentAnswer, AgentFailure};
use crate::error::{Error, Result};
use crate::faults::crash_point;
use crate::ids::ThreadId;
use crate::run::actions::{self, Hand, Once, OnceKey};
use crate::run::lifecycle::{Origin, StartRequest};
use crate::run_request::RunRequest;
use crate::sandbox::children::{ChildCall, ChildState, Children, MAX_DEPTH};
use crate::store::Storage;
use crate::store::records::{ParentLink, ThreadStatus};

/// The scope of the keys child threads are started under.
const KEY_SCOPE: &str = "child";

/// Child workflows on one store.
#[derive(Debug, Clone)]
pub struct StoreChildren {
    store: Storage,
}

impl StoreChildren {
    pub fn shared(store: &Storage) -> std::sync::Arc<dyn Children> {
        std::sync::Arc::new(StoreChildren { store: store.clone() })
    }
}

impl Children for StoreChildren {
    fn call(&self, call: ChildCall) -> BoxFuture<'_, ChildState> {
        async move {
            let workflow = call.workflow.clone();
            let request = call.request.clone();
            let id = match start(&self.store, call).await {
                Ok(id) => id,
                // The child exists, at rest, and could not be handed to a worker: the parent
                // waits on it, as on a child whose worker died later (`resume` of the parent
                // resumes it).
                Err(Error::WorkerLost { thread, cause, .. })
                    if let Ok(thread) = thread.parse::<ThreadId>() =>
                {
                    tracing::warn!("child thread {thread} was not handed over: {cause}");
                    return ChildState::Running(thread);
                }
                Err(e) => return ChildState::Ended(Err(failed(&workflow, &e))),
            };
            crash_point("child-started");
            match self.store.threads().read(id) {
                Ok(record) if record.end.is_some() => ChildState::Ended(
                    actions::child_result(&record)
                        .map(|content| AgentAnswer { content, meta: None, usage: None })
                        .map_err(AgentFailure::failed),
                ),
                // Left at rest by a crash (its worker's, or this one's before it was handed
                // over): it goes on now, so that its parent does not wait on nothing.
                Ok(record) if record.status() == ThreadStatus::Interrupted => {
                    match actions::resume(&self.store, id, &request, Hand::Detach).await {
                        Ok(_) => ChildState::Running(id),
                        // Resumed meanwhile by someone else, or left at rest again by a
                        // worker that died: the parent waits on it.
                        Err(e) if e.is_busy() || matches!(e, Error::WorkerLost { .. }) => {
                            ChildState::Running(id)
                        }
                        Err(e) => ChildState::Ended(Err(failed(&workflow, &e))),
                    }
                }
                Ok(_) => ChildState::Running(id),
                Err(e) => ChildState::Ended(Err(failed(&workflow, &e))),
            }
        }
        .boxed()
    }

    fn rested(&self, id: ThreadId) -> BoxFuture<'_, ()> {
        async move {
            if let Err(e) = rested(&self.store, id).await {
                tracing::warn!("thread {id}: passing a child's result on: {e}");
            }
        }
        .boxed()
    }
}

/// A step's failure to start its child, as the call's failure.
fn failed(workflow: &str, e: &Error) -> AgentFailure {
    let transient = e.is_database_unavailable() || matches!(e, Error::Io { .. });
    AgentFailure::Failed {
        message: format!("child workflow `{workflow}`: {}", crate::error::chain_line(e)),
        transient,
    }
}

/// Starts the child thread `call` runs, unless it was started already; its id.
async fn start(store: &Storage, call: ChildCall) -> Result<ThreadId> {
    let depth = call.depth + 1;
    if depth > MAX_DEPTH {
        return Err(Error::Usage(format!(
            "child workflows nest deeper than {MAX_DEPTH} (does a workflow run itself?)"
        )));
    }
    // The step's resolved inputs are the child's trigger data.
    let input: Value =
        call.input.as_deref().and_then(|i| serde_json::from_str(i).ok()).unwrap_or_default();
    let trigger_data = match input.get("inputs") {
        Some(inputs) => inputs.clone(),
        None => Value::Object(Default::default()),
    };
    // A description with references is resolved for the call: the input's `instructions`.
    let prompt = match input.get("instructions").and_then(Value::as_str) {
        Some(instructions) => instructions.to_string(),
        None => call.prompt.clone(),
    };
    let start = StartRequest {
        name: call.workflow.clone(),
        prompt,
        trigger_data: Some(trigger_data),
        request: call.request.clone(),
        origin: Origin {
            parent: Some(ParentLink { thread_id: call.parent, role: call.role.clone(), depth }),
            ..Origin::default()
        },
    };
    let key = OnceKey {
        scope: KEY_SCOPE.into(),
        key: format!("{}/{}/{}", call.parent, call.step, call.seq),
        fingerprint: call.digest.clone(),
    };
    match actions::start_once(store, start, Some(key)).await? {
        Once::Started(id) | Once::Replayed(id) => Ok(id),
    }
}

/// After thread `id` came to rest: if it is a child that ended, its parent gets its result; if
/// it waits on a child that ended meanwhile, it gets it itself.
pub async fn rested(store: &Storage, id: ThreadId) -> Result<()> {
    let record = store.threads().read(id)?;
    if record.end.is_some()
        && let Some(parent) = &record.start.parent
    {
        actions::deliver(store, parent.thread_id, &RunRequest::default(), Hand::Detach).await?;
    }
    if record.waited_child().is_some() {
        actions::deliver(store, id, &RunRequest::default(), Hand::Detach).await?;
    }
    Ok(())
}
