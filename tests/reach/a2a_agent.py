"""An A2A agent written with the official Python SDK's server (a2a-sdk), for
tests/cli/a2a.rs's `kind: a2a` binding: a reviewer that approves, answering with a text part
and a data part. It wants `Authorization: Bearer TOKEN`, and keeps each message it is sent as
a JSON line in OUT. Prints `port=PORT` once it listens.

usage: a2a_agent.py OUT TOKEN
"""

import asyncio
import json
import socket
import sys

import uvicorn
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes.agent_card_routes import create_agent_card_routes
from a2a.server.routes.jsonrpc_routes import create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.helpers.proto_helpers import new_task
from a2a.types.a2a_pb2 import (
    AgentCapabilities, AgentCard, AgentInterface, AgentSkill, Part, TaskState,
)
from google.protobuf.json_format import MessageToDict
from google.protobuf.struct_pb2 import Value
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.responses import JSONResponse

OUT, TOKEN = sys.argv[1], sys.argv[2]


class Reviewer(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        with open(OUT, "a") as out:
            out.write(json.dumps(MessageToDict(context.message)) + "\n")
        if context.current_task is None:
            await event_queue.enqueue_event(
                new_task(context.task_id, context.context_id, TaskState.TASK_STATE_SUBMITTED,
                         history=[context.message]))
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.start_work()
        verdict = Value()
        verdict.struct_value.update({"approved": True})
        await updater.add_artifact(
            [Part(text="Reviewed by the A2A agent: the change is sound."), Part(data=verdict)],
            name="review",
        )
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


sock = socket.socket()
sock.bind(("127.0.0.1", 0))
port = sock.getsockname()[1]
card = AgentCard(
    name="reviewer",
    description="Reviews a change",
    version="1.0.0",
    supported_interfaces=[
        AgentInterface(url=f"http://127.0.0.1:{port}/rpc", protocol_binding="JSONRPC", protocol_version="1.0")
    ],
    capabilities=AgentCapabilities(streaming=False),
    default_input_modes=["text/plain"],
    default_output_modes=["text/plain", "application/json"],
    skills=[AgentSkill(id="review", name="review", description="Reviews a change", tags=["review"])],
)
handler = DefaultRequestHandler(agent_executor=Reviewer(), task_store=InMemoryTaskStore(), agent_card=card)


class Bearer(BaseHTTPMiddleware):
    async def dispatch(self, request, call_next):
        if request.url.path == "/rpc" and request.headers.get("authorization") != f"Bearer {TOKEN}":
            return JSONResponse({"error": "a token is required"}, status_code=401)
        return await call_next(request)


app = Starlette(
    routes=create_agent_card_routes(card) + create_jsonrpc_routes(handler, rpc_url="/rpc"),
    middleware=[Middleware(Bearer)],
)


print(f"port={port}", flush=True)
asyncio.run(uvicorn.Server(uvicorn.Config(app, log_level="warning")).serve(sockets=[sock]))
