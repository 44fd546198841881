"""What tracing costs per step, measured for `make bench` (report.py calls `section()`; run
alone with `python3 runtime/benches/report.py --only telemetry`):

the same 1,000-step thread (solve-issue on the scripted agent, `--max-rounds 1000`), run by the
release binary with export off, and with export on to a collector in this process (an OTLP/HTTP
endpoint that reads each request and answers 200). Runs alternate, off then on, so that the
machine's noise falls on both alike. The home is on tmpfs: what is left is the CPU the spans
cost, not the disk.
"""

import http.server
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import loopback
import workers

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "target"
BINARY = TARGET / "release" / "uncaged-workflow"
BUNDLE = TARGET / "wasm32-wasip2" / "guest" / "solve_issue.wasm"
STEPS = 1000
RUNS = 7
# Rows for BENCHMARKS.md's targets, set by the last `section()`.
TARGETS = []
ANSWERS = """planner: "Plan: fix it\\n{\\"steps\\": [\\"Reproduce the bug\\"]}"
developer: "Done\\n{\\"summary\\": \\"Fixed\\"}"
reviewer: "Not yet\\n{\\"approved\\": false, \\"comments\\": [\\"More\\"]}"
"""


class Collector(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint: reads the export, counts its bytes, answers 200."""
    received = 0
    requests = 0

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        Collector.received += len(body)
        Collector.requests += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def run_once(env, answers):
    # Each run starts its worker: one left by the run before would not have this run's exporter.
    workers.wait_until_gone(env["UNCAGED_WORKFLOW_HOME"])
    started = time.perf_counter()
    done = subprocess.run([BINARY, "run", "solve-issue", "-p", "Fix the crash", "--max-rounds", str(STEPS),
                           "--agent", f"scripted:{answers}"], env=env, capture_output=True)
    elapsed = time.perf_counter() - started
    assert done.returncode == 2, done  # max rounds reached: STEPS steps taken
    return elapsed * 1e6 / STEPS


def section():
    server = loopback.serve(Collector)
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    off, on = [], []
    with tempfile.TemporaryDirectory(dir=shm) as home:
        base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        base["UNCAGED_WORKFLOW_HOME"] = home
        answers = Path(home) / "answers.yaml"
        answers.write_text(ANSWERS)
        subprocess.run([BINARY, "add", "solve-issue", BUNDLE], check=True, env=base, capture_output=True)
        traced = dict(base, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint)
        run_once(base, answers)  # warm the AOT cache
        for _ in range(RUNS):
            off.append(run_once(base, answers))
            on.append(run_once(traced, answers))
    server.shutdown()
    o, t = statistics.median(off), statistics.median(on)
    TARGETS[:] = [f"| tracing on costs ≤ 5% a step | {(t - o) / o * 100:+.0f}% ({t - o:+.0f} µs) "
                  f"| {'yes' if (t - o) / o <= 0.05 else 'no'} |"]
    return ["## Tracing: what export costs per step (release build, home on tmpfs)", "",
            f"A thread of {STEPS:,} steps (solve-issue, scripted agent), the whole `run` process divided by",
            f"its steps, {RUNS} runs each, alternating. Export on sends every span (a run, {STEPS:,} steps,",
            f"{STEPS:,} agent calls) over OTLP/HTTP to a collector on loopback; the worker waits for none",
            "of them.", "",
            "| export | per step (median) | spread |", "|---|---|---|",
            f"| off | {o:.0f} µs | {min(off):.0f} – {max(off):.0f} µs |",
            f"| on | {t:.0f} µs | {min(on):.0f} – {max(on):.0f} µs |",
            f"| cost of tracing | {t - o:+.0f} µs ({(t - o) / o * 100:+.0f}%) | |", "",
            f"The collector received {Collector.requests:,} export requests, "
            f"{Collector.received / 1024:.0f} KiB in all, for the {RUNS} traced runs.", ""]


if __name__ == "__main__":
    print("\n".join(section()))
