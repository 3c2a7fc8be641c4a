"""Environment benchmark: steps/s and reset seconds per environment, alone and with many episodes in flight,
and pool_speedup for environments that keep an engine (`reusable`).

    python benchmarks/env_bench.py --env twx --env textworld       # a few minutes on 2 cores
    python benchmarks/env_bench.py --env twx --in-flight 8 --pool-episodes 8

Each environment plays its scripted expert (a policy that costs nothing, so what is timed is the
environment) through the real episode runner, omrl.rollout.play_episodes, with every reset and step
timed by a thin wrapper. Per environment:
- start_s: mean seconds to make one instance (its engine process started, for engine environments);
- steps_per_s_alone, reset_s_alone: environment steps per wall-clock second (resets included) and the
  mean reset, one episode at a time in one instance;
- steps_per_s_in_flight, reset_s_in_flight: the same with `--in-flight` episodes at once (32), one
  instance each (instances made before the clock starts);
- pool_speedup (reusable environments only): episodes/s of `--pool-episodes` episodes at
  `--pool-concurrency`, through an EnvPool (instances kept and reset between episodes) over the same
  with a fresh instance per episode (made and closed around each), measured in the same run;
- expert_success: the scripted expert's success rate over every episode played (a sanity check).

An environment joins by adding one entry to BENCHES: how to make its test tasks, its options and turn
budget, and what to prepare untimed (TextWorld builds its games into the cache). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omrl.envs import env_class, generate_tasks, make_env, unavailable  # noqa: E402
from omrl.envs.base import Task  # noqa: E402
from omrl.policies.scripted import ScriptedPolicy  # noqa: E402
from omrl.rollout import EnvPool, RolloutSettings, play_episodes  # noqa: E402


@dataclass
class Bench:
    """How one environment is benchmarked."""

    tasks: Callable[[int], list[Task]]  # n distinct test tasks
    options: dict[str, Any] = field(default_factory=dict)  # constructor options
    max_turns: int = 100
    max_tasks: int | None = None  # distinct tasks to use at most (episodes then repeat them as samples)
    prepare: Callable[[list[Task]], None] | None = None  # untimed work before the clock starts


SCIENCEWORLD_SHORT = "find-animal,find-living-thing,find-non-living-thing,find-plant"


def _textworld_prepare(tasks: list[Task]) -> None:
    from omrl.envs.textworld import build_games

    build_games(tasks)


BENCHES: dict[str, Bench] = {
    "grid": Bench(lambda n: generate_tasks("grid", n, split="eval"), max_turns=32),
    "twx": Bench(lambda n: generate_tasks("twx", n, split="test")),
    "textworld": Bench(lambda n: generate_tasks("textworld", n, split="test"), max_tasks=4,
                       prepare=_textworld_prepare),
    "bfcl": Bench(lambda n: generate_tasks("bfcl", n, split="multi_turn_base"), max_turns=32),
    # The find-* tasks: gold paths of 5-10 steps, whose making (the expert's, untimed by the wrapper but in
    # the wall time) is quick; other task types spend most of an episode's wall time making the gold path.
    "scienceworld": Bench(lambda n: generate_tasks("scienceworld", n, split="test", tasks=SCIENCEWORLD_SHORT),
                          max_turns=64, max_tasks=8),
    # One Chromium per instance (start_s: its start); the utterances are read from the pages when the tasks
    # are made, before the clock starts.
    "miniwob": Bench(lambda n: generate_tasks("miniwob", n, split="test", tasks="scripted"), max_turns=12),
}


class Timings:
    """Reset and step durations, from every instance (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.resets: list[float] = []
        self.steps = 0
        self.made: list[float] = []

    def add(self, kind: str, seconds: float) -> None:
        with self.lock:
            if kind == "reset":
                self.resets.append(seconds)
            elif kind == "step":
                self.steps += 1
            else:
                self.made.append(seconds)


class Timed:
    """An environment whose resets and steps are timed; `reusable` as the run asks."""

    def __init__(self, env: Any, timings: Timings, reusable: bool) -> None:
        self.env, self.timings, self.reusable = env, timings, reusable
        self.name = env.name

    def reset(self, task: Task):
        started = time.perf_counter()
        try:
            return self.env.reset(task)
        finally:
            self.timings.add("reset", time.perf_counter() - started)

    def step(self, action):
        result = self.env.step(action)
        self.timings.add("step", 0.0)
        return result

    def expert_action(self):
        return self.env.expert_action()

    def close(self) -> None:
        self.env.close()


def factory(name: str, bench: Bench, timings: Timings, reusable: bool) -> Callable[[], Timed]:
    def make() -> Timed:
        started = time.perf_counter()
        env = make_env(name, **bench.options)
        timings.add("made", time.perf_counter() - started)
        return Timed(env, timings, reusable and getattr(env, "reusable", False) is True)

    return make


def jobs_for(tasks: list[Task], episodes: int) -> list[tuple[Task, int]]:
    """`episodes` (task, sample) jobs cycling over `tasks`."""
    return [(tasks[i % len(tasks)], i // len(tasks)) for i in range(episodes)]


def play(name: str, bench: Bench, jobs: list[tuple[Task, int]], concurrency: int, *, reusable: bool,
         premade: int = 0) -> tuple[float, Timings, list[Any]]:
    """Wall seconds, timings and episodes of `jobs` at `concurrency`; `premade` instances are made untimed."""
    timings = Timings()
    make = factory(name, bench, timings, reusable)
    settings = RolloutSettings(env=name, max_turns=bench.max_turns, concurrency=concurrency, seed=0)

    async def run() -> tuple[float, list[Any]]:
        pool = EnvPool(make)
        made = await asyncio.gather(*(asyncio.to_thread(make) for _ in range(premade)))
        pool.idle.extend(made)
        started = time.perf_counter()
        try:
            episodes = await play_episodes(jobs, make, ScriptedPolicy(), settings, run_id=f"bench-{name}",
                                           pool=pool)
        finally:
            elapsed = time.perf_counter() - started
            await pool.close()
        return elapsed, episodes

    elapsed, episodes = asyncio.run(run())
    return elapsed, timings, episodes


def measure(name: str, bench: Bench, episodes: int, in_flight: int, pool_episodes: int, pool_concurrency: int
            ) -> dict[str, Any]:
    cls = env_class(name)
    reason = unavailable(cls)
    if reason:
        return {"skipped": reason}
    wanted = max(episodes, in_flight, pool_episodes)
    tasks = bench.tasks(min(wanted, bench.max_tasks or wanted))
    if bench.prepare is not None:
        bench.prepare(tasks)
    out: dict[str, Any] = {"tasks": len(tasks)}
    all_episodes: list[Any] = []

    elapsed, timings, played = play(name, bench, jobs_for(tasks, episodes), 1, reusable=True, premade=1)
    all_episodes += played
    out["start_s"] = round(sum(timings.made) / len(timings.made), 3) if timings.made else None
    out["steps_per_s_alone"] = round(timings.steps / elapsed, 1)
    out["reset_s_alone"] = round(sum(timings.resets) / len(timings.resets), 4)

    elapsed, timings, played = play(name, bench, jobs_for(tasks, in_flight), in_flight, reusable=True,
                                    premade=in_flight)
    all_episodes += played
    out["in_flight"] = in_flight
    out["steps_per_s_in_flight"] = round(timings.steps / elapsed, 1)
    out["reset_s_in_flight"] = round(sum(timings.resets) / len(timings.resets), 4)

    if getattr(cls, "reusable", False) is True:
        jobs = jobs_for(tasks, pool_episodes)
        pooled_s, pooled, played = play(name, bench, jobs, pool_concurrency, reusable=True)
        all_episodes += played
        fresh_s, fresh, played = play(name, bench, jobs, pool_concurrency, reusable=False)
        all_episodes += played
        out["pool_episodes"], out["pool_concurrency"] = pool_episodes, pool_concurrency
        out["pool_instances_made"], out["fresh_instances_made"] = len(pooled.made), len(fresh.made)
        out["pool_speedup"] = round(fresh_s / pooled_s, 2)
    statuses = [e.status for e in all_episodes]
    out["episodes"] = len(all_episodes)
    out["errors"] = sum(s not in ("ok", "truncated") for s in statuses)
    out["expert_success"] = round(sum(bool(e.success) for e in all_episodes) / len(all_episodes), 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", action="append", choices=sorted(BENCHES),
                        help="environment to measure (repeatable; default: all in BENCHES)")
    parser.add_argument("--episodes", type=int, default=8, help="episodes played alone")
    parser.add_argument("--in-flight", type=int, default=32, help="episodes at once in the in-flight run")
    parser.add_argument("--pool-episodes", type=int, default=16, help="episodes of each pool_speedup run")
    parser.add_argument("--pool-concurrency", type=int, default=2, help="episodes at once in the pool_speedup runs")
    args = parser.parse_args()
    result: dict[str, Any] = {"cpus": os.cpu_count(), "load_1m_before": round(os.getloadavg()[0], 2)}
    for name in args.env or sorted(BENCHES):
        result[name] = measure(name, BENCHES[name], args.episodes, args.in_flight, args.pool_episodes,
                               args.pool_concurrency)
    result["load_1m_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
