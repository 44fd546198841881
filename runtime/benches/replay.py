"""Replay speed, measured for `make bench` (report.py calls `section()`; run alone with
`python3 runtime/benches/report.py --only replay`).

Threads of the 100-step sequential YAML workflow of fan_out.py are recorded on the built-in
scripted agent by the release binary (home on tmpfs), then `replay` runs them all through the
same workflow file, offline: the journal answers every call. Reported: recorded steps per
second as `replay` measures its own loop (bundle loaded), and for the whole process (building
the bundle from YAML, loading it, reading every thread and journal).
"""

import os
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import fan_out

ROOT = Path(__file__).resolve().parents[2]
BINARY = ROOT / "target" / "release" / "uncaged-workflow"
THREADS = 20
RUNS = 5


def section():
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    loop, whole = [], []
    with tempfile.TemporaryDirectory(dir=shm) as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env["UNCAGED_WORKFLOW_HOME"] = home
        (Path(home) / "config.yaml").write_text("limits:\n  roles: 128\n")
        path = Path(home) / "sequential.yaml"
        path.write_text(fan_out.sequential_yaml())
        subprocess.run([BINARY, "add", "sequential", path], check=True, env=env, capture_output=True)
        for _ in range(THREADS):
            subprocess.run([BINARY, "run", "sequential", "-p", "go"], check=True, env=env,
                           capture_output=True)
        steps = THREADS * fan_out.ITEMS
        for _ in range(RUNS):
            started = time.perf_counter()
            done = subprocess.run([BINARY, "replay", path, "--workflow", "sequential"], env=env,
                                  capture_output=True, text=True)
            elapsed = time.perf_counter() - started
            assert done.returncode == 0, done
            found = re.search(r"\((\d+) steps in (\d+) ms\)", done.stdout)
            assert found and int(found.group(1)) == steps, done.stdout
            loop.append(steps / max(int(found.group(2)), 1) * 1000)
            whole.append(steps / elapsed)
    return ["## Replay: recorded steps per second (release build, home on tmpfs)", "",
            f"{THREADS} threads of {fan_out.ITEMS} steps each (the sequential YAML workflow above, on the",
            "scripted agent), replayed by `replay` through the same workflow file: every call answered",
            f"from the thread's journal, every step compared with the recorded one. {RUNS} runs.", "",
            "| | recorded steps / s (median) | spread |", "|---|---|---|",
            f"| replay loop (bundle loaded) | {statistics.median(loop):,.0f} | {min(loop):,.0f} – {max(loop):,.0f} |",
            f"| whole `replay` process | {statistics.median(whole):,.0f} | {min(whole):,.0f} – {max(whole):,.0f} |", ""]


if __name__ == "__main__":
    print("\n".join(section()))
