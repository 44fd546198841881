"""Waiting for a home directory's bundle workers to exit, for the benchmarks that time a cold
`run` (a worker stays a moment after its last thread, for the next one: a `run` started in that
moment hands its thread to it instead of starting one); and stopping the workers a benchmark's
commands started on their own (on a database, a pool worker started on demand, which a
benchmark that stops the database would otherwise leave waiting on its threads' agents)."""

import fcntl
import os
import signal
import time
from pathlib import Path


def wait_until_gone(home, timeout=30.0):
    """Returns once no worker serves a socket under `home` (`run/<HASH>.sock`) and none holds
    its lock (`run/<HASH>.lock`, held until the process is gone: a worker started while the
    last one still held it would wait for it)."""
    deadline = time.monotonic() + timeout
    run = Path(home) / "run"
    while any(run.glob("*.sock")) or any(held(lock) for lock in run.glob("*.lock")):
        if time.monotonic() > deadline:
            raise TimeoutError(f"a worker of {home} did not exit within {timeout} s")
        time.sleep(0.01)


def held(lock):
    """Whether a process holds `lock` (a worker's `flock`)."""
    try:
        with open(lock, "rb") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(f, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    except FileNotFoundError:
        return False


def kill_all(home):
    """Kills (SIGKILL) every process started for `home`: named in its environment or on its
    command line (`--home HOME`)."""
    mark = f"UNCAGED_WORKFLOW_HOME={home}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
            if mark in environ or any(a == b"--home" and b == os.fsencode(home) for a, b in zip(argv, argv[1:])):
                os.kill(int(proc.name), signal.SIGKILL)
        except OSError:
            pass
