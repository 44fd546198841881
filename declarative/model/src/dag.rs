//! Planning a DAG: from the thread's recorded steps, which steps are done, which run next
//! (all that are ready, at once), which are skipped, and when the thread is over.
//!
//! A step that succeeded is a recorded step of its own role (named by its id); one that
//! failed or was skipped is a step of [`STATUS_ROLE`] whose meta says which and why; a
//! person's decision under `ask_user` is a step of [`USER_ROLE`]. Nothing else is kept, so a
//! resumed or forked thread plans exactly as the thread it continues.

use std::collections::HashMap;

use serde_json::{Value, json};

use crate::{
    DagStep, FailurePolicy, MAX_PARALLEL, OnStepFailure, RETURN_FAILED, RETURN_PARTIAL,
    STATUS_ROLE, StepView, USER_ROLE, expr,
};

/// What a step has come to.
#[derive(Debug, Clone, PartialEq)]
pub enum Status<'a> {
    Succeeded(&'a Value),
    Failed(String),
    Skipped(String),
}

/// What the interpreter does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Record these steps as skipped and these as failed (with why), and run these (their
    /// agents at once); all in one group.
    Stage { skip: Vec<(String, String)>, fail: Vec<(String, String)>, run: Vec<String> },
    /// Ask a person what to do about a failed step.
    Ask { step: String, error: String },
    /// The thread is over.
    End { return_code: i32, summary: String },
}

/// A person's answer to [`Action::Ask`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Retry,
    Skip,
    Abort,
}

impl Decision {
    /// Reads an answer: `retry`, `skip` or `abort` (any case, surrounding blanks ignored).
    pub fn parse(answer: &str) -> Option<Decision> {
        match answer.trim().to_ascii_lowercase().as_str() {
            "retry" => Some(Decision::Retry),
            "skip" => Some(Decision::Skip),
            "abort" => Some(Decision::Abort),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Retry => "retry",
            Decision::Skip => "skip",
            Decision::Abort => "abort",
        }
    }
}

/// The meta of a [`STATUS_ROLE`] step.
pub fn status_meta(step: &str, status: &Status<'_>) -> Value {
    match status {
        Status::Succeeded(_) => json!({ "step": step, "status": "succeeded" }),
        Status::Failed(error) => json!({ "step": step, "status": "failed", "error": error }),
        Status::Skipped(reason) => json!({ "step": step, "status": "skipped", "reason": reason }),
    }
}

/// The meta of a [`USER_ROLE`] step.
pub fn decision_meta(step: &str, decision: Decision) -> Value {
    json!({ "step": step, "decision": decision.as_str() })
}

/// JSON Schema of the [`STATUS_ROLE`] role's meta.
pub fn status_schema() -> Value {
    json!({
        "type": "object",
        "required": ["step", "status"],
        "properties": {
            "step": { "type": "string" },
            "status": { "enum": ["failed", "skipped"] },
            "error": { "type": "string" },
            "reason": { "type": "string" }
        }
    })
}

/// JSON Schema of the [`USER_ROLE`] role's meta.
pub fn decision_schema() -> Value {
    json!({
        "type": "object",
        "required": ["step", "decision"],
        "properties": {
            "step": { "type": "string" },
            "decision": { "enum": ["retry", "skip", "abort"] }
        }
    })
}

/// Every step's status after `history` (steps not yet run are absent), and the step a person
/// aborted on, if one did.
pub fn statuses<'a>(history: &[StepView<'a>]) -> (HashMap<&'a str, Status<'a>>, Option<&'a str>) {
    let mut status = HashMap::new();
    let mut aborted = None;
    for step in history {
        let named = step.meta.get("step").and_then(Value::as_str);
        match (step.role, named) {
            (STATUS_ROLE, Some(id)) => {
                let text =
                    |key| step.meta.get(key).and_then(Value::as_str).unwrap_or("").to_string();
                let s = match step.meta.get("status").and_then(Value::as_str) {
                    Some("skipped") => Status::Skipped(text("reason")),
                    _ => Status::Failed(text("error")),
                };
                status.insert(id, s);
            }
            (USER_ROLE, Some(id)) => {
                match step.meta.get("decision").and_then(Value::as_str).and_then(Decision::parse) {
                    Some(Decision::Retry) => {
                        status.remove(id);
                    }
                    Some(Decision::Skip) => {
                        status.insert(id, Status::Skipped("skipped by the user".into()));
                    }
                    Some(Decision::Abort) => aborted = Some(id),
                    None => {}
                }
            }
            (role, _) => {
                status.insert(role, Status::Succeeded(step.meta));
            }
        }
    }
    (status, aborted)
}

/// What a step's `when` reads besides the steps: the thread's prompt and trigger data.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    pub prompt: &'a str,
    pub trigger_data: &'a Value,
}

/// What a `when` condition is evaluated over (and binds as variables): `steps` (each settled
/// step's `output` and `status`), `trigger_data` and `prompt`.
pub fn condition_input(status: &HashMap<&str, Status<'_>>, scope: Scope<'_>) -> Value {
    let steps: serde_json::Map<String, Value> = status
        .iter()
        .map(|(id, s)| {
            let (output, word) = match s {
                Status::Succeeded(meta) => ((*meta).clone(), "succeeded"),
                Status::Failed(_) => (Value::Null, "failed"),
                Status::Skipped(_) => (Value::Null, "skipped"),
            };
            (id.to_string(), json!({ "output": output, "status": word }))
        })
        .collect();
    json!({ "steps": steps, "trigger_data": scope.trigger_data, "prompt": scope.prompt })
}

/// What to do after `history`. `steps` are in topological order (the host sorts them).
pub fn plan(
    steps: &[DagStep],
    policy: &FailurePolicy,
    history: &[StepView<'_>],
    scope: Scope<'_>,
) -> Action {
    let (mut status, aborted) = statuses(history);
    if let Some(step) = aborted {
        return Action::End {
            return_code: RETURN_FAILED,
            summary: format!("aborted by the user after step `{step}` failed"),
        };
    }
    // The first failure whose policy stops or asks decides; the others let the rest go on.
    for s in steps {
        let Some(Status::Failed(error)) = status.get(s.id.as_str()) else { continue };
        let (step, error) = (s.id.clone(), error.clone());
        match s.on_failure(policy) {
            OnStepFailure::Stop => {
                return Action::End {
                    return_code: RETURN_FAILED,
                    summary: format!("step `{step}` failed, and the policy is `stop`: {error}"),
                };
            }
            OnStepFailure::AskUser => return Action::Ask { step, error },
            OnStepFailure::SkipDependents | OnStepFailure::Continue => {}
        }
    }
    // A failed step whose policy is `continue` counts as done for the steps after it.
    let carries_on = |id: &str, status: &HashMap<&str, Status<'_>>| {
        matches!(status.get(id), Some(Status::Failed(_)))
            && steps.iter().any(|s| s.id == id && s.on_failure(policy) == OnStepFailure::Continue)
    };
    let mut skip = Vec::new();
    let mut fail = Vec::new();
    let mut run = Vec::new();
    // Built at the first `when` to decide, from the steps settled by then.
    let mut condition: Option<Value> = None;
    // Topological order: a step's dependencies are settled (or skipped above) before it.
    for step in steps {
        if status.contains_key(step.id.as_str()) {
            continue;
        }
        let blocked = step.depends_on.iter().find_map(|d| match status.get(d.as_str()) {
            Some(Status::Failed(_)) if carries_on(d, &status) => None,
            Some(Status::Failed(_)) => Some(format!("`{d}`, which failed")),
            Some(Status::Skipped(_)) => Some(format!("`{d}`, which was skipped")),
            _ => None,
        });
        if let Some(why) = blocked {
            let reason = format!("it depends on {why}");
            status.insert(&step.id, Status::Skipped(reason.clone()));
            skip.push((step.id.clone(), reason));
            continue;
        }
        let ready = step.depends_on.iter().all(|d| {
            matches!(status.get(d.as_str()), Some(Status::Succeeded(_))) || carries_on(d, &status)
        });
        if !ready || run.len() >= MAX_PARALLEL {
            continue;
        }
        if let Some(when) = &step.when {
            let input = condition.get_or_insert_with(|| condition_input(&status, scope));
            match expr::evaluate_with_variables(when, input) {
                Ok(true) => {}
                Ok(false) => {
                    let reason = format!("{BY_CONDITION}`{when}` is false");
                    status.insert(&step.id, Status::Skipped(reason.clone()));
                    skip.push((step.id.clone(), reason));
                    continue;
                }
                Err(e) => {
                    let error = format!("{BY_CONDITION}`{when}` could not be evaluated: {e}");
                    status.insert(&step.id, Status::Failed(error.clone()));
                    fail.push((step.id.clone(), error));
                    continue;
                }
            }
        }
        run.push(step.id.clone());
    }
    if !skip.is_empty() || !fail.is_empty() || !run.is_empty() {
        return Action::Stage { skip, fail, run };
    }
    let with = |f: fn(&Status<'_>) -> bool| -> Vec<&str> {
        steps
            .iter()
            .filter(|s| status.get(s.id.as_str()).is_some_and(f))
            .map(|s| s.id.as_str())
            .collect()
    };
    let failed = with(|s| matches!(s, Status::Failed(_)));
    let skipped = with(|s| matches!(s, Status::Skipped(_)));
    if failed.is_empty() && skipped.is_empty() {
        return Action::End {
            return_code: 0,
            summary: format!("all {} steps succeeded", steps.len()),
        };
    }
    let mut parts = vec![format!(
        "{} of {} steps succeeded",
        steps.len() - failed.len() - skipped.len(),
        steps.len()
    )];
    if !failed.is_empty() {
        parts.push(format!("failed: {}", failed.join(", ")));
    }
    if !skipped.is_empty() {
        parts.push(format!("skipped: {}", skipped.join(", ")));
    }
    // Steps a condition left out (and the steps that needed them) are the workflow working
    // as written; a failure, or a skip that follows from one, makes the run partial.
    let return_code = if failed.is_empty() && !skips_follow_a_failure(steps, &status) {
        0
    } else {
        RETURN_PARTIAL
    };
    Action::End { return_code, summary: parts.join("; ") }
}

/// The start of the reason of a step a false `when` skipped.
const BY_CONDITION: &str = "its condition ";

/// Whether a skipped step was skipped because something failed: by a person (after its
/// failure), or because it depends on such a step; not when a condition skipped it, or it
/// depends only on steps a condition skipped.
fn skips_follow_a_failure(steps: &[DagStep], status: &HashMap<&str, Status<'_>>) -> bool {
    let mut after_failure: HashMap<&str, bool> = HashMap::new();
    // Topological order: a step's dependencies are decided before it.
    for step in steps {
        let affected = match status.get(step.id.as_str()) {
            Some(Status::Failed(_)) => true,
            Some(Status::Skipped(reason)) if reason.starts_with(BY_CONDITION) => false,
            Some(Status::Skipped(reason)) if reason.starts_with("it depends on") => {
                step.depends_on.iter().any(|d| after_failure.get(d.as_str()) == Some(&true))
            }
            Some(Status::Skipped(_)) => true,
            _ => false,
        };
        after_failure.insert(&step.id, affected);
    }
    steps.iter().any(|s| {
        matches!(status.get(s.id.as_str()), Some(Status::Skipped(_)))
            && after_failure[s.id.as_str()]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(id: &str, deps: &[&str]) -> DagStep {
        DagStep {
            id: id.into(),
            depends_on: deps.iter().map(|d| d.to_string()).collect(),
            inputs: Default::default(),
            when: None,
            retry: None,
            on_failure: None,
            for_each: None,
            timeout_ms: None,
            workflow: None,
            instructions: None,
            expected_output: None,
        }
    }

    const SCOPE: Scope<'static> = Scope { prompt: "fix it", trigger_data: &Value::Null };

    fn plan(steps: &[DagStep], policy: &FailurePolicy, history: &[StepView<'_>]) -> Action {
        super::plan(steps, policy, history, SCOPE)
    }

    /// 004's example: A fails; B depends on A, D on B; C is independent.
    fn dag() -> Vec<DagStep> {
        vec![step("a", &[]), step("c", &[]), step("b", &["a"]), step("d", &["b"])]
    }

    fn policy(on: OnStepFailure) -> FailurePolicy {
        FailurePolicy { on_step_failure: on, ..FailurePolicy::default() }
    }

    fn failed(id: &str) -> Value {
        status_meta(id, &Status::Failed("boom".into()))
    }

    #[test]
    fn independent_steps_run_together() {
        let action = plan(&dag(), &policy(OnStepFailure::Stop), &[]);
        assert_eq!(
            action,
            Action::Stage { skip: vec![], fail: vec![], run: vec!["a".into(), "c".into()] }
        );
    }

    #[test]
    fn skip_dependents_skips_transitively_and_lets_the_rest_finish() {
        let ok = json!({});
        let fail = failed("a");
        let h = [StepView { role: STATUS_ROLE, meta: &fail }, StepView { role: "c", meta: &ok }];
        let action = plan(&dag(), &policy(OnStepFailure::SkipDependents), &h);
        let Action::Stage { skip, run, .. } = action else { panic!("{action:?}") };
        assert_eq!(skip.iter().map(|s| s.0.as_str()).collect::<Vec<_>>(), ["b", "d"]);
        assert!(skip[1].1.contains("`b`, which was skipped"), "{skip:?}");
        assert!(run.is_empty());
        let b = status_meta("b", &Status::Skipped(skip[0].1.clone()));
        let d = status_meta("d", &Status::Skipped(skip[1].1.clone()));
        let mut h = h.to_vec();
        h.push(StepView { role: STATUS_ROLE, meta: &b });
        h.push(StepView { role: STATUS_ROLE, meta: &d });
        let Action::End { return_code, summary } =
            plan(&dag(), &policy(OnStepFailure::SkipDependents), &h)
        else {
            panic!()
        };
        assert_eq!(return_code, RETURN_PARTIAL);
        assert_eq!(summary, "1 of 4 steps succeeded; failed: a; skipped: b, d");
    }

    #[test]
    fn stop_ends_the_thread() {
        let fail = failed("a");
        let h = [StepView { role: STATUS_ROLE, meta: &fail }];
        let Action::End { return_code, .. } = plan(&dag(), &policy(OnStepFailure::Stop), &h) else {
            panic!()
        };
        assert_eq!(return_code, RETURN_FAILED);
    }

    #[test]
    fn ask_user_asks_then_follows_the_decision() {
        let fail = failed("a");
        let p = policy(OnStepFailure::AskUser);
        let mut h = vec![StepView { role: STATUS_ROLE, meta: &fail }];
        assert_eq!(plan(&dag(), &p, &h), Action::Ask { step: "a".into(), error: "boom".into() });
        let retry = decision_meta("a", Decision::Retry);
        h.push(StepView { role: USER_ROLE, meta: &retry });
        assert_eq!(
            plan(&dag(), &p, &h),
            Action::Stage { skip: vec![], fail: vec![], run: vec!["a".into(), "c".into()] }
        );
        let skip = decision_meta("a", Decision::Skip);
        h.push(StepView { role: USER_ROLE, meta: &skip });
        let Action::Stage { skip, run, .. } = plan(&dag(), &p, &h) else { panic!() };
        assert_eq!((skip.len(), run), (2, vec!["c".to_string()]));
        let abort = decision_meta("a", Decision::Abort);
        h.push(StepView { role: USER_ROLE, meta: &abort });
        assert!(matches!(plan(&dag(), &p, &h), Action::End { return_code: RETURN_FAILED, .. }));
    }

    #[test]
    fn a_false_condition_skips_the_step_and_its_dependents_follow() {
        let mut steps = vec![step("triage", &[]), step("fix", &["triage"]), step("test", &["fix"])];
        steps[1].when = Some("$steps.triage.output.severity = 'high'".into());
        let low = json!({ "severity": "low" });
        let h = [StepView { role: "triage", meta: &low }];
        let p = policy(OnStepFailure::Stop);
        let Action::Stage { skip, fail, run } = plan(&steps, &p, &h) else { panic!() };
        // The step, and in the same stage the step that depends on it.
        let why: Vec<(&str, &str)> = skip.iter().map(|(s, r)| (s.as_str(), r.as_str())).collect();
        assert_eq!(
            why,
            [
                ("fix", "its condition `$steps.triage.output.severity = 'high'` is false"),
                ("test", "it depends on `fix`, which was skipped"),
            ]
        );
        assert!(fail.is_empty() && run.is_empty());
        let skipped = status_meta("fix", &Status::Skipped(skip[0].1.clone()));
        let test = status_meta("test", &Status::Skipped(skip[1].1.clone()));
        let h3 = [
            h[0],
            StepView { role: STATUS_ROLE, meta: &skipped },
            StepView { role: STATUS_ROLE, meta: &test },
        ];
        let Action::End { return_code, summary } = plan(&steps, &p, &h3) else { panic!() };
        assert_eq!(
            (return_code, summary.as_str()),
            (0, "1 of 3 steps succeeded; skipped: fix, test")
        );
        // High severity: it runs.
        let high = json!({ "severity": "high" });
        let h = [StepView { role: "triage", meta: &high }];
        assert_eq!(
            plan(&steps, &p, &h),
            Action::Stage { skip: vec![], fail: vec![], run: vec!["fix".into()] }
        );
    }

    #[test]
    fn a_condition_reads_the_trigger_data_and_one_that_cannot_be_evaluated_fails_its_step() {
        let mut steps = vec![step("a", &[])];
        steps[0].when = Some("$count($trigger_data.items) > 0".into());
        let data = json!({ "items": [1] });
        let scope = Scope { prompt: "", trigger_data: &data };
        let p = policy(OnStepFailure::Stop);
        assert!(
            matches!(super::plan(&steps, &p, &[], scope), Action::Stage { ref run, .. } if run == &["a"])
        );
        let none = json!({ "items": [] });
        let scope = Scope { prompt: "", trigger_data: &none };
        assert!(
            matches!(super::plan(&steps, &p, &[], scope), Action::Stage { ref skip, .. } if skip.len() == 1)
        );
        steps[0].when = Some("$error('no')".into());
        let Action::Stage { fail, .. } = plan(&steps, &p, &[]) else { panic!() };
        assert!(fail[0].1.contains("could not be evaluated"), "{fail:?}");
    }

    #[test]
    fn a_steps_own_policy_overrides_the_workflows() {
        // The workflow stops on a failure, but `a` continues: `b` runs on its null output.
        let mut steps = dag();
        steps[0].on_failure = Some(OnStepFailure::Continue);
        let fail = failed("a");
        let ok = json!({});
        let p = policy(OnStepFailure::Stop);
        let h = [StepView { role: STATUS_ROLE, meta: &fail }, StepView { role: "c", meta: &ok }];
        assert_eq!(
            plan(&steps, &p, &h),
            Action::Stage { skip: vec![], fail: vec![], run: vec!["b".into()] }
        );
        let h = [h[0], h[1], StepView { role: "b", meta: &ok }, StepView { role: "d", meta: &ok }];
        let Action::End { return_code, summary } = plan(&steps, &p, &h) else { panic!() };
        assert_eq!(
            (return_code, summary.as_str()),
            (RETURN_PARTIAL, "3 of 4 steps succeeded; failed: a")
        );
        // The workflow continues past failures, but `a` stops it.
        let mut steps = dag();
        steps[0].on_failure = Some(OnStepFailure::Stop);
        let h = [StepView { role: STATUS_ROLE, meta: &fail }];
        let action = plan(&steps, &policy(OnStepFailure::SkipDependents), &h);
        assert!(matches!(action, Action::End { return_code: RETURN_FAILED, .. }), "{action:?}");
    }

    #[test]
    fn retries_back_off_up_to_their_bound() {
        let retry = crate::Retry { max: 5, delay_ms: 100, backoff: 3.0, max_delay_ms: Some(1000) };
        let delays: Vec<u32> = (1..=4).map(|n| retry.delay_before(n)).collect();
        assert_eq!(delays, [100, 300, 900, 1000]);
        let policy =
            FailurePolicy { max_retries: 2, retry_delay_ms: 500, ..FailurePolicy::default() };
        let inherited = step("a", &[]).retry(&policy);
        assert_eq!((inherited.max, inherited.delay_before(3)), (2, 2000));
    }
}
