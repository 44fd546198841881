"""solve-issue in Python: a planner plans, a developer implements, a reviewer reviews; the
developer goes again until the reviewer approves or the thread runs out of rounds. The same
workflow as bundles/solve-issue (Rust): same roles, prompts, schemas and routing."""

import uncaged_workflow as uw

ROLES = [
    uw.Role(
        "planner",
        "Breaks the issue into a short, ordered plan",
        system_prompt="You are the planner. Read the issue and write a short, ordered plan a "
        "developer can follow. Name the files you expect to change.",
        extract_prompt="List the plan's steps in order and the files it touches.",
        schema={
            "type": "object",
            "required": ["steps"],
            "properties": {
                "steps": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                "files": {"type": "array", "items": {"type": "string"}},
            },
            "examples": [{
                "steps": ["Reproduce the bug with a failing test", "Fix the parser", "Run the tests"],
                "files": ["src/parser.rs", "tests/parser.rs"],
            }],
        },
    ),
    uw.Role(
        "developer",
        "Implements the plan, or addresses the reviewer's comments",
        system_prompt="You are the developer. Implement the planner's plan. If the reviewer left "
        "comments, address every one of them. Report what you changed.",
        extract_prompt="Summarise the change and list the files changed.",
        schema={
            "type": "object",
            "required": ["summary"],
            "properties": {
                "summary": {"type": "string"},
                "files_changed": {"type": "array", "items": {"type": "string"}},
            },
            "examples": [{
                "summary": "Fixed the off-by-one in the parser and added a regression test",
                "files_changed": ["src/parser.rs", "tests/parser.rs"],
            }],
        },
    ),
    uw.Role(
        "reviewer",
        "Reviews the change; approves it or asks for changes",
        system_prompt="You are the reviewer. Review the developer's latest change against the "
        "issue and the plan. Approve only if it is correct and tested; otherwise say exactly what "
        "must change.",
        extract_prompt="Did the reviewer approve? List the requested changes, if any.",
        schema={
            "type": "object",
            "required": ["approved"],
            "properties": {
                "approved": {"type": "boolean"},
                "comments": {"type": "array", "items": {"type": "string"}},
            },
            "examples": [
                {"approved": False, "comments": ["Handle the empty-input case"]},
                {"approved": True, "comments": []},
            ],
        },
    ),
]


def moderator(thread: uw.ThreadContext) -> uw.Next:
    last = thread.last()
    if last is None:
        return uw.Next.role("planner")
    if last.role == "planner":
        return uw.Next.role("developer")
    if last.role == "developer":
        return uw.Next.role("reviewer")
    if last.role == "reviewer" and last.meta.get("approved") is True:
        return uw.Next.done(f"approved after {thread.count('developer')} development round(s)")
    if last.role == "reviewer":
        return uw.Next.role("developer")
    return uw.Next.fail(1, f"unexpected role `{last.role}` in thread")


Workflow = uw.export(uw.Definition(
    description="Solve an issue: a planner breaks it into steps, a developer implements them, and "
    "a reviewer reviews the change; the developer revises until the reviewer approves.",
    roles=ROLES,
    moderator=moderator,
    max_rounds=10,
    # A tracker's webhook or a caller may say which issue: its number and title.
    input_schema={
        "type": "object",
        "properties": {
            "issue": {"type": "integer", "minimum": 1, "description": "The issue's number"},
            "title": {"type": "string", "maxLength": 512, "description": "The issue's title"},
        },
    },
))
