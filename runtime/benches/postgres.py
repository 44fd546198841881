"""The PostgreSQL store, measured for `make bench` (report.py calls `section()`; run alone with
`python3 runtime/benches/postgres.py` to print just this part):

- per durable step: our runtime on PostgreSQL vs on files vs LangGraph with its Postgres
  checkpointer (langgraph-checkpoint-postgres), all against the same server;
- throughput of short threads (10 steps, instant agent) with 1, 2 and 4 worker processes;
- takeover: from `kill -9` of a worker to the first new step of its threads on another;
- what a thread and a step cost in the database, for the capacity plan in docs/postgres.md.

The server is the distribution's PostgreSQL, `initdb` in a temporary directory, on an ephemeral
loopback port, run as the `postgres` user when we are root, with its durable defaults (fsync on).
"""

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "target"
BINARY = TARGET / "release" / "uncaged-workflow"
PG_PACKAGES = ["langgraph-checkpoint-postgres", "psycopg[binary]"]
THROUGHPUT_THREADS = 400
LEASE_MS = 3000


def pg_bin():
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name))
    if not versions:
        raise SystemExit("PostgreSQL is not installed (make test installs it)")
    return versions[-1].parent


class Server:
    """A PostgreSQL server of our own, stopped on exit."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="uncaged-bench-pg-"))
        as_root = os.geteuid() == 0
        self.prefix = ["runuser", "-u", "postgres", "--"] if as_root else []
        if as_root:
            shutil.chown(self.dir, user="postgres")
        bin = pg_bin()
        subprocess.run(self.prefix + [bin / "initdb", "-D", self.dir / "data", "-U", "uncaged", "--auth=trust",
                                      "-E", "UTF8"], check=True, capture_output=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.process = subprocess.Popen(self.prefix + [bin / "postgres", "-D", self.dir / "data", "-p", str(self.port),
                                                       "-k", self.dir, "-c", "listen_addresses=127.0.0.1",
                                                       "-c", "max_connections=300"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for line in self.process.stderr:
            if "ready to accept connections" in line:
                break
        self.count = 0

    def url(self, db):
        return f"postgres://uncaged@127.0.0.1:{self.port}/{db}"

    def psql(self, db, sql):
        return subprocess.run([pg_bin() / "psql", "-X", "-q", "-A", "-t", "-d", self.url(db), "-c", sql],
                              check=True, capture_output=True, text=True).stdout.strip()

    def database(self):
        self.count += 1
        name = f"bench{self.count}"
        self.psql("postgres", f"CREATE DATABASE {name}")
        return name

    def stop(self):
        self.process.terminate()
        self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class Session:
    """One psql process kept open for many queries."""

    def __init__(self, server, db):
        self.process = subprocess.Popen([pg_bin() / "psql", "-X", "-q", "-A", "-t", "-d", server.url(db)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    def query(self, sql):
        self.process.stdin.write(f"{sql};\n\\echo __done__\n")
        self.process.stdin.flush()
        lines = []
        for line in self.process.stdout:
            if line.strip() == "__done__":
                return "\n".join(lines)
            lines.append(line.strip())
        raise SystemExit("psql went away")

    def close(self):
        self.process.stdin.close()
        self.process.wait()


def median_spread(values):
    values = sorted(values)
    return statistics.median(values), values[0], values[-1]


def fmt_us(us):
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.0f} µs"


def per_step(server, python):
    """Our durable step on PostgreSQL, and LangGraph's with its Postgres checkpointer."""
    env = dict(os.environ, UNCAGED_BENCH_PG=server.url(server.database()))
    out = subprocess.run(["cargo", "bench", "-q", "-p", "uncaged-workflow", "--bench", "workflow"], cwd=ROOT,
                         env=env, check=True, capture_output=True, text=True).stdout
    results = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    ours = {r["steps"]: r["per_step_us"] for r in results if r["mode"] == "postgres"}
    files = {r["steps"]: r["per_step_us"] for r in results if r["mode"] == "durable"}
    peer = {}
    script = ROOT / "runtime" / "benches" / "langgraph" / "solve_issue.py"
    for steps in ours:
        dsn = server.url(server.database()).replace("postgres://", "postgresql://")
        out = subprocess.run([python, script, "--steps", str(steps), "--saver", "postgres", "--dsn", dsn,
                              "--repeat", "5"], check=True, capture_output=True, text=True).stdout
        peer[steps] = json.loads(out)["per_step_us"]
    return ours, files, peer


def start_worker(env, home, log, max_threads=200):
    process = subprocess.Popen([BINARY, "--home", home, "-v", "worker", "--max-threads", str(max_threads)],
                               env=env, stdout=subprocess.PIPE, stderr=open(log, "a"), text=True)
    assert process.stdout.readline().startswith("ready"), "the worker did not start"
    return process


def queue(server, db, home, n):
    env = dict(os.environ, UNCAGED_BENCH_PG=server.url(db), UNCAGED_BENCH_ENQUEUE=str(n),
               UNCAGED_BENCH_ANSWERS=str(Path(home) / "answers.yaml"))
    subprocess.run(["cargo", "bench", "-q", "-p", "uncaged-workflow", "--bench", "workflow"], cwd=ROOT, env=env,
                   check=True, capture_output=True)


def throughput(server, workers):
    """Seconds for `workers` worker processes to run THROUGHPUT_THREADS queued 10-step threads."""
    db = server.database()
    with tempfile.TemporaryDirectory(dir=TARGET) as home:
        queue(server, db, home, THROUGHPUT_THREADS)
        env = dict(os.environ, UNCAGED_WORKFLOW_STORE=server.url(db))
        # One psql session polls (a process and a server backend started every poll would
        # take a share of this 2-core machine's CPU from what is measured).
        poll = Session(server, db)
        started = time.perf_counter()
        processes = [start_worker(env, home, Path(home) / f"w{i}.log") for i in range(workers)]
        while True:
            done, queued = map(int, poll.query("SELECT count(*) FILTER (WHERE summary->>'returnCode' IS NOT NULL), "
                                               "count(*) FILTER (WHERE runnable) "
                                               "FROM uncaged_workflow.threads").split("|"))
            if done >= THROUGHPUT_THREADS:
                break
            if queued == 0:
                raise SystemExit(f"only {done} of {THROUGHPUT_THREADS} threads ended (see {home}/w*.log)")
            time.sleep(0.02)
        elapsed = time.perf_counter() - started
        poll.close()
        for p in processes:
            p.terminate()
            p.wait()
        steps = int(server.psql(db, "SELECT count(*) FROM uncaged_workflow.thread_records "
                                    "WHERE line LIKE '{\"role\"%'"))
    return elapsed, steps, db


def takeover(server, runs=3):
    """From `kill -9` of a worker to the first new step of its threads on another worker."""
    results = []
    for _ in range(runs):
        db = server.database()
        with tempfile.TemporaryDirectory(dir=TARGET) as home:
            agent = Path(home) / "agent.sh"
            agent.write_text("#!/bin/sh\ninput=$(cat)\nsleep 0.2\ncase \"$input\" in\n"
                             "  *'\"role\":{\"name\":\"planner\"'*) echo '{\"steps\": [\"a\"]}' ;;\n"
                             "  *'\"role\":{\"name\":\"developer\"'*) echo '{\"summary\": \"s\"}' ;;\n"
                             "  *) echo '{\"approved\": false}' ;;\nesac\n")
            agent.chmod(0o755)
            env = dict(os.environ, UNCAGED_WORKFLOW_STORE=server.url(db), UNCAGED_WORKFLOW_LEASE_MS=str(LEASE_MS))
            bundle = TARGET / "wasm32-wasip2" / "guest" / "solve_issue.wasm"
            subprocess.run([BINARY, "--home", home, "add", "solve-issue", bundle], env=env, check=True,
                           capture_output=True)
            first = start_worker(env, home, Path(home) / "first.log")
            for _ in range(20):
                subprocess.run([BINARY, "--home", home, "run", "solve-issue", "-p", "x", "--max-rounds", "200",
                                "--agent", f"command:{agent}", "--detach"], env=env, check=True, capture_output=True)
            time.sleep(1.5)
            second = start_worker(env, home, Path(home) / "second.log")
            count = "SELECT count(*) FROM uncaged_workflow.thread_records"
            first.kill()
            killed = time.perf_counter()
            first.wait()
            before = int(server.psql(db, count))
            while int(server.psql(db, count)) == before:
                time.sleep(0.005)
            results.append((time.perf_counter() - killed) * 1000)
            second.terminate()
            second.wait()
    return results


def sizes(server, db):
    """Bytes in the database per thread and per step, from the throughput run's database."""
    rows = server.psql(db, "SELECT (SELECT count(*) FROM uncaged_workflow.threads), "
                           "(SELECT count(*) FROM uncaged_workflow.thread_records WHERE line LIKE '{\"role\"%'), "
                           "pg_total_relation_size('uncaged_workflow.threads'), "
                           "pg_total_relation_size('uncaged_workflow.thread_records'), "
                           "pg_total_relation_size('uncaged_workflow.thread_calls'), "
                           "pg_total_relation_size('uncaged_workflow.thread_log')").split("|")
    threads, steps, *table_bytes = map(int, rows)
    return threads, steps, dict(zip(["threads", "thread_records", "thread_calls", "thread_log"], table_bytes))


def section(python):
    """The BENCHMARKS.md lines of this part."""
    subprocess.run([python, "-m", "pip", "install", "-q", *PG_PACKAGES], check=True)
    server = Server()
    try:
        ours, files, peer = per_step(server, python)
        runs = {workers: throughput(server, workers) for workers in [1, 2, 4]}
        taken = takeover(server)
        threads, steps, table_bytes = sizes(server, runs[1][2])
    finally:
        server.stop()
    lines = ["## PostgreSQL store", "",
             "One PostgreSQL server (the distribution's, fsync on) on this machine, over loopback.", "",
             "### Per durable step: PostgreSQL vs files vs LangGraph's Postgres checkpointer", "",
             "The solve-issue loop, instant agent, as in the tables above; ours through the real runtime",
             "with the store in the database; LangGraph with `langgraph-checkpoint-postgres` on the same",
             "server; ours with the store in files (fsync per step) in the same run.", "",
             "| N | ours, PostgreSQL | ours, files | LangGraph, Postgres checkpointer | PostgreSQL / files | LangGraph / ours on PostgreSQL |",
             "|---|---|---|---|---|---|"]
    for n in sorted(ours):
        o, f, p = median_spread(ours[n]), median_spread(files[n]), median_spread(peer[n])
        lines.append(f"| {n} | {fmt_us(o[0])} ({fmt_us(o[1])}–{fmt_us(o[2])}) | {fmt_us(f[0])} | {fmt_us(p[0])} "
                     f"({fmt_us(p[1])}–{fmt_us(p[2])}) | {o[0] / f[0]:.2f}× | {p[0] / o[0]:.1f}× |")
    lines += ["", f"### Throughput: {THROUGHPUT_THREADS} queued threads of 10 steps (instant agent)", "",
              "Worker processes started on an already filled queue, timed until the last thread ended;",
              "all on this 2-core machine, database included.", "",
              "| workers | seconds | threads/s | steps/s | vs 1 worker |", "|---|---|---|---|---|"]
    base = runs[1][0]
    for workers, (elapsed, steps_run, _) in sorted(runs.items()):
        lines.append(f"| {workers} | {elapsed:.2f} | {THROUGHPUT_THREADS / elapsed:.0f} | {steps_run / elapsed:.0f} | "
                     f"{base / elapsed:.2f}× |")
    t = median_spread(taken)
    lines += ["", "### Takeover after `kill -9` of a worker", "",
              f"20 threads on a worker with a {LEASE_MS} ms lease (`UNCAGED_WORKFLOW_LEASE_MS`), agents of",
              "200 ms; another worker idle beside it; from the kill to the first step the other worker",
              "stores for them.", "",
              f"| lease | median | spread |", "|---|---|---|",
              f"| {LEASE_MS} ms | {t[0]:.0f} ms | {t[1]:.0f} – {t[2]:.0f} ms |", "",
              "### What a thread costs in the database", "",
              f"From the 1-worker run: {threads} threads, {steps} steps (10-step threads, short answers).", "",
              "| table | bytes | per thread | per step |", "|---|---|---|---|"]
    for table, size in table_bytes.items():
        lines.append(f"| `{table}` | {size:,} | {size / threads:,.0f} | {size / max(steps, 1):,.0f} |")
    lines.append("")
    return lines


if __name__ == "__main__":
    python = sys.argv[1] if len(sys.argv) > 1 else str(TARGET / "bench-venv" / "bin" / "python")
    print("\n".join(section(python)))
