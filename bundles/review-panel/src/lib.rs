//! `review-panel`: a developer answers, then three reviewers (security, tests, style) review
//! the change at once; the developer revises until all three approve.

use uncaged_workflow_sdk::{Next, Role, ThreadContext, Value, Workflow, export_workflow, json};

/// The reviewers, in the order their steps are recorded.
const REVIEWERS: [&str; 3] = ["security-reviewer", "tests-reviewer", "style-reviewer"];

struct ReviewPanel;

impl Workflow for ReviewPanel {
    const DESCRIPTION: &'static str = "Review panel: a developer makes a change, then a security, \
        a tests and a style reviewer review it in parallel; the developer revises until all \
        three approve.";

    const MAX_ROUNDS: u32 = 12;

    fn roles() -> Vec<Role> {
        let mut roles = vec![
            Role::new("developer", "Makes the change, or addresses every reviewer's comments")
                .system_prompt(
                    "You are the developer. Make the change the task asks for. If reviewers left \
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
                        "summary": "Validated the input and added tests",
                        "files_changed": ["src/input.rs", "tests/input.rs"]
                    }]
                })),
        ];
        for (name, focus) in [
            ("security-reviewer", "security: untrusted input, secrets, injection"),
            ("tests-reviewer", "tests: is every change covered, do the tests prove it"),
            ("style-reviewer", "style: naming, structure, comments, consistency"),
        ] {
            roles.push(
                Role::new(name, format!("Reviews the latest change for {focus}"))
                    .system_prompt(format!(
                        "You are a reviewer on a panel of three. Review the developer's latest \
                         change for {focus}, and only that. Approve it, or say exactly what \
                         must change."
                    ))
                    .extract_prompt("Did the reviewer approve? List the requested changes.")
                    .schema(review_schema()),
            );
        }
        roles
    }

    fn moderator(thread: &ThreadContext) -> Next {
        let Some(last) = thread.last() else {
            return Next::role("developer");
        };
        if last.role == "developer" {
            return Next::parallel(REVIEWERS);
        }
        // The last round's three reviews are the thread's last three steps.
        let reviews = &thread.steps[thread.steps.len().saturating_sub(REVIEWERS.len())..];
        if reviews.iter().map(|s| s.role.as_str()).ne(REVIEWERS) {
            return Next::fail(1, format!("unexpected step `{}` in thread", last.role));
        }
        if reviews.iter().all(|s| s.meta["approved"] == Value::Bool(true)) {
            let rounds = thread.count("developer");
            return Next::done(format!("all three reviewers approved after {rounds} round(s)"));
        }
        Next::role("developer")
    }
}

/// What every reviewer reports; the examples make the scripted agent reject once, then
/// approve.
fn review_schema() -> Value {
    json!({
        "type": "object",
        "required": ["approved"],
        "properties": {
            "approved": { "type": "boolean" },
            "comments": { "type": "array", "items": { "type": "string" } }
        },
        "examples": [
            { "approved": false, "comments": ["Needs another look"] },
            { "approved": true, "comments": [] }
        ]
    })
}

export_workflow!(ReviewPanel);
