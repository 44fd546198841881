"""Evals, measured for `make bench` (report.py calls `section()`; run alone with
`python3 runtime/benches/report.py --only evals`).

A five-step sequential YAML workflow bound to an OpenAI-compatible endpoint in this process that
answers each request after 1 ms; 50 threads of it recorded by the release binary (home on tmpfs).
Then, `RUNS` times each:

- an eval asking every role live (`--agent-for` each role): 250 model calls, one thread at a
  time (`--concurrency 1`), against the same 250 calls made back to back from here on one
  kept-alive connection: what the eval adds over the live calls it makes;
- an eval of the same workflow with nothing live: every call answered by the recorded journal,
  every thread judged and compared: recorded steps judged per second.

The eval's own time is from its making to its end (`finished - created` in its report: the
bundle loaded, the threads chosen, run, judged); the whole process adds its start and exit.
"""

import http.client
import http.server
import json
import os
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import loopback

ROOT = Path(__file__).resolve().parents[2]
BINARY = ROOT / "target" / "release" / "uncaged-workflow"
THREADS = 50
STEPS = 5
RUNS = 3
# Threads at once: one, and the eval's default.
AT_ONCE = [1, 4]
ROLES = [f"step{i}" for i in range(1, STEPS + 1)]

# The rows of the Targets table this part measured (filled by `section()`).
TARGETS = []


def workflow():
    lines = ["description: Five steps, each reading the one before", "steps:"]
    for i, role in enumerate(ROLES):
        lines += [f"  - id: {role}", f"    description: Step {i + 1} of the work."]
        if i == 0:
            lines.append("    inputs: {task: $prompt}")
        else:
            lines += [f"    depends_on: [{ROLES[i - 1]}]", f"    inputs: {{before: $steps.{ROLES[i - 1]}.output}}"]
    return "\n".join(lines) + "\n"


class Model(http.server.BaseHTTPRequestHandler):
    """Chat completions answered after 1 ms, with a usage. Its header and body go out in one
    write, without Nagle's wait: written apart, a kept-alive client's delayed ACK holds every
    answer 40 ms."""
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        time.sleep(0.001)
        body = json.dumps({"id": "x", "object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "{\"ok\": true}"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 20}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def calls_alone(port, n, at_once):
    """Seconds for `n` requests, `at_once` of them at a time, each line of requests back to
    back on a kept-alive connection of its own."""
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 400}]})

    def line(count):
        connection = http.client.HTTPConnection("127.0.0.1", port)
        for _ in range(count):
            connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
            connection.getresponse().read()
        connection.close()

    lines = [threading.Thread(target=line, args=(n // at_once + (i < n % at_once),)) for i in range(at_once)]
    started = time.perf_counter()
    for t in lines:
        t.start()
    for t in lines:
        t.join()
    return time.perf_counter() - started


def eval_once(env, args):
    """One eval: (its own seconds, the whole process's seconds, its report)."""
    started = time.perf_counter()
    done = subprocess.run([BINARY, "eval", *args, "--json"], env=env, capture_output=True, text=True)
    whole = time.perf_counter() - started
    assert done.returncode == 0, done
    report = json.loads(done.stdout)
    return (report["finished"] - report["created"]) / 1000, whole, report


def section():
    server = loopback.serve(Model)
    port = server.server_address[1]
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    live, journal = {}, []
    try:
        with tempfile.TemporaryDirectory(dir=shm) as home:
            env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
            env["UNCAGED_WORKFLOW_HOME"] = home
            (Path(home) / "config.yaml").write_text(
                f"agent: local\nagents:\n  local:\n    kind: openai\n    base_url: http://127.0.0.1:{port}/v1\n    model: m\n")
            path = Path(home) / "flow.yaml"
            path.write_text(workflow())
            subprocess.run([BINARY, "add", "flow", path], check=True, env=env, capture_output=True)
            for i in range(THREADS):
                subprocess.run([BINARY, "run", "flow", "-p", f"task {i}"], check=True, env=env,
                               capture_output=True)
            every_role = [a for role in ROLES for a in ("--agent-for", f"{role}=local")]
            for _ in range(RUNS):
                for at_once in AT_ONCE:
                    own, whole, report = eval_once(env, [path, "--workflow", "flow", "--concurrency", str(at_once), *every_role])
                    assert report["totals"]["live"]["calls"] == THREADS * STEPS, report["totals"]
                    alone = calls_alone(port, THREADS * STEPS, at_once)
                    live.setdefault(at_once, []).append((own, whole, alone))
                own, whole, report = eval_once(env, [path, "--workflow", "flow"])
                assert report["totals"]["live"]["calls"] == 0, report["totals"]
                assert report["totals"]["unchanged"] == THREADS, report["totals"]
                journal.append((own, whole))
    finally:
        server.shutdown()
    steps = THREADS * STEPS
    med = statistics.median
    rate = [steps / own for own, _ in journal]
    whole_rate = [steps / whole for _, whole in journal]
    rows = []
    overheads = {}
    for at_once, runs in live.items():
        overhead = [own / alone - 1 for own, _, alone in runs]
        overheads[at_once] = (med(overhead), med([whole / alone - 1 for _, whole, alone in runs]))
        span = lambda values: f"{med(values) * 1000:.0f} ms | {min(values) * 1000:.0f} – {max(values) * 1000:.0f} ms"
        rows += [
            f"| every role live, {at_once} thread(s) at once: the eval | {span([o for o, _, _ in runs])} |",
            f"| … the whole process | {span([w for _, w, _ in runs])} |",
            f"| … the same {steps} calls alone, {at_once} at a time | {span([a for _, _, a in runs])} |",
            f"| … overhead of the eval over its calls | {med(overhead) * 100:.0f}% | {min(overhead) * 100:.0f} – {max(overhead) * 100:.0f}% |",
        ]
    default = overheads[AT_ONCE[-1]]
    TARGETS[:] = [
        f"| an eval's overhead over the live model calls it makes (1 ms model, {THREADS} threads of {STEPS} steps, {AT_ONCE[-1]} at once) ≤ 10% | {default[0] * 100:.0f}% (whole process {default[1] * 100:.0f}%; one at a time {overheads[1][0] * 100:.0f}%) | {'yes' if default[0] <= 0.10 else 'no'} |",
        f"| an eval answered by the journal: ≥ 5,000 recorded steps judged per second | {med(rate):,.0f}/s (whole process {med(whole_rate):,.0f}/s) | {'yes' if med(rate) >= 5000 else 'no'} |",
    ]
    return ["## Evals: overhead over the live calls, and recorded steps judged per second (release build, home on tmpfs)", "",
            f"{THREADS} recorded threads of a {STEPS}-step sequential YAML workflow on an OpenAI-compatible endpoint",
            f"in the benchmark's process answering each request after 1 ms. Every role asked live ({steps} calls),",
            "one thread at a time and four at once (the default), against the same requests made from",
            "Python as many at a time, each line of them on a kept-alive connection; and nothing live (the",
            "recorded journal answers every call, each thread judged and compared). The eval's own time is",
            f"`finished - created` of its report. {RUNS} runs.", "",
            "| | median | spread |", "|---|---|---|", *rows,
            f"| nothing live: recorded steps judged / s, the eval | {med(rate):,.0f} | {min(rate):,.0f} – {max(rate):,.0f} |",
            f"| nothing live: recorded steps judged / s, the whole process | {med(whole_rate):,.0f} | {min(whole_rate):,.0f} – {max(whole_rate):,.0f} |", ""]

if __name__ == "__main__":
    print("\n".join(section()))
    print("\n".join(TARGETS))
