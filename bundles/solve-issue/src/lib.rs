//! `solve-issue`: a planner plans, a developer implements, a reviewer reviews; the developer
//! goes again until the reviewer approves or the thread runs out of rounds.

use uncaged_workflow_sdk::{Next, Role, ThreadContext, Value, Workflow, export_workflow, json};

struct SolveIssue;

impl Workflow for SolveIssue {
    const DESCRIPTION: &'static str = "Solve an issue: a planner breaks it into steps, a developer \
        implements them, and a reviewer reviews the change; the developer revises until the \
        reviewer approves.";

    const MAX_ROUNDS: u32 = 10;

    /// A tracker's webhook or a caller may say which issue: its number and title.
    fn input_schema() -> Option<Value> {
        Some(json!({
            "type": "object",
            "properties": {
                "issue": {"type": "integer", "minimum": 1, "description": "The issue's number"},
                "title": {"type": "string", "maxLength": 512, "description": "The issue's title"}
            }
        }))
    }

    fn roles() -> Vec<Role> {
        vec![
            Role::new("planner", "Breaks the issue into a short, ordered plan")
                .system_prompt(
                    "You are the planner. Read the issue and write a short, ordered plan a \
                     developer can follow. Name the files you expect to change.",
                )
                .extract_prompt("List the plan's steps in order and the files it touches.")
                .schema(json!({
                    "type": "object",
                    "required": ["steps"],
                    "properties": {
                        "steps": { "type": "array", "items": { "type": "string" }, "minItems": 1 },
                        "files": { "type": "array", "items": { "type": "string" } }
                    },
                    "examples": [{
                        "steps": ["Reproduce the bug with a failing test", "Fix the parser", "Run the tests"],
                        "files": ["src/parser.rs", "tests/parser.rs"]
                    }]
                })),
            Role::new("developer", "Implements the plan, or addresses the reviewer's comments")
                .system_prompt(
                    "You are the developer. Implement the planner's plan. If the reviewer left \
                     comments, address every one of them. Report what you changed.",
                )
                .extract_prompt("Summarise the change and list the files changed.")
                .schema(json!({
                    "type": "object",
                    "required": ["summary"],
                    "properties": {
                        "summary": { "type": "string" },
                        "files_changed": { "type": "array", "items": { "type": "string" } }
                    },
                    "examples": [{
                        "summary": "Fixed the off-by-one in the parser and added a regression test",
                        "files_changed": ["src/parser.rs", "tests/parser.rs"]
                    }]
                })),
            Role::new("reviewer", "Reviews the change; approves it or asks for changes")
                .system_prompt(
                    "You are the reviewer. Review the developer's latest change against the \
                     issue and the plan. Approve only if it is correct and tested; otherwise \
                     say exactly what must change.",
                )
                .extract_prompt("Did the reviewer approve? List the requested changes, if any.")
                .schema(json!({
                    "type": "object",
                    "required": ["approved"],
                    "properties": {
                        "approved": { "type": "boolean" },
                        "comments": { "type": "array", "items": { "type": "string" } }
                    },
                    "examples": [
                        { "approved": false, "comments": ["Handle the empty-input case"] },
                        { "approved": true, "comments": [] }
                    ]
                })),
        ]
    }

    fn moderator(thread: &ThreadContext) -> Next {
        let Some(last) = thread.last() else {
            return Next::role("planner");
        };
        match last.role.as_str() {
            "planner" => Next::role("developer"),
            "developer" => Next::role("reviewer"),
            "reviewer" if last.meta["approved"] == json!(true) => {
                let rounds = thread.count("developer");
                Next::done(format!("approved after {rounds} development round(s)"))
            }
            "reviewer" => Next::role("developer"),
            other => Next::fail(1, format!("unexpected role `{other}` in thread")),
        }
    }
}

export_workflow!(SolveIssue);
