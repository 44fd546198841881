//! {{name}}: an uncaged-workflow bundle. One role answers the prompt; edit the roles and the
//! moderator to make it yours.

use uncaged_workflow_sdk::{Next, Role, ThreadContext, Workflow, export_workflow, json};

struct Bundle;

impl Workflow for Bundle {
    const DESCRIPTION: &'static str = "An assistant answers the prompt once.";
    const MAX_ROUNDS: u32 = 4;

    fn roles() -> Vec<Role> {
        vec![
            Role::new("assistant", "Answers the prompt")
                .system_prompt("You are a helpful assistant. Answer the user's prompt.")
                .extract_prompt("Put the answer in `answer`.")
                .schema(json!({
                    "type": "object",
                    "required": ["answer"],
                    "properties": { "answer": { "type": "string" } },
                    "examples": [{ "answer": "Hello!" }]
                })),
        ]
    }

    fn moderator(thread: &ThreadContext) -> Next {
        match thread.last() {
            None => Next::role("assistant"),
            Some(step) => Next::done(format!("answered: {}", step.meta["answer"].as_str().unwrap_or(""))),
        }
    }
}

export_workflow!(Bundle);
