"""Calls `serve`'s A2A agent with the official Python SDK's client (a2a-sdk), as another agent
would, and prints what it saw as JSON lines for tests/cli/a2a.rs to check: the agent card, a
task that asks a question (input-required), its answer as the next message, the same first
message sent again (one task), a streamed task, its cancellation, and the listing.

usage: a2a_client.py BASE_URL TOKEN SKILL BINDING PUSH_URL   (BINDING: JSONRPC or HTTP+JSON)
"""

import asyncio
import json
import sys
import uuid

import httpx
from a2a.client import ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    TaskPushNotificationConfig,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskState,
)
from google.protobuf.json_format import MessageToDict

BASE, TOKEN, SKILL, BINDING, PUSH = sys.argv[1:6]

# Message ids of this run: a message sent again with one is the same message.
RUN = uuid.uuid4().hex


def say(what, **fields):
    print(json.dumps({"what": what, **fields}), flush=True)


def text_of(message):
    return "".join(p.text for p in message.parts)


def message(message_id, text, task_id=None, skill=None):
    m = Message(message_id=message_id, role=Role.ROLE_USER, parts=[Part(text=text)])
    if task_id:
        m.task_id = task_id
    if skill:
        m.metadata.update({"skill": skill})
    return SendMessageRequest(message=m)


async def last_task(client, request):
    task = None
    async for event in client.send_message(request):
        if event.HasField("task"):
            task = event.task
    return task


async def main():
    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
    card = (await http.get(f"{BASE}/.well-known/agent-card.json")).json()
    say("card", skills=[s["id"] for s in card["skills"]],
        bindings=[i["protocolBinding"] for i in card["supportedInterfaces"]])

    config = ClientConfig(httpx_client=http, streaming=False, supported_protocol_bindings=[BINDING])
    client = await ClientFactory(config).create_from_url(BASE)

    first = await last_task(client, message(f"{RUN}-ask", "Fix the parser", skill=SKILL))
    say("asked", id=first.id, state=TaskState.Name(first.status.state),
        question=text_of(first.status.message))
    pushed = await client.create_task_push_notification_config(
        TaskPushNotificationConfig(task_id=first.id, url=PUSH, token="push-secret"))
    say("push", id=pushed.id)
    again = await last_task(client, message(f"{RUN}-ask", "Fix the parser", skill=SKILL))
    say("again", id=again.id)
    done = await last_task(
        client, message(f"{RUN}-answer", 'Ship it. {"approved": true}', task_id=first.id))
    say("answered", id=done.id, state=TaskState.Name(done.status.state),
        artifacts=[MessageToDict(a) for a in done.artifacts])
    got = await client.get_task(GetTaskRequest(id=first.id))
    say("got", state=TaskState.Name(got.status.state))

    streaming = await ClientFactory(
        ClientConfig(httpx_client=http, streaming=True, supported_protocol_bindings=[BINDING])
    ).create_from_url(BASE)
    events = []
    streamed = None
    async for event in streaming.send_message(message(f"{RUN}-stream", "Stream it", skill=SKILL)):
        if event.HasField("task"):
            events.append("task")
            streamed = event.task.id
        elif event.HasField("status_update"):
            update = event.status_update
            events.append(TaskState.Name(update.status.state))
            streamed = update.task_id
    say("streamed", id=streamed, events=events)
    resubscribed = []
    async for event in streaming.subscribe(SubscribeToTaskRequest(id=streamed)):
        if event.HasField("task"):
            resubscribed.append("task")
        elif event.HasField("status_update"):
            resubscribed.append(TaskState.Name(event.status_update.status.state))
    say("subscribed", events=resubscribed)
    canceled = await client.cancel_task(CancelTaskRequest(id=streamed))
    say("canceled", state=TaskState.Name(canceled.status.state))
    # Right after a cancel, on the same connection (a server that left the cancel's body
    # unread would close it under this request).
    listed = await client.list_tasks(ListTasksRequest(page_size=10))
    say("listed", ids=[t.id for t in listed.tasks],
        states=[TaskState.Name(t.status.state) for t in listed.tasks])
    await http.aclose()


asyncio.run(main())
