"""Collection against a slow one-slot server: `omrl collect` on its defaults against the same run at
`--concurrency 1`, both at once, each against its own server. Prints one JSON line.

    python benchmarks/slow_server.py              # 10 tasks x 2 samples, 3 turns; about 3 minutes
    python benchmarks/slow_server.py --quick      # 4 tasks x 2 samples

The server (omrl.testing.slow_server, in its own process) is what issue 21 met: llama-cpp-python serving
a small model on a CPU, one request at a time, an 8,192-token context, saying nothing about its slots or
context, and generating on for requests whose client gave up. Its model answers the math tasks after some
reasoning (40 to 400 tokens), and one reply in four rambles on to the end of the context when the request
sets no max_tokens, as small models do. Generation runs at --tokens-per-s, scaled so that a reply of the
default max_tokens takes a fair share of the default 120 s timeout, as on the real machine.

Figures (targets from the issue): slow_server_ok_fraction, the share of episodes of the default run that
did not end as `timeout` (>= 0.95), and slow_server_time_ratio, its wall time over the --concurrency 1
run's (<= 1.5). Also the statuses of both runs, the requests the server saw, those it generated for a
client that had gone, and the most requests it held waiting at once.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from omrl.envs.expression import ExpressionError, evaluate, format_number  # noqa: E402

CONTEXT = 8192


def answer(request: dict) -> dict:
    """The fake model: some reasoning, then the value of the expression in the task (math env's format)."""
    messages = request.get("messages") or []
    user = next((str(m.get("content") or "") for m in messages if m.get("role") == "user"), "")
    rng = random.Random(hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest())
    match = re.search(r"[-+*/() 0-9.]{3,}", user)
    try:
        value = format_number(evaluate(match.group(0).strip())) if match else "0"  # the task's own arithmetic
    except ExpressionError:
        value = "0"
    thinking = "Let me work this out step by step. " * rng.randint(4, 40)  # about 10 tokens each
    return {"content": f"{thinking}The answer is {value}.", "ramble": rng.random() < 0.25}


def serve(tokens_per_s: float, ready) -> None:
    from omrl.testing.slow_server import SlowServer

    server = SlowServer(slots=1, tokens_per_s=tokens_per_s, context_length=CONTEXT, cancel_on_disconnect=False,
                        advertise=False, responder=answer).start()
    ready.send(server.base_url)
    while True:
        command = ready.recv()
        if command == "stats":
            ready.send({"requests": server.calls, "abandoned": server.abandoned,
                        "wasted_tokens": server.wasted_tokens, "peak_waiting": server.peak_waiting,
                        "generated_tokens": server.generated_tokens})
        else:
            server.stop()
            return


def start_collect(base_url: str, work: Path, name: str, tasks: int, extra: list[str]) -> tuple:
    argv = [sys.executable, "-m", "omrl", "collect", "--env", "math", "--tasks", "shipped:math_arith",
            "--limit", str(tasks), "-n", "2", "--max-turns", "3", "--policy", "openai:small-gguf",
            "--base-url", base_url, "--store", str(work / name), "--no-progress", *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENAI_API_KEY": "EMPTY"}
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return process, time.monotonic()


def finish_collect(process: subprocess.Popen, started: float, work: Path, name: str) -> dict:
    stdout, stderr = process.communicate(timeout=3600)
    wall = time.monotonic() - started
    if process.returncode != 0:
        raise SystemExit(f"{name} failed:\n{stdout}\n{stderr[-2000:]}")
    from omrl.store import Store

    rows = Store(work / name).read("trajectories", ["status"]).to_pylist()
    statuses: dict[str, int] = {}
    for row in rows:
        statuses[row["status"]] = statuses.get(row["status"], 0) + 1
    return {"wall_s": round(wall, 1), "episodes": len(rows), "statuses": statuses}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--tokens-per-s", type=float, default=40.0,
                        help="generation speed: 1,024 tokens (the default max_tokens) take 26 s at 40")
    parser.add_argument("--quick", action="store_true", help="4 tasks, twice the speed")
    args = parser.parse_args()
    tasks, speed = (4, args.tokens_per_s * 2) if args.quick else (args.tasks, args.tokens_per_s)

    # Both runs at once, each against its own one-slot server: the machine's load falls on both alike.
    runs, servers, started = {}, {}, {}
    pipes, processes = {}, []
    with tempfile.TemporaryDirectory(prefix="omrl-slow-") as tmp:
        try:
            for name, extra in (("defaults", []), ("concurrency_1", ["--concurrency", "1"])):
                ours, theirs = multiprocessing.Pipe()
                server = multiprocessing.Process(target=serve, args=(speed, theirs), daemon=True)
                server.start()
                processes.append(server)
                pipes[name] = ours
                started[name] = start_collect(ours.recv(), Path(tmp), name, tasks, extra)
            for name, (process, began) in started.items():
                runs[name] = finish_collect(process, began, Path(tmp), name)
                pipes[name].send("stats")
                servers[name] = pipes[name].recv()
        finally:
            for pipe in pipes.values():
                pipe.send("stop")
            for server in processes:
                server.join(timeout=10)
                if server.is_alive():
                    server.kill()
    default = runs["defaults"]
    ok = default["episodes"] - default["statuses"].get("timeout", 0)
    print(json.dumps({
        "slow_server_ok_fraction": round(ok / max(1, default["episodes"]), 3),
        "slow_server_time_ratio": round(default["wall_s"] / max(1e-9, runs["concurrency_1"]["wall_s"]), 2),
        "tasks": tasks, "samples": 2, "max_turns": 3, "tokens_per_s": speed, "context": CONTEXT,
        "runs": runs, "server": servers,
        "load_1min": round(os.getloadavg()[0], 1),
    }))


if __name__ == "__main__":
    main()
