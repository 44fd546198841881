"""Threads started over MCP (`serve`'s /mcp) side by side with the same starts over the HTTP API
(`POST /api/v1/threads`), measured for `make bench` (report.py calls `section()`; run alone with
`python3 runtime/benches/report.py --only mcp`):

- starts per second from CLIENTS clients at once: the API's POST (answered once the thread is
  queued), an MCP `tools/call` from a client of the tasks extension (answered with the task once
  the thread is queued: the same start), and an MCP call that waits for the thread's end (5
  steps of solve-issue on the scripted agent);
- the time from the request to the thread's first step, one start at a time: the first step's
  recorded time minus the time the request was sent.

Both sides speak plain HTTP/1.1 from this process (http.client, keep-alive), so neither pays for
a client library: the MCP requests are the stateless 2026-07-28 ones an SDK sends. The release
binary, on loopback, a home on the disk under target/. Rounds alternate API and MCP.
"""

import concurrent.futures
import http.client
import json
import os
import statistics
import subprocess
import tempfile
import time

from serve_load import BINARY, BUNDLE, TARGET, Serve, home_env

STARTS = 200
CALLS_TO_END = 80
CLIENTS = 8
ROUNDS = 3
FIRST_STEPS = 30

MCP_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
    "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
}
PLAIN_META = dict(MCP_META, **{"io.modelcontextprotocol/clientCapabilities": {}})


class Starter:
    """One client's connection, starting threads one way."""

    def __init__(self, serve, way):
        host, port = serve.target
        self.connection = http.client.HTTPConnection(host, port, timeout=120)
        self.serve, self.way, self.n = serve, way, 0

    def start(self, prompt):
        """Starts one thread; its id."""
        self.n += 1
        headers = {"Authorization": f"Bearer {self.serve.token}", "Content-Type": "application/json",
                   "Host": self.serve.addr}
        if self.way == "api":
            body = json.dumps({"workflow": "solve-issue", "prompt": prompt})
            self.connection.request("POST", "/api/v1/threads", body, headers)
            answer = self.connection.getresponse()
            text = answer.read()
            assert answer.status == 201, (answer.status, text)
            return json.loads(text)["id"]
        meta = MCP_META if self.way == "mcp-task" else PLAIN_META
        body = json.dumps({"jsonrpc": "2.0", "id": self.n, "method": "tools/call", "params": {
            "name": "solve-issue", "arguments": {"prompt": prompt}, "_meta": meta}})
        headers.update({"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28",
                        "Mcp-Method": "tools/call", "Mcp-Name": "solve-issue"})
        self.connection.request("POST", "/mcp", body, headers)
        answer = self.connection.getresponse()
        text = answer.read().decode()
        assert answer.status == 200, (answer.status, text)
        message = [line[5:] for line in text.splitlines() if line.startswith("data:") and line[5:].strip()][-1]
        result = json.loads(message)["result"]
        return result["_meta"]["uncaged-workflow/thread"]

    def close(self):
        self.connection.close()


def burst(serve, way, count):
    """`count` starts from CLIENTS clients at once: per second, median and p99 request (ms)."""

    def client(n):
        starter = Starter(serve, way)
        latencies = []
        for i in range(n):
            started = time.perf_counter()
            starter.start(f"burst {way} {i}")
            latencies.append((time.perf_counter() - started) * 1e3)
        starter.close()
        return latencies

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        latencies = [ms for part in pool.map(client, [count // CLIENTS] * CLIENTS) for ms in part]
    elapsed = time.perf_counter() - started
    latencies.sort()
    return len(latencies) / elapsed, statistics.median(latencies), latencies[int(len(latencies) * 0.99) - 1]


def first_steps(serve, way, env):
    """The time (ms) from each of FIRST_STEPS requests, one at a time, to its thread's first step."""
    starter = Starter(serve, way)
    sent = []
    for i in range(FIRST_STEPS):
        at = time.time() * 1e3
        sent.append((starter.start(f"first {way} {i}"), at))
        time.sleep(0.05)
    starter.close()
    delays = []
    for thread, at in sent:
        for _ in range(500):
            shown = subprocess.run([BINARY, "thread", thread, "--json"], env=env, check=True,
                                   capture_output=True, text=True).stdout
            steps = json.loads(shown)["steps"]
            if steps:
                delays.append(steps[0]["timestamp"] - at)
                break
            time.sleep(0.02)
    return statistics.median(delays)


def measure():
    with tempfile.TemporaryDirectory(dir=TARGET) as home:
        env = home_env(home)
        subprocess.run([BINARY, "add", "solve-issue", BUNDLE], env=env, check=True, capture_output=True)
        # A client of the tasks extension is handed its task at once, not after its thread
        # had `mcp.task_after` to end: the start path is what is measured.
        with open(os.path.join(home, "config.yaml"), "w") as config:
            config.write("mcp:\n  task_after: 0s\n")
        serve = Serve(home)
        try:
            for way in ("api", "mcp-task"):
                burst(serve, way, CLIENTS * 2)  # the worker started, the paths warm
            rows = {way: [] for way in ("api", "mcp-task", "mcp-end")}
            for _ in range(ROUNDS):
                rows["api"].append(burst(serve, "api", STARTS))
                rows["mcp-task"].append(burst(serve, "mcp-task", STARTS))
                rows["mcp-end"].append(burst(serve, "mcp-end", CALLS_TO_END))
                # Let the burst's threads run out before the next round.
                time.sleep(3)
            firsts = {}
            for way in ("api", "mcp-task", "api", "mcp-task"):
                # Each way twice, alternating; the second (warm) one is kept.
                firsts[way] = first_steps(serve, way, env)
            return rows, firsts
        finally:
            serve.stop()


# The rows of the Targets table this part measured (filled by `section()`).
TARGETS = []


def section():
    """The BENCHMARKS.md lines of this part."""
    rows, firsts = measure()
    med = statistics.median
    rate = {way: med(r[0] for r in runs) for way, runs in rows.items()}
    starts_ratio = rate["api"] / rate["mcp-task"]
    first_ratio = firsts["mcp-task"] / firsts["api"]
    TARGETS[:] = [
        f"| MCP starts per second within 1.5× of the API's ({CLIENTS} clients, tasks) | {starts_ratio:.2f}× "
        f"({rate['mcp-task']:,.0f} vs {rate['api']:,.0f}/s) | {'yes' if starts_ratio <= 1.5 else 'no'} |",
        f"| MCP `tools/call` to the first step within 1.5× of the API's | {first_ratio:.2f}× "
        f"({firsts['mcp-task']:.1f} vs {firsts['api']:.1f} ms) | {'yes' if first_ratio <= 1.5 else 'no'} |",
    ]
    lines = ["## MCP: workflows as tools, against the API (release build, loopback, home on disk)", "",
             f"Threads started from {CLIENTS} clients at once, {ROUNDS} alternating rounds (medians of the rounds;",
             "spread: the rounds' lowest and highest rate). MCP requests are the stateless 2026-07-28",
             "ones; a client of the tasks extension is answered once the thread is queued, as the API is;",
             "a client without tasks waits for the thread's end (5 steps, scripted agent):", "",
             "| how | threads per second | spread | median request | p99 request | MCP / API |", "|---|---|---|---|---|---|"]
    names = {"api": "`POST /api/v1/threads`", "mcp-task": "MCP `tools/call`, tasks",
             "mcp-end": "MCP `tools/call` to the end"}
    for way, runs in rows.items():
        rates = [r[0] for r in runs]
        ratio = "—" if way == "api" else f"{rate['api'] / rate[way]:.2f}×"
        lines.append(f"| {names[way]} | {rate[way]:,.0f} | {min(rates):,.0f}–{max(rates):,.0f} | "
                     f"{med(r[1] for r in runs):.1f} ms | {med(r[2] for r in runs):.1f} ms | {ratio} |")
    lines += ["", f"From the request to the thread's first step, one start at a time ({FIRST_STEPS} each, median):", "",
              "| how | to the first step |", "|---|---|",
              f"| `POST /api/v1/threads` | {firsts['api']:.1f} ms |",
              f"| MCP `tools/call` | {firsts['mcp-task']:.1f} ms |", ""]
    return lines


if __name__ == "__main__":
    print("\n".join(section()))
