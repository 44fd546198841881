"""A 100-item fan-out against 100 sequential steps, measured for `make bench` (report.py calls
`section()`; run alone with `python3 runtime/benches/report.py --only fan-out`).

Two YAML workflows on the built-in scripted agent (answers from the schemas' examples), run by
the release binary with the home on tmpfs: one whose second step fans out over the 100 items
the first lists (`max_parallel: 64`), one of 100 steps each depending on the one before. The
whole `run` process is timed, runs alternating, and divided by 100: what an item costs against
what a step costs.
"""

import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BINARY = ROOT / "target" / "release" / "uncaged-workflow"
ITEMS = 100
RUNS = 7

SCHEMA = """    schema:
      type: object
      required: [done]
      properties:
        done: { type: boolean }
      examples:
        - { done: true }
"""


def fan_out_yaml():
    files = ", ".join(f"f{i}.rs" for i in range(ITEMS))
    return f"""description: Review {ITEMS} files at once
steps:
  - id: list
    description: List the files.
    schema:
      type: object
      required: [files]
      properties:
        files: {{ type: array, items: {{ type: string }} }}
      examples:
        - files: [{files}]
  - id: review
    description: Review one file.
    depends_on: [list]
    for_each: $steps.list.output.files
    max_parallel: 64
    inputs:
      file: $item
{SCHEMA}"""


def sequential_yaml():
    steps = []
    for i in range(ITEMS):
        depends = f"\n    depends_on: [s{i - 1}]" if i else ""
        steps.append(f"  - id: s{i}\n    description: Step {i}.{depends}\n{SCHEMA}")
    return f"description: {ITEMS} steps one after the other\nmax_rounds: {ITEMS * 3}\nsteps:\n" + "".join(steps)


def run_once(env, name):
    started = time.perf_counter()
    done = subprocess.run([BINARY, "run", name, "-p", "go"], env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    assert done.returncode == 0, done
    return elapsed * 1e6 / ITEMS


def section():
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    fan, seq = [], []
    with tempfile.TemporaryDirectory(dir=shm) as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env["UNCAGED_WORKFLOW_HOME"] = home
        # 100 steps are 100 roles, over the default limit of 64 a bundle may declare.
        (Path(home) / "config.yaml").write_text("limits:\n  roles: 128\n")
        for name, text in [("fan-out", fan_out_yaml()), ("sequential", sequential_yaml())]:
            path = Path(home) / f"{name}.yaml"
            path.write_text(text)
            subprocess.run([BINARY, "add", name, path], check=True, env=env, capture_output=True)
            run_once(env, name)  # warm the AOT cache
        for _ in range(RUNS):
            fan.append(run_once(env, "fan-out"))
            seq.append(run_once(env, "sequential"))
    f, s = statistics.median(fan), statistics.median(seq)
    return ["## Fan-out: 100 items at once vs 100 sequential steps (release build, home on tmpfs)", "",
            f"Two YAML workflows on the scripted agent: a step fanning out over {ITEMS} items (64 at a",
            f"time, each item its own journaled agent call, the whole fan-out one step of the thread)",
            f"against {ITEMS} steps each depending on the one before (each its own step, and role: the",
            f"home's `limits.roles` is raised to 128 for it). The whole",
            f"`run` process, divided by {ITEMS}; {RUNS} runs each, alternating.", "",
            "| | per item / per step (median) | spread |", "|---|---|---|",
            f"| 100-item fan-out | {f:.0f} µs | {min(fan):.0f} – {max(fan):.0f} µs |",
            f"| 100 sequential steps | {s:.0f} µs | {min(seq):.0f} – {max(seq):.0f} µs |",
            f"| an item / a step | {f / s:.2f}× | |", ""]


if __name__ == "__main__":
    print("\n".join(section()))
