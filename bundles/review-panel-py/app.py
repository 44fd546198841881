"""review-panel in Python: a developer makes a change, then a security, a tests and a style
reviewer review it in parallel; the developer revises until all three approve. The same
workflow as bundles/review-panel (Rust): same roles, prompts, schemas and routing."""

import uncaged_workflow as uw

REVIEWERS = ["security-reviewer", "tests-reviewer", "style-reviewer"]

REVIEW_SCHEMA = {
    "type": "object",
    "required": ["approved"],
    "properties": {
        "approved": {"type": "boolean"},
        "comments": {"type": "array", "items": {"type": "string"}},
    },
    "examples": [
        {"approved": False, "comments": ["Needs another look"]},
        {"approved": True, "comments": []},
    ],
}

ROLES = [
    uw.Role(
        "developer",
        "Makes the change, or addresses every reviewer's comments",
        system_prompt="You are the developer. Make the change the task asks for. If reviewers left "
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
                "summary": "Validated the input and added tests",
                "files_changed": ["src/input.rs", "tests/input.rs"],
            }],
        },
    ),
] + [
    uw.Role(
        name,
        f"Reviews the latest change for {focus}",
        system_prompt=f"You are a reviewer on a panel of three. Review the developer's latest change "
        f"for {focus}, and only that. Approve it, or say exactly what must change.",
        extract_prompt="Did the reviewer approve? List the requested changes.",
        schema=REVIEW_SCHEMA,
    )
    for name, focus in [
        ("security-reviewer", "security: untrusted input, secrets, injection"),
        ("tests-reviewer", "tests: is every change covered, do the tests prove it"),
        ("style-reviewer", "style: naming, structure, comments, consistency"),
    ]
]


def moderator(thread: uw.ThreadContext) -> uw.Next:
    last = thread.last()
    if last is None:
        return uw.Next.role("developer")
    if last.role == "developer":
        return uw.Next.parallel(REVIEWERS)
    # The last round's three reviews are the thread's last three steps.
    reviews = thread.steps[-len(REVIEWERS):]
    if [s.role for s in reviews] != REVIEWERS:
        return uw.Next.fail(1, f"unexpected step `{last.role}` in thread")
    if all(s.meta.get("approved") is True for s in reviews):
        return uw.Next.done(f"all three reviewers approved after {thread.count('developer')} round(s)")
    return uw.Next.role("developer")


Workflow = uw.export(uw.Definition(
    description="Review panel: a developer makes a change, then a security, a tests and a style "
    "reviewer review it in parallel; the developer revises until all three approve.",
    roles=ROLES,
    moderator=moderator,
    max_rounds=12,
))
