//! `serve`'s HTTP side: the page, its live feed, the API (`/api/v1`, [`super::api`]), and the
//! guards every request passes.
//!
//! Guards: a request to a loopback listener must name it in `Host` (a page on another site
//! cannot reach it by rebinding a domain to 127.0.0.1). The page is open on a loopback
//! listener without `--token`; otherwise every request carries a token (a cookie set by
//! visiting `/?token=…`, or `Authorization: Bearer`): the server's, or one `token create`
//! made. The API always wants one, or the page's session: its CSRF token in a header and, if
//! the browser says where it comes from, this origin — a form or script on another site can
//! do neither. A read-only token only reads. Responses forbid framing and inline script (a
//! Content-Security-Policy), so text that slipped into markup could not run.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{any, get, post};
use serde::Deserialize;

use super::api::{self, Caller};
use super::app::App;
use super::{assets, hooks};
use crate::ids::ThreadId;
use crate::store::tokens;

/// The cookie holding the access token, named per port (`uncaged_workflow_token_8420`):
/// cookies are not kept apart by port, and two servers on one host must not read each
/// other's.
pub fn token_cookie(port: u16) -> String {
    format!("uncaged_workflow_token_{port}")
}
/// The header a POST carries the CSRF token in.
pub const CSRF_HEADER: &str = "x-uncaged-csrf";

type Shared = State<Arc<App>>;

/// The routes; `/mcp` is `mcp`'s.
pub fn router(app: Arc<App>, mcp: super::mcp::http::McpService) -> Router {
    let mcp = Router::new().route("/mcp", any(super::mcp::http::endpoint)).with_state(mcp);
    Router::new()
        .route("/", get(index))
        .route("/assets/app.js", get(|| async { asset("text/javascript", assets::APP_JS) }))
        .route("/assets/app.css", get(|| async { asset("text/css", &STYLE) }))
        .route("/api/events", get(events))
        .route("/metrics", get(metrics))
        .nest("/api/v1", api::routes(app.max_body))
        .merge(super::a2a::routes(app.clone()))
        .merge(mcp)
        .route(
            "/links/{thread}/{token}",
            get(super::links::show)
                .post(super::links::decide)
                .layer(axum::extract::DefaultBodyLimit::max(app.max_body)),
        )
        .route(
            "/hooks/{workflow}",
            post(hooks::deliver).layer(axum::extract::DefaultBodyLimit::max(app.max_body)),
        )
        .fallback(api::no_route)
        .method_not_allowed_fallback(api::wrong_method)
        .layer(axum::middleware::from_fn_with_state(app.clone(), guard))
        .with_state(app)
}

/// Every request, guarded (see the module documentation), with the security headers on its
/// response, and logged in one line at `-v`: method, route (the matched pattern, or the path
/// escaped: never a query string, which may hold a token), status, duration, and who called
/// (a token's name, never the token).
async fn guard(State(app): Shared, request: Request, next: Next) -> Response {
    let started = std::time::Instant::now();
    let method = request.method().clone();
    let route = match request.extensions().get::<axum::extract::MatchedPath>() {
        Some(matched) => matched.as_str().to_string(),
        None => crate::terminal::line(request.uri().path()).into_owned(),
    };
    let mut caller = None;
    let response = checked(&app, request, next, &mut caller).await;
    tracing::info!(
        "{method} {route} {} {} ms{}",
        response.status().as_u16(),
        started.elapsed().as_millis(),
        caller.map(|c| format!(" ({c})")).unwrap_or_default()
    );
    response
}

/// The guards, and the request run if they let it through; `caller` is set to who called
/// when a token or the page's session says.
async fn checked(
    app: &Arc<App>,
    mut request: Request,
    next: Next,
    caller_name: &mut Option<String>,
) -> Response {
    let app = app.clone();
    // Whoever calls, no client names the caller: the guard does, for A2A (see `mcp_checked`).
    request.headers_mut().remove(super::a2a::CALLER_HEADER);
    let headers = request.headers();
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
    if !app.hosts.is_empty() && !app.hosts.iter().any(|h| h == host) {
        return refuse(StatusCode::MISDIRECTED_REQUEST, "this server does not answer to that host");
    }
    let path = request.uri().path();
    // A webhook's signature is its credential (see `hooks`), a link's token its (`links`).
    if path == "/api/v1/health" || path.starts_with("/hooks/") || path.starts_with("/links/") {
        return secure(next.run(request).await);
    }
    if path == "/mcp" {
        return secure(mcp_checked(&app, request, next, caller_name).await);
    }
    if path == "/a2a" || path.starts_with("/a2a/") {
        // Read whole before the SDK's handler runs: its HTTP+JSON `tasks/{id}:cancel` ignores
        // the body a client sends, and a connection whose request body was left unread is
        // closed after the answer — under a client's next request on it, as a Python client
        // found. (Bounded as every body is.)
        let (parts, body) = request.into_parts();
        let body = match axum::body::to_bytes(body, app.max_body).await {
            Ok(body) => body,
            Err(_) => {
                return refuse(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "the request is over the server's limit (serve.max_body_bytes)",
                );
            }
        };
        let request = Request::from_parts(parts, axum::body::Body::from(body));
        return secure(mcp_checked(&app, request, next, caller_name).await);
    }
    // An agent card is for discovery: public, as A2A has it (it names the workflows offered,
    // which `mcp.workflows` chooses, and how to sign in).
    if path == a2a_server::WELL_KNOWN_AGENT_CARD_PATH {
        return secure(next.run(request).await);
    }
    if path == "/api/v1" || path.starts_with("/api/v1/") {
        let caller = match api_caller(&app, &request) {
            Ok(caller) => caller,
            Err(refusal) => return secure(refusal.into_response()),
        };
        *caller_name = Some(caller.name.clone());
        if request.method() != Method::GET && request.method() != Method::HEAD && !caller.may_act {
            return secure(api::error(
                StatusCode::FORBIDDEN,
                "read_only",
                "this token may read, not act (make one without --read-only)",
            ));
        }
        request.extensions_mut().insert(caller);
        return secure(next.run(request).await);
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return refuse(StatusCode::METHOD_NOT_ALLOWED, "the page only reads; act through /api/v1");
    }
    if !app.open {
        let given_query = request
            .uri()
            .query()
            .and_then(|q| form_urlencoded(q).find(|(k, _)| k == "token").map(|(_, v)| v));
        if let Some(given) = &given_query
            && path == "/"
            && matches!(token_caller(&app, given), Ok(Some(_)))
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
        let given = cookie(headers, &app.cookie).or_else(|| bearer(headers).map(str::to_string));
        let page_caller = given.and_then(|g| token_caller(&app, &g).ok().flatten());
        let ok = page_caller.is_some();
        *caller_name = page_caller.map(|c| c.name);
        if !ok {
            return refuse(
                StatusCode::UNAUTHORIZED,
                "a token is required: open /?token=TOKEN (the token `serve` was given, or one \
                 `uncaged-workflow token create` made)",
            );
        }
    }
    secure(next.run(request).await)
}

/// A request to `/mcp`: from no foreign origin (a page on another site must not reach a local
/// server: the DNS-rebinding rule of MCP's transport), with a bearer token as the API takes.
/// Refusals are JSON-RPC errors, as a client reads them.
async fn mcp_checked(
    app: &Arc<App>,
    mut request: Request,
    next: Next,
    caller_name: &mut Option<String>,
) -> Response {
    let headers = request.headers();
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
    let foreign = headers.get(header::ORIGIN).is_some_and(|origin| {
        let origin = origin.to_str().unwrap_or("");
        let own = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            .is_some_and(|o| !host.is_empty() && o == host);
        !own
    });
    let refuse = |status: StatusCode, message: &str| {
        let body = serde_json::json!({
            "jsonrpc": "2.0", "id": null, "error": {"code": -32001, "message": message}
        });
        let mut response = (status, axum::Json(body)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    };
    if foreign {
        return refuse(StatusCode::FORBIDDEN, "requests from another origin are refused");
    }
    let caller = match bearer(headers) {
        None => {
            return refuse(
                StatusCode::UNAUTHORIZED,
                "a token is required: send `Authorization: Bearer TOKEN` (make one with \
                 `uncaged-workflow token create --name NAME`)",
            );
        }
        Some(given) => match token_caller(app, given) {
            Ok(Some(caller)) => caller,
            Ok(None) => {
                return refuse(
                    StatusCode::UNAUTHORIZED,
                    "the token is not valid (revoked, or never made)",
                );
            }
            Err(e) => return api::ApiError::from(e).into_response(),
        },
    };
    *caller_name = Some(caller.name.clone());
    // A2A's SDK hands its handler the request's headers, not its extensions: who called goes
    // in a header only this guard sets (one a client sent is dropped above).
    let who = format!("{}:{}", if caller.may_act { "act" } else { "read" }, caller.name);
    if let Ok(value) = HeaderValue::from_str(&who) {
        request.headers_mut().insert(super::a2a::CALLER_HEADER, value);
    }
    request.extensions_mut().insert(caller);
    next.run(request).await
}

/// Who calls the API: the holder of a bearer token, or the page (its session).
fn api_caller(app: &App, request: &Request) -> Result<Caller, api::ApiError> {
    let headers = request.headers();
    if headers.contains_key(header::AUTHORIZATION) {
        let Some(given) = bearer(headers) else {
            return Err(unauthorized("the Authorization header must be `Bearer TOKEN`"));
        };
        return match token_caller(app, given)? {
            Some(caller) => Ok(caller),
            None => Err(unauthorized("the token is not valid (revoked, or never made)")),
        };
    }
    if let Some(caller) = page_session(app, headers) {
        return Ok(caller);
    }
    Err(unauthorized(
        "a token is required: send `Authorization: Bearer TOKEN` (make one with \
         `uncaged-workflow token create --name NAME`)",
    ))
}

fn unauthorized(message: &str) -> api::ApiError {
    api::ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
}

/// The page, calling the API from this server's own origin with its CSRF token: a form or a
/// script on another site can send neither. It acts as its token does (or freely where the
/// page is open).
fn page_session(app: &App, headers: &HeaderMap) -> Option<Caller> {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
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
        return None;
    }
    if app.open {
        return Some(Caller { name: "page".into(), may_act: true });
    }
    let given = cookie(headers, &app.cookie)?;
    token_caller(app, &given).ok().flatten()
}

/// The caller a token stands for: the server's own (`--token`), one `token create` made, or
/// none. A stored token is looked up by its hash, never compared as it was given.
fn token_caller(app: &App, given: &str) -> crate::error::Result<Option<Caller>> {
    if app.token.as_deref().is_some_and(|token| same(given, token)) {
        return Ok(Some(Caller { name: "server".into(), may_act: true }));
    }
    Ok(tokens::authenticate(app.store.tokens(), given)?
        .map(|t| Caller { name: format!("token:{}", t.name), may_act: !t.read_only }))
}

/// The token of an `Authorization: Bearer TOKEN` header; the scheme's name is read as RFC
/// 7235 says, in any case (`bearer`, `BEARER`).
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim_start().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim()).filter(|t| !t.is_empty())
}

fn secure(mut response: Response) -> Response {
    let headers = response.headers_mut();
    let set = |headers: &mut HeaderMap, name: &'static str, value: &'static str| {
        headers.insert(name, HeaderValue::from_static(value));
    };
    // A page with a policy of its own (a link's, whose form posts) keeps it.
    headers.entry("content-security-policy").or_insert(HeaderValue::from_static(
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
         connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ));
    set(headers, "x-content-type-options", "nosniff");
    set(headers, "referrer-policy", "no-referrer");
    set(headers, "x-frame-options", "DENY");
    set(headers, "cache-control", "no-store");
    response
}

fn refuse(status: StatusCode, message: &str) -> Response {
    let code = match status {
        StatusCode::UNAUTHORIZED => "unauthorized",
        StatusCode::MISDIRECTED_REQUEST => "wrong_host",
        _ => "refused",
    };
    secure(api::error(status, code, message))
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

/// Prometheus' scrape: guarded as the page is (a token unless the page is open).
async fn metrics(State(app): Shared) -> Response {
    match super::metrics::render(&app.store, &app.deliveries, &app.latencies) {
        Ok(text) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response(),
        Err(e) => api::ApiError::from(e).into_response(),
    }
}

/// The page's stylesheet: its own, and an eval report's.
static STYLE: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| format!("{}\n{}", assets::APP_CSS, crate::eval::html::CSS));

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

async fn index(State(app): Shared) -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], app.index.clone()).into_response()
}

#[derive(Debug, Deserialize)]
struct EventsQuery {
    thread: Option<String>,
}

/// Server-sent events: `change` whenever what the open view shows has changed (the threads,
/// the schedules, and the watched thread's records and agent at work); the page then fetches
/// it again. The view is watched once for all the streams that watch it ([`super::live`]).
/// What a page's event stream holds: the digest of what it shows, and, for a thread's page,
/// the thread's live text (with the feed it comes from, kept while the page is open).
struct Page {
    changes: tokio::sync::watch::Receiver<String>,
    stopping: tokio::sync::watch::Receiver<bool>,
    first: bool,
    live: Option<super::feeds::Following>,
}

async fn events(
    State(app): Shared,
    Query(query): Query<EventsQuery>,
) -> Sse<impl futures::Stream<Item = Result<Event, Infallible>>> {
    let thread: Option<ThreadId> = query.thread.and_then(|t| t.parse().ok());
    let changes = app.live.subscribe(&app.store, &app.histories, app.stopping.subscribe(), thread);
    let stopping = app.stopping.subscribe();
    // A thread's page is sent its model's live text too (`delta`), as the API's feed hears it.
    let live =
        thread.and_then(|id| app.feeds.follow(&app.store, id, app.stopping.subscribe()).ok());
    let start = Page { changes, stopping, first: true, live };
    let stream = futures::stream::unfold(start, |mut page| async move {
        loop {
            // The first event is the state at once (once known); then one per change.
            if !page.first || page.changes.borrow().is_empty() {
                let mut receiver = page.live.as_mut().map(|following| &mut following.live);
                let text = async {
                    match &mut receiver {
                        Some(live) => live.recv().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    // Text heard before a change goes first: it was written before the step
                    // the change shows.
                    biased;
                    text = text => match text {
                        Ok(live) => {
                            let event = Event::default().event("delta").data(live.json.clone());
                            return Some((Ok(event), page));
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                            page.live = None;
                            continue;
                        }
                    },
                    changed = page.changes.changed() => changed.ok()?,
                    _ = page.stopping.changed() => return None,
                }
            }
            if *page.stopping.borrow() {
                return None;
            }
            let digest = page.changes.borrow_and_update().clone();
            let event = Event::default().event("change").data(digest);
            page.first = false;
            return Some((Ok(event), page));
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}
