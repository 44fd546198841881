"""The solve-issue loop in LangGraph, for comparison with uncaged-workflow.

Same shape as the Rust bench: planner -> developer -> reviewer, looping back to the developer
until N steps were taken; each node's "agent" returns a fixed string instantly, and the node
records {role, content, meta} the way uncaged-workflow records a step.

    python solve_issue.py --steps 100 --saver sqlite --repeat 5   # prints JSON
    python solve_issue.py --steps 100 --saver postgres --dsn postgresql://…

Checkpoints are written with `durability="sync"`: each step's checkpoint is persisted before
the next step starts, as uncaged-workflow stores each step before its thread's next agent call.
LangGraph's default, `"async"`, persists it while the next step already runs (a crash may lose
a step whose successor was acted on); `--durability async` measures that.
"""

import argparse
import json
import operator
import os
import statistics
import sys
import tempfile
import time
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph

ANSWERS = {
    "planner": ("Plan: fix it", {"steps": ["Reproduce the bug", "Fix the parser", "Run the tests"]}),
    "developer": ("Done: fixed it", {"summary": "Fixed the off-by-one in the parser"}),
    "reviewer": ("Not yet", {"approved": False, "comments": ["Handle the empty-input case"]}),
}


class State(TypedDict):
    prompt: str
    limit: int
    steps: Annotated[list, operator.add]


def node(role):
    def run(state: State):
        content, meta = ANSWERS[role]
        return {"steps": [{"role": role, "content": content, "meta": meta, "timestamp": time.time_ns() // 1_000_000}]}

    return run


def route(state: State):
    steps = state["steps"]
    if len(steps) >= state["limit"]:
        return END
    last = steps[-1]["role"]
    return {"planner": "developer", "developer": "reviewer", "reviewer": "developer"}[last]


def build(saver):
    graph = StateGraph(State)
    for role in ANSWERS:
        graph.add_node(role, node(role))
        graph.add_conditional_edges(role, route, ["developer", "reviewer", END])
    graph.add_edge(START, "planner")
    return graph.compile(checkpointer=saver)


def make_saver(kind, directory, dsn=None):
    if kind == "postgres":
        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver

        connection = psycopg.connect(dsn, autocommit=True, prepare_threshold=0)
        saver = PostgresSaver(connection)
        saver.setup()
        return saver
    if kind == "memory":
        from langgraph.checkpoint.memory import InMemorySaver

        return InMemorySaver()
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver

    connection = sqlite3.connect(os.path.join(directory, "checkpoints.sqlite"), check_same_thread=False)
    return SqliteSaver(connection)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--saver", choices=["memory", "sqlite", "postgres"], default="sqlite")
    parser.add_argument("--dsn", help="the PostgreSQL database, for --saver postgres")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--durability", choices=["sync", "async"], default="sync",
                        help="when a step's checkpoint is persisted (see the module's text)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        app = build(make_saver(args.saver, directory, args.dsn))
        per_step = []
        for i in range(args.repeat):
            config = {"configurable": {"thread_id": f"t{i}"}, "recursion_limit": args.steps + 10}
            started = time.perf_counter()
            result = app.invoke({"prompt": "Fix the crash", "limit": args.steps, "steps": []}, config,
                                durability=args.durability)
            elapsed = time.perf_counter() - started
            assert len(result["steps"]) == args.steps, len(result["steps"])
            per_step.append(elapsed / args.steps * 1e6)
    json.dump({"steps": args.steps, "saver": args.saver, "per_step_us": per_step,
               "median_us": statistics.median(per_step)}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
