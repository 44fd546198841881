//! Judging one finished thread: its outcome (it completed, returning 0) and each check of the
//! eval (a JSONata expression over the thread as [`document`] lays it out).

use serde::Serialize;
use serde_json::{Value, json};

use crate::store::evals::Check;
use crate::store::records::{EndStatus, ThreadRecord};

/// What a thread was judged.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    /// Its outcome and every check passed.
    pub passed: bool,
    /// How it stands: `completed`, `failed`, `killed`, or a status it rests in.
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub return_code: Option<i32>,
    /// Each check, in the order the eval lists them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<CheckResult>,
    /// Why it did not pass, a line each.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
}

/// One check of one thread.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckResult {
    pub name: String,
    pub passed: bool,
    /// Why it could not be evaluated, if it could not (a failure).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Thread `record` judged by its outcome and `checks`.
pub fn judge(record: &ThreadRecord, checks: &[Check]) -> Verdict {
    let mut reasons = Vec::new();
    let (status, return_code) = match &record.end {
        Some(end) => (end.end.status.as_str().to_string(), Some(end.end.return_code)),
        None => (record.status().as_str().to_string(), None),
    };
    match &record.end {
        Some(end) if end.end.status == EndStatus::Completed && end.end.return_code == 0 => {}
        Some(end) => reasons.push(format!(
            "it {} with return code {}: {}",
            end.end.status.as_str(),
            end.end.return_code,
            crate::terminal::line(&end.end.summary)
        )),
        None => reasons.push(format!("it has not ended: it is {status}")),
    }
    let document = document(record);
    let checks: Vec<CheckResult> = checks
        .iter()
        .map(|check| {
            match uncaged_workflow_declarative::expr::evaluate_with_variables(
                &check.expression,
                &document,
            ) {
                Ok(passed) => CheckResult { name: check.name.clone(), passed, error: None },
                Err(error) => {
                    CheckResult { name: check.name.clone(), passed: false, error: Some(error) }
                }
            }
        })
        .collect();
    for check in checks.iter().filter(|c| !c.passed) {
        reasons.push(match &check.error {
            Some(error) => format!("check `{}` could not be evaluated: {error}", check.name),
            None => format!("check `{}` is false", check.name),
        });
    }
    Verdict { passed: reasons.is_empty(), status, return_code, checks, reasons }
}

/// Thread `record` as a check reads it, each key also a variable (`$steps`, `$status` …):
/// `prompt`; `status` and `returnCode`; `summary` (its result's summary); `steps`, the last
/// step of each role by role (`content`, `meta`, `agent`, `tokens`, `costUsd`); `history`,
/// every step in order (`role`, `content`, `meta`); `stepCount`, `tokens`, `costUsd` and
/// `durationMs` of the whole thread.
pub fn document(record: &ThreadRecord) -> Value {
    let mut steps = serde_json::Map::new();
    for step in &record.steps {
        let usage = step.usage.as_ref();
        steps.insert(
            step.role.clone(),
            json!({
                "content": step.content,
                "meta": step.meta,
                "agent": step.agent,
                "tokens": usage.map_or(0, |u| u.input_tokens + u.output_tokens),
                "costUsd": usage.and_then(|u| u.cost_usd),
            }),
        );
    }
    let history: Vec<Value> = record
        .steps
        .iter()
        .map(|s| json!({"role": s.role, "content": s.content, "meta": s.meta}))
        .collect();
    let usage = record.usage();
    let end = record.end.as_ref();
    json!({
        "prompt": record.start.parameters.prompt,
        "status": end.map_or(record.status().as_str(), |e| e.end.status.as_str()),
        "returnCode": end.map(|e| e.end.return_code),
        "summary": end.map(|e| e.end.summary.as_str()),
        "steps": steps,
        "history": history,
        "stepCount": record.steps.len(),
        "tokens": usage.as_ref().map_or(0, |u| u.input_tokens + u.output_tokens),
        "costUsd": usage.as_ref().and_then(|u| u.cost_usd),
        "durationMs": end.map(|e| e.timestamp.saturating_sub(record.start.timestamp)),
    })
}

/// Checks an eval's checks before anything runs: names unique and set, expressions that
/// parse and call only what a condition may.
pub fn validate(checks: &[Check]) -> crate::Result<()> {
    let mut seen = std::collections::HashSet::new();
    for check in checks {
        let name = crate::terminal::line(&check.name);
        if check.name.trim().is_empty() || !seen.insert(check.name.as_str()) {
            return Err(crate::Error::Usage(format!(
                "check `{name}`: every check needs a name of its own"
            )));
        }
        if let Err(e) = uncaged_workflow_declarative::expr::check(&check.expression) {
            return Err(crate::Error::Usage(format!(
                "check `{name}`: `{}` {} (at offset {})",
                crate::terminal::line(&check.expression),
                e.message,
                e.offset
            )));
        }
    }
    Ok(())
}
