"""An MCP client for the tests, on the official Python SDK (PyPI `mcp`): it connects to
`uncaged-workflow mcp` over stdio or to `serve`'s /mcp over Streamable HTTP, carries out a plan
of steps given as JSON, and prints one JSON line per step.

    client.py --stdio BINARY [--home HOME] --plan '[...]'
    client.py --http URL [--token TOKEN] --plan '[...]'
    [--mode auto|legacy]   auto: the SDK's default (2026-07-28 if the server speaks it)

Steps:
    {"op": "list"}                                   -> {"tools": [{name, description, inputSchema, annotations}]}
    {"op": "call", "tool": T, "args": {...},          -> {"result": ..., "progress": [...], "asked": [...]}
        "meta": {...}, "answers": [text...]}             each question a person is asked (elicitation) is
                                                        answered by the next of `answers` ({"answer": text})
                                                        or, for a decision, {"decision": ..., "text": ...}
    {"op": "cancel", "tool": T, "args": {...},        -> {"cancelled": true}: the call is cancelled once
        "after_progress": N}                              N progress notifications came
    {"op": "drop", "tool": T, "args": {...},          -> the process exits at once (no goodbye) once N
        "after_progress": N}                              progress notifications came
    {"op": "wait_list_changed", "timeout": S}        -> {"list_changed": bool}
    {"op": "task", "tool": T, "args": {...},          -> {"task": created, "statuses": [...], "final": task}
        "answers": [...], "cancel_at": STATUS}           with the tasks extension declared: the call's task
                                                        is polled (tasks/get) to its end; a question is
                                                        answered (tasks/update) with the next of `answers`;
                                                        the task is cancelled (tasks/cancel) once it is
                                                        seen in status `cancel_at`
An error of a step is {"error": "..."} and ends the plan.
"""

import argparse
import asyncio
import json
import os
import sys
from typing import ClassVar

import anyio
import httpx2 as httpx
import mcp.types as types
from mcp import Client, StdioServerParameters
from pydantic import ConfigDict, TypeAdapter


def say(value):
    print(json.dumps(value), flush=True)


class Params(types.RequestParams):
    """A request's params as given: those of methods the SDK has no type for."""

    model_config = ConfigDict(extra="allow")


class TaskRequest(types.Request):
    """A `tasks/*` request: the task's id goes in the `Mcp-Name` header too, as SEP-2663 asks."""

    name_param: ClassVar[str | None] = "taskId"


async def request(client, method, params):
    """A request the SDK has no method for (the tasks extension's), as plain JSON."""
    return await client.session.send_request(TaskRequest(method=method, params=Params(**params)), TypeAdapter(dict))


def dump(model):
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--stdio")
    parser.add_argument("--home")
    parser.add_argument("--http")
    parser.add_argument("--token")
    parser.add_argument("--mode", default="auto")
    parser.add_argument("--plan", required=True)
    options = parser.parse_args()
    plan = json.loads(options.plan)

    answers = []
    asked = []
    list_changed = asyncio.Event()

    async def on_elicit(context, params):
        asked.append(params.message)
        if not answers:
            return types.ElicitResult(action="decline")
        given = answers.pop(0)
        content = given if isinstance(given, dict) else {"answer": given}
        return types.ElicitResult(action="accept", content=content)

    async def on_message(message):
        if isinstance(message, types.ServerNotification) and isinstance(
            message.root if hasattr(message, "root") else message, types.ToolListChangedNotification
        ):
            list_changed.set()
        elif getattr(message, "method", None) == "notifications/tools/list_changed":
            list_changed.set()

    if options.stdio:
        args = (["--home", options.home] if options.home else []) + ["mcp"]
        server = StdioServerParameters(command=options.stdio, args=args, env=dict(os.environ))
    else:
        headers = {"Authorization": f"Bearer {options.token}"} if options.token else {}
        server = options.http
    kwargs = dict(mode=options.mode, elicitation_callback=on_elicit, message_handler=on_message)
    if any(step["op"] == "task" for step in plan):
        from mcp.client import advertise

        kwargs["extensions"] = [advertise("io.modelcontextprotocol/tasks")]
    if options.http:
        from mcp.client.streamable_http import streamable_http_client

        client_http = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(120.0))
        server = streamable_http_client(options.http, http_client=client_http)

    async with Client(server, **kwargs) as client:
        for step in plan:
            op = step["op"]
            try:
                if op == "list":
                    listed = await client.list_tools()
                    say({"tools": [dump(t) for t in listed.tools]})
                elif op == "call":
                    answers[:] = list(step.get("answers", []))
                    asked.clear()
                    progress = []

                    async def on_progress(done, total, message):
                        progress.append(message)

                    result = await client.call_tool(
                        step["tool"], step.get("args", {}), progress_callback=on_progress,
                        meta=step.get("meta"),
                    )
                    say({"result": dump(result), "progress": progress, "asked": list(asked)})
                elif op in ("cancel", "drop"):
                    enough = anyio.Event()
                    count = 0
                    wanted = step.get("after_progress", 1)

                    async def on_progress(done, total, message):
                        nonlocal count
                        count += 1
                        if count >= wanted:
                            enough.set()

                    async with anyio.create_task_group() as group:
                        async def calling():
                            await client.call_tool(step["tool"], step.get("args", {}), progress_callback=on_progress)

                        group.start_soon(calling)
                        await enough.wait()
                        if op == "drop":
                            say({"dropped": True})
                            os._exit(0)
                        group.cancel_scope.cancel()
                    # Let the cancellation reach the server before the next step (or the exit).
                    await anyio.sleep(0.5)
                    say({"cancelled": True})
                elif op == "task":
                    answers[:] = list(step.get("answers", []))
                    call = types.CallToolRequest(
                        params=types.CallToolRequestParams(name=step["tool"], arguments=step.get("args", {}))
                    )
                    created = await client.session.send_request(call, TypeAdapter(dict))
                    task_id = created["taskId"]
                    statuses = []
                    while True:
                        task = await request(client, "tasks/get", {"taskId": task_id})
                        if not statuses or statuses[-1] != task["status"]:
                            statuses.append(task["status"])
                        if task["status"] in ("completed", "failed", "cancelled"):
                            break
                        if task["status"] == step.get("cancel_at"):
                            await request(client, "tasks/cancel", {"taskId": task_id})
                        elif task["status"] == "input_required" and answers:
                            given = answers.pop(0)
                            content = given if isinstance(given, dict) else {"answer": given}
                            responses = {key: {"action": "accept", "content": content} for key in task["inputRequests"]}
                            await request(client, "tasks/update", {"taskId": task_id, "inputResponses": responses})
                        await anyio.sleep(task.get("pollIntervalMs", 200) / 1000 / 5)
                    say({"task": created, "statuses": statuses, "final": task})
                elif op == "wait_list_changed":
                    try:
                        await asyncio.wait_for(list_changed.wait(), step.get("timeout", 10))
                        say({"list_changed": True})
                    except asyncio.TimeoutError:
                        say({"list_changed": False})
                else:
                    say({"error": f"unknown op {op}"})
                    return
            except Exception as e:  # noqa: BLE001 - the test reads what failed
                say({"error": f"{type(e).__name__}: {e}"})
                return


asyncio.run(main())
