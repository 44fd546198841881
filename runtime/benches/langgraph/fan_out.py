"""Three parallel agent calls in LangGraph, for comparison with review-panel's review round.

A `Send` fan-out to three reviewer tasks, each an "agent" that takes 100 ms (a sleep), then a
join: LangGraph runs the three tasks of the superstep concurrently. Prints the wall time of
each repetition in milliseconds, as JSON.

    python fan_out.py --repeat 7
"""

import argparse
import json
import operator
import sys
import time
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

REVIEWERS = ["security-reviewer", "tests-reviewer", "style-reviewer"]


class State(TypedDict):
    prompt: str
    steps: Annotated[list, operator.add]


def review(task):
    time.sleep(0.1)
    meta = {"approved": True, "comments": []}
    return {"steps": [{"role": task["role"], "content": "ok", "meta": meta,
                       "timestamp": time.time_ns() // 1_000_000}]}


def fan_out(state: State):
    return [Send("review", {"role": role}) for role in REVIEWERS]


def build():
    graph = StateGraph(State)
    graph.add_node("review", review)
    graph.add_conditional_edges(START, fan_out, ["review"])
    graph.add_edge("review", END)
    return graph.compile()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    app = build()
    app.invoke({"prompt": "warm-up", "steps": []})
    times = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        result = app.invoke({"prompt": "Validate the upload size", "steps": []})
        times.append((time.perf_counter() - started) * 1e3)
        assert len(result["steps"]) == 3, result
    json.dump({"agent_ms": 100, "group_ms": times}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
