"""Durable agents, measured for `make bench` (report.py calls `section()`; run alone with
`python3 runtime/benches/report.py --only agents`):

- what durability costs per turn: `cargo bench --bench agent_loop`, the same loop of model turns
  and tool calls journaled on disk and not journaled, on a model that answers in 1 ms;
- the time from a streamed chunk leaving the model's endpoint to a follower's `delta`: through
  `run --json` (the worker's socket), and through `serve`'s event stream (the API), on a home
  directory, with the release binary. The endpoint is in this process: it writes a piece of text,
  notes the time, and waits for the follower to have it before it writes the next, so each piece
  is timed alone. Both clocks are this machine's.
"""

import http.server
import json
import os
import queue
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import loopback

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "target"
BINARY = TARGET / "release" / "uncaged-workflow"
PIECES = 40
WORKFLOW = """description: One developer
roles:
  developer:
    description: Writes
    system_prompt: You are the developer.
graph:
  - from: $START
    transitions: [{to: developer}]
  - from: developer
    transitions: [{to: $END}]
"""


class Model(http.server.BaseHTTPRequestHandler):
    """A chat-completions endpoint that streams PIECES pieces, one at a time: each written when
    the follower said it had the one before (`Model.heard`), its time noted in `Model.sent`."""
    sent = []
    heard = None
    ready = None

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        Model.ready.wait()
        for i in range(PIECES):
            chunk = {"choices": [{"index": 0, "delta": {"content": f"piece {i} "}}]}
            data = f"data: {json.dumps(chunk)}\n\n".encode()
            Model.sent.append(time.time_ns())
            self.wfile.write(data)
            self.wfile.flush()
            Model.heard.get(timeout=30)
        end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        self.wfile.write(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode())
        self.wfile.flush()

    def log_message(self, *args):
        pass



# The rows of the Targets table this part measured (filled by `section()`).
TARGETS = []

def follow_run(env):
    """First-delta latencies (ms) through `run --json`."""
    latencies = []
    run = subprocess.Popen([BINARY, "run", "dev", "-p", "Write", "--json"], env=env,
                           stdout=subprocess.PIPE, text=True)
    Model.ready.set()
    for line in run.stdout:
        event = json.loads(line)
        if event.get("type") == "delta":
            latencies.append((time.time_ns() - Model.sent[len(latencies)]) / 1e6)
            Model.heard.put(None)
    run.wait()
    return latencies


def follow_api(env, address, token):
    """First-delta latencies (ms) through the API's event stream."""
    started = subprocess.run([BINARY, "run", "dev", "-p", "Write", "--detach"], env=env,
                             capture_output=True, text=True, check=True)
    thread = started.stdout.strip()
    request = urllib.request.Request(f"http://{address}/api/v1/threads/{thread}/events",
                                     headers={"Authorization": f"Bearer {token}"})
    latencies = []
    with urllib.request.urlopen(request, timeout=60) as stream:
        # Let the feed find the thread's worker before the model writes.
        time.sleep(1.5)
        Model.ready.set()
        for raw in stream:
            line = raw.decode().strip()
            if line == "event: delta":
                data = json.loads(next(stream).decode().strip()[len("data: "):])
                assert data["type"] == "delta"
                latencies.append((time.time_ns() - Model.sent[len(latencies)]) / 1e6)
                Model.heard.put(None)
            elif line == "event: ended":
                break
    return latencies


def measure(follow, *args):
    Model.sent, Model.heard, Model.ready = [], queue.Queue(), threading.Event()
    latencies = follow(*args)
    assert len(latencies) == PIECES, latencies
    return latencies


def agent_loop():
    out = subprocess.run(["cargo", "bench", "-q", "-p", "uncaged-workflow", "--bench", "agent_loop"],
                         cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return json.loads(next(l for l in out.splitlines() if l.startswith("{")))


def section():
    loop = agent_loop()
    server = loopback.serve(Model)
    run_ms, api_ms = [], []
    with tempfile.TemporaryDirectory(dir=TARGET) as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env["UNCAGED_WORKFLOW_HOME"] = home
        (Path(home) / "dev.yaml").write_text(WORKFLOW)
        (Path(home) / "config.yaml").write_text(
            "roles: {developer: coder}\nagents:\n  coder:\n    kind: openai\n"
            f"    base_url: http://127.0.0.1:{server.server_address[1]}/v1\n    model: m\n"
            "    stream: true\n")
        subprocess.run([BINARY, "add", "dev", Path(home) / "dev.yaml"], check=True, env=env, capture_output=True)
        token = subprocess.run([BINARY, "token", "create", "--name", "bench"], env=env, check=True,
                               capture_output=True, text=True).stdout.strip()
        serve = subprocess.Popen([BINARY, "serve", "--listen", "127.0.0.1:0", "--no-schedules"], env=env,
                                 stdout=subprocess.PIPE, text=True)
        address = serve.stdout.readline().split("http://")[1].split("/")[0]
        try:
            for _ in range(3):
                run_ms += measure(follow_run, env)
                api_ms += measure(follow_api, env, address, token)
        finally:
            serve.terminate()
            serve.wait()
    server.shutdown()

    def row(name, values):
        values = sorted(values)
        p90 = values[int(len(values) * 0.9) - 1]
        return f"| {name} | {statistics.median(values):.2f} ms | {p90:.2f} ms | {len(values)} |"

    journaled, unjournaled = statistics.median(loop["journaled_us"]), statistics.median(loop["unjournaled_us"])
    in_memory = statistics.median(loop["journaled_in_memory_us"])
    overhead = (journaled / unjournaled - 1) * 100
    memory_overhead = (in_memory / unjournaled - 1) * 100
    first_delta = (statistics.median(run_ms), statistics.median(api_ms))
    TARGETS[:] = [
        f"| a durable agent's journaling ≤ 5% over the same loop unjournaled (model at 1 ms) | "
        f"{overhead:+.1f}% (tmpfs: {memory_overhead:+.1f}%) | {'yes' if overhead <= 5 else 'no'} |",
        f"| first `delta` to a follower ≤ 5 ms after the endpoint's chunk, `run` / API | "
        f"{first_delta[0]:.2f} ms / {first_delta[1]:.2f} ms | {'yes' if max(first_delta) <= 5 else 'no'} |",
    ]
    return ["## Durable agents: what journaling costs a turn, and how soon followers see the text", "",
            f"**Per turn.** One agent call of {loop['turns']} model turns, each calling one read-only tool of",
            "an MCP server over stdio (the test ledger server, Python SDK), then an answer; the model answers",
            f"after {loop['model_ms']} ms. Journaled: each turn's message with the mark of its call in one synced",
            "write, the read-only call's result unsynced, landing with the next turn's write (a home on disk):",
            "one synced write a turn. Not journaled: the same loop, nothing written.",
            "Median of 7 calls each, alternating (`cargo bench --bench agent_loop`).", "",
            "| loop | per turn (model turn + tool call) | over not journaled |", "|---|---|---|",
            f"| not journaled | {unjournaled / 1000:.2f} ms | |",
            f"| journaled on tmpfs (the syncs cost nothing) | {in_memory / 1000:.2f} ms | {memory_overhead:+.1f}% |",
            f"| journaled on disk, 1 sync per turn | {journaled / 1000:.2f} ms | {overhead:+.1f}% (target ≤ 5%) |", "",
            "**Live text.** The time from a streamed chunk written by the model's endpoint to the follower",
            f"reading its `delta` ({PIECES} pieces per run, each timed alone, 3 runs each; release build,",
            "home directory store):", "",
            "| follower | median | p90 | pieces |", "|---|---|---|---|",
            row("`run --json` (the worker's socket)", run_ms),
            row("`GET /api/v1/threads/{id}/events` (`serve`)", api_ms),
            "", "Target: ≤ 5 ms.", ""]
