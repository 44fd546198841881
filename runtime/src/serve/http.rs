//! The web view's HTTP side: routes, the guards every request passes, and the actions, each
//! calling the same library code as the CLI command of the same name.
//!
//! Guards: a request to a loopback listener must name it in `Host` (a page on another site
//! cannot reach it by rebinding a domain to 127.0.0.1); with a token, every request carries it
//! (a cookie set by visiting `/?token=…`, or `Authorization: Bearer`); every POST carries the
//! page's CSRF token in a header and, if the browser says where it comes from, comes from this
//! origin — a form or script on another site can do neither. Responses forbid framing and
//! inline script (a Content-Security-Policy), so text that slipped into markup could not run.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{assets, views};
use crate::agents::AgentFlags;
use crate::error::{Error, exit};
use crate::ids::ThreadId;
use crate::run::actions::{self, Hand};
use crate::run::{control, lifecycle};
use crate::store::Storage;

/// The cookie holding the access token, named per port (`uncaged_workflow_token_8420`):
/// cookies are not kept apart by port, and two servers on one host must not read each
/// other's.
pub fn token_cookie(port: u16) -> String {
    format!("uncaged_workflow_token_{port}")
}
/// The header a POST carries the CSRF token in.
pub const CSRF_HEADER: &str = "x-uncaged-csrf";

/// What every handler shares.
#[derive(Debug)]
pub struct App {
    pub store: Storage,
    /// Required on every request when set.
    pub token: Option<String>,
    /// The page's token for actions.
    pub csrf: String,
    /// `Host` values a loopback listener answers to; empty: any.
    pub hosts: Vec<String>,
    /// The page, with its CSRF token in.
    pub index: String,
    /// The schedules' firing logs as read so far.
    pub histories: super::views::SharedHistories,
    /// Set when the server stops: live views end.
    pub stopping: tokio::sync::watch::Sender<bool>,
    /// What live views watch, each watched once.
    pub live: super::live::LiveViews,
    /// The name of the token's cookie (see [`token_cookie`]).
    pub cookie: String,
}

type Shared = State<Arc<App>>;

/// The routes.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/assets/app.js", get(|| async { asset("text/javascript", assets::APP_JS) }))
        .route("/assets/app.css", get(|| async { asset("text/css", assets::APP_CSS) }))
        .route("/api/workflows", get(workflows))
        .route("/api/schedules", get(schedules))
        .route("/api/threads", get(threads))
        .route("/api/threads/{id}", get(thread))
        .route("/api/events", get(events))
        .route("/api/threads/{id}/{action}", post(act))
        .layer(axum::middleware::from_fn_with_state(app.clone(), guard))
        .with_state(app)
}

/// The guards (see the module documentation), and the security headers on every response.
async fn guard(State(app): Shared, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
    if !app.hosts.is_empty() && !app.hosts.iter().any(|h| h == host) {
        return refuse(StatusCode::MISDIRECTED_REQUEST, "this server does not answer to that host");
    }
    if let Some(token) = &app.token {
        let given_cookie = cookie(headers, &app.cookie);
        let given_bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.strip_prefix("Bearer "));
        let given_query = request
            .uri()
            .query()
            .and_then(|q| form_urlencoded(q).find(|(k, _)| k == "token").map(|(_, v)| v));
        if let Some(given) = &given_query
            && request.method() == Method::GET
            && request.uri().path() == "/"
            && same(given, token)
        {
            // The token leaves the address bar (and history) at once, for a cookie scripts
            // cannot read and other sites do not send.
            let mut response = Redirect::to("/").into_response();
            let cookie = format!("{}={given}; Path=/; HttpOnly; SameSite=Strict", app.cookie);
            if let Ok(value) = HeaderValue::from_str(&cookie) {
                response.headers_mut().insert(header::SET_COOKIE, value);
            }
            return secure(response);
        }
        let ok = given_cookie.as_deref().or(given_bearer).is_some_and(|g| same(g, token));
        if !ok {
            return refuse(
                StatusCode::UNAUTHORIZED,
                "a token is required: open /?token=TOKEN (the token `serve` was given)",
            );
        }
    }
    if request.method() == Method::POST {
        let csrf_ok = headers
            .get(CSRF_HEADER)
            .and_then(|h| h.to_str().ok())
            .is_some_and(|given| same(given, &app.csrf));
        let origin_ok = headers
            .get(header::ORIGIN)
            .and_then(|h| h.to_str().ok())
            .is_none_or(|origin| origin.strip_prefix("http://").is_some_and(|o| o == host));
        let site_ok = headers
            .get("sec-fetch-site")
            .and_then(|h| h.to_str().ok())
            .is_none_or(|site| site == "same-origin");
        if !(csrf_ok && origin_ok && site_ok) {
            return refuse(StatusCode::FORBIDDEN, "cross-site request refused");
        }
    }
    secure(next.run(request).await)
}

fn secure(mut response: Response) -> Response {
    let headers = response.headers_mut();
    let set = |headers: &mut HeaderMap, name: &'static str, value: &'static str| {
        headers.insert(name, HeaderValue::from_static(value));
    };
    set(
        headers,
        "content-security-policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
         connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    );
    set(headers, "x-content-type-options", "nosniff");
    set(headers, "referrer-policy", "no-referrer");
    set(headers, "x-frame-options", "DENY");
    set(headers, "cache-control", "no-store");
    response
}

fn refuse(status: StatusCode, message: &str) -> Response {
    secure((status, axum::Json(json!({"error": message}))).into_response())
}

/// Compares two secrets in time independent of where they differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|h| h.to_str().ok())
        .flat_map(|h| h.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

fn form_urlencoded(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    query.split('&').filter_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        Some((k.to_string(), v.to_string()))
    })
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

async fn index(State(app): Shared) -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], app.index.clone()).into_response()
}

/// A library error as an HTTP answer: its one line, and a status from its exit code.
struct ApiError(Error);

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        ApiError(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = match self.0.exit_code() {
            exit::USAGE | exit::DATA => StatusCode::BAD_REQUEST,
            exit::NOT_FOUND => StatusCode::NOT_FOUND,
            exit::STATE => StatusCode::CONFLICT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let message = crate::error::chain_line(&self.0);
        (status, axum::Json(json!({"error": message}))).into_response()
    }
}

type ApiResult = Result<axum::Json<Value>, ApiError>;

/// A JSON request body, refused (400 malformed, 415 not JSON, 422 the wrong shape) with the
/// same JSON error every answer of the API gives, not axum's plain text.
pub struct JsonBody<T>(pub T);

impl<T, S> axum::extract::FromRequest<S> for JsonBody<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(request, state).await {
            Ok(axum::Json(value)) => Ok(JsonBody(value)),
            Err(rejection) => {
                let message = rejection.body_text();
                Err((rejection.status(), axum::Json(json!({"error": message}))).into_response())
            }
        }
    }
}

impl<T, S> axum::extract::OptionalFromRequest<S> for JsonBody<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = Response;

    /// No body (no content type) is no value; a body that is there must be good JSON.
    async fn from_request(request: Request, state: &S) -> Result<Option<Self>, Self::Rejection> {
        if !request.headers().contains_key(header::CONTENT_TYPE) {
            return Ok(None);
        }
        <Self as axum::extract::FromRequest<S>>::from_request(request, state).await.map(Some)
    }
}

fn to_json(value: impl serde::Serialize) -> ApiResult {
    Ok(axum::Json(serde_json::to_value(value).expect("views serialize")))
}

async fn workflows(State(app): Shared) -> ApiResult {
    to_json(views::workflows(&app.store)?)
}

async fn schedules(State(app): Shared) -> ApiResult {
    to_json(views::schedules(&app.store, &app.histories)?)
}

#[derive(Debug, Deserialize)]
struct ThreadFilter {
    workflow: Option<String>,
    status: Option<String>,
}

async fn threads(State(app): Shared, Query(filter): Query<ThreadFilter>) -> ApiResult {
    let workflow = filter.workflow.as_deref().filter(|w| !w.is_empty());
    let status = filter.status.as_deref().filter(|s| !s.is_empty());
    to_json(views::threads(&app.store, workflow, status)?)
}

async fn thread(State(app): Shared, Path(id): Path<String>) -> ApiResult {
    let id: ThreadId = id.parse()?;
    Ok(axum::Json(views::thread(&app.store, id).await?))
}

#[derive(Debug, Deserialize)]
struct EventsQuery {
    thread: Option<String>,
}

/// Server-sent events: `change` whenever what the open view shows has changed (the threads,
/// the schedules, and the watched thread's records and agent at work); the page then fetches
/// it again. The view is watched once for all the streams that watch it ([`super::live`]).
async fn events(
    State(app): Shared,
    Query(query): Query<EventsQuery>,
) -> Sse<impl futures::Stream<Item = Result<Event, Infallible>>> {
    let thread: Option<ThreadId> = query.thread.and_then(|t| t.parse().ok());
    let changes = app.live.subscribe(&app.store, &app.histories, app.stopping.subscribe(), thread);
    let stopping = app.stopping.subscribe();
    let start = (changes, stopping, true);
    let stream = futures::stream::unfold(start, |(mut changes, mut stopping, first)| async move {
        // The first event is the state at once (once known); then one per change.
        if !first || changes.borrow().is_empty() {
            tokio::select! {
                changed = changes.changed() => changed.ok()?,
                _ = stopping.changed() => return None,
            }
        }
        if *stopping.borrow() {
            return None;
        }
        let digest = changes.borrow_and_update().clone();
        let event = Event::default().event("change").data(digest);
        Some((Ok(event), (changes, stopping, false)))
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

#[derive(Debug, Default, Deserialize)]
struct ActionBody {
    /// `fork`: how many steps the fork keeps.
    at: Option<usize>,
    /// `answer`: the answer.
    text: Option<String>,
}

/// `pause`, `resume`, `kill`, `fork` (`{"at": N}`) and `answer` (`{"text": …}`).
async fn act(
    State(app): Shared,
    Path((id, action)): Path<(String, String)>,
    body: Option<JsonBody<ActionBody>>,
) -> ApiResult {
    let store = &app.store;
    let id: ThreadId = id.parse()?;
    let body = body.map(|b| b.0).unwrap_or_default();
    match action.as_str() {
        "kill" => control::kill(store, id).await?,
        "pause" => control::pause(store, id).await?,
        "resume" => {
            actions::resume(store, id, &AgentFlags::default(), Hand::Detach).await?;
        }
        "answer" => {
            let text =
                body.text.ok_or_else(|| Error::Usage("the answer's `text` is missing".into()))?;
            actions::answer(store, id, text, Hand::Detach).await?;
        }
        "fork" => {
            let at = body.at.map_or(lifecycle::ForkAt::All, lifecycle::ForkAt::Steps);
            let forked = actions::fork(store, id, &at, AgentFlags::default(), Hand::Detach).await?;
            return to_json(json!({"ok": true, "thread": forked.handed.id}));
        }
        other => return Err(Error::Usage(format!("no action `{other}` on a thread")).into()),
    }
    to_json(json!({"ok": true, "thread": id}))
}
