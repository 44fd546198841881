"""Write uncaged-workflow bundles in Python: roles as data, a moderator, one `export` call.

The same model as the Rust SDK (guest-sdk/src), on contract 0.3.0: each call of the host's
`next()` runs the moderator, asks the agents the host bound to the chosen role or roles
(`Next.parallel([...])`: all at once, the host runs them concurrently), extracts each role's
meta with the host's extractor, and yields the steps together. The SDK keeps the thread's
steps itself; the host hands them over once. A thread started with recorded steps continues
after them (resume, fork), and a thread ends with return code 2 once it would hold more than
`max_rounds` steps.

    # app.py
    import uncaged_workflow as uw

    def moderator(thread):
        return uw.Next.role("echo") if not thread.steps else uw.Next.done("echoed")

    Workflow = uw.export(uw.Definition(
        description="Says the prompt back, once.",
        roles=[uw.Role("echo", "Repeats the prompt", schema={"type": "object"})],
        moderator=moderator,
    ))

Build with `componentize-py -d wit -w bundle componentize app -o app.wasm` (the bundle's
directory must hold this module, `workflow.py` beside it, and the WIT in `wit/`).
"""

import json
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import host, types

RETURN_OK = 0
RETURN_FAILED = 1
RETURN_MAX_ROUNDS = 2


@dataclass
class Role:
    """A role: pure data. The host binds an agent to it at run time."""

    name: str
    description: str
    system_prompt: str = ""
    extract_prompt: str = ""
    schema: Any = field(default_factory=lambda: {"type": "object"})


@dataclass
class Step:
    """One completed role execution."""

    role: str
    content: str
    meta: Any
    timestamp: int


@dataclass
class ThreadContext:
    """The thread so far: what the moderator decides from."""

    thread_id: str
    prompt: str
    steps: List[Step]
    max_rounds: int
    trigger_data: Any = None

    def last(self) -> Optional[Step]:
        return self.steps[-1] if self.steps else None

    def last_of(self, role: str) -> Optional[Step]:
        return next((s for s in reversed(self.steps) if s.role == role), None)

    def count(self, role: str) -> int:
        return sum(1 for s in self.steps if s.role == role)


@dataclass
class Next:
    """A moderator's decision: run `role_names` (one, or several at once), or end with
    `return_code` and `summary`."""

    role_names: Optional[List[str]] = None
    return_code: int = RETURN_OK
    summary: str = ""

    @staticmethod
    def role(name: str) -> "Next":
        return Next(role_names=[name])

    @staticmethod
    def parallel(names: List[str]) -> "Next":
        """Run every role of `names` at once (a parallel group), e.g. three reviewers."""
        return Next(role_names=list(names))

    @staticmethod
    def done(summary: str) -> "Next":
        return Next(summary=summary)

    @staticmethod
    def fail(return_code: int, summary: str) -> "Next":
        return Next(return_code=return_code, summary=summary)


@dataclass
class Definition:
    """A workflow: a description, roles, and a pure moderator routing between them.

    `input_schema`, a JSON Schema, says what data a thread starts with (`thread.trigger_data`):
    the host validates every start against it and shows it to callers; without one (`None`) a
    thread takes any data.
    """

    description: str
    roles: List[Role]
    moderator: Callable[[ThreadContext], Next]
    max_rounds: int = 10
    input_schema: Any = None


_definition: Optional[Definition] = None


def export(definition: Definition):
    """Makes `definition` this bundle's workflow; returns the class to bind to `Workflow`."""
    global _definition
    _definition = definition

    class Workflow(exports.Workflow):
        def descriptor(self) -> types.BundleDescriptor:
            return types.BundleDescriptor(
                description=definition.description,
                roles=[
                    types.RoleDescriptor(
                        name=r.name,
                        description=r.description,
                        system_prompt=r.system_prompt,
                        extract_prompt=r.extract_prompt,
                        schema=_dumps(r.schema),
                    )
                    for r in definition.roles
                ],
                default_max_rounds=definition.max_rounds,
                input_schema=None if definition.input_schema is None else _dumps(definition.input_schema),
            )

    return Workflow


def _dumps(value: Any) -> str:
    # The same text as serde_json's compact form, so all languages send identical requests.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _meta(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _to_wit(step: Step) -> types.RoleOutput:
    return types.RoleOutput(role=step.role, content=step.content, meta=_dumps(step.meta), timestamp=step.timestamp)


def _error_text(error: Any) -> str:
    value = getattr(error, "value", error)
    kind = type(value).__name__.split("_")[-1]
    message = getattr(value, "value", str(value))
    return {
        "Unavailable": f"unavailable: {message}",
        "Timeout": f"timed out: {message}",
        "InvalidSchema": f"invalid schema: {message}",
    }.get(kind, message)


class Thread:
    """The generator behind the WIT `thread` resource (see `workflow.py`)."""

    def __init__(self, input: types.RunInput, options: types.RunOptions) -> None:
        assert _definition is not None, "call uncaged_workflow.export() in the app module"
        self.definition = _definition
        self.thread = ThreadContext(
            thread_id=options.thread_id,
            prompt=input.prompt,
            steps=[Step(s.role, s.content, _meta(s.meta), s.timestamp) for s in input.steps],
            max_rounds=options.max_rounds,
            trigger_data=None if input.trigger_data is None else _meta(input.trigger_data),
        )
        self.finished: Optional[types.WorkflowResult] = None

    def next(self) -> types.Step:
        if self.finished is None:
            outcome = self._advance()
            if isinstance(outcome, list):
                self.thread.steps.extend(outcome)
                return types.Step_Outputs([_to_wit(s) for s in outcome])
            self.finished = outcome
        return types.Step_Done(self.finished)

    def _advance(self):
        thread = self.thread
        decision = self.definition.moderator(thread)
        if decision.role_names is None:
            return types.WorkflowResult(return_code=decision.return_code, summary=decision.summary)
        names = decision.role_names
        if not names:
            return types.WorkflowResult(return_code=RETURN_FAILED, summary="moderator chose unknown role ``")
        if len(thread.steps) + len(names) > thread.max_rounds:
            shown = "`, `".join(names)
            return types.WorkflowResult(
                return_code=RETURN_MAX_ROUNDS,
                summary=f"reached max rounds ({thread.max_rounds}) before the workflow finished; next: `{shown}`",
            )
        roles = []
        for name in names:
            role = next((r for r in self.definition.roles if r.name == name), None)
            if role is None:
                return types.WorkflowResult(return_code=RETURN_FAILED, summary=f"moderator chose unknown role `{name}`")
            roles.append(role)
        answers = host.agents([types.AgentCall(role=r.name, input=None) for r in roles])
        steps = []
        for role, answer in zip(roles, answers):
            if isinstance(answer, Err):
                return types.WorkflowResult(
                    return_code=RETURN_FAILED, summary=f"agent for role `{role.name}` failed: {_error_text(answer)}"
                )
            content = answer.value
            try:
                meta = host.extract(
                    types.ExtractRequest(schema=_dumps(role.schema), prompt=role.extract_prompt, content=content)
                )
            except Err as e:
                return types.WorkflowResult(
                    return_code=RETURN_FAILED,
                    summary=f"could not extract the meta of role `{role.name}`: {_error_text(e)}",
                )
            steps.append(Step(role=role.name, content=content, meta=_meta(meta), timestamp=host.now()))
        return steps
