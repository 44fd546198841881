//! Two threads compared step by step (a fork and its original, a thread before and after a
//! version change): each position the same, changed (which of role, content, meta), or held
//! by one thread only. Timestamps, durations and agents are how a step ran, not what it is,
//! and are not compared.

use serde::Serialize;

use crate::store::records::{StepRecord, ThreadRecord};

/// One position of two threads.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum StepDiff {
    Same { index: usize, role: String },
    Changed { index: usize, fields: Vec<&'static str>, a: Box<StepRecord>, b: Box<StepRecord> },
    OnlyInA { index: usize, step: StepRecord },
    OnlyInB { index: usize, step: StepRecord },
}

/// The steps of `a` and `b` compared position by position (1-based indexes).
pub fn diff(a: &ThreadRecord, b: &ThreadRecord) -> Vec<StepDiff> {
    let longest = a.steps.len().max(b.steps.len());
    (0..longest)
        .map(|i| {
            let index = i + 1;
            match (a.steps.get(i), b.steps.get(i)) {
                (Some(x), Some(y)) => {
                    let mut fields = Vec::new();
                    if x.role != y.role {
                        fields.push("role");
                    }
                    if x.content != y.content {
                        fields.push("content");
                    }
                    if x.meta != y.meta {
                        fields.push("meta");
                    }
                    match fields.is_empty() {
                        true => StepDiff::Same { index, role: x.role.clone() },
                        false => StepDiff::Changed {
                            index,
                            fields,
                            a: Box::new(x.clone()),
                            b: Box::new(y.clone()),
                        },
                    }
                }
                (Some(x), None) => StepDiff::OnlyInA { index, step: x.clone() },
                (None, Some(y)) => StepDiff::OnlyInB { index, step: y.clone() },
                (None, None) => unreachable!("an index below the longer thread's length"),
            }
        })
        .collect()
}
