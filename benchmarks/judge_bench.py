"""Judge throughput against the ideal for the fake server's latency, and calls per trajectory.

Prints one JSON line: efficiency_1/16/64 = ideal time / measured time, where the ideal for N calls
at concurrency C and latency L is ceil(N / C) * L (target >= 0.9 at 16); calls_per_traj_pointwise
and calls_per_traj_group. The fake server runs in its own process (sharing the client's GIL would measure Python, not the judge).
Run: python benchmarks/judge_bench.py [--latency 0.5] [--rounds 10]   (about 30 s; more rounds amortise start-up)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import time

from omrl.annotate.judge import JudgeConfig, run_judge
from omrl.annotate.rubric import load_rubric
from omrl.schema import Message, ToolCall, Trajectory
from omrl.testing.openai_server import FakeOpenAIServer

RUBRIC = load_rubric({"name": "bench", "criteria": ["correct"], "scale": {"min": 0, "max": 10}})


def rows(n: int, group_size: int = 8) -> list[dict]:
    out = []
    for i in range(n):
        msgs = [Message("user", f"task {i // group_size}"),
                Message("assistant", None, tool_calls=[ToolCall("answer", json.dumps({"answer": str(i)}), "c")])]
        out.append(Trajectory(id=f"t{i}", task_id=f"task{i // group_size}", run_id="bench", sample=i % group_size,
                              messages=msgs, instruction=f"task {i // group_size}").to_row())
    return out


def responder(latency: float):
    def reply(request: dict) -> dict:
        text = request["messages"][-1]["content"]
        n = text.count("=== TRAJECTORY ")
        if n:
            return {"delay": latency, "content": json.dumps({"scores": [{"id": i, "score": 5} for i in range(1, n + 1)]})}
        return {"delay": latency, "content": '{"score": 5, "rationale": "ok"}'}
    return reply


def serve(latency: float, urls: multiprocessing.Queue, stop: multiprocessing.Event) -> None:
    """The fake server in its own process: sharing the client's GIL would measure Python, not the judge."""
    with FakeOpenAIServer(responder=responder(latency)) as server:
        urls.put(server.base_url)
        stop.wait()


def measure(base_url: str, data: list[dict], mode: str, concurrency: int) -> tuple[float, int]:
    cfg = JudgeConfig(rubric=RUBRIC, model="bench", base_url=base_url, mode=mode, concurrency=concurrency,
                      temperature=time.time())  # a fresh temperature per run: no cache hits
    start = time.perf_counter()
    out, stats = asyncio.run(run_judge(cfg, data, "bench"))
    elapsed = time.perf_counter() - start
    assert all(r["status"] == "ok" for r in out), [r["error"] for r in out if r["status"] != "ok"][:3]
    return elapsed, stats.calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.5,
                        help="fake server latency per call, seconds (real judges take 0.5-5 s)")
    parser.add_argument("--rounds", type=int, default=10, help="calls per level = rounds x concurrency")
    args = parser.parse_args()
    result: dict[str, float] = {"latency_s": args.latency}
    urls: multiprocessing.Queue = multiprocessing.Queue()
    stop = multiprocessing.Event()
    proc = multiprocessing.Process(target=serve, args=(args.latency, urls, stop), daemon=True)
    proc.start()
    try:
        url = urls.get(timeout=30)
        measure(url, rows(8), "pointwise", 8)  # warm-up: imports, first connections
        for c in (1, 16, 64):
            n = args.rounds * c if c > 1 else args.rounds * 2
            elapsed, calls = measure(url, rows(n), "pointwise", c)
            ideal = math.ceil(calls / c) * args.latency
            result[f"efficiency_{c}"] = round(ideal / elapsed, 3)
            result[f"calls_{c}"] = calls
        data = rows(64)
        result["calls_per_traj_pointwise"] = round(measure(url, data, "pointwise", 16)[1] / len(data), 3)
        result["calls_per_traj_group"] = round(measure(url, data, "group", 16)[1] / len(data), 3)
    finally:
        stop.set()
        proc.join(timeout=10)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
