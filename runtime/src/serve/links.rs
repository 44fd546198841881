//! The page of a signed one-time link: `GET /links/{thread}/{token}` shows what the link will
//! decide and a button to confirm (mail scanners and chat clients open links: a GET decides
//! nothing); `POST` of the same address decides. The token in the address is the credential —
//! no API token or cookie — so the page works from a mail on a phone. What it may decide is
//! [`crate::reach::links`]'; this only shows and carries it. Every page is `no-store`, sends no
//! referrer (the address holds the token), and may post only to itself.

use std::sync::Arc;

use axum::Form;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::app::App;
use crate::error::Error;
use crate::reach::links::{self, Decided, Open, Refused};
use crate::run::waits::{Action, Decision};
use crate::spending::Budget;
use crate::terminal::html;

/// The longest path segment looked at: a thread id is 26 characters, a token 64.
const MAX_SEGMENT: usize = 128;

/// What the confirm form posts.
#[derive(Debug, Default, Deserialize)]
pub struct LinkForm {
    /// The answer, why a call is denied, or what the model gets instead of a skipped call.
    #[serde(default)]
    text: Option<String>,
    /// A raise: the new limits (empty fields leave a limit as it is).
    #[serde(default)]
    max_cost: Option<String>,
    #[serde(default)]
    max_tokens: Option<String>,
    #[serde(default)]
    max_agent_calls: Option<String>,
}

/// `GET /links/{thread}/{token}`: what it decides, and a button; or why it decides nothing.
pub async fn show(
    State(app): State<Arc<App>>,
    Path((thread, token)): Path<(String, String)>,
) -> Response {
    if thread.len() > MAX_SEGMENT || token.len() > MAX_SEGMENT {
        return refused(&Refused::Unknown);
    }
    match links::open(&app.store, &thread, &token) {
        Ok(Ok(open)) => page(StatusCode::OK, &title(&open), &confirm(&open, None)),
        Ok(Err(refusal)) => refused(&refusal),
        Err(e) => failed(&e),
    }
}

/// `POST /links/{thread}/{token}`: decides, once.
pub async fn decide(
    State(app): State<Arc<App>>,
    Path((thread, token)): Path<(String, String)>,
    form: Result<Form<LinkForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    if thread.len() > MAX_SEGMENT || token.len() > MAX_SEGMENT {
        return refused(&Refused::Unknown);
    }
    let form = form.map(|f| f.0).unwrap_or_default();

    let open = match links::open(&app.store, &thread, &token) {
        Ok(Ok(open)) => open,
        Ok(Err(refusal)) => return refused(&refusal),
        Err(e) => return failed(&e),
    };
    let decision = match decision(open.action, &form) {
        Ok(decision) => decision,
        Err(why) => {
            return page(
                StatusCode::UNPROCESSABLE_ENTITY,
                &title(&open),
                &confirm(&open, Some(&why)),
            );
        }
    };
    match links::decide(&app.store, &thread, &token, decision).await {
        Ok(Decided::Applied(open)) => {
            let body = format!(
                "<p class=\"done\">Done: {} — thread {} goes on.</p>",
                html(done(open.action)),
                html(&open.wait.thread.to_string())
            );
            page(StatusCode::OK, "Decided", &body)
        }
        Ok(Decided::Refused(refusal)) => refused(&refusal),
        // What does not fit (an answer the role's schema refuses, an empty reason) spent
        // nothing: the form is shown again with why.
        Err(e @ (Error::Usage(_) | Error::InvalidAnswer { .. })) => page(
            StatusCode::UNPROCESSABLE_ENTITY,
            &title(&open),
            &confirm(&open, Some(&crate::error::chain_line(&e))),
        ),
        Err(e) => failed(&e),
    }
}

/// The decision `action` makes with what `form` holds, or why the form does not make one.
fn decision(action: Action, form: &LinkForm) -> std::result::Result<Decision, String> {
    let text = || {
        form.text
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .ok_or_else(|| "write the text first".to_string())
    };
    Ok(match action {
        Action::Answer => Decision::Answer { text: text()? },
        Action::Approve => Decision::Approve,
        Action::Deny => Decision::Deny { reason: text()? },
        Action::Redo => Decision::Redo,
        Action::Skip => Decision::Skip { text: text()? },
        Action::Raise => {
            let number =
                |field: &Option<String>, what: &str| -> std::result::Result<Option<f64>, String> {
                    match field.as_deref().map(str::trim).filter(|v| !v.is_empty()) {
                        None => Ok(None),
                        Some(v) => v
                            .parse::<f64>()
                            .ok()
                            .filter(|n| n.is_finite() && *n >= 0.0)
                            .map(Some)
                            .ok_or_else(|| format!("{what}: `{v}` is not a number")),
                    }
                };
            Decision::Raise {
                budget: Budget {
                    max_cost_usd: number(&form.max_cost, "cost")?,
                    max_tokens: number(&form.max_tokens, "tokens")?.map(|n| n as u64),
                    max_agent_calls: number(&form.max_agent_calls, "agent calls")?
                        .map(|n| n as u64),
                    max_duration_ms: None,
                },
            }
        }
    })
}

fn title(open: &Open) -> String {
    let tool = open.wait.tool.as_ref().map_or("", |t| t.tool.as_str());
    match open.action {
        Action::Answer => format!("Answer for role `{}`", open.wait.role.as_deref().unwrap_or("?")),
        Action::Approve => format!("Approve tool call `{tool}`?"),
        Action::Deny => format!("Deny tool call `{tool}`?"),
        Action::Redo => format!("Make tool call `{tool}` again?"),
        Action::Skip => format!("Skip tool call `{tool}`?"),
        Action::Raise => "Raise the thread's budget?".into(),
    }
}

fn done(action: Action) -> &'static str {
    match action {
        Action::Answer => "answered",
        Action::Approve => "approved",
        Action::Deny => "denied",
        Action::Redo => "to be made again",
        Action::Skip => "skipped",
        Action::Raise => "budget raised",
    }
}

/// The confirm form: what the thread asks, and the one button that decides.
fn confirm(open: &Open, error: Option<&str>) -> String {
    let wait = &open.wait;
    let mut body = format!(
        "<p>Thread <code>{}</code> of workflow <code>{}</code> waits.</p><pre>{}</pre>",
        html(&wait.thread.to_string()),
        html(&wait.workflow),
        html(&wait.question)
    );
    if let Some(reasoning) = wait.tool.as_ref().and_then(|t| t.reasoning.as_deref()) {
        body.push_str(&format!("<p>The model said before it:</p><pre>{}</pre>", html(reasoning)));
    }
    if let Some(error) = error {
        body.push_str(&format!("<p class=\"error\" role=\"alert\">{}</p>", html(error)));
    }
    body.push_str("<form method=\"post\">");
    match open.action {
        Action::Answer | Action::Deny | Action::Skip => {
            let label = match open.action {
                Action::Answer => "Your answer",
                Action::Deny => "Why it is denied (the model is told)",
                _ => "What the model is given instead of the call's result",
            };
            body.push_str(&format!(
                "<label for=\"text\">{label}</label><textarea id=\"text\" name=\"text\" rows=\"8\" \
                 required></textarea>"
            ));
        }
        Action::Raise => {
            let now = wait.budget.clone().unwrap_or_default();
            let field = |name: &str, label: &str, value: Option<String>| {
                format!(
                    "<label for=\"{name}\">{label}</label><input id=\"{name}\" name=\"{name}\" \
                     inputmode=\"decimal\" value=\"{}\">",
                    html(&value.unwrap_or_default())
                )
            };
            body.push_str(&field(
                "max_cost",
                "Cost, US dollars",
                now.max_cost_usd.map(|c| format!("{}", c * 2.0)),
            ));
            body.push_str(&field(
                "max_tokens",
                "Tokens",
                now.max_tokens.map(|t| (t * 2).to_string()),
            ));
            body.push_str(&field(
                "max_agent_calls",
                "Agent calls",
                now.max_agent_calls.map(|c| (c * 2).to_string()),
            ));
        }
        Action::Approve | Action::Redo => {}
    }
    body.push_str(&format!(
        "<button type=\"submit\" id=\"confirm\">{}</button></form><p class=\"note\">This link \
         decides once. Nothing is decided until you press the button.</p>",
        open.action.label()
    ));
    body
}

fn refused(refusal: &Refused) -> Response {
    let status = StatusCode::from_u16(refusal.status()).unwrap_or(StatusCode::GONE);
    page(
        status,
        "This link decides nothing",
        &format!("<p class=\"refused\">{}</p>", html(&refusal.to_string())),
    )
}

fn failed(e: &Error) -> Response {
    tracing::warn!("a link's page: {}", crate::error::chain_line(e));
    page(
        StatusCode::SERVICE_UNAVAILABLE,
        "Not now",
        "<p class=\"refused\">The server could not read the link just now; nothing was decided. \
         Try again in a moment.</p>",
    )
}

const STYLE: &str = "body{font:16px/1.5 system-ui,sans-serif;max-width:40rem;margin:2rem auto;\
padding:0 1rem;color:#222}pre{white-space:pre-wrap;background:#f4f4f4;padding:.75rem;\
border-radius:4px}label{display:block;margin-top:1rem}textarea,input{width:100%;\
box-sizing:border-box;font:inherit}button{margin-top:1rem;font:inherit;padding:.5rem 1.25rem}\
.error,.refused{color:#a00}.done{color:#070}.note{color:#666;font-size:.9em}";

/// A whole page, with the headers every link page has.
fn page(status: StatusCode, title: &str, body: &str) -> Response {
    let text = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" \
         content=\"width=device-width,initial-scale=1\"><meta name=\"robots\" content=\"noindex\">\
         <title>{0}</title><style>{STYLE}</style></head><body><h1>{0}</h1>{body}</body></html>",
        html(title)
    );
    let mut response =
        (status, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], text).into_response();
    // The page's own policy: inline style, a form that posts only to itself, nothing else.
    response.headers_mut().insert(
        "content-security-policy",
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; base-uri 'none'; \
             frame-ancestors 'none'",
        ),
    );
    response
}
