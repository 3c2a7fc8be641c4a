"""MiniWoB benchmark: the scripted solver's and the random policy's success per task, and what collect leaves.

    python benchmarks/miniwob_bench.py                          # 21 tasks x 50 test seeds, ~30 min on 2 busy cores
    python benchmarks/miniwob_bench.py --seeds 5 --tasks click-test,enter-text --skip-collect

- per task (`--tasks`, default: every task the scripted expert solves): success and mean reward of the
  scripted expert and of the random policy (`random`, seed 0) over `--seeds` test-split seeds, played
  through omrl.rollout.play_episodes with `--concurrency` browsers in a pool; `solver_tasks_at_0_9` counts
  the tasks where the expert reaches 0.9;
- collect: `omrl collect --env miniwob --policy scripted` of `--collect-episodes` episodes at
  `--collect-concurrency` in flight in a subprocess, then the browser and driver processes it left
  running (`left_after_collect`); the same command again, killed with SIGKILL once its browsers run
  (`left_after_kill9`, counted 10 s after the kill). Processes are found by a marker in their environment.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from omrl.envs.miniwob import MiniWoBEnv  # noqa: E402
from omrl.envs.miniwob.solver import SOLVERS  # noqa: E402
from omrl.policies.random_policy import RandomPolicy  # noqa: E402
from omrl.policies.scripted import ScriptedPolicy  # noqa: E402
from omrl.rollout import EnvPool, RolloutSettings, play_episodes  # noqa: E402
from tests.engine_helpers import kill_collect_mid_run, marked_processes  # noqa: E402


def success_table(names: list[str], seeds: int, concurrency: int, max_turns: int) -> dict[str, Any]:
    started = time.monotonic()
    tasks = MiniWoBEnv.generate_tasks(seeds * len(names), seed=0, split="test", tasks=",".join(names))
    generate_s = time.monotonic() - started
    settings = RolloutSettings(env="miniwob", max_turns=max_turns, concurrency=concurrency, seed=0)
    pool = EnvPool(MiniWoBEnv)

    async def run(policy: Any) -> list[Any]:
        return await play_episodes([(t, 0) for t in tasks], MiniWoBEnv, policy, settings, run_id="bench",
                                   pool=pool)

    try:
        played = {}
        for label, policy in (("solver", ScriptedPolicy()), ("random", RandomPolicy(seed=0))):
            began = time.monotonic()
            played[label] = (asyncio.run(run(policy)), time.monotonic() - began)
    finally:
        asyncio.run(pool.close())
    name_of = {t.id: t.payload["task"] for t in tasks}
    per_task: dict[str, Any] = {}
    for name in names:
        row: dict[str, Any] = {}
        for label, (episodes, _) in played.items():
            mine = [e for e in episodes if name_of[e.row["task_id"]] == name]
            rewards = [e.reward for e in mine if e.reward is not None]
            row[f"{label}_success"] = round(sum(bool(e.success) for e in mine) / len(mine), 3)
            row[f"{label}_reward"] = round(sum(rewards) / len(rewards), 3) if rewards else None
            errors = sum(e.status not in ("ok", "truncated") for e in mine)
            if errors:
                row[f"{label}_errors"] = errors
        per_task[name] = row
    return {
        "seeds": seeds, "tasks": len(names), "concurrency": concurrency, "generate_s": round(generate_s, 1),
        "solver_s": round(played["solver"][1], 1), "random_s": round(played["random"][1], 1),
        "browsers_made": pool.made,
        "solver_tasks_at_0_9": sum(r["solver_success"] >= 0.9 for r in per_task.values()),
        "solver_success_min": min(r["solver_success"] for r in per_task.values()),
        "random_success_mean": round(sum(r["random_success"] for r in per_task.values()) / len(per_task), 3),
        "per_task": per_task,
    }


def collect_check(episodes: int, concurrency: int) -> dict[str, Any]:
    names = sorted(SOLVERS)
    work = Path(tempfile.mkdtemp(prefix="miniwob-bench-"))
    tasks_file = work / "web.jsonl"
    tasks = MiniWoBEnv.generate_tasks(episodes, seed=1, split="test", tasks=",".join(names))
    tasks_file.write_text("".join(json.dumps(t.to_row()) + "\n" for t in tasks))

    def argv(store: str) -> list[str]:
        return ["collect", "--env", "miniwob", "--tasks", str(tasks_file), "--policy", "scripted", "--store",
                str(work / store), "--concurrency", str(concurrency), "--max-turns", "10", "--no-progress"]

    marker = uuid.uuid4().hex
    env = {**os.environ, "OMRL_TEST_MARKER": marker, "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "omrl", *argv("store")], cwd=work, env=env, capture_output=True,
                          text=True, timeout=3600)
    collect_s = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"collect failed: {done.stderr[-2000:]}")
    left = marked_processes(marker)
    engines, left_killed = kill_collect_mid_run(argv("killed"), work, "chromium")
    summary = [line for line in done.stdout.splitlines() if "written" in line or "success" in line]
    return {"collect_episodes": episodes, "collect_concurrency": concurrency, "collect_s": round(collect_s, 1),
            "collect_summary": " / ".join(s.strip() for s in summary),
            "left_after_collect": len(left), "browser_processes_seen_before_kill9": len(engines),
            "left_after_kill9": len(left_killed)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=",".join(sorted(SOLVERS)), help="comma-separated MiniWoB tasks")
    parser.add_argument("--seeds", type=int, default=50, help="test seeds per task")
    parser.add_argument("--concurrency", type=int, default=4, help="browsers (episodes in flight) for the table")
    parser.add_argument("--max-turns", type=int, default=10)
    parser.add_argument("--collect-episodes", type=int, default=64)
    parser.add_argument("--collect-concurrency", type=int, default=8)
    parser.add_argument("--skip-collect", action="store_true")
    args = parser.parse_args()
    result: dict[str, Any] = {"cpus": os.cpu_count(), "load_1m_before": round(os.getloadavg()[0], 2)}
    if not args.skip_collect:
        result.update(collect_check(args.collect_episodes, args.collect_concurrency))
    if args.seeds:
        result.update(success_table(args.tasks.split(","), args.seeds, args.concurrency, args.max_turns))
    result["load_1m_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
