"""evaluate: collect with source "eval", then success rate, mean reward and pass@k over the run's rows."""
from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from omrl.errors import UsageError
from omrl.rollout.collection import CollectResult, attempt_ids, collect, default_run_name
from omrl.rollout.pool import EnvFactory
from omrl.schema import is_failed
from omrl.schema.rows import TrajectoryRow
from omrl.store import Store


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task with n samples of which c succeeded (Chen et al., 2021)."""
    if k > n:
        raise UsageError(f"pass@{k} needs at least {k} samples per task, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def eval_metrics(rows: list[TrajectoryRow], ks: Iterable[int] = (1,)) -> dict[str, dict[str, Any]]:
    """Per env: episodes, tasks, success rate, failed, unknown_success, mean reward (scored rows), pass@k, errors.

    The success rate is omrl.schema's one definition: solved / episodes with a known outcome; failed
    episodes and unknown success are counted beside it (None when no episode has a known outcome).
    pass@k is over each task's known outcomes.
    """
    from omrl.schema import success_counts

    by_env: dict[str, list[TrajectoryRow]] = {}
    for row in rows:
        by_env.setdefault(row["env"], []).append(row)
    out = {}
    for env, env_rows in sorted(by_env.items()):
        per_task: dict[str, list[bool]] = {}
        for row in env_rows:
            outcomes = per_task.setdefault(row["task_id"], [])
            if not is_failed(row.get("status")) and row.get("success") is not None:
                outcomes.append(bool(row["success"]))
        rewards = [r["reward"] for r in env_rows if r["reward"] is not None]
        metrics: dict[str, Any] = {
            "episodes": len(env_rows), "tasks": len(per_task),
            **success_counts(env_rows).as_dict(),
            "mean_reward": sum(rewards) / len(rewards) if rewards else None,
            "errors": sum(is_failed(r.get("status")) for r in env_rows),
            "truncated": sum(r["status"] == "truncated" for r in env_rows),
        }
        known = [v for v in per_task.values() if v]
        n_min = min((len(v) for v in known), default=0)
        for k in ks:
            if 0 < k <= n_min:
                metrics[f"pass@{k}"] = sum(pass_at_k(len(v), sum(v), k) for v in known) / len(known)
        out[env] = metrics
    return out


@dataclass
class EvalResult:
    collect: CollectResult
    metrics: dict[str, dict[str, Any]]


async def evaluate(env_spec: str | EnvFactory | None, tasks: Iterable[Any], policy: Any, store: Store, *,
                   samples: int = 1, run_id: str | None = None, round: int = 0, **options: Any) -> EvalResult:
    """Collect with source "eval", then success rate, mean reward and pass@k over this run's rows."""
    tasks = list(tasks)
    if run_id is None:
        env_name = (env_spec if isinstance(env_spec, str) else getattr(env_spec, "__name__", None)
                    or (options["settings"].env if options.get("settings") else "env"))
        run_id = default_run_name(env_name, None, getattr(policy, "name", "policy"), prefix="eval-")
    result = await collect(env_spec, tasks, policy, store, samples=samples, run_id=run_id, round=round,
                           source="eval", **options)
    table = await asyncio.to_thread(store.read, "trajectories",
                                    ["id", "env", "task_id", "status", "reward", "success"])
    stored = set(table.column("id").to_pylist())
    # Each episode's current row: its last attempt (retry_failed keeps the failed ones before it as history).
    wanted = {ids[-1] for t in tasks for s in range(samples) if (ids := attempt_ids(stored, run_id, round, t.id, s))}
    # Filtered in Arrow: the store may hold many other runs, which need not become Python dicts.
    rows = table.filter(pc.is_in(table["id"], value_set=pa.array(sorted(wanted), pa.string()))).to_pylist()
    ks = sorted({1, samples} | {k for k in (2, 4, 8, 16) if k < samples})
    return EvalResult(collect=result, metrics=eval_metrics(rows, ks))
