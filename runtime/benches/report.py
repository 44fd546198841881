"""`make bench`: runs every benchmark in one go and writes BENCHMARKS.md.

In-process figures come from criterion (runtime/benches/micro.rs) and from the workflow bench
(runtime/benches/workflow.rs, JSON lines); the peer is LangGraph, installed from PyPI into a
venv of our own, running runtime/benches/langgraph/solve_issue.py; whole-process figures time
the release binary and the python process from here. Nothing here asserts a time: the report
says what was measured and whether the targets were met.
"""

import json
import re
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import postgres  # noqa: E402  (runtime/benches/postgres.py)
import serve_load  # noqa: E402  (runtime/benches/serve_load.py)
import telemetry  # noqa: E402  (runtime/benches/telemetry.py)
import fan_out  # noqa: E402  (runtime/benches/fan_out.py)
import workers  # noqa: E402  (runtime/benches/workers.py)
import replay  # noqa: E402  (runtime/benches/replay.py)
import durable_agents  # noqa: E402  (runtime/benches/durable_agents.py)
import mcp  # noqa: E402  (runtime/benches/mcp.py)
import starts  # noqa: E402  (runtime/benches/starts.py)
import fleet  # noqa: E402  (runtime/benches/fleet.py)
import evals  # noqa: E402  (runtime/benches/evals.py)

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "target"
VENV = TARGET / "bench-venv"
PYTHON = VENV / "bin" / "python"
LANGGRAPH = ["langgraph==1.2.22", "langgraph-checkpoint-sqlite"]
SIZES = [10, 100, 1000]
CONCURRENCY = [100, 1000, 10_000]
CONCURRENCY_CEILING = 1_000_000
SCRIPT = ROOT / "runtime" / "benches" / "langgraph" / "solve_issue.py"
FAN_OUT = ROOT / "runtime" / "benches" / "langgraph" / "fan_out.py"
ANSWERS = """planner: "Plan: fix it\\n{\\"steps\\": [\\"Reproduce the bug\\", \\"Fix the parser\\", \\"Run the tests\\"]}"
developer: "Done: fixed it\\n{\\"summary\\": \\"Fixed the off-by-one in the parser\\"}"
reviewer: "Not yet\\n{\\"approved\\": false, \\"comments\\": [\\"Handle the empty-input case\\"]}"
"""


def sh(*args, **kw):
    print("+", " ".join(str(a) for a in args), file=sys.stderr, flush=True)
    return subprocess.run([str(a) for a in args], check=True, cwd=ROOT, **kw)


def median_spread(values):
    values = sorted(values)
    return statistics.median(values), values[0], values[-1]


def fmt_us(us):
    if us >= 1000:
        return f"{us / 1000:.2f} ms"
    if us >= 1:
        return f"{us:.1f} µs"
    return f"{us * 1000:.0f} ns"


def machine():
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem = next(l for l in Path("/proc/meminfo").read_text().splitlines() if l.startswith("MemTotal"))
        mem_gib = int(mem.split()[1]) / 1024 / 1024
    except Exception:
        mem_gib = 0
    rustc = subprocess.run(["rustc", "--version"], capture_output=True, text=True).stdout.strip()
    lg = subprocess.run([PYTHON, "-c", "import importlib.metadata as m; print(m.version('langgraph'))"],
                        capture_output=True, text=True).stdout.strip()
    py = subprocess.run([PYTHON, "--version"], capture_output=True, text=True).stdout.strip()
    return (f"{cpu}, {os.cpu_count()} cores, {mem_gib:.0f} GiB; Linux {platform.release()}; "
            f"{rustc}; {py}; LangGraph {lg}")


def criterion(*names):
    """Criterion's median and 95% interval in µs for a benchmark, by its group/function names
    (criterion may rewrite characters of directory names, so match on a prefix too)."""
    path = TARGET / "criterion"
    for name in names:
        exact = path / name
        path = exact if exact.exists() else next((p for p in path.glob("*") if p.name.startswith(name[:12])), exact)
    path = path / "new" / "estimates.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())["median"]
    return (data["point_estimate"] / 1000, data["confidence_interval"]["lower_bound"] / 1000,
            data["confidence_interval"]["upper_bound"] / 1000)


def langgraph(steps, saver):
    repeat = 3 if steps >= 1000 else 5
    out = subprocess.run([PYTHON, SCRIPT, "--steps", str(steps), "--saver", saver, "--repeat", str(repeat)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["per_step_us"]


def langgraph_fan_out():
    out = subprocess.run([PYTHON, FAN_OUT, "--repeat", "7"], check=True, capture_output=True, text=True).stdout
    return json.loads(out)["group_ms"]


def whole_process(runs=10):
    """Cold processes, warm AOT cache: our release binary vs the python process, 10 steps."""
    binary = TARGET / "release" / "uncaged-workflow"
    bundle = TARGET / "wasm32-wasip2" / "guest" / "solve_issue.wasm"
    with tempfile.TemporaryDirectory(dir=TARGET) as home:
        env = dict(os.environ, UNCAGED_WORKFLOW_HOME=home)
        answers = Path(home) / "answers.yaml"
        answers.write_text(ANSWERS)
        subprocess.run([binary, "add", "solve-issue", bundle], check=True, env=env, capture_output=True)
        ours_cmd = [binary, "run", "solve-issue", "-p", "Fix the crash", "--max-rounds", "10",
                    "--agent", f"scripted:{answers}"]
        subprocess.run(ours_cmd, env=env, capture_output=True)  # warm the AOT cache
        ours, peer = [], []
        for _ in range(runs):
            workers.wait_until_gone(home)  # cold: the run starts its worker
            started = time.perf_counter()
            done = subprocess.run(ours_cmd, env=env, capture_output=True)
            ours.append((time.perf_counter() - started) * 1e6)
            assert done.returncode == 2, done  # max rounds reached: 10 steps taken
            started = time.perf_counter()
            subprocess.run([PYTHON, SCRIPT, "--steps", "10", "--saver", "sqlite", "--repeat", "1"],
                           check=True, capture_output=True)
            peer.append((time.perf_counter() - started) * 1e6)
    return ours, peer


def concurrency(n):
    """One worker's runtime holding n waiting threads, in a process of its own."""
    env = dict(os.environ, UNCAGED_BENCH_THREADS=str(n))
    done = subprocess.run(["cargo", "bench", "-q", "-p", "uncaged-workflow", "--bench", "workflow"],
                          cwd=ROOT, capture_output=True, text=True, env=env)
    found = [json.loads(l) for l in done.stdout.splitlines() if l.startswith("{")]
    if found:
        return found[0]
    err = done.stderr.strip().splitlines()
    # A panic's message is the line after "panicked at"; else the last line said.
    at = next((i for i, l in enumerate(err) if "panicked at" in l), None)
    last = err[at + 1] if at is not None and at + 1 < len(err) else (err or [f"exit status {done.returncode}"])[-1]
    return {"bench": "concurrency", "threads": n, "error": f"the process died: {last}"}


def concurrency_runs():
    """The issue's N, then doubling until a run fails (or the ceiling), then halving the gap
    down to 5%: the largest N that works here."""
    runs = {n: concurrency(n) for n in CONCURRENCY}
    good = max((n for n, r in runs.items() if not r.get("error")), default=None)
    bad = min((n for n, r in runs.items() if r.get("error")), default=None)
    while good is not None and bad is None and good < CONCURRENCY_CEILING:
        n = min(good * 2, CONCURRENCY_CEILING)
        runs[n] = concurrency(n)
        good, bad = (good, n) if runs[n].get("error") else (n, None)
    while good is not None and bad is not None and bad - good > good // 20:
        n = (good + bad) // 2 // 100 * 100
        runs[n] = concurrency(n)
        good, bad = (good, n) if runs[n].get("error") else (n, bad)
    return runs


def evicted_step():
    """Answer → next step of threads that give their instances up while they wait."""
    env = dict(os.environ, UNCAGED_BENCH_EVICTED="1")
    out = sh("cargo", "bench", "-q", "-p", "uncaged-workflow", "--bench", "workflow",
             capture_output=True, text=True, env=env).stdout
    return next(json.loads(l) for l in out.splitlines() if l.startswith("{"))


def instances_section():
    """One worker holding N threads waiting on a slow agent, and the cost of a rebuilt
    instance: the section's lines, and its rows of the targets."""
    conc = concurrency_runs()
    maps_limit = max_map_count()
    lines = ["## Concurrency: one worker, N threads waiting on a slow agent", "",
             "Each N in a fresh process, on a home directory on tmpfs. The worker keeps at most 1,000",
             "live instances (`limits.live-instances`); a thread whose agent call has been out for",
             "200 ms (`limits.evict-after`) gives its instance up, and the next thread in line gets it.",
             "Measured once every thread is in its call and the last ones in gave their instances up.",
             f"Mappings are the process's memory mappings, which the kernel caps at `vm.max_map_count` ({maps_limit} here);",
             "in brackets, a thread's share: the mappings the pool reserves up front + those the thread adds.",
             "Past the first N, N grows until a run fails, then the gap is halved, to find the largest N",
             "that works on this machine.", "",
             "| N | started in | threads/s | RSS | RSS per thread | mappings | allocator | note |",
             "|---|---|---|---|---|---|---|---|"]
    for n, r in sorted(conc.items()):
        note = (r.get("error") or "").replace("|", "/")
        # An I/O error's own words, not the whole debug dump around them.
        said = re.search(r'message: "([^"]+)"', note)
        if said:
            note = f"{note.split(':')[0]}: {said.group(1)}"
        if "rss_kib" not in r:
            lines.append(f"| {n:,} | | | | | | | {note} |")
            continue
        lines.append(f"| {n:,} | {r['start_seconds']:.2f} s | {r['threads_per_second']:.0f} | {r['rss_kib'] / 1024:.0f} MiB | "
                     f"{r['rss_per_thread_kib']:.1f} KiB | {r['memory_maps']:,} "
                     f"({r.get('memory_maps_pool_per_thread', 0):.2f} + {r['memory_maps_per_thread']:.2f}) | "
                     f"{r['allocator']} | {note} |")
    works = [n for n, r in conc.items() if not r.get("error")]
    if works:
        lines.append("")
        lines.append(f"Largest N that worked: **{max(works):,}**"
                     + ("" if len(works) < len(conc) else f" (not probed past {max(works):,})") + ".")
    e = evicted_step()
    lines += ["", "### Answer → next step of a thread that gave its instance up", "",
              f"Eight threads of solve-issue on a home directory on disk, every agent call taking {e['delay_ms']} ms;",
              "steps 21 to 45 of each, so every rebuild hands the bundle 20 or more recorded steps. A step's",
              "time beyond the agent's, with the instance kept (`evict-after: 10m`) and given up after 20 ms",
              "(each of those steps is then: the answer, the instance rebuilt from the journal, the step persisted).", "",
              "| instance | samples | p50 | p99 | max |", "|---|---|---|---|---|"]
    for name in ["kept", "evicted"]:
        r = e[name]
        lines.append(f"| {name} | {r['samples']} | {r['p50_ms']:.2f} ms | {r['p99_ms']:.2f} ms | {r['max_ms']:.2f} ms |")
    lines.append("")
    targets = []
    big = conc.get(10_000)
    if big and "rss_kib" in big:
        ok = not big.get("error") and big["rss_kib"] < 1024 * 1024
        targets.append(f"| 10,000 waiting threads in one worker under 1 GiB RSS | {big['rss_kib'] / 1024:.0f} MiB | {'yes' if ok else 'no'} |")
    most = max(works, default=0)
    targets.append(f"| 1,000,000 waiting threads in one worker, ≤ 512 MiB | {most:,} at most (see the concurrency section) | {'yes' if most >= 1_000_000 else 'no'} |")
    p99 = e["evicted"]["p99_ms"]
    targets.append(f"| answer → next step of an evicted thread with 20 recorded steps, p99 ≤ 50 ms | {p99:.1f} ms | {'yes' if p99 <= 50 else 'no'} |")
    return lines, targets


def thread_listing(n=100_000, runs=5):
    """`threads` over a home of n ended threads, each with its data file and call journal and a
    prompt of a few hundred characters. Three states of the index: missing (built from the
    files), present while the bundle's directory has just changed (a thread was created: the
    directory is listed again, ended threads come from the index), and present with the
    directory unchanged. Wall time of the whole process, output to a pipe."""
    binary = TARGET / "release" / "uncaged-workflow"
    prompt = ("Fix the failing test in the parser module; the reviewer wants a regression test, "
              "a changelog entry and no new dependency. ") * 3
    with tempfile.TemporaryDirectory(dir=TARGET) as home:
        logs = Path(home) / "logs" / "0000000000000"
        logs.mkdir(parents=True)
        base = 1_795_000_000_000
        alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
        for i in range(n):
            # A ULID: 10 characters of time, 16 of randomness (here a counter), Crockford.
            rest, tail = i, ""
            for _ in range(16):
                tail = alphabet[rest % 32] + tail
                rest //= 32
            tid = "01M80000000" + tail[1:]
            start = {"name": "w", "hash": "0000000000000", "threadId": tid,
                     "parameters": {"prompt": f"task {i}: {prompt}", "options": {"maxRounds": 3}},
                     "timestamp": base + i}
            step = {"role": "r", "content": "c", "meta": {}, "timestamp": base + i}
            end = {"end": {"returnCode": 0, "summary": "ok", "status": "completed"},
                   "timestamp": base + i}
            (logs / f"{tid}.data.jsonl").write_text(
                "\n".join(json.dumps(x) for x in (start, step, end)) + "\n")
            (logs / f"{tid}.calls.jsonl").write_text("{}\n")
        env = dict(os.environ, UNCAGED_WORKFLOW_HOME=home)

        def listing():
            started = time.perf_counter()
            out = subprocess.run([binary, "threads"], env=env, capture_output=True)
            elapsed = (time.perf_counter() - started) * 1e6
            assert out.returncode == 0 and out.stdout.count(b"\n") == n + 1, out.stderr
            return elapsed

        timings = {"cold": [listing()], "changed": [], "warm": []}
        for _ in range(runs):
            # A directory time is trusted once it is 2 s old (see store/thread_index.rs).
            (logs / "unrelated").touch()
            timings["changed"].append(listing())
            time.sleep(2.1)
            listing()  # writes the index with the settled time
            timings["warm"].append(listing())
        return timings


def thread_listing_lines(n=100_000):
    t = thread_listing(n)
    cold, changed, warm = (median_spread(t[k]) for k in ("cold", "changed", "warm"))
    ok = warm[0] < 200_000
    return [f"## Listing {n:,} threads (`threads`, whole process, release build)", "",
            "Each thread has a data file and a call journal (200,000 files in one directory) and a",
            "prompt of about 330 characters; the listing prints every thread.", "",
            "| index | wall time | spread |", "|---|---|---|",
            f"| missing: built from the thread files | {fmt_us(cold[0])} | |",
            f"| present, directory just changed (listed again) | {fmt_us(changed[0])} | {fmt_us(changed[1])} – {fmt_us(changed[2])} |",
            f"| present, directory unchanged | {fmt_us(warm[0])} | {fmt_us(warm[1])} – {fmt_us(warm[2])} |", "",
            f"Target: under 200 ms with the index present and the directory unchanged — {'met' if ok else 'missed'}.", ""]


def max_map_count():
    try:
        return int(Path("/proc/sys/vm/max_map_count").read_text())
    except OSError:
        return None


def main():
    sh("rustup", "target", "add", "wasm32-wasip2")
    if not PYTHON.exists():
        sh(sys.executable, "-m", "venv", VENV)
    sh(PYTHON, "-m", "pip", "install", "-q", *LANGGRAPH)
    sh("cargo", "build", "--release", "-p", "uncaged-workflow")
    sh("cargo", "build", "--target", "wasm32-wasip2", "--profile", "guest", "-p", "solve-issue")
    sh("cargo", "bench", "-p", "uncaged-workflow", "--bench", "micro", "--", "--noplot")
    runs = sh("cargo", "bench", "-p", "uncaged-workflow", "--bench", "workflow",
              capture_output=True, text=True).stdout
    results = [json.loads(l) for l in runs.splitlines() if l.startswith("{")]

    lines = ["# Benchmarks", "",
             "Written by `make bench` (runtime/benches/report.py); every figure below was measured in the",
             "same run, on this machine:", "", f"> {machine()}", "",
             "Medians, with the spread (min–max of the repetitions, or criterion's 95% interval). The",
             "machine is shared and noisy: read ratios, not digits.", ""]

    # Micro.
    lines += ["## In-process micro-benchmarks (criterion)", "", "| what | median | spread |", "|---|---|---|"]
    host_share = None
    share_file = TARGET / "criterion" / "host-share.txt"
    if share_file.exists():
        host_share = float(share_file.read_text())
    for label, names in [
        ("load the solve-issue bundle from the AOT cache", ["load", "from AOT cache"]),
        ("compile it (cache miss)", ["load", "compile"]),
        ("instantiate a thread, on-demand allocator", ["instantiate", "on demand"]),
        ("instantiate a thread, pooling allocator", ["instantiate", "pooling"]),
        ("one generator step, instant in-process agent", ["generator step (instant agent)"]),
        ("append one step, fsync (the durability floor)", ["append one step", "fsync"]),
        ("append one step, no fsync", ["append one step", "no fsync"]),
    ]:
        m = criterion(*names)
        if m:
            extra = ""
            if names[0].startswith("generator") and host_share is not None:
                extra = f" (host {fmt_us(m[0] * host_share)}, guest {fmt_us(m[0] * (1 - host_share))})"
            lines.append(f"| {label} | {fmt_us(m[0])}{extra} | {fmt_us(m[1])} – {fmt_us(m[2])} |")
    lines.append("")

    # Whole workflow.
    def per_step(bench, mode, steps):
        for r in results:
            if r.get("bench") == bench and r.get("mode") == mode and r.get("steps") == steps:
                return median_spread(r["per_step_us"])
        return None

    verdicts = []
    # Per-step medians by (mode, N), ours and LangGraph's: the contract-0.2 targets.
    medians = {}
    listing = thread_listing_lines()
    for mode, saver, title in [("durable", "sqlite", "Durable vs durable: every step fsynced vs LangGraph's SQLite checkpointer"),
                               ("memory", "memory", "In memory vs in memory: home on tmpfs vs LangGraph's in-memory saver")]:
        lines += [f"## {title}", "",
                  "Per-step cost of the planner → developer → reviewer loop for N steps, an agent that",
                  "answers instantly with a fixed string, the same meta on both sides. LangGraph persists each",
                  "step's checkpoint before the next step starts (`durability=\"sync\"`), as ours stores each",
                  "step before the next agent call.", "",
                  "| N | uncaged-workflow | native Rust floor | LangGraph | ours / native | LangGraph / ours |",
                  "|---|---|---|---|---|---|"]
        for n in SIZES:
            ours, native = per_step("ours", mode, n), per_step("native", mode, n)
            peer = median_spread(langgraph(n, saver))
            if not ours or not native:
                continue
            lines.append(f"| {n} | {fmt_us(ours[0])} ({fmt_us(ours[1])}–{fmt_us(ours[2])}) | "
                         f"{fmt_us(native[0])} | {fmt_us(peer[0])} ({fmt_us(peer[1])}–{fmt_us(peer[2])}) | "
                         f"{ours[0] / native[0]:.2f}× | {peer[0] / ours[0]:.1f}× |")
            medians[(mode, n)] = (ours[0], peer[0])
            if n == 100:
                verdicts.append((mode, ours[0], native[0], peer[0]))
        lines.append("")

    # Declarative: the same solve-issue written in YAML, run by the interpreter bundle.
    yaml_ratios = {}
    lines += ["## Declarative: solve-issue in YAML vs in Rust", "",
              "The same loop and answers as above, the bundle built from `bundles/solve-issue.yaml` (the",
              "interpreter composed with the definition; routing by JSONata inside the sandbox).", "",
              "| mode | N | YAML | Rust | YAML / Rust |", "|---|---|---|---|---|"]
    for mode in ["durable", "memory"]:
        for n in SIZES:
            y, r = per_step("ours_yaml", mode, n), per_step("ours", mode, n)
            if not y or not r:
                continue
            lines.append(f"| {mode} | {n} | {fmt_us(y[0])} ({fmt_us(y[1])}–{fmt_us(y[2])}) | {fmt_us(r[0])} | {y[0] / r[0]:.2f}× |")
            yaml_ratios[(mode, n)] = y[0] / r[0]
    add = next((r for r in results if r.get("bench") == "add_yaml"), None)
    if add:
        a = median_spread(add["ms"])
        lines += ["", f"`add` of a YAML workflow never added before (validate, assemble, compile; the function",
                  f"cache warm from one earlier YAML workflow): **{a[0]:.0f} ms** ({a[1]:.0f}–{a[2]:.0f} ms)."]
    lines.append("")

    group = next((r for r in results if r.get("bench") == "parallel"), None)
    send = median_spread(langgraph_fan_out())
    if group:
        g = median_spread(group["group_ms"])
        lines += ["## Three agents at once: a parallel group vs LangGraph's `Send` fan-out", "",
                  "Three agent calls of 100 ms each (ours: review-panel's three reviewers through the real",
                  "runtime on tmpfs, the scripted agent with a 100 ms delay — asked, answered, extracted and",
                  "persisted as one group; LangGraph: three `Send` tasks that sleep 100 ms, then the join).", "",
                  "| | group wall time | spread | overhead above 100 ms |", "|---|---|---|---|",
                  f"| uncaged-workflow | {g[0]:.1f} ms | {g[1]:.1f} – {g[2]:.1f} ms | {g[0] - 100:.1f} ms |",
                  f"| LangGraph | {send[0]:.1f} ms | {send[1]:.1f} – {send[2]:.1f} ms | {send[0] - 100:.1f} ms |", ""]

    ours, peer = whole_process()
    o, p = median_spread(ours), median_spread(peer)
    lines += ["## Whole process, cold, 10 steps, warm AOT cache", "",
              "`uncaged-workflow run` (release build; it also starts the bundle's worker process) vs",
              "`python solve_issue.py` with LangGraph's SQLite checkpointer.", "",
              "| | median | spread |", "|---|---|---|",
              f"| uncaged-workflow | {fmt_us(o[0])} | {fmt_us(o[1])} – {fmt_us(o[2])} |",
              f"| python + LangGraph | {fmt_us(p[0])} | {fmt_us(p[1])} – {fmt_us(p[2])} |",
              f"| ratio | {p[0] / o[0]:.1f}× faster | |", ""]

    conc_lines, conc_targets = instances_section()
    lines += conc_lines
    lines += listing
    lines += serve_load.section()
    lines += telemetry.section()
    lines += fan_out.section()
    lines += replay.section()
    lines += evals.section()
    lines += durable_agents.section()
    lines += mcp.section()
    lines += starts.section()
    lines += fleet.section()
    lines += postgres.section(PYTHON)
    lines += ["## Targets", "", "| target | measured | met |", "|---|---|---|"]
    for mode, ours_us, native_us, peer_us in verdicts:
        if mode == "durable":
            lines.append(f"| durable per step ≥ 10× lower than LangGraph (N=100) | {peer_us / ours_us:.1f}× | {'yes' if peer_us / ours_us >= 10 else 'no'} |")
            lines.append(f"| durable per step within 1.15× of the native floor (N=100) | {ours_us / native_us:.2f}× | {'yes' if ours_us / native_us <= 1.15 else 'no'} |")
        else:
            lines.append(f"| in-memory per step ≥ 50× lower than LangGraph (N=100) | {peer_us / ours_us:.1f}× | {'yes' if peer_us / ours_us >= 50 else 'no'} |")
            lines.append(f"| in-memory per step within 1.5× of the native floor (N=100) | {ours_us / native_us:.2f}× | {'yes' if ours_us / native_us <= 1.5 else 'no'} |")
    lines.append(f"| whole 10-step process ≥ 50× faster than LangGraph's | {p[0] / o[0]:.1f}× | {'yes' if p[0] / o[0] >= 50 else 'no'} |")
    if ("memory", 10) in medians and ("memory", 1000) in medians:
        flat = medians[("memory", 1000)][0] / medians[("memory", 10)][0]
        lines.append(f"| in-memory per step at N=1000 within 1.5× of N=10 | {flat:.2f}× | {'yes' if flat <= 1.5 else 'no'} |")
        ours_us, peer_us = medians[("memory", 1000)]
        lines.append(f"| in-memory per step ≥ 10× lower than LangGraph (N=1000) | {peer_us / ours_us:.1f}× | {'yes' if peer_us / ours_us >= 10 else 'no'} |")
    if ("durable", 1000) in medians:
        ours_us, peer_us = medians[("durable", 1000)]
        lines.append(f"| durable per step ≥ 5× lower than LangGraph's SQLite (N=1000) | {peer_us / ours_us:.1f}× | {'yes' if peer_us / ours_us >= 5 else 'no'} |")
    for mode in ["durable", "memory"]:
        if (mode, 100) in yaml_ratios:
            r = yaml_ratios[(mode, 100)]
            lines.append(f"| declarative solve-issue step ≤ 1.5× the Rust bundle's, {mode} (N=100) | {r:.2f}× | {'yes' if r <= 1.5 else 'no'} |")
    if add:
        lines.append(f"| `add` of a YAML workflow under 0.3 s, warm cache | {a[0]:.0f} ms | {'yes' if a[0] < 300 else 'no'} |")
    lines += conc_targets
    # The sections' own targets, as their last run measured them.
    lines += telemetry.TARGETS + fan_out.TARGETS
    lines += durable_agents.TARGETS + mcp.TARGETS + starts.TARGETS + fleet.TARGETS + evals.TARGETS
    lines.append("")
    (ROOT / "BENCHMARKS.md").write_text("\n".join(with_notes(lines)))
    print("\n".join(lines))


NOTES = ROOT / "runtime" / "benches" / "NOTES.md"


def with_notes(lines):
    """`lines` of BENCHMARKS.md with what the numbers say at the end, from NOTES.md (the one
    place that text is written: a run of one section keeps it current too)."""
    notes = NOTES.read_text().strip()
    heading = notes.splitlines()[0]
    end = next((i for i, l in enumerate(lines) if l == heading), len(lines))
    return lines[:end] + [notes, ""]


def only_postgres():
    """Measures the PostgreSQL store alone and puts its section into BENCHMARKS.md in place."""
    if not PYTHON.exists():
        sh(sys.executable, "-m", "venv", VENV)
    sh(PYTHON, "-m", "pip", "install", "-q", *LANGGRAPH)
    sh("cargo", "build", "--release", "-p", "uncaged-workflow")
    sh("cargo", "build", "--target", "wasm32-wasip2", "--profile", "guest", "-p", "solve-issue")
    in_place(postgres.section(PYTHON))


def in_place(section):
    """Puts `section` (its first line a heading) into BENCHMARKS.md where it is, or before the
    targets."""
    path = ROOT / "BENCHMARKS.md"
    lines = path.read_text().splitlines()
    start = next((i for i, l in enumerate(lines) if l == section[0]), None)
    if start is None:
        start = end = next(i for i, l in enumerate(lines) if l == "## Targets")
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    path.write_text("\n".join(with_notes(lines[:start] + section + lines[end:])))
    print("\n".join(section))


def targets_in_place(rows):
    """Puts `rows` into BENCHMARKS.md's Targets table, each in place of the row of the same target
    (its first cell), else at the table's end."""
    path = ROOT / "BENCHMARKS.md"
    lines = path.read_text().splitlines()
    start = lines.index("## Targets")
    end = next(i for i in range(start + 4, len(lines)) if not lines[i].startswith("|"))
    target = lambda row: row.split(" | ")[0]
    for row in rows:
        at = next((i for i in range(start, end) if target(lines[i]) == target(row)), None)
        if at is None:
            lines.insert(end, row)
            end += 1
        else:
            lines[at] = row
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] == ["--only", "postgres"]:
        only_postgres()
    elif sys.argv[1:] == ["--only", "serve"]:
        sh("cargo", "build", "--release", "-p", "uncaged-workflow")
        sh("cargo", "build", "--target", "wasm32-wasip2", "--profile", "guest", "-p", "solve-issue")
        in_place(serve_load.section())
    elif sys.argv[1:] == ["--only", "telemetry"]:
        sh("cargo", "build", "--release", "-p", "uncaged-workflow")
        sh("cargo", "build", "--target", "wasm32-wasip2", "--profile", "guest", "-p", "solve-issue")
        in_place(telemetry.section())
        targets_in_place(telemetry.TARGETS)
    elif sys.argv[1:] == ["--only", "fan-out"]:
        sh("cargo", "build", "--release", "-p", "uncaged-workflow")
        in_place(fan_out.section())
        targets_in_place(fan_out.TARGETS)
    elif sys.argv[1:] == ["--only", "replay"]:
        sh("cargo", "build", "--release", "-p", "uncaged-workflow")
        in_place(replay.section())
    elif sys.argv[1:] == ["--only", "evals"]:
        sh("cargo", "build", "--release", "-p", "uncaged-workflow")
        in_place(evals.section())
        targets_in_place(evals.TARGETS)
    elif sys.argv[1:] == ["--only", "agents"]:
        sh("cargo", "build", "--release", "-p", "uncaged-workflow")
        in_place(durable_agents.section())
    elif sys.argv[1:] == ["--only", "mcp"]:
        sh("cargo", "build", "--release", "-p", "uncaged-workflow")
        sh("cargo", "build", "--target", "wasm32-wasip2", "--profile", "guest", "-p", "solve-issue")
        in_place(mcp.section())
    elif sys.argv[1:] == ["--only", "starts"]:
        sh("cargo", "build", "--release", "-p", "uncaged-workflow")
        sh("cargo", "build", "--target", "wasm32-wasip2", "--profile", "guest", "-p", "solve-issue")
        in_place(starts.section())
    elif sys.argv[1:] == ["--only", "fleet"]:
        sh("cargo", "build", "--release", "-p", "uncaged-workflow")
        sh("cargo", "build", "--target", "wasm32-wasip2", "--profile", "guest", "-p", "solve-issue")
        in_place(fleet.section())
        targets_in_place(fleet.TARGETS)
    elif sys.argv[1:] == ["--only", "instances"]:
        sh("cargo", "build", "--target", "wasm32-wasip2", "--profile", "guest", "-p", "solve-issue")
        section, targets = instances_section()
        in_place(section)
        targets_in_place(targets)
    elif sys.argv[1:] == ["--only", "threads"]:
        sh("cargo", "build", "--release", "-p", "uncaged-workflow")
        print("\n".join(thread_listing_lines()))
    else:
        main()
