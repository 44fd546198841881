"""A fleet of agent threads on one provider limit, measured for `make bench` (report.py calls
`section()`; run alone with `python3 runtime/benches/report.py --only fleet`):

- THREADS threads of solve-issue (three model calls each) on two worker processes, each with a
  home of its own (two machines' workers), sharing one PostgreSQL, every call through one
  provider limit of RPM requests and TPM tokens a minute, against a mock provider in this
  process that enforces the same limits itself over a sliding minute of its own clock and
  answers 429 past them: how many 429s it answered, and how much of each limit the busy minutes
  used;
- the same with the provider answering one 429 with `Retry-After: 5` in the middle: how many
  calls of the limit any thread sent in those five seconds.

The provider counts a request's tokens as its messages' bytes over four plus the twenty of its
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

import postgres
from serve_load import BINARY, BUNDLE

THREADS = 200
RPM = 300
TPM = 60_000
ANSWER_TOKENS = 20

# The rows of the Targets table this part measured (filled by `section()`).
TARGETS = []


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
        content = ("Plan:\n```json\n{\"steps\": [\"fix it\"]}\n```" if "planner" in system
                   else "{\"summary\": \"fixed\"}" if "developer" in system
                   else "Approved. {\"approved\": true}")
        reply = {"choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                              "finish_reason": "stop"}],
                 "usage": {"prompt_tokens": tokens - ANSWER_TOKENS, "completion_tokens": ANSWER_TOKENS}}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def fleet(server, threads, retry_after_at=None):
    """Runs `threads` threads on two workers; the provider's record of what it answered."""
    Provider.answered, Provider.retry_after_at = [], retry_after_at
    provider = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Provider)
    threading.Thread(target=provider.serve_forever, daemon=True).start()
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
        closing = fleet(server, THREADS // 4, retry_after_at=THREADS // 4)
    finally:
        server.stop()
    told = next(a[0] for a in closing if a[1] == 429)
    inside = sum(1 for a in closing if told < a[0] < told + 5)
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
    lines += [f"| one 429 with `Retry-After: 5` in a run of {THREADS // 4} threads: calls sent in those 5 s | "
              f"{inside} |", ""]
    best = max((max(m) for m in minutes), default=0.0)
    near = bool(minutes) and all(max(m) >= 0.95 for m in minutes)
    TARGETS[:] = [
        f"| {THREADS} threads on 2 workers against a provider enforcing {RPM} requests/min and {TPM:,} "
        f"tokens/min: no 429, each busy minute within 95% of its binding limit | {refused} answers of 429; "
        f"busiest minute at {best:.0%} | {'yes' if refused == 0 and near else 'no'} |",
        f"| the same with one 429 + `Retry-After: 5`: no call of that limit sent in those 5 s | {inside} sent | "
        f"{'yes' if inside == 0 else 'no'} |",
    ]
    return lines
