//! Webhook triggers: `POST /hooks/<workflow>` starts one thread of the workflow per delivery,
//! the request's JSON body as its `$trigger_data`, when a webhook schedule of the workflow
//! (`trigger: {type: webhook}` or `schedule add --webhook`) is there and the request is signed
//! with its secret.
//!
//! Signatures: GitHub's (`X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>`) and
//! Standard Webhooks' (`webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<base64 HMAC
//! of "id.timestamp.body">`, a `whsec_` base64 secret, 5 minutes' tolerance). A request with
//! neither, or a wrong one, gets 401 and starts nothing. The delivery id (`X-GitHub-Delivery`
//! or `webhook-id`) is a request key: a delivery sent again gets 200 and the thread the first
//! started, also when it reaches two `serve` processes on one database at once. The answer
//! comes once the thread is recorded, not when it ends.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::api::{ApiError, types::Started};
use super::app::App;
use super::metrics::Deliveries;
use crate::clock::now_ms;
use crate::run::actions::{self, Once, OnceKey};
use crate::schedule;
use crate::store::records::ScheduledBy;
use crate::store::schedules::{Schedule, Trigger};

/// How far a Standard Webhooks timestamp may be from now.
const TOLERANCE_MS: u64 = 5 * 60 * 1000;

/// The longest delivery id taken.
const MAX_ID_LEN: usize = 200;

/// `POST /hooks/{workflow}`. Every refusal — a body over the limit included, refused before
/// it is read whole — is the API's JSON error, counted, and logged at `warn`.
pub async fn deliver(
    State(app): State<Arc<App>>,
    Path(workflow): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, ApiError> {
    let answer = match body {
        Ok(body) => answer(&app, &workflow, &headers, &body).await,
        Err(rejection) => Err(match rejection.status() {
            StatusCode::PAYLOAD_TOO_LARGE => refusal(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                &format!(
                    "the delivery is over the server's limit of {} (serve.max_body_bytes in \
                     config.yaml raises it)",
                    crate::limits::Size(app.max_body)
                ),
            ),
            status => refusal(status, "invalid", &rejection.body_text()),
        }),
    };
    let outcome = match &answer {
        Ok((StatusCode::CREATED, _)) => &app.deliveries.started,
        Ok(_) => &app.deliveries.replayed,
        Err(_) => &app.deliveries.refused,
    };
    Deliveries::count(outcome);
    if let Err(refused) = &answer {
        tracing::warn!(
            "webhook delivery to /hooks/{} refused: {} {} ({})",
            crate::terminal::line(&workflow),
            refused.status.as_u16(),
            refused.code,
            refused.message
        );
    }
    let (status, id) = answer?;
    Ok((status, axum::Json(Started { id: id.to_string() })).into_response())
}

/// Starts the thread of a delivery, or finds the one it started; the status to answer with.
async fn answer(
    app: &App,
    workflow: &str,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<(StatusCode, crate::ids::ThreadId), ApiError> {
    let schedule = webhook_of(app, workflow)?;
    let Trigger::Webhook { secret_env, map } = &schedule.trigger else {
        unreachable!("a webhook schedule")
    };
    // The secret is read at each delivery: a rotated secret takes effect without a restart.
    // Said once, when serve starts (`warn_of_missing_secrets`), not at every delivery.
    let secret = std::env::var(secret_env).map_err(|_| {
        refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_configured",
            "this webhook's secret is not configured on the server",
        )
    })?;
    let delivery = verify(headers, body, secret.as_bytes(), now_ms())?;
    let data: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
        refusal(StatusCode::BAD_REQUEST, "malformed_json", &format!("the body is not JSON: {e}"))
    })?;
    let mut start = schedule::thread_request(&schedule);
    start.trigger_data = Some(crate::data_map::apply(map, data));
    start.origin.schedule = Some(ScheduledBy {
        name: schedule.name.clone(),
        firing: format!("delivery:{}", crate::terminal::line(&delivery)),
    });
    // Every delivery of one id is the same request: its body is not compared.
    let key = OnceKey {
        scope: format!("hook:{}", schedule.name),
        key: delivery,
        fingerprint: String::new(),
    };
    Ok(match actions::start_once(&app.store, start, Some(key)).await? {
        Once::Started(id) => (StatusCode::CREATED, id),
        Once::Replayed(id) => (StatusCode::OK, id),
    })
}

/// Says, once, which webhooks cannot be delivered because `serve` was started without the
/// variable holding their secret (each such delivery then gets 503).
pub fn warn_of_missing_secrets(store: &crate::store::Storage) {
    let Ok(schedules) = store.schedules().list() else { return };
    for schedule in schedules {
        if let Trigger::Webhook { secret_env, .. } = &schedule.trigger
            && std::env::var_os(secret_env).is_none()
        {
            super::say(format_args!(
                "webhook of `{}` (POST /hooks/{}): {secret_env}, the variable holding its \
                 secret, is not set; its deliveries are refused (503) until serve is started \
                 with it",
                schedule.name, schedule.workflow
            ));
        }
    }
}

/// The webhook schedule of `workflow`: refused if there is none (404) or it is paused (409).
fn webhook_of(app: &App, workflow: &str) -> Result<Schedule, ApiError> {
    let schedule = app
        .store
        .schedules()
        .list()?
        .into_iter()
        .find(|s| s.workflow == workflow && matches!(s.trigger, Trigger::Webhook { .. }))
        .ok_or_else(|| {
            refusal(StatusCode::NOT_FOUND, "not_found", "no webhook is declared for this workflow")
        })?;
    if schedule.paused {
        return Err(refusal(StatusCode::CONFLICT, "paused", "this webhook's schedule is paused"));
    }
    Ok(schedule)
}

/// Checks the request's signature with `secret`; its delivery id.
pub fn verify(
    headers: &HeaderMap,
    body: &[u8],
    secret: &[u8],
    now: u64,
) -> Result<String, ApiError> {
    let header = |name: &str| headers.get(name).and_then(|h| h.to_str().ok());
    let unsigned = |why: &str| refusal(StatusCode::UNAUTHORIZED, "bad_signature", why);
    let delivery = |id: Option<&str>, name: &str| -> Result<String, ApiError> {
        id.filter(|id| !id.is_empty() && id.len() <= MAX_ID_LEN).map(str::to_string).ok_or_else(
            || refusal(StatusCode::BAD_REQUEST, "invalid", &format!("a delivery needs `{name}`")),
        )
    };
    if let Some(signature) = header("x-hub-signature-256") {
        let hex =
            signature.strip_prefix("sha256=").ok_or_else(|| unsigned("malformed signature"))?;
        let given = decode_hex(hex).ok_or_else(|| unsigned("malformed signature"))?;
        let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key");
        mac.update(body);
        // verify_slice compares in constant time.
        mac.verify_slice(&given).map_err(|_| unsigned("the signature does not match"))?;
        return delivery(header("x-github-delivery"), "X-GitHub-Delivery");
    }
    if let Some(signatures) = header("webhook-signature") {
        let id = delivery(header("webhook-id"), "webhook-id")?;
        let timestamp = header("webhook-timestamp")
            .and_then(|t| t.parse::<u64>().ok())
            .ok_or_else(|| unsigned("a missing or malformed webhook-timestamp"))?;
        if now.abs_diff(timestamp.saturating_mul(1000)) > TOLERANCE_MS {
            return Err(unsigned("the webhook-timestamp is more than 5 minutes from now"));
        }
        let engine = base64::engine::general_purpose::STANDARD;
        let key = crate::http::standard_webhooks_key(secret)
            .ok_or_else(|| unsigned("a malformed secret"))?;
        let mac = crate::http::standard_webhooks_mac(&key, &id, timestamp, body);
        let matches = signatures
            .split(' ')
            .filter_map(|s| s.strip_prefix("v1,"))
            .filter_map(|s| engine.decode(s).ok())
            .any(|given| mac.clone().verify_slice(&given).is_ok());
        if !matches {
            return Err(unsigned("the signature does not match"));
        }
        return Ok(id);
    }
    Err(unsigned("the request is not signed (X-Hub-Signature-256 or webhook-signature)"))
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) || hex.len() > 128 {
        return None;
    }
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok()).collect()
}

fn refusal(status: StatusCode, code: &'static str, message: &str) -> ApiError {
    ApiError::new(status, code, message)
}
