//! The HTTP API, v1 (`/api/v1`): what another system — a CI job, a chat bot, a service —
//! calls to start threads, follow them and act on them. Every handler calls the library
//! functions the CLI calls ([`crate::run::actions`], [`crate::run::control`],
//! [`crate::run::query`]), on either store; the OpenAPI document at `/api/v1/openapi.json`
//! is generated from the handlers' types ([`ApiDoc`]).
//!
//! Who may call: a bearer token (`token create`; a read-only one may not act), the token
//! `serve` was given, or the web page itself (its session, with its CSRF token in a header).
//! Every error is `{"error": {"code", "message"}}` with a 4xx or 5xx status, and changes
//! nothing.

pub mod evals;
pub mod threads;
pub mod types;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;
use utoipa::OpenApi;

use super::app::App;
use super::views;
use crate::error::{Error, exit};
use types::{ErrorBody, ErrorDetail, Health};

/// What a caller may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// Whose requests these are: a token's name (`token:ci`), the server's token, the page.
    pub name: String,
    pub may_act: bool,
}

/// The routes under `/api/v1`, with the body limit.
pub fn routes(max_body: usize) -> Router<Arc<App>> {
    Router::new()
        .route("/health", get(health))
        .route("/openapi.json", get(openapi))
        .route("/threads", post(threads::start).get(threads::list))
        .route("/threads/{id}", get(threads::one))
        .route("/threads/{id}/events", get(threads::events))
        .route("/threads/{id}/{action}", post(threads::act))
        .route("/evals", post(evals::start).get(evals::list))
        .route("/evals/{id}", get(evals::one))
        .route("/evals/{id}/html", get(evals::one_html))
        .route("/workflows", get(workflows))
        .route("/schedules", get(schedules))
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(max_body))
}

/// A path no route has, as the JSON error.
pub async fn no_route(request: Request) -> Response {
    let path = request.uri().path();
    let message = match path.strip_prefix("/api/").filter(|_| !path.starts_with("/api/v1")) {
        Some(_) => format!(
            "no such route: `{}` (the API is under /api/v1; see /api/v1/openapi.json)",
            crate::terminal::line(path)
        ),
        None => {
            format!("no such route: `{}` (see /api/v1/openapi.json)", crate::terminal::line(path))
        }
    };
    error(StatusCode::NOT_FOUND, "not_found", &message)
}

/// A route asked with a method it does not take, as the JSON error.
pub async fn wrong_method(request: Request) -> Response {
    let message = format!(
        "`{}` is not a method `{}` takes (see /api/v1/openapi.json)",
        request.method(),
        crate::terminal::line(request.uri().path())
    );
    error(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", &message)
}

/// A path's parameters, refused with the API's JSON error (400 `invalid`: an id that is not
/// text, say) where axum's own `Path` answers in plain text.
pub struct ApiPath<T>(pub T);

impl<T, S> axum::extract::FromRequestParts<S> for ApiPath<T>
where
    T: serde::de::DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(ApiPath(value)),
            Err(rejection) => {
                Err(error(StatusCode::BAD_REQUEST, "invalid", &rejection.body_text()))
            }
        }
    }
}

/// A query string, refused with the API's JSON error (400 `invalid_query`: `?limit=-1`, say)
/// where axum's own `Query` answers in plain text.
pub struct ApiQuery<T>(pub T);

impl<T, S> axum::extract::FromRequestParts<S> for ApiQuery<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(ApiQuery(value)),
            Err(rejection) => {
                Err(error(StatusCode::BAD_REQUEST, "invalid_query", &rejection.body_text()))
            }
        }
    }
}

/// The OpenAPI 3.1 document of the API.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "uncaged-workflow",
        description = "Start, follow and act on threads of sandboxed multi-role agent workflows."
    ),
    paths(
        health, openapi, workflows, schedules, threads::start, threads::list, threads::one,
        threads::events, threads::act, evals::start, evals::list, evals::one, evals::one_html
    ),
    modifiers(&BearerAuth),
    security(("bearer" = []))
)]
pub struct ApiDoc;

/// Declares the bearer scheme every route but `/health` asks for.
struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components
            .add_security_scheme("bearer", SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)));
    }
}

/// An API error: a status, a stable code a program can test, and one line for a person.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// Where in the request's data it is wrong, when that is the error.
    pub path: Option<String>,
}

impl ApiError {
    /// An error with a status, a code and a line.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, code, message: message.into(), path: None }
    }
}

/// The JSON error answer.
pub fn error(status: StatusCode, code: &'static str, message: &str) -> Response {
    error_at(status, code, message, None)
}

/// The JSON error answer, naming where in the request's data it is wrong.
fn error_at(status: StatusCode, code: &'static str, message: &str, path: Option<&str>) -> Response {
    let detail =
        ErrorDetail { code: code.into(), message: message.into(), path: path.map(str::to_string) };
    (status, axum::Json(ErrorBody { error: detail })).into_response()
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let (status, code) = match &e {
            Error::KeyReused(_) => (StatusCode::UNPROCESSABLE_ENTITY, "idempotency_key_reused"),
            Error::InvalidAnswer { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_answer"),
            Error::InvalidInput { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_input"),
            Error::ThreadBusy(_) => (StatusCode::CONFLICT, "thread_busy"),
            _ if e.is_database_unavailable() => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            _ => match e.exit_code() {
                exit::USAGE | exit::DATA => (StatusCode::BAD_REQUEST, "invalid"),
                exit::NOT_FOUND => (StatusCode::NOT_FOUND, "not_found"),
                exit::STATE => (StatusCode::CONFLICT, "conflict"),
                _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
            },
        };
        let path = match &e {
            Error::InvalidInput { path, .. } => Some(path.clone()),
            _ => None,
        };
        ApiError { status, code, message: crate::error::chain_line(&e), path }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        error_at(self.status, self.code, &self.message, self.path.as_deref())
    }
}

/// A JSON request body, refused with the API's JSON error: 400 malformed, 413 over the limit,
/// 415 not JSON, 422 the wrong shape.
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
                let status = rejection.status();
                let code = match status {
                    StatusCode::PAYLOAD_TOO_LARGE => "too_large",
                    StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
                    StatusCode::UNPROCESSABLE_ENTITY => "invalid_body",
                    _ => "malformed_json",
                };
                Err(error(status, code, &rejection.body_text()))
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

type Shared = State<Arc<App>>;

/// The instant a request's `since` (a duration such as `7d`; empty or absent: none) reaches
/// back to (ms since the epoch).
fn started_after(since: Option<&str>) -> Result<Option<u64>, ApiError> {
    let Some(since) = since.filter(|s| !s.is_empty()) else { return Ok(None) };
    let ago = humantime::parse_duration(since).map_err(|e| {
        ApiError::from(Error::Usage(format!(
            "since `{}`: {e} (e.g. 30m, 12h, 7d)",
            crate::terminal::line(since)
        )))
    })?;
    Ok(Some(crate::clock::now_ms().saturating_sub(ago.as_millis() as u64)))
}

/// Whether the server answers (no token needed: for load balancers and probes).
#[utoipa::path(get, path = "/api/v1/health", security(()),
    responses((status = 200, description = "The server answers", body = Health)))]
async fn health() -> axum::Json<Health> {
    axum::Json(Health { status: "ok".into(), version: env!("CARGO_PKG_VERSION").into() })
}

/// This document.
#[utoipa::path(get, path = "/api/v1/openapi.json",
    responses((status = 200, description = "The OpenAPI 3.1 document", body = Object),
        (status = 401, description = "No valid token", body = ErrorBody)))]
async fn openapi() -> Response {
    axum::Json(ApiDoc::openapi()).into_response()
}

/// The registered workflows, with their versions and roles.
#[utoipa::path(get, path = "/api/v1/workflows",
    responses((status = 200, description = "Every registered workflow", body = Vec<Object>),
        (status = 401, description = "No valid token", body = ErrorBody)))]
async fn workflows(State(app): Shared) -> Result<Response, ApiError> {
    Ok(axum::Json(views::workflows(&app.store)?).into_response())
}

/// The schedules, with their next firing and last firings.
#[utoipa::path(get, path = "/api/v1/schedules",
    responses((status = 200, description = "Every schedule", body = Vec<Object>),
        (status = 401, description = "No valid token", body = ErrorBody)))]
async fn schedules(State(app): Shared) -> Result<Response, ApiError> {
    let list = views::schedules(&app.store, &app.histories)?;
    Ok(axum::Json(json!(list)).into_response())
}
