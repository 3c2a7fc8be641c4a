"""The one rollout step of the RL trainers (GRPO's rollout_func, PPO's steps): play the step's episodes with
omrl.rollout.play_episodes, score them online when the recipe has a reward recipe, store them, and stop
with the first error when every rollout failed.

    rollouts = RolloutStep(recipe, "ppo", store=store, reporter=reporter)   # recipe: GRPORecipe or PPORecipe
    try:
        played = rollouts.run(step, jobs, policy)       # jobs: (task, sample) pairs; played.episodes, .scored
    finally:
        rollouts.close()

Each step has a base seed of its own per (algorithm, round, step) from which each episode derives its
seed, every episode of the step in flight (one generation batch), run id `<run_name>/round-<round>/step-NNNNN`
(`.../attempt-N/...` when an earlier run stored rollouts under the prefix), source `collected:<algorithm>`.
Reusable engines (JVMs, game interpreters) are kept across steps in one EnvPool until `close` (inside
omrl.rollout.shared_engines(), the block's pool, kept for the calls after this run too). With several
processes (`processes`: PPO's omrl.train.rl.ppo_update.Processes) the main one picks the run prefix, each stores
its own share and the failure check counts every process's rollouts.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from omrl.errors import UsageError
from omrl.progress import QUIET, Reporter
from omrl.schema import is_failed, success_counts


class OneProcess:
    """The processes of a run that has one: itself."""

    main = True
    rank = 0

    def from_main(self, value: Any) -> Any:
        return value

    def total(self, n: int) -> int:
        return n


@dataclass
class Played:
    """One step's rollouts: the episodes (rows in `.row`) and, with a reward recipe, their online scores."""

    episodes: list[Any]
    scored: Any = None  # omrl.train.data.online_reward's step result, or None without a reward recipe

    def rewards(self) -> list[float | None]:
        """Each episode's reward as trained on: the combined reward when scored online, else the env's."""
        if self.scored is not None:
            return [self.scored.rewards.get(e.row["id"]) for e in self.episodes]
        return [e.row["reward"] for e in self.episodes]


class RolloutStep:
    """The rollouts of one RL run, step by step (see the module doc)."""

    def __init__(self, recipe: Any, algorithm: str, *, store: Any = None, reporter: Reporter | None = None,
                 processes: Any = None) -> None:
        from omrl.rollout import EnvPool, env_factory, env_pool
        from omrl.train.trainer import open_store

        self.recipe, self.algorithm = recipe, algorithm
        self.reporter = reporter or QUIET
        self.processes = processes or OneProcess()
        self.pool, self.owns_pool = env_pool(recipe.rollout.env, recipe.rollout.env_options)
        if self.pool is None:
            self.pool = EnvPool(env_factory(recipe.rollout.env, recipe.rollout.env_options))
        self.store = None
        self.run_prefix = f"{recipe.run_name}/round-{recipe.round}"
        target = store if store is not None else recipe.store
        if target is not None and target != "":
            if self.processes.main:
                self.store = open_store(target, None)
                self.run_prefix = free_run_prefix(self.store, self.run_prefix)
            # One prefix for all, chosen before any process stores this run's rows (they would look like an
            # earlier run's).
            self.run_prefix = self.processes.from_main(self.run_prefix)
            if self.store is None:
                self.store = open_store(target, None)
        self.online = None
        if getattr(recipe, "reward", None) is not None:
            if self.store is None:
                raise UsageError("a reward recipe needs `store`: every online score is stored beside its rollout")
            from omrl.annotate.reward import load_reward_recipe
            from omrl.train.data.online_reward import OnlineReward

            reward = load_reward_recipe(recipe.reward)
            # The cache folder of `omrl annotate` unless the recipe shares one: a reply is asked once.
            self.online = OnlineReward(reward, reward.cache or self.store.cache_dir("judge"))
        self.calls = self.episodes = self.stored = self.annotations = 0
        self.solved = self.known = 0  # this process's solved rollouts and those with a known outcome (omrl.schema)
        self.statuses: dict[str, int] = {}
        self.seconds: list[float] = []  # per step: play + scoring + storing (a trainer's update is not in it)
        self.scoring_tail: list[float] = []  # per step: seconds scoring went on after the last episode ended

    def settings(self, step: int, episodes: int):
        """The step's RolloutSettings: the recipe's, every episode of the step in flight (one generation
        batch), and a base seed of its own per (round, step) from which each episode derives its seed."""
        from omrl.rollout import episode_seed

        base = self.recipe.rollout
        seed = episode_seed(base.seed, f"{self.algorithm}/round-{self.recipe.round}", step)
        return replace(base, seed=seed, concurrency=max(base.concurrency, episodes))

    def run_id(self, step: int) -> str:
        """One run id per step: (run, round, task) is then exactly the group GRPO normalises over."""
        return f"{self.run_prefix}/step-{step:05d}"

    @property
    def policy_name(self) -> str:
        return f"{self.recipe.run_name}@round{self.recipe.round}"

    def run(self, step: int, jobs: list[tuple[Any, int]], policy: Any,
            before_store: Callable[[Played], None] | None = None) -> Played:
        """Play `jobs` with `policy` as step `step`, [score,] store the rows (and scores), stop when every
        rollout failed; `before_store(played)` may write into the rows first (GRPO's step credit)."""
        started = time.perf_counter()
        played = asyncio.run(self._play(step, jobs, policy))
        self.calls += 1
        if before_store is not None:
            before_store(played)
        self._store(played)  # before the all-failed check: a broken setup's rows are kept to inspect
        self.seconds.append(time.perf_counter() - started)
        self._count(played.episodes)
        self._stop_if_all_failed(step, played)
        return played

    async def _play(self, step: int, jobs: list[tuple[Any, int]], policy: Any) -> Played:
        from omrl.rollout import play_episodes

        name = self.algorithm
        scoring = None
        if self.online is not None:
            scoring = self.online.step(step, self.recipe.round, Counter(task.id for task, _ in jobs))
        try:
            episodes = await play_episodes(jobs, self.pool.make, policy, self.settings(step, len(jobs)),
                                           run_id=self.run_id(step), round=self.recipe.round,
                                           source=f"collected:{name}", metadata=self._metadata(step),
                                           on_episode=scoring.on_episode if scoring is not None else None,
                                           pool=self.pool)
        except BaseException:
            if scoring is not None:
                await scoring.cancel()
            raise
        if scoring is None:
            return Played(episodes)
        finished = time.perf_counter()
        scored = await scoring.finish()
        self.scoring_tail.append(time.perf_counter() - finished)  # the part of scoring not overlapped with play
        return Played(episodes, scored)

    def _metadata(self, step: int) -> dict[str, Any]:
        metadata = {f"{self.algorithm}_step": step, f"{self.algorithm}_round": self.recipe.round}
        if not isinstance(self.processes, OneProcess):
            metadata[f"{self.algorithm}_process"] = self.processes.rank
        return metadata

    def _store(self, played: Played) -> None:
        if self.store is not None and played.episodes:
            self.store.append([e.row for e in played.episodes])  # this process's own (the store's lock orders them)
            self.stored += len(played.episodes)
        if self.store is not None and played.scored is not None and played.scored.annotations:
            # After the rows they score, in one part: a step's scores are committed together.
            self.store.append(played.scored.annotations, table="annotations")
            self.annotations += len(played.scored.annotations)

    def _count(self, episodes: list[Any]) -> None:
        """Count the step's rollouts by status, and show the run's success so far (omrl.schema's rate)."""
        self.episodes += len(episodes)
        for episode in episodes:
            status = episode.row["status"]
            self.statuses[status] = self.statuses.get(status, 0) + 1
        counts = success_counts(e.row for e in episodes)
        self.solved, self.known = self.solved + counts.solved, self.known + counts.known
        if self.known:
            self.reporter.advance(0, success=self.solved / self.known)

    def _stop_if_all_failed(self, step: int, played: Played) -> None:
        episodes = played.episodes
        failed = [e.row for e in episodes if is_failed(e.row["status"])]
        name = self.algorithm.upper()
        if self.processes.total(len(episodes) - len(failed)) == 0:
            # Nothing to learn from and a setup that is broken: stop loudly (the rows are stored to inspect).
            first = failed[0] if failed else {"status": "none", "error": "no episodes"}
            raise RuntimeError(f"{name} step {step}: all {self.processes.total(len(episodes))} rollouts failed; "
                               f"first error ({first['status']}): {first['error']}")
        scored = played.scored
        if scored is not None and episodes and all(r is None for r in played.rewards()):
            # Every sample lacks a reward: training on nothing is a broken judge or recipe; say why.
            raise RuntimeError(f"{name} step {step}: no rollout has a reward ({scored.dropped} lacking a component, "
                               f"{scored.failed} failed; missing {dict(scored.missing)}); first error: "
                               f"{scored.first_error}")

    def reward_steps(self) -> list[dict[str, Any]]:
        """Per rollout step: scored, dropped and failed rollouts and missing components ([] without a recipe)."""
        return list(self.online.steps) if self.online is not None else []

    def summary(self) -> dict[str, Any]:
        """This process's counts: calls, episodes, stored rows, statuses, the run prefix, seconds per step."""
        return {"calls": self.calls, "episodes": self.episodes, "stored": self.stored, "statuses": self.statuses,
                "run_prefix": self.run_prefix,
                "rollout_s": [round(x, 3) for x in self.seconds],
                **({"annotations": self.annotations, "scoring_tail_s": [round(x, 3) for x in self.scoring_tail]}
                   if self.online is not None else {})}

    def close(self) -> None:
        """Close the engines kept between steps (call once training is over; a shared pool stays open)."""
        if self.owns_pool:
            asyncio.run(self.pool.close())


def free_run_prefix(store: Any, prefix: str) -> str:
    """`prefix`, or `prefix/attempt-N` when an earlier run (killed and resumed, or re-run) already stored
    rollouts under it: the same step would otherwise get the same trajectory ids as different episodes."""
    from omrl.store.query import quote_literal

    taken = {r["run_id"] for r in store.sql(
        f"SELECT DISTINCT run_id FROM trajectories WHERE starts_with(run_id, {quote_literal(prefix + '/')})"
    ).to_pylist()}
    if not any(run.startswith(f"{prefix}/step-") for run in taken):
        return prefix
    n = 2
    while any(run.startswith(f"{prefix}/attempt-{n}/") for run in taken):
        n += 1
    return f"{prefix}/attempt-{n}"
