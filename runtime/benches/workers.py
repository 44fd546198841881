"""Waiting for a home directory's bundle workers to exit, for the benchmarks that time a cold
`run` (a worker stays a moment after its last thread, for the next one: a `run` started in that
moment hands its thread to it instead of starting one)."""

import time
from pathlib import Path


def wait_until_gone(home, timeout=30.0):
    """Returns once no worker serves a socket under `home` (`run/<HASH>.sock`)."""
    deadline = time.monotonic() + timeout
    run = Path(home) / "run"
    while any(run.glob("*.sock")):
        if time.monotonic() > deadline:
            raise TimeoutError(f"a worker of {home} did not exit within {timeout} s")
        time.sleep(0.01)
