"""The PostgreSQL store, measured for `make bench` (report.py calls `section()`; run alone with
`python3 runtime/benches/postgres.py` to print just this part):

- per durable step: our runtime on PostgreSQL vs on files vs LangGraph with its Postgres
  checkpointer (langgraph-checkpoint-postgres), all against the same server;
- throughput of short threads (10 steps, instant agent) with 1, 2 and 4 worker processes, with
  the CPU the workers and the database spent and the transactions group commit made;
- the group-commit window's latency/throughput trade-off, and a capacity plan from the above;
- takeover: from `kill -9` of a worker to the first new step of its threads on another;
- `threads` over 100,000 threads;
- what a thread and a step cost in the database, for the capacity plan in docs/postgres.md.

The server is the distribution's PostgreSQL, `initdb` in a temporary directory, on an ephemeral
loopback port, run as the `postgres` user when we are root, with its durable defaults (fsync on).
"""

import json
import os
import shutil
import socket
import statistics
import struct
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
WINDOWS_US = [0, 500, 2000]
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


def per_step_ours(server, window_us):
    """Our durable step on PostgreSQL (one thread, N=100) with a group-commit window."""
    env = dict(os.environ, UNCAGED_BENCH_PG=server.url(server.database()),
               UNCAGED_WORKFLOW_PG_COMMIT_WINDOW_US=str(window_us))
    out = subprocess.run(["cargo", "bench", "-q", "-p", "uncaged-workflow", "--bench", "workflow"], cwd=ROOT,
                         env=env, check=True, capture_output=True, text=True).stdout
    results = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    return [r["per_step_us"] for r in results if r["mode"] == "postgres" and r["steps"] == 100][0]


def per_step(server, python, rounds=3):
    """Our durable step on PostgreSQL, and LangGraph's with its Postgres checkpointer, measured
    in turns (ours, then theirs, `rounds` times, each on a fresh database) and pooled: this
    machine's speed drifts by more than the ratio's margin within minutes, and a drift then
    slows both sides rather than the one measured during it. LangGraph runs with each
    checkpoint persisted before its next step (`durability="sync"`, as ours), and with its
    default (`"async"`, persisted while the next step runs) for reference."""
    ours, files, peer, peer_async = {}, {}, {}, {}
    script = ROOT / "runtime" / "benches" / "langgraph" / "solve_issue.py"
    for _ in range(rounds):
        env = dict(os.environ, UNCAGED_BENCH_PG=server.url(server.database()))
        out = subprocess.run(["cargo", "bench", "-q", "-p", "uncaged-workflow", "--bench", "workflow"], cwd=ROOT,
                             env=env, check=True, capture_output=True, text=True).stdout
        for r in (json.loads(l) for l in out.splitlines() if l.startswith("{")):
            mode = {"postgres": ours, "durable": files}.get(r["mode"])
            if mode is not None:
                mode.setdefault(r["steps"], []).extend(r["per_step_us"])
        for steps in sorted(ours):
            for durability, into in [("sync", peer), ("async", peer_async)]:
                dsn = server.url(server.database()).replace("postgres://", "postgresql://")
                out = subprocess.run([python, script, "--steps", str(steps), "--saver", "postgres", "--dsn", dsn,
                                      "--repeat", "3", "--durability", durability],
                                     check=True, capture_output=True, text=True).stdout
                into.setdefault(steps, []).extend(json.loads(out)["per_step_us"])
    return ours, files, peer, peer_async


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


HZ = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """User + system CPU of process `pid` so far (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / HZ
    except (OSError, IndexError, ValueError):
        return 0.0


def postgres_cpu():
    """CPU so far of every PostgreSQL process (server and backends), by pid."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "postgres":
                    found[entry.name] = cpu_seconds(entry.name)
            except OSError:
                pass
    return found


def commits(server, db):
    """Transactions committed in database `db` so far."""
    return int(server.psql("postgres", f"SELECT xact_commit FROM pg_stat_database WHERE datname = '{db}'"))


def throughput(server, workers, window_us=0):
    """Seconds for `workers` worker processes to run THROUGHPUT_THREADS queued 10-step threads,
    with the CPU the workers and the database spent meanwhile and the transactions committed."""
    db = server.database()
    with tempfile.TemporaryDirectory(dir=TARGET) as home:
        queue(server, db, home, THROUGHPUT_THREADS)
        env = dict(os.environ, UNCAGED_WORKFLOW_STORE=server.url(db),
                   UNCAGED_WORKFLOW_PG_COMMIT_WINDOW_US=str(window_us))
        commits_before = commits(server, db)
        db_cpu_before = postgres_cpu()
        # One psql session polls (a process and a server backend started every poll would
        # take a share of this 2-core machine's CPU from what is measured).
        poll = Session(server, db)
        started = time.perf_counter()
        processes = [start_worker(env, home, Path(home) / f"w{i}.log") for i in range(workers)]
        while True:
            done, queued = map(int, poll.query("SELECT count(*) FILTER (WHERE return_code IS NOT NULL), "
                                               "count(*) FILTER (WHERE runnable) "
                                               "FROM uncaged_workflow.threads").split("|"))
            if done >= THROUGHPUT_THREADS:
                break
            if queued == 0:
                raise SystemExit(f"only {done} of {THROUGHPUT_THREADS} threads ended (see {home}/w*.log)")
            time.sleep(0.02)
        elapsed = time.perf_counter() - started
        poll.close()
        worker_cpu = sum(cpu_seconds(p.pid) for p in processes)
        db_cpu = sum(cpu - db_cpu_before.get(pid, 0.0) for pid, cpu in postgres_cpu().items())
        for p in processes:
            p.terminate()
            p.wait()
        transactions = commits(server, db) - commits_before
        steps = int(server.psql(db, "SELECT count(*) FROM uncaged_workflow.thread_records "
                                    "WHERE line LIKE '{\"role\"%'"))
    return {"elapsed": elapsed, "steps": steps, "db": db, "worker_cpu": worker_cpu, "db_cpu": db_cpu,
            "transactions": transactions}


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


LISTED_THREADS = 100_000


# Packing a listing summary as the binary does (`store/postgres/summary.rs`: layout byte 2, then
# postcard of `ThreadSummary`'s fields in order), for the rows this bench makes without running
# them; checked against what the binary packed for the thread it ran, so that the listing
# measured reads packed summaries (a row it could not read would be read from its columns).
SUMMARY_LAYOUT = 2
STATUSES = ["running", "paused", "waiting", "interrupted", "completed", "failed", "killed", "queued"]
CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def varint(n):
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | 0x80 if n else byte)
        if not n:
            return bytes(out)


def crockford(text):
    value = 0
    for c in text:
        value = value * 32 + CROCKFORD.index(c)
    return value


def packed_text(text):
    data = text.encode()
    return varint(len(data)) + data


def packed_option(value, pack):
    return b"\0" if value is None else b"\1" + pack(value)


def packed_summary(t):
    return (bytes([SUMMARY_LAYOUT]) + varint(crockford(t["id"])) + packed_text(t["name"])
            + varint(crockford(t["bundle"])) + varint(STATUSES.index(t["status"]))
            + varint(t["steps"]) + varint(t["started_ms"]) + packed_text(t["prompt"])
            + packed_option(t["return_code"], lambda c: varint((c << 1) ^ (c >> 31)))
            + packed_option(t["ended_ms"], varint) + packed_option(None, packed_text)  # waiting role
            + packed_option(None, varint) + packed_option(None, packed_text)  # paused, schedule
            + varint(t["tokens"]) + packed_option(t["cost_usd"], lambda f: struct.pack("<d", f))
            + packed_option(None, varint)  # parent
            + packed_option(None, packed_text))  # started by (a request from outside)


def listing(server, runs=5):
    """`threads` over a database of 100,000 ended threads: one real thread run by the binary, and
    copies of its row with other ids, times and prompts, packed summary included (the listing
    reads `threads` rows only). Wall time of the whole process, every thread printed to a pipe."""
    db = server.database()
    url = server.url(db)
    with tempfile.TemporaryDirectory(dir=TARGET) as home:
        env = dict(os.environ, UNCAGED_WORKFLOW_HOME=home, UNCAGED_WORKFLOW_STORE=url)
        bundle = TARGET / "wasm32-wasip2" / "guest" / "solve_issue.wasm"
        subprocess.run([BINARY, "add", "solve-issue", bundle], env=env, check=True, capture_output=True)
        subprocess.run([BINARY, "run", "solve-issue", "-p", "x"], env=env, check=True, capture_output=True)
        real = json.loads(server.psql(db, """
            SELECT row_to_json(t) FROM (SELECT id, bundle, next_seq, name, status, steps,
                started_ms, prompt, return_code, ended_ms, tokens, cost_usd,
                encode(listing, 'hex') AS listing FROM uncaged_workflow.threads) t"""))
        assert packed_summary(real).hex() == real["listing"], "bench packs as the binary does"
        columns = ["id", "bundle", "next_seq", "lease_token", "name", "status", "steps", "started_ms",
                   "prompt", "return_code", "ended_ms", "tokens", "cost_usd", "listing"]
        lines = []
        for i in range(1, LISTED_THREADS):
            task = f"task {i}: " + "Fix the failing test in the parser module; the reviewer wants a test. " * 3
            t = dict(real, id=str(i).rjust(26, "0"), lease_token=1, prompt=task[:120],
                     started_ms=real["started_ms"] + i, ended_ms=real["ended_ms"] + i)
            t["listing"] = "\\\\x" + packed_summary(t).hex()
            lines.append("\t".join(r"\N" if t[c] is None else str(t[c]) for c in columns))
        subprocess.run([pg_bin() / "psql", "-X", "-q", "-d", url, "-c",
                        f"COPY uncaged_workflow.threads ({', '.join(columns)}) FROM STDIN"],
                       input="\n".join(lines) + "\n", text=True, check=True, capture_output=True)
        server.psql(db, "VACUUM ANALYZE uncaged_workflow.threads")
        # The earlier parts of the bench leave the server writing out their steps; the listing
        # is measured once that is done, not against it.
        server.psql(db, "CHECKPOINT")

        def once():
            started = time.perf_counter()
            out = subprocess.run([BINARY, "threads"], env=env, capture_output=True)
            elapsed = (time.perf_counter() - started) * 1e6
            assert out.returncode == 0 and out.stdout.count(b"\n") == LISTED_THREADS + 1, out.stderr
            return elapsed

        once()  # the server's caches warm, as for any listing after the first
        return [once() for _ in range(runs)]


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
        ours, files, peer, peer_async = per_step(server, python)
        runs = {workers: throughput(server, workers) for workers in [1, 2, 4]}
        windows = {us: (per_step_ours(server, us), throughput(server, 1, us)) for us in WINDOWS_US}
        taken = takeover(server)
        listed = listing(server)
        threads, steps, table_bytes = sizes(server, runs[1]["db"])
    finally:
        server.stop()
    lines = ["## PostgreSQL store", "",
             "One PostgreSQL server (the distribution's, fsync on) on this machine, over loopback.", "",
             "### Per durable step: PostgreSQL vs files vs LangGraph's Postgres checkpointer", "",
             "The solve-issue loop, instant agent, as in the tables above; ours through the real runtime",
             "with the store in the database; LangGraph with `langgraph-checkpoint-postgres` on the same",
             "server, each step's checkpoint persisted before the next step starts (`durability=\"sync\"`:",
             "what ours does, a step stored before the next agent call); ours with the store in files",
             "(fsync per step) in the same run. Measured in turns (ours, then LangGraph, three times, each",
             "on a fresh database) and pooled: 21 runs of ours and 9 of LangGraph per N. The last column",
             "is LangGraph with its default durability, `\"async\"` (a checkpoint persisted while the next",
             "step already runs), measured in the same turns, for reference.", "",
             "| N | ours, PostgreSQL | ours, files | LangGraph, Postgres checkpointer | PostgreSQL / files | LangGraph / ours on PostgreSQL | LangGraph `async` (/ ours) |",
             "|---|---|---|---|---|---|---|"]
    for n in sorted(ours):
        o, f, p = median_spread(ours[n]), median_spread(files[n]), median_spread(peer[n])
        a = median_spread(peer_async[n])
        lines.append(f"| {n} | {fmt_us(o[0])} ({fmt_us(o[1])}–{fmt_us(o[2])}) | {fmt_us(f[0])} | {fmt_us(p[0])} "
                     f"({fmt_us(p[1])}–{fmt_us(p[2])}) | {o[0] / f[0]:.2f}× | {p[0] / o[0]:.1f}× | "
                     f"{fmt_us(a[0])} ({a[0] / o[0]:.1f}×) |")
    lines += ["", f"### Throughput: {THROUGHPUT_THREADS} queued threads of 10 steps (instant agent)", "",
              "Worker processes started on an already filled queue, timed until the last thread ended;",
              "all on this 2-core machine, database included.", "",
              "Where the time goes: CPU seconds of the worker processes and of every PostgreSQL process",
              "(server and backends) during the drain, out of 2 × the elapsed time this machine has;",
              "transactions are the database's own count (`pg_stat_database.xact_commit`), every one of",
              "them (claims, releases, heartbeats, journal reads too): a thread of 10 steps makes about 16",
              "statements, 11 of them its records, so 0.7 steps per transaction would be no grouping at all.", "",
              "| workers | seconds | threads/s | steps/s | vs 1 worker | worker CPU | database CPU | idle | steps per transaction |",
              "|---|---|---|---|---|---|---|---|---|"]
    base = runs[1]["elapsed"]
    for workers, run in sorted(runs.items()):
        elapsed = run["elapsed"]
        idle = max(0.0, 1 - (run["worker_cpu"] + run["db_cpu"]) / (2 * elapsed))
        lines.append(f"| {workers} | {elapsed:.2f} | {THROUGHPUT_THREADS / elapsed:.0f} | {run['steps'] / elapsed:.0f} | "
                     f"{base / elapsed:.2f}× | {run['worker_cpu']:.2f} s | {run['db_cpu']:.2f} s | {idle:.0%} | "
                     f"{run['steps'] / max(run['transactions'], 1):.1f} |")
    lines += ["", "### Group commit: the window's latency/throughput trade-off", "",
              "`UNCAGED_WORKFLOW_PG_COMMIT_WINDOW_US` holds a batch open that long for more statements",
              "(0, the default, sends whatever gathered while the previous commit was flushed). Latency:",
              "one thread's durable step at N=100; throughput: the 1-worker drain above. The window is a",
              "tokio timer, whose resolution is a millisecond: a sub-millisecond window waits a whole one.", "",
              "| window | one thread, per step | drain, steps/s | steps per transaction |", "|---|---|---|---|"]
    for us, (latency, run) in sorted(windows.items()):
        lat = median_spread(latency)
        lines.append(f"| {us} µs | {fmt_us(lat[0])} ({fmt_us(lat[1])}–{fmt_us(lat[2])}) | "
                     f"{run['steps'] / run['elapsed']:.0f} | {run['steps'] / max(run['transactions'], 1):.1f} |")
    one = runs[1]
    per_db_core = one["steps"] / max(one["db_cpu"], 1e-9)
    per_worker_core = one["steps"] / max(one["worker_cpu"], 1e-9)
    database = 8 * per_db_core
    fleet = 10 * 2 * per_worker_core
    lines += ["", "### Capacity plan", "",
              "Measured (the 1-worker drain above, instant agent, 10-step threads): "
              f"**{per_db_core:,.0f} steps per second of database CPU** and "
              f"**{per_worker_core:,.0f} steps per second of worker CPU**.", "",
              "Extrapolated, assuming CPU is what runs out (the disk's flushes are shared by group commit,",
              "and the run above is CPU-bound on this machine): a database of 8 such cores carries about",
              f"{database:,.0f} steps/s; 10 worker machines of 2 such cores about {fleet:,.0f} steps/s; a deployment",
              f"of both carries about **{min(database, fleet):,.0f} steps/s**, bounded by "
              f"{'the database' if database < fleet else 'the workers'}. Real agents take seconds, not",
              "microseconds: at one step per agent call of 1 s, that is as many threads at work at once. Not",
              "measured: network round trips to a remote database (each step waits for one commit; group",
              "commit keeps that to one flush per batch, so more latency means larger batches rather than",
              "fewer steps/s, up to the workers' `--max-threads`), and the database's disk under that load.", ""]
    listed = median_spread(listed)
    lines += ["", f"### Listing {LISTED_THREADS:,} threads (`threads`, whole process, release build)", "",
              "Ended threads, each with a prompt of 120 characters as summaries keep it; every thread",
              "printed, output to a pipe; after one listing (the server's caches warm).", "",
              "| threads | median | spread |", "|---|---|---|",
              f"| {LISTED_THREADS:,} | {fmt_us(listed[0])} | {fmt_us(listed[1])} – {fmt_us(listed[2])} |", "",
              f"Target: under 200 ms, as the file store — {'met' if listed[0] < 200_000 else 'not met'}.", ""]
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
