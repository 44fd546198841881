//! `/api/v1/threads`: start a thread (once per `Idempotency-Key`), list them a page at a time,
//! read one, follow its events (server-sent, resumable with `Last-Event-ID`), and act on it.

use std::convert::Infallible;

use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::types::{
    ActionBody, ActionDone, ErrorBody, ListQuery, StartThread, Started, ThreadItem, ThreadList,
};
use super::{ApiError, ApiPath, ApiQuery, Caller, JsonBody, Shared};
use crate::error::Error;
use crate::ids::ThreadId;
use crate::run::actions::{self, Hand, Once, OnceKey};
use crate::run::answer::Answer;
use crate::run::catalog::Catalog;
use crate::run::control;
use crate::run::lifecycle::ForkAt;
use crate::run::query::{self, ThreadQuery};
use crate::run_request::RunRequest;
use crate::serve::views;
use crate::store::pauses::DecidedBy;
use crate::store::records::{StartedBy, ThreadStatus};
use crate::store::request_keys::MAX_KEY_LEN;

/// The header that makes a retried start return the thread the first one started.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The most threads a page holds, and how many unless asked.
const MAX_PAGE: usize = 1000;
const DEFAULT_PAGE: usize = 100;

/// Starts a thread of a registered workflow, detached: the answer comes once the thread is
/// recorded and handed to a worker, not when it ends.
#[utoipa::path(post, path = "/api/v1/threads", request_body = StartThread,
    params(("Idempotency-Key" = Option<String>, Header,
        description = "A retry with the same key returns the same thread (200), not a second one")),
    responses(
        (status = 201, description = "Started", body = Started),
        (status = 200, description = "Started before, by a request with this key", body = Started),
        (status = 400, description = "Bad request (a body that is not JSON, say)", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "A read-only token", body = ErrorBody),
        (status = 404, description = "No such workflow", body = ErrorBody),
        (status = 413, description = "Body over the limit", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 422, description = "The wrong shape, or a key used for another request",
            body = ErrorBody)))]
pub async fn start(
    State(app): Shared,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<StartThread>,
) -> Result<Response, ApiError> {
    let key = match headers.get(IDEMPOTENCY_KEY) {
        None => None,
        Some(value) => {
            let key = value
                .to_str()
                .ok()
                .filter(|k| !k.is_empty() && k.len() <= MAX_KEY_LEN)
                .ok_or_else(|| {
                    Error::Usage(format!(
                        "the Idempotency-Key must be 1 to {MAX_KEY_LEN} visible ASCII characters"
                    ))
                })?;
            Some(OnceKey {
                scope: caller.name.clone(),
                key: key.to_string(),
                fingerprint: fingerprint(&body),
            })
        }
    };
    let mut start = body.start_request(Catalog::new(&app.store).name_of(&body.workflow)?);
    start.origin.started_by = Some(StartedBy::new("api", &caller.name, None));
    let (status, id) = match actions::start_once(&app.store, start, key).await? {
        Once::Started(id) => (StatusCode::CREATED, id),
        Once::Replayed(id) => (StatusCode::OK, id),
    };
    Ok((status, axum::Json(Started { id: id.to_string() })).into_response())
}

/// What a start request asked, as a digest: a key sent again with another request is refused.
fn fingerprint(body: &StartThread) -> String {
    let asked = serde_json::to_vec(body).expect("a request serializes");
    crate::store::bundles::sha256_hex(&asked)
}

/// Threads, newest first, a page at a time.
#[utoipa::path(get, path = "/api/v1/threads", params(ListQuery),
    responses((status = 200, description = "A page of threads", body = ThreadList),
        (status = 400, description = "A filter that does not parse", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody)))]
pub async fn list(
    State(app): Shared,
    ApiQuery(asked): ApiQuery<ListQuery>,
) -> Result<axum::Json<ThreadList>, ApiError> {
    let bad = |what: String| ApiError::from(Error::Usage(what));
    let statuses = match asked.status.as_deref().filter(|s| !s.is_empty()) {
        None => vec![],
        Some(name) => vec![ThreadStatus::named(name).ok_or_else(|| {
            bad(format!("status `{}`: not a thread status", crate::terminal::line(name)))
        })?],
    };
    let started_after = super::started_after(asked.since.as_deref())?;
    let before = match asked.cursor.as_deref().filter(|c| !c.is_empty()) {
        None => None,
        Some(cursor) => Some(cursor.parse::<ThreadId>().map_err(|_| bad("not a cursor".into()))?),
    };
    let limit = asked.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(bad(format!("limit {limit}: from 1 to {MAX_PAGE}")));
    }
    let query = ThreadQuery {
        workflow: asked.workflow.filter(|w| !w.is_empty()),
        statuses,
        started_after,
        before,
        limit: Some(limit),
        experiment: None,
    };
    let page = query::threads(&app.store, &query)?;
    let mut limit_waits = query::limit_waits(&app.store, &page.threads).await?;
    Ok(axum::Json(ThreadList {
        threads: page
            .threads
            .into_iter()
            .map(|t| {
                let waiting_for = limit_waits.remove(&t.thread_id);
                ThreadItem { waiting_for, ..ThreadItem::from(t) }
            })
            .collect(),
        next_cursor: page.next.map(|id| id.to_string()),
    }))
}

/// One thread: its start, status, steps (each with its agent and duration), routing, the
/// agent at work, its end, and the tail of its debug log.
#[utoipa::path(get, path = "/api/v1/threads/{id}",
    params(("id" = String, Path, description = "A thread id, or a unique prefix of one")),
    responses((status = 200, description = "The thread", body = Object),
        (status = 400, description = "A malformed id", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 404, description = "No such thread", body = ErrorBody)))]
pub async fn one(State(app): Shared, ApiPath(id): ApiPath<String>) -> Result<Response, ApiError> {
    let id = app.store.threads().resolve(&id)?;
    Ok(axum::Json(views::thread(&app.store, id).await?).into_response())
}

/// What happens to a thread, as server-sent events: `step` (id: the step's index), then
/// `waiting`, `paused` or `ended` as it comes to rest; the stream ends with `ended`. A client
/// that reconnects with `Last-Event-ID` (or `?after=N`) hears the steps after it.
#[utoipa::path(get, path = "/api/v1/threads/{id}/events",
    params(("id" = String, Path, description = "A thread id, or a unique prefix of one"),
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this step"),
        ("after" = Option<usize>, Query, description = "Start after this step")),
    responses((status = 200, description = "A stream of events (text/event-stream); each \
            `data` is a JSON event whose `type` names it, as `run --json` prints them",
            content_type = "text/event-stream", body = String),
        (status = 400, description = "A malformed id, or `after` not a step number",
            body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 404, description = "No such thread", body = ErrorBody)))]
pub async fn events(
    State(app): Shared,
    ApiPath(id): ApiPath<String>,
    ApiQuery(after): ApiQuery<AfterQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let id = app.store.threads().resolve(&id)?;
    let resumed = headers
        .get("last-event-id")
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.trim().parse::<usize>().ok());
    let after = resumed.or(after.after).unwrap_or(0);
    // The thread is read once for all its followers (see `serve::feeds`); this stream keeps only its
    // place in the shared log. Reading it first makes a thread that does not read a 4xx/5xx,
    // not a stream that ends at once.
    let crate::serve::feeds::Following { log, live } =
        app.feeds.follow(&app.store, id, app.stopping.subscribe())?;
    let state =
        Follow { log, live: Some(live), stopping: app.stopping.subscribe(), next: None, after };
    let frames = futures::stream::unfold(state, |mut state| async move {
        let mut keep_alive =
            tokio::time::interval_at(tokio::time::Instant::now() + KEEP_ALIVE, KEEP_ALIVE);
        loop {
            // Live text already heard was written before anything new in the log: it goes
            // first (the log and the text come on two channels, and both may be ready).
            if let Some(live) = &mut state.live {
                match live.try_recv() {
                    Ok(live) => return Some((Ok(live.frame.clone()), state)),
                    Err(tokio::sync::broadcast::error::TryRecvError::Closed) => state.live = None,
                    Err(_) => {}
                }
            }
            let snapshot = state.log.borrow_and_update().clone();
            // Where this client starts: after its step `after` (from the first event if 0).
            let next = *state.next.get_or_insert_with(|| snapshot.start_of(state.after));
            if let Some(told) = snapshot.events.get(next) {
                state.next = Some(next + 1);
                // The log's own bytes: a thousand followers share one copy of a large step.
                return Some((Ok::<_, Infallible>(told.frame.clone()), state));
            }
            if snapshot.closed || *state.stopping.borrow() {
                return None;
            }
            tokio::select! {
                changed = state.log.changed() => changed.ok()?,
                // Live text: sent as it comes, kept by nobody.
                text = next_live(&mut state.live) => match text {
                    Ok(live) => return Some((Ok(live.frame.clone()), state)),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => state.live = None,
                },
                _ = state.stopping.changed() => return None,
                _ = keep_alive.tick() => {
                    return Some((Ok(axum::body::Bytes::from_static(b":\n\n")), state));
                }
            }
        }
    });
    Ok((
        [
            (axum::http::header::CONTENT_TYPE, "text/event-stream"),
            (axum::http::header::CACHE_CONTROL, "no-cache"),
        ],
        axum::body::Body::from_stream(frames),
    )
        .into_response())
}

/// How long a stream stays silent before a comment tells the client (and any proxy between)
/// that it is still there.
const KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(15);

type LiveReceiver =
    tokio::sync::broadcast::Receiver<std::sync::Arc<crate::serve::feeds::LiveFrame>>;

/// The next piece of live text; never, once there is none to follow.
pub async fn next_live(
    live: &mut Option<LiveReceiver>,
) -> Result<std::sync::Arc<crate::serve::feeds::LiveFrame>, tokio::sync::broadcast::error::RecvError>
{
    match live {
        Some(live) => live.recv().await,
        None => std::future::pending().await,
    }
}

/// A client's place in a thread's shared log.
struct Follow {
    log: tokio::sync::watch::Receiver<std::sync::Arc<crate::serve::feeds::Log>>,
    /// The thread's live text, as its feed hears it (none once the feed is gone).
    live: Option<LiveReceiver>,
    stopping: tokio::sync::watch::Receiver<bool>,
    /// The next event of the log to send (found on the first look).
    next: Option<usize>,
    /// The step the client had heard (`Last-Event-ID`).
    after: usize,
}

/// `?after=N`.
#[derive(Debug, serde::Deserialize)]
pub struct AfterQuery {
    after: Option<usize>,
}

/// `kill`, `pause`, `resume`, `answer` (`{"text": …}`) or `fork` (`{"at": N}`): what the CLI
/// command of the same name does, detached.
#[utoipa::path(post, path = "/api/v1/threads/{id}/{action}", request_body = Option<ActionBody>,
    params(("id" = String, Path, description = "A thread id, or a unique prefix of one"),
        ("action" = String, Path, description = "kill, pause, resume, answer or fork")),
    responses((status = 200, description = "Done: the thread (for fork, the new one)",
            body = ActionDone),
        (status = 400, description = "A malformed id, or what the action needs is missing",
            body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "A read-only token", body = ErrorBody),
        (status = 404, description = "No such thread, or no such action", body = ErrorBody),
        (status = 409, description = "Not in a state for it (kill an ended thread, say)",
            body = ErrorBody),
        (status = 422, description = "An answer of the wrong shape", body = ErrorBody)))]
pub async fn act(
    State(app): Shared,
    Extension(caller): Extension<Caller>,
    ApiPath((id, action)): ApiPath<(String, String)>,
    body: Option<JsonBody<ActionBody>>,
) -> Result<axum::Json<ActionDone>, ApiError> {
    let by = DecidedBy::new(&caller.name, "api");
    let store = &app.store;
    let id = store.threads().resolve(&id)?;
    let body = body.map(|b| b.0).unwrap_or_default();
    let done = |thread: ThreadId| Ok(axum::Json(ActionDone { thread: thread.to_string() }));
    match action.as_str() {
        "kill" => control::kill(store, id).await?,
        "pause" => control::pause(store, id).await?,
        "resume" => {
            if let Some(raise) = body.raise_budget {
                actions::raise_budget(store, id, &raise.into(), &by)?;
            }
            actions::resume(store, id, &RunRequest::default(), Hand::Detach).await?;
        }
        "answer" => {
            let answer = match (body.text, body.decision) {
                (text, Some(decision)) => {
                    Answer::Decision(decision.with(text).map_err(Error::Usage)?)
                }
                (Some(text), None) => Answer::Text(text),
                (None, None) => {
                    return Err(Error::Usage(
                        "the answer's `text` (or, for a tool call, its `decision`) is missing"
                            .into(),
                    )
                    .into());
                }
            };
            actions::answer(store, id, answer, &by, Hand::Detach).await?;
        }
        "fork" => {
            let at = body.at.map_or(ForkAt::All, ForkAt::Steps);
            let forked =
                actions::fork(store, id, &at, &RunRequest::default(), Hand::Detach).await?;
            return done(forked.handed.id);
        }
        other => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!(
                    "no action `{}` on a thread (kill, pause, resume, answer, fork)",
                    crate::terminal::line(other)
                ),
            ));
        }
    }
    done(id)
}
