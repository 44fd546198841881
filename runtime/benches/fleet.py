"""A fleet of agent threads on one provider limit, measured for `make bench` (report.py calls
`section()`; run alone with `python3 runtime/benches/report.py --only fleet`):

- THREADS threads of solve-issue (three model calls each) on two worker processes, each with a
  home of its own (two machines' workers), sharing one PostgreSQL, every call through one
  provider limit of RPM requests and TPM tokens a minute, against a mock provider in this
  process that enforces the same limits itself over a sliding minute of its own clock and
  answers 429 past them: how many 429s it answered, and how much of each limit the busy minutes
  used;
- a thread of five agent calls (five roles, one binding) each listing a directory through the
  filesystem MCP server from npm: how many times the server started, and what the thread took;
- the same again, the provider answering request CLOSE_AT (in the second minute, while calls
  wait for the limit) with 429 and `Retry-After: 5`: how many calls of the limit any thread
  sent in those five seconds.

The provider counts a request's tokens as its messages' bytes over four plus the ANSWER_TOKENS of its
answer, and reports them as the answer's usage (what the host settles with).
"""

import http.server
import json
import os
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import loopback
import postgres
from serve_load import BINARY, BUNDLE, TARGET

ROOT = TARGET.parent

THREADS = 200
# The request answered 429 + Retry-After: 5 in the second run: in its second minute, while
# calls wait for the limit.
CLOSE_AT = 350
RPM = 300
TPM = 60_000
ANSWER_TOKENS = 110
# A worker's limiter looks at a limit again this often (`POLL` in store/limiter.rs): a call let
# through in the round before a 429 was heard arrives within it.
LIMITER_ROUND = 0.25

# The rows of the Targets table this part measured (filled by `section()`).
TARGETS = []


def answer(handler, message, usage=None):
    """Answers a chat completion with `message` (and `usage`, if given)."""
    reply = {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
    if usage:
        reply["usage"] = usage
    data = json.dumps(reply).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


class Provider(http.server.BaseHTTPRequestHandler):
    """A chat-completions endpoint enforcing RPM and TPM over the last 60 s of its own clock."""
    lock = threading.Lock()
    answered = []  # (time, status, tokens)
    retry_after_at = None  # answer the request with this index with 429 + Retry-After: 5

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        tokens = len(json.dumps(body["messages"], separators=(",", ":"), ensure_ascii=False)) // 4 + ANSWER_TOKENS
        now = time.monotonic()
        with Provider.lock:
            window = [a for a in Provider.answered if a[1] == 200 and a[0] > now - 60]
            used = sum(a[2] for a in window)
            forced = Provider.retry_after_at is not None and len(Provider.answered) == Provider.retry_after_at
            refused = forced or len(window) >= RPM or used + tokens > TPM
            Provider.answered.append((now, 429 if refused else 200, tokens))
        if refused:
            self.send_response(429)
            if forced:
                self.send_header("Retry-After", "5")
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"error": {"message": "rate limit reached"}}')
            return
        system = body["messages"][0]["content"]
        content = ("Plan:\n```json\n{\"steps\": [\"fix it\"]}\n```" if "You are the planner" in system
                   else "{\"summary\": \"fixed\"}" if "You are the developer" in system
                   else "Approved. {\"approved\": true}")
        usage = {"prompt_tokens": tokens - ANSWER_TOKENS, "completion_tokens": ANSWER_TOKENS}
        answer(self, {"role": "assistant", "content": content}, usage)

    def log_message(self, *args):
        pass


def fleet(server, threads, retry_after_at=None):
    """Runs `threads` threads on two workers; the provider's record of what it answered."""
    Provider.answered, Provider.retry_after_at = [], retry_after_at
    provider = loopback.serve(Provider)
    db = server.database()
    workers, homes = [], []
    try:
        for i in range(2):
            home = tempfile.mkdtemp(prefix=f"uncaged-bench-fleet-{i}-")
            homes.append(home)
            with open(os.path.join(home, "config.yaml"), "w") as f:
                f.write(f"agent: provider\nagents:\n  provider:\n    kind: openai\n"
                        f"    base_url: http://127.0.0.1:{provider.server_port}/v1\n    model: m\n"
                        f"    max_tokens: {ANSWER_TOKENS}\n    retries: 5\n    limit: provider\n"
                        f"limits:\n  provider: {{requests_per_minute: {RPM}, tokens_per_minute: {TPM}}}\n")
            env = dict(os.environ, UNCAGED_WORKFLOW_HOME=home, UNCAGED_WORKFLOW_STORE=server.url(db))
            if i == 0:
                subprocess.run([BINARY, "add", "solve-issue", str(BUNDLE)], env=env, check=True,
                               capture_output=True)
            workers.append((env, postgres.start_worker(env, home, os.path.join(home, "worker.log"))))
        env = workers[0][0]

        def start(n):
            subprocess.run([BINARY, "run", "solve-issue", "-p", f"issue {n}", "--detach"], env=env,
                           check=True, capture_output=True)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(start, range(threads)))
        while True:
            listed = json.loads(subprocess.run([BINARY, "threads", "--json", "--limit", str(threads)], env=env,
                                               check=True, capture_output=True, text=True).stdout)
            if sum(1 for t in listed if t["status"] == "completed") >= threads:
                break
            failed = [t for t in listed if t["status"] in ("failed", "killed", "interrupted")]
            assert not failed, failed[:3]
            time.sleep(1)
        return list(Provider.answered)
    finally:
        for _, worker in workers:
            worker.terminate()
            worker.wait(timeout=60)
        provider.shutdown()


class ToolModel(http.server.BaseHTTPRequestHandler):
    """A model whose every call lists the repository through the filesystem server once, then
    answers."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        if body["messages"][-1]["role"] == "tool":
            message = {"role": "assistant", "content": "Done.\n{\"summary\": \"listed\"}"}
        else:
            call = {"id": "c1", "type": "function",
                    "function": {"name": "fs__list_directory", "arguments": json.dumps({"path": ToolModel.root})}}
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
        answer(self, message)

    def log_message(self, *args):
        pass


FIVE_ROLES = "description: Five roles ask one durable agent\nroles:\n" + "".join(
    f"  r{i}: {{description: R{i}, system_prompt: You are r{i}., schema: {{type: object, required: [summary], "
    f"properties: {{summary: {{type: string}}}}}}}}\n" for i in range(5)) + "graph:\n" + "".join(
    f"  - from: {frm}\n    transitions: [{{to: {to}}}]\n"
    for frm, to in zip(["$START"] + [f"r{i}" for i in range(5)], [f"r{i}" for i in range(5)] + ["$END"]))


def tool_servers(runs=3):
    """Starts of the filesystem server, and the wall time, of a five-call thread (median)."""
    server_js = ROOT / "target/mcp-node/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"
    assert server_js.exists(), "the filesystem server is missing: run tests/mcp/install.sh (make bench does)"
    home = tempfile.mkdtemp(prefix="uncaged-bench-tools-")
    starts = os.path.join(home, "starts")
    wrapper = os.path.join(home, "node.sh")
    with open(wrapper, "w") as f:
        f.write(f"#!/bin/sh\necho start >> {starts}\nexec node \"$@\"\n")
    os.chmod(wrapper, 0o755)
    ToolModel.root = str(ROOT)
    model = loopback.serve(ToolModel)
    with open(os.path.join(home, "config.yaml"), "w") as f:
        f.write("roles: {" + ", ".join(f"r{i}: coder" for i in range(5)) + "}\n"
                f"agents:\n  coder:\n    kind: openai\n    base_url: http://127.0.0.1:{model.server_port}/v1\n"
                f"    model: m\n    tools:\n      fs:\n        command: {wrapper}\n"
                f"        args: [{server_js}, {ROOT}]\n")
    flow = os.path.join(home, "five.yaml")
    with open(flow, "w") as f:
        f.write(FIVE_ROLES)
    env = dict(os.environ, UNCAGED_WORKFLOW_HOME=home)
    env.pop("UNCAGED_WORKFLOW_STORE", None)
    subprocess.run([BINARY, "add", "five", flow], env=env, check=True, capture_output=True)
    times, counts = [], []
    try:
        for _ in range(runs):
            open(starts, "w").close()
            started = time.perf_counter()
            subprocess.run([BINARY, "run", "five", "-p", "List it"], env=env, check=True, capture_output=True)
            times.append(time.perf_counter() - started)
            counts.append(sum(1 for _ in open(starts)))
    finally:
        model.shutdown()
    return sorted(counts)[len(counts) // 2], sorted(times)[len(times) // 2]


def busy_minutes(answered):
    """Requests and tokens answered in each whole minute from the first request, as shares of
    RPM and TPM (the last, partial minute left out)."""
    start, end = answered[0][0], answered[-1][0]
    shares = []
    minute = start
    while minute + 60 <= end:
        inside = [a for a in answered if minute <= a[0] < minute + 60 and a[1] == 200]
        shares.append((len(inside) / RPM, sum(a[2] for a in inside) / TPM))
        minute += 60
    return shares


def section():
    server = postgres.Server()
    try:
        answered = fleet(server, THREADS)
        refused = sum(1 for a in answered if a[1] == 429)
        minutes = busy_minutes(answered)
        closing = fleet(server, THREADS, retry_after_at=CLOSE_AT)
    finally:
        server.stop()
    starts, took = tool_servers()
    told = next(a[0] for a in closing if a[1] == 429)
    # How soon after the 429 each call that came in those 5 s arrived (ms). A call another
    # worker let through before the close reached the store is already on its way, and no
    # design calls it back: what the row holds against the limiter is a call let through after
    # the close was heard, i.e. one arriving later than a round of the limiter (LIMITER_ROUND)
    # after the 429.
    after = [round((a[0] - told) * 1e3, 1) for a in closing if told < a[0] < told + 5]
    in_flight = [ms for ms in after if ms <= LIMITER_ROUND * 1e3]
    let_through = len(after) - len(in_flight)
    ok = [a for a in answered if a[1] == 200]
    span = ok[-1][0] - ok[0][0]
    lines = ["## A fleet on one provider limit", "",
             f"{THREADS} threads of solve-issue (3 model calls each) on two worker processes, each with a home of "
             f"its own, sharing one PostgreSQL; every call through one limit of {RPM} requests and {TPM:,} "
             "tokens a minute, against a provider (in the benchmark's process) that enforces the same itself "
             "over a sliding minute and answers 429 past them.", "",
             "| what | measured |", "|---|---|",
             f"| requests answered / refused (429) | {len(ok)} / {refused} |",
             f"| first to last answered | {span:.0f} s |"]
    for i, (requests, tokens) in enumerate(minutes, 1):
        lines.append(f"| busy minute {i}: share of the requests / tokens limits used | "
                     f"{requests:.1%} / {tokens:.1%} |")
    lines += [f"| one 429 with `Retry-After: 5` (request {CLOSE_AT} of a second run): calls that arrived in those "
              f"5 s, later than a limiter round ({LIMITER_ROUND * 1e3:.0f} ms) after the 429 / within it (let "
              f"through before the close was heard) | {let_through} / {len(in_flight)}"
              + (f" (arrived {', '.join(f'{ms} ms' for ms in after)} after the 429)" if after else "") + " |",
              f"| a thread of 5 agent calls through the filesystem MCP server (npm): server starts / the "
              f"thread's time (median of 3, home directory) | {starts} / {took:.2f} s |", ""]
    # Each limit's share in its least used busy minute.
    least = [min(m[k] for m in minutes) if minutes else 0.0 for k in (0, 1)]
    near = all(share >= 0.95 for share in least)
    TARGETS[:] = [
        f"| {THREADS} threads on 2 workers against a provider enforcing {RPM} requests/min and {TPM:,} "
        f"tokens/min: no 429, each busy minute within 95% of each limit | {refused} answers of 429; requests "
        f"{least[0]:.1%}, tokens {least[1]:.1%} | {'yes' if refused == 0 and near else 'no'} |",
        f"| the same with one 429 + `Retry-After: 5`: no call of that limit let through in those 5 s (arriving "
        f"later than a limiter round after it) | {let_through} let through ({len(in_flight)} in flight before the close "
        f"was heard) | "
        f"{'yes' if let_through == 0 else 'no'} |",
        f"| a 5-call agent with the filesystem MCP server (npm): starts once per thread | {starts} "
        f"start{'s' if starts != 1 else ''} | {'yes' if starts == 1 else 'no'} |",
    ]
    return lines
