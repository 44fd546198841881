//! Routing a role graph: from the role that just finished, the first transition whose
//! condition holds (a transition without one always holds).

use serde_json::{Value, json};

use crate::{END, Node, START, StepView, expr};

/// Where a graph goes next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Run this role.
    Role(String),
    /// The thread is over: a transition went to [`END`].
    End,
}

/// Why a graph cannot go on: the thread fails with this message.
pub type RouteError = String;

/// The next role after `history` (the thread's steps, oldest first).
pub fn route(nodes: &[Node], history: &[StepView<'_>]) -> Result<Route, RouteError> {
    let from = history.last().map_or(START, |s| s.role);
    let node = nodes
        .iter()
        .find(|n| n.from == from)
        .ok_or_else(|| format!("the graph has no transitions from `{from}`"))?;
    // `history` grows with the thread: it is built only for conditions that read it, so that
    // routing a long thread stays as cheap per step as routing a short one.
    let reads_history = node
        .transitions
        .iter()
        .filter_map(|t| t.condition.as_deref())
        .any(|c| c.contains("history"));
    let conditional = node.transitions.iter().any(|t| t.condition.is_some());
    let input = match history.split_last() {
        // Unconditional transitions need no input.
        _ if !conditional => Value::Null,
        None => json!({ "role": START, "meta": {}, "depth": 0, "history": [] }),
        Some((last, earlier)) => {
            let earlier: Vec<Value> = if reads_history {
                earlier.iter().map(|s| json!({ "role": s.role, "meta": s.meta })).collect()
            } else {
                Vec::new()
            };
            json!({ "role": last.role, "meta": last.meta, "depth": history.len(), "history": earlier })
        }
    };
    for transition in &node.transitions {
        let holds = match &transition.condition {
            None => true,
            Some(condition) => expr::evaluate(condition, &input).map_err(|e| {
                format!(
                    "the condition `{condition}` (from `{from}` to `{}`) failed: {e}",
                    transition.to
                )
            })?,
        };
        if holds {
            return Ok(if transition.to == END {
                Route::End
            } else {
                Route::Role(transition.to.clone())
            });
        }
    }
    Err(format!("no transition from `{from}` holds (add one without a condition as the fallback)"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Transition;

    fn t(to: &str, condition: Option<&str>) -> Transition {
        Transition { to: to.into(), condition: condition.map(Into::into) }
    }

    /// The 002 example graph.
    fn graph() -> Vec<Node> {
        vec![
            Node { from: START.into(), transitions: vec![t("planner", None)] },
            Node {
                from: "planner".into(),
                transitions: vec![
                    t("developer", Some("$not($exists(meta.needsClarification))")),
                    t(END, None),
                ],
            },
            Node { from: "developer".into(), transitions: vec![t("reviewer", None)] },
            Node {
                from: "reviewer".into(),
                transitions: vec![t("developer", Some("meta.approved = false")), t(END, None)],
            },
        ]
    }

    #[test]
    fn routes_the_002_example() {
        let g = graph();
        let plan = json!({"steps": ["a"]});
        let unclear = json!({"needsClarification": "which file?"});
        let rejected = json!({"approved": false});
        let approved = json!({"approved": true});
        let step = |role, meta| StepView { role, meta };
        assert_eq!(route(&g, &[]), Ok(Route::Role("planner".into())));
        assert_eq!(route(&g, &[step("planner", &unclear)]), Ok(Route::End));
        let mut h = vec![step("planner", &plan)];
        assert_eq!(route(&g, &h), Ok(Route::Role("developer".into())));
        h.push(step("developer", &plan));
        h.push(step("reviewer", &rejected));
        assert_eq!(route(&g, &h), Ok(Route::Role("developer".into())));
        h.push(step("developer", &plan));
        h.push(step("reviewer", &approved));
        assert_eq!(route(&g, &h), Ok(Route::End));
    }

    #[test]
    fn a_condition_on_history_sees_every_earlier_step() {
        let g = vec![
            Node { from: START.into(), transitions: vec![t("dev", None)] },
            Node {
                from: "dev".into(),
                transitions: vec![
                    t(END, Some("$count(history[role = 'dev']) >= 2")),
                    t("dev", None),
                ],
            },
        ];
        let meta = json!({});
        let step = StepView { role: "dev", meta: &meta };
        assert_eq!(route(&g, &[step, step]), Ok(Route::Role("dev".into())));
        assert_eq!(route(&g, &[step, step, step]), Ok(Route::End));
    }

    #[test]
    fn no_holding_transition_is_an_error_naming_the_role() {
        let g = vec![Node { from: START.into(), transitions: vec![t("a", Some("false"))] }];
        assert!(route(&g, &[]).unwrap_err().contains("from `$START`"));
    }
}
