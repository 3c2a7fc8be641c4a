"""The scripted expert's and the random policy's success on an environment's own test tasks, scored by the
environment (the benchmark's checker), through the real episode runner.

    python benchmarks/expert_success.py --env bfcl --split multi_turn_base --n 50
    python benchmarks/expert_success.py --env scienceworld --split test --n 50 --random-n 20 --max-turns 250
    python benchmarks/expert_success.py --env miniwob --option tasks=scripted --n 1050 --per task --max-turns 10

Prints one JSON line: per policy the episodes, successes, success rate, statuses and wall seconds, plus
the machine's load average at the start and the end (a busy machine slows a JVM a lot, not the rates).
`--option KEY=VALUE` goes to the task generator; `--per KEY` adds the success rate and mean reward per
value of that task payload key (e.g. miniwob's task name), and `at_0_9`: how many values reach 0.9.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omrl.cli.collect import env_options  # noqa: E402
from omrl.envs import generate_tasks  # noqa: E402
from omrl.policies import make_policy  # noqa: E402
from omrl.rollout import RolloutSettings, play_episodes  # noqa: E402


def measure(env: str, tasks: list, policy: str, max_turns: int, concurrency: int, per: str | None = None) -> dict:
    settings = RolloutSettings(env=env, max_turns=max_turns, concurrency=concurrency)
    started = time.monotonic()
    episodes = asyncio.run(play_episodes([(t, 0) for t in tasks], None, make_policy(policy), settings,
                                         run_id=f"bench-{policy}"))
    wins = sum(bool(e.success) for e in episodes)
    failed = [e.row["task_id"] + (f" ({e.status}: {e.row['error'][:160]})" if e.row["error"] else "")
              for e in episodes if not e.success]
    out = {"episodes": len(episodes), "successes": wins, "success_rate": wins / len(episodes),
           "statuses": dict(Counter(e.status for e in episodes)), "wall_s": round(time.monotonic() - started, 1),
           "not_solved": failed[:20]}
    if per is not None:
        key_of = {t.id: str(t.payload.get(per)) for t in tasks}
        groups: dict[str, list] = {}
        for e in episodes:
            groups.setdefault(key_of[e.row["task_id"]], []).append(e)
        out["per"] = {}
        for value, group in sorted(groups.items()):
            rewards = [e.reward for e in group if e.reward is not None]
            out["per"][value] = {"success": round(sum(bool(e.success) for e in group) / len(group), 3),
                                 "reward": round(sum(rewards) / len(rewards), 3) if rewards else None}
        out["at_0_9"] = sum(g["success"] >= 0.9 for g in out["per"].values())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", required=True)
    parser.add_argument("--split", default="test")
    parser.add_argument("--n", type=int, default=50, help="tasks for the expert")
    parser.add_argument("--random-n", type=int, default=None, help="tasks for the random policy (default: --n)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-turns", type=int, default=120)
    parser.add_argument("--random-max-turns", type=int, default=None, help="turn budget of the random policy")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="an option of the environment's task generator (repeatable)")
    parser.add_argument("--per", default=None, metavar="KEY", help="break success down by this task payload key")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    options = env_options(tuple(args.option), "--option")  # values as `omrl tasks generate --option` reads them
    tasks = generate_tasks(args.env, n=args.n, seed=args.seed, split=args.split, **options)
    out = {"env": args.env, "split": args.split, "seed": args.seed, "load_before": round(load_before, 1),
           "options": options, "expert": measure(args.env, tasks, "scripted", args.max_turns, args.concurrency, args.per)}
    random_tasks = tasks[:args.random_n] if args.random_n is not None else tasks
    out["random"] = measure(args.env, random_tasks, "random", args.random_max_turns or args.max_turns, args.concurrency,
                            args.per)
    out["load_after"] = round(os.getloadavg()[0], 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
