"""Synthetic but realistic trajectories, for benchmarks, tests and the shipped samples.

Shape follows real agent logs: a long repeated system prompt, tool calls with JSON arguments,
tool outputs of 0.2-4 KB, a handful of turns (geometric, mean about 8), groups of samples per task.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

from omrl.envs.base import tool_schema
from omrl.schema import group_id, trajectory_id

ENVS = ("code", "math", "shop", "sql")
TOOLS = {
    "code": ["list_files", "read_file", "write_file", "run_tests", "submit"],
    "math": ["calculator", "answer"],
    "shop": ["search", "click"],
    "sql": ["execute_sql", "answer"],
}
WORDS = [
    "value", "error", "index", "file", "test", "module", "return", "order", "table", "column", "product",
    "price", "query", "result", "function", "parameter", "failure", "success", "output", "input", "config",
    "cache", "token", "request", "response",
]

SYSTEM_PROMPT = (
    "You are an autonomous agent. You solve the user's task by calling the tools you are given. "
    "Think step by step, call one tool at a time, read each observation carefully, and finish by calling "
    "the tool that submits your answer. Never invent tool results. " * 6
)[:1500]


def _text(rng: random.Random, n_bytes: int) -> str:
    words: list[str] = []
    size = 0
    while size < n_bytes:
        word = rng.choice(WORDS)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)


def _tool_schemas(env: str) -> list[dict[str, Any]]:
    return [tool_schema(name, f"The {name} tool.", {"input": {"type": "string"}}) for name in TOOLS[env]]


def synthetic_trajectory(index: int, rng: random.Random, samples_per_task: int = 4,
                         created: datetime | None = None, tool_bytes: tuple[int, int] = (200, 4000)
                         ) -> dict[str, Any]:
    """One schema-1 trajectory row (a plain dict) with realistic sizes."""
    env = ENVS[(index // samples_per_task) % len(ENVS)]
    task_id = f"{env}-{index // samples_per_task:06d}"
    sample = index % samples_per_task
    run_id = "synthetic"
    n_turns = min(30, 1 + int(rng.expovariate(1 / 7)))
    success = rng.random() < 0.45
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"Task {task_id}: " + _text(rng, rng.randint(80, 400))},
    ]
    turns = []
    for turn in range(n_turns):
        last = turn == n_turns - 1
        tool = TOOLS[env][-1] if last else rng.choice(TOOLS[env][:-1] or TOOLS[env])
        call_id = f"call_{turn}"
        messages.append({
            "role": "assistant",
            "content": _text(rng, rng.randint(20, 200)),
            "tool_calls": [{"id": call_id, "name": tool,
                            "arguments": json.dumps({"input": _text(rng, rng.randint(10, 80))})}],
        })
        messages.append({"role": "tool", "tool_call_id": call_id, "name": tool,
                         "content": _text(rng, rng.randint(*tool_bytes))})
        turns.append({"index": turn, "reward": (1.0 if success else 0.0) if last else 0.0, "done": last,
                      "latency_s": round(rng.uniform(0.2, 3.0), 3), "prompt_tokens": 400 + 300 * turn,
                      "completion_tokens": rng.randint(20, 120), "info": "{}"})
    start = (created or datetime(2026, 1, 1, tzinfo=timezone.utc)) + timedelta(seconds=index)
    return {
        "id": trajectory_id(run_id, 0, task_id, sample),
        "run_id": run_id,
        "round": 0,
        "task_id": task_id,
        "group_id": group_id(run_id, 0, task_id),
        "sample": sample,
        "env": env,
        "model": "synthetic-policy",
        "instruction": messages[1]["content"],
        "task": json.dumps({"answer": str(rng.randint(0, 999))}),
        "tools": json.dumps(_tool_schemas(env)),
        "messages": messages,
        "turns": turns,
        "reward": 1.0 if success else 0.0,
        "success": success,
        "status": "ok",
        "num_turns": n_turns,
        "prompt_tokens": sum(t["prompt_tokens"] for t in turns),
        "completion_tokens": sum(t["completion_tokens"] for t in turns),
        "duration_s": round(sum(t["latency_s"] for t in turns), 3),
        "source": "synthetic",
        "metadata": "{}",
        "created_at": start,
    }


def synthetic_trajectories(n: int, seed: int = 0, samples_per_task: int = 4,
                           tool_bytes: tuple[int, int] = (200, 4000)) -> Iterator[dict[str, Any]]:
    """`n` synthetic trajectory rows, deterministic for a seed."""
    rng = random.Random(seed)
    for index in range(n):
        yield synthetic_trajectory(index, rng, samples_per_task, tool_bytes=tool_bytes)
