//! `/api/v1/evals`: start an eval of a registered workflow's recorded threads (it runs in
//! this server, beside them), list the evals, and read one's report, as JSON or as the HTML
//! the web view shows. The library does the work ([`crate::eval`]), as it does for `eval`.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::types::ErrorBody;
use super::{ApiError, ApiPath, JsonBody, Shared};
use crate::agent_spec::AgentSpec;
use crate::error::Error;
use crate::eval::compare::report;
use crate::eval::plan::{Against, EvalSpec, plan};
use crate::eval::runs::{self, DEFAULT_CONCURRENCY};
use crate::eval::{experiment_id, html};
use crate::run_request::RunRequest;
use crate::sandbox::engine::Runtime;
use crate::store::evals::{Check, Experiment};
use crate::store::records::EvalTools;

/// The most threads an eval started over the API runs at once.
const MAX_CONCURRENCY: usize = 16;

/// An eval to start.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StartEval {
    /// A registered workflow's name.
    pub workflow: String,
    /// A stored version of it to run the threads on (its hash); none: its current version.
    #[serde(default)]
    pub version: Option<String>,
    /// These recorded threads; none: its ended threads `since` and `last` select.
    #[serde(default)]
    pub threads: Vec<String>,
    /// Only threads started within this long, e.g. `7d`.
    #[serde(default)]
    pub since: Option<String>,
    /// Only the newest N threads.
    #[serde(default)]
    pub last: Option<usize>,
    /// The threads of a set saved with `eval set save` instead.
    #[serde(default)]
    pub set: Option<String>,
    /// Roles asked again live whatever their request.
    #[serde(default)]
    pub live: Vec<String>,
    /// Role → a binding of config.yaml (`agents:`), `scripted` or `human`: the roles rebound
    /// (and so asked live). A request cannot name a command to run.
    #[serde(default)]
    pub agent_for: BTreeMap<String, String>,
    /// What a tool call the recorded thread never made gets: `journal` (default), `live`,
    /// `deny`.
    #[serde(default)]
    pub tools: Option<String>,
    /// Checks each finished thread must pass: JSONata over the thread.
    #[serde(default)]
    #[schema(value_type = Vec<Object>)]
    pub checks: Vec<Check>,
    /// An earlier eval of the workflow to compare with, rather than the recorded threads.
    #[serde(default)]
    pub baseline: Option<String>,
    /// An LLM judge: `{"agent": BINDING, "role": ROLE, "instructions": TEXT}`, a binding of
    /// config.yaml asked which answer of each thread is better.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub judge: Option<crate::store::evals::JudgeSpec>,
    /// What the eval may spend on the calls it asks live, over all its threads.
    #[serde(default)]
    pub budget: Option<super::types::BudgetBody>,
    /// How many threads run at once (1 to 16; 4 unless given).
    #[serde(default)]
    pub concurrency: Option<usize>,
}

/// An eval started.
#[derive(Debug, Serialize, ToSchema)]
pub struct EvalStarted {
    /// Its id: `GET /api/v1/evals/{id}` reads its report as it goes.
    pub id: String,
    /// How many recorded threads it runs again.
    pub threads: usize,
}

/// An eval in a list.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EvalItem {
    pub id: String,
    pub workflow: String,
    /// The version it runs the threads on, as it was named.
    pub against: String,
    pub created: u64,
    pub finished: Option<u64>,
    pub threads: usize,
}

impl From<&Experiment> for EvalItem {
    fn from(e: &Experiment) -> Self {
        EvalItem {
            id: e.id.to_string(),
            workflow: e.workflow.clone(),
            against: e.against.clone(),
            created: e.created,
            finished: e.finished,
            threads: e.threads.len(),
        }
    }
}

/// Starts an eval: the threads are chosen and the experiment kept before this answers; they
/// run in this server afterwards (a server stopped midway leaves it for `eval resume`).
#[utoipa::path(post, path = "/api/v1/evals", request_body = StartEval,
    responses(
        (status = 202, description = "Started", body = EvalStarted),
        (status = 400, description = "A role, version, check or binding that is not there", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "A read-only token", body = ErrorBody),
        (status = 404, description = "No such workflow or thread", body = ErrorBody),
        (status = 413, description = "Body over the limit", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 422, description = "The wrong shape", body = ErrorBody)))]
pub async fn start(
    State(app): Shared,
    JsonBody(body): JsonBody<StartEval>,
) -> Result<Response, ApiError> {
    let store = app.store.clone();
    let bad = |what: String| ApiError::from(Error::Usage(what));
    let mut request = RunRequest::default();
    for (role, spec) in &body.agent_for {
        let spec: AgentSpec =
            spec.parse().map_err(|e: String| bad(format!("agentFor.{role}: {e}")))?;
        match spec {
            AgentSpec::Named(_) | AgentSpec::Human | AgentSpec::Scripted { answers: None } => {}
            _ => {
                return Err(bad(format!(
                    "agentFor.{role}: a request may bind a role to a binding of config.yaml \
                     (agents:), scripted or human, never to a command or a file"
                )));
            }
        }
        request.agent_for.insert(role.clone(), spec);
    }
    let tools = match body.tools.as_deref() {
        None | Some("journal") => EvalTools::Journal,
        Some("live") => EvalTools::Live,
        Some("deny") => EvalTools::Deny,
        Some(other) => {
            return Err(bad(format!(
                "tools `{}`: journal, live or deny",
                crate::terminal::line(other)
            )));
        }
    };
    let concurrency = body.concurrency.unwrap_or(DEFAULT_CONCURRENCY);
    if !(1..=MAX_CONCURRENCY).contains(&concurrency) {
        return Err(bad(format!("concurrency {concurrency}: from 1 to {MAX_CONCURRENCY}")));
    }
    let since_ms = super::started_after(body.since.as_deref())?;
    let against = match body.version.as_deref() {
        None => Against::Current,
        Some(hash) => Against::Version(hash.parse().map_err(|_| {
            bad(format!("version `{}`: not a bundle hash", crate::terminal::line(hash)))
        })?),
    };
    let threads = body
        .threads
        .iter()
        .map(|t| store.threads().resolve(t))
        .collect::<crate::Result<Vec<_>>>()?;
    let spec = EvalSpec {
        workflow: body.workflow.clone(),
        against,
        threads,
        since_ms,
        last: body.last,
        set: body.set.clone(),
        live: body.live.clone(),
        request,
        tools,
        checks: body.checks.clone(),
        baseline: body.baseline.as_deref().map(experiment_id).transpose()?,
        config: None,
        budget: body.budget.clone().map(Into::into).unwrap_or_default(),
        judge: body.judge.clone(),
    };
    let runtime = Runtime::new(store.home())?;
    let (mut experiment, bundle) = plan(&store, &runtime, &spec).await?;
    let started = EvalStarted { id: experiment.id.to_string(), threads: experiment.threads.len() };
    tokio::spawn(async move {
        let id = experiment.id;
        match runs::run(&store, &runtime, &bundle, &mut experiment, concurrency, |_| {}).await {
            Ok(None) => {}
            Ok(Some(spent)) => tracing::info!("eval {id} stopped asking: {spent}"),
            Err(e) => tracing::warn!(
                "eval {id} stopped: {e} (`uncaged-workflow eval resume {id}` goes on)"
            ),
        }
    });
    Ok((StatusCode::ACCEPTED, axum::Json(started)).into_response())
}

/// The evals, oldest first.
#[utoipa::path(get, path = "/api/v1/evals",
    responses((status = 200, description = "Every eval", body = Vec<EvalItem>),
        (status = 401, description = "No valid token", body = ErrorBody)))]
pub async fn list(State(app): Shared) -> Result<Response, ApiError> {
    let all: Vec<EvalItem> = app.store.evals().list()?.iter().map(EvalItem::from).collect();
    Ok(axum::Json(all).into_response())
}

/// An eval's report, as its threads stand: per thread, improved, regressed or unchanged,
/// where it first differs from its recorded thread, and what each cost; and the totals.
#[utoipa::path(get, path = "/api/v1/evals/{id}",
    params(("id" = String, Path, description = "An eval id")),
    responses((status = 200, description = "Its report", body = Object),
        (status = 400, description = "Not an eval id", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 404, description = "No such eval", body = ErrorBody)))]
pub async fn one(State(app): Shared, ApiPath(id): ApiPath<String>) -> Result<Response, ApiError> {
    let experiment = found(&app.store, &id)?;
    Ok(axum::Json(report(&app.store, &experiment)?).into_response())
}

/// An eval's report as the HTML the web view shows (escaped; no script).
#[utoipa::path(get, path = "/api/v1/evals/{id}/html",
    params(("id" = String, Path, description = "An eval id")),
    responses((status = 200, description = "Its report, as HTML", body = String, content_type = "text/html"),
        (status = 400, description = "Not an eval id", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 404, description = "No such eval", body = ErrorBody)))]
pub async fn one_html(
    State(app): Shared,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    let experiment = found(&app.store, &id)?;
    let body = html::body(&report(&app.store, &experiment)?);
    Ok(([(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response())
}

fn found(store: &crate::store::Storage, id: &str) -> Result<Experiment, ApiError> {
    let id = experiment_id(id)?;
    store
        .evals()
        .get(id)?
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("no eval {id}")))
}
