"""A fan-out's item against a sequential step, measured for `make bench` (report.py calls
`section()`; run alone with `python3 runtime/benches/report.py --only fan-out`).

Two YAML workflows on the built-in scripted agent (answers from the schemas' examples), run by
the release binary with the home on tmpfs: one whose second step fans out over the items the
first lists (`max_parallel: 64`), one of steps each depending on the one before. Each is run at
two sizes, 10 and 110 items (steps), the whole `run` process timed, runs alternating: the
difference between the sizes, divided by 100, is what an item (a step) costs. Dividing one
run's time by its items instead would count the process's start (~20 ms) as part of each.
"""

import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import workers

ROOT = Path(__file__).resolve().parents[2]
BINARY = ROOT / "target" / "release" / "uncaged-workflow"
ITEMS = 100
# The smaller size of each workflow; the larger is SMALL + ITEMS.
SMALL = 10
# Rows for BENCHMARKS.md's targets, set by the last `section()`.
TARGETS = []
RUNS = 7

SCHEMA = """    schema:
      type: object
      required: [done]
      properties:
        done: { type: boolean }
      examples:
        - { done: true }
"""


def fan_out_yaml(items=ITEMS):
    files = ", ".join(f"f{i}.rs" for i in range(items))
    return f"""description: Review {items} files at once
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


def sequential_yaml(items=ITEMS):
    steps = []
    for i in range(items):
        depends = f"\n    depends_on: [s{i - 1}]" if i else ""
        steps.append(f"  - id: s{i}\n    description: Step {i}.{depends}\n{SCHEMA}")
    return f"description: {items} steps one after the other\nmax_rounds: {items * 3}\nsteps:\n" + "".join(steps)


def run_once(env, name):
    """The whole `run` of workflow `name`, in milliseconds, its worker started for it."""
    workers.wait_until_gone(env["UNCAGED_WORKFLOW_HOME"])
    started = time.perf_counter()
    done = subprocess.run([BINARY, "run", name, "-p", "go"], env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    assert done.returncode == 0, done
    return elapsed * 1e3


def section():
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    large = SMALL + ITEMS
    runs = {}
    with tempfile.TemporaryDirectory(dir=shm) as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env["UNCAGED_WORKFLOW_HOME"] = home
        # 110 steps are 110 roles, over the default limit of 64 a bundle may declare.
        (Path(home) / "config.yaml").write_text("limits:\n  roles: 128\n")
        for n in (SMALL, large):
            for name, text in [(f"fan-out-{n}", fan_out_yaml(n)), (f"sequential-{n}", sequential_yaml(n))]:
                path = Path(home) / f"{name}.yaml"
                path.write_text(text)
                subprocess.run([BINARY, "add", name, path], check=True, env=env, capture_output=True)
                run_once(env, name)  # warm the AOT cache
        names = [f"{kind}-{n}" for kind in ("fan-out", "sequential") for n in (SMALL, large)]
        for _ in range(RUNS):
            for name in names:
                runs.setdefault(name, []).append(run_once(env, name))
    m = {name: statistics.median(times) for name, times in runs.items()}
    item = (m[f"fan-out-{large}"] - m[f"fan-out-{SMALL}"]) * 1e3 / ITEMS
    step = (m[f"sequential-{large}"] - m[f"sequential-{SMALL}"]) * 1e3 / ITEMS
    whole_item, whole_step = m[f"fan-out-{large}"], m[f"sequential-{large}"]
    TARGETS[:] = [f"| a fan-out item ≤ 0.5× a sequential step | {item / step:.2f}× ({item:.0f} vs {step:.0f} µs) "
                  f"| {'yes' if item / step <= 0.5 else 'no'} |"]
    return ["## Fan-out: an item vs a sequential step (release build, home on tmpfs)", "",
            "Two YAML workflows on the scripted agent: a step fanning out over its items (64 at a",
            "time, each item its own journaled agent call, the whole fan-out one step of the thread)",
            "against steps each depending on the one before (each its own step, and role: the",
            f"home's `limits.roles` is raised to 128 for it). Each at {SMALL} and {large} items (steps),",
            f"the whole `run` process, {RUNS} runs each, alternating; an item's (a step's) cost is the",
            f"difference between the two sizes' medians divided by {ITEMS}, so that the process's start",
            "is not counted in it.", "",
            "| | whole run, " + f"{SMALL} | whole run, {large} | per item / per step |", "|---|---|---|---|",
            f"| fan-out | {m[f'fan-out-{SMALL}']:.1f} ms | {whole_item:.1f} ms | {item:.0f} µs |",
            f"| sequential steps | {m[f'sequential-{SMALL}']:.1f} ms | {whole_step:.1f} ms | {step:.0f} µs |",
            f"| an item / a step | | | {item / step:.2f}× |", "",
            f"Divided whole (the {large}-item run by its items, the start included): "
            f"{whole_item * 1e3 / large:.0f} µs an item, {whole_step * 1e3 / large:.0f} µs a step "
            f"({whole_item / whole_step:.2f}×), how this row was measured before.", ""]


if __name__ == "__main__":
    print("\n".join(section()))
