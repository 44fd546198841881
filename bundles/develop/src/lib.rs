//! `develop`: a developer makes a change and a tester checks it; the developer goes again
//! until the tests pass or the thread runs out of rounds.

use uncaged_workflow_sdk::{Next, Role, ThreadContext, Workflow, export_workflow, json};

struct Develop;

impl Workflow for Develop {
    const DESCRIPTION: &'static str = "Develop a change: a developer implements the request and \
        a tester runs the checks; the developer fixes failures until everything passes.";

    const MAX_ROUNDS: u32 = 8;

    fn roles() -> Vec<Role> {
        vec![
            Role::new("developer", "Implements the request, or fixes the failing checks")
                .system_prompt(
                    "You are the developer. Implement the request. If the tester reported \
                     failures, fix each of them. Report what you changed.",
                )
                .extract_prompt("Summarise the change.")
                .schema(json!({
                    "type": "object",
                    "required": ["summary"],
                    "properties": { "summary": { "type": "string" } },
                    "examples": [{ "summary": "Implemented the requested change" }]
                })),
            Role::new("tester", "Runs the checks and reports failures")
                .system_prompt(
                    "You are the tester. Run the project's checks against the developer's \
                     change and report whether they pass, listing each failure.",
                )
                .extract_prompt("Did all checks pass? List the failures.")
                .schema(json!({
                    "type": "object",
                    "required": ["passed"],
                    "properties": {
                        "passed": { "type": "boolean" },
                        "failures": { "type": "array", "items": { "type": "string" } }
                    },
                    "examples": [
                        { "passed": false, "failures": ["test_empty_input fails"] },
                        { "passed": true, "failures": [] }
                    ]
                })),
        ]
    }

    fn moderator(thread: &ThreadContext) -> Next {
        match thread.last() {
            None => Next::role("developer"),
            Some(last) if last.role == "developer" => Next::role("tester"),
            Some(last) if last.meta["passed"] == json!(true) => Next::done(format!(
                "checks pass after {} development round(s)",
                thread.count("developer")
            )),
            Some(_) => Next::role("developer"),
        }
    }
}

export_workflow!(Develop);
