//! Fixture: role `judge` declares `{"type": 12}`, which is no JSON Schema; `add` must refuse it.

use uncaged_workflow_sdk::{Next, Role, ThreadContext, Workflow, export_workflow, json};

struct BadSchema;

impl Workflow for BadSchema {
    const DESCRIPTION: &'static str = "A bundle with an invalid schema (a test fixture).";

    fn roles() -> Vec<Role> {
        vec![Role::new("judge", "Judges").schema(json!({"type": 12}))]
    }

    fn moderator(_: &ThreadContext) -> Next {
        Next::role("judge")
    }
}

export_workflow!(BadSchema);
