"""{{name}}: an uncaged-workflow bundle. One role answers the prompt; edit the roles and the
moderator to make it yours."""

import uncaged_workflow as uw

ROLES = [
    uw.Role(
        "assistant",
        "Answers the prompt",
        system_prompt="You are a helpful assistant. Answer the user's prompt.",
        extract_prompt="Put the answer in `answer`.",
        schema={
            "type": "object",
            "required": ["answer"],
            "properties": {"answer": {"type": "string"}},
            "examples": [{"answer": "Hello!"}],
        },
    ),
]


def moderator(thread: uw.ThreadContext) -> uw.Next:
    last = thread.last()
    if last is None:
        return uw.Next.role("assistant")
    return uw.Next.done(f"answered: {last.meta.get('answer', '')}")


Workflow = uw.export(uw.Definition(
    description="An assistant answers the prompt once.",
    roles=ROLES,
    moderator=moderator,
    max_rounds=4,
))
