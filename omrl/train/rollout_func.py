"""TRL's `rollout_func` for GRPO, played by omrl's agent loop and episode runner (omrl.rollout.play_episodes),
never a second loop inside the trainer.

Contract (trl 1.16 GRPOTrainer): `rollout_func(prompts, trainer) -> dict` with, per prompt, one
episode's `prompt_ids`, `completion_ids` and `logprobs`; extra keys go to the reward functions except
`env_mask`, which TRL uses as its tool mask (1 = the model's tokens, 0 = tokens the environment or the
chat template added: no loss on them). The prompts are task ids, each repeated `num_generations` times
in a row, so consecutive episodes of one task form one GRPO group.

With a reward recipe (GRPORecipe.reward) each group is scored by omrl/train/online_reward.py as its last
episode finishes (judge calls overlap the episodes still playing); the step's rows and then its
annotations are appended to the store, and the combined reward (None when missing: left out of the
group's baseline) is what TRL sees. A step in which no rollout has a reward stops with the first error.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from omrl.envs.base import Task
from omrl.errors import UsageError
from omrl.schema import is_failed


class AgentRollout:
    """Callable passed to GRPOTrainer as rollout_func: plays the step's episodes with omrl.rollout's
    play_episodes (environments made in threads, seeded per episode; reusable engines kept in one EnvPool
    across steps until `close`), then stores the rows."""

    def __init__(self, recipe: Any, tasks: list[Task], tokenizer: Any) -> None:
        self.recipe = recipe
        self.tasks = {t.id: t for t in tasks}
        self.tokenizer = tokenizer
        from omrl.rollout import EnvPool, env_factory, env_pool

        self.make_env = env_factory(recipe.rollout.env, recipe.rollout.env_options)
        # Reusable engines (JVMs, game interpreters) are kept across steps: started once, not every step
        # (inside omrl.rollout.shared_engines(), the block's pool, kept for the calls after this run too).
        self.pool, self.owns_pool = env_pool(recipe.rollout.env, recipe.rollout.env_options)
        if self.pool is None:
            self.pool = EnvPool(self.make_env)
        self.store = None
        self.run_prefix = f"{recipe.run_name}/round-{recipe.round}"
        if recipe.store:
            from omrl.store import Store

            self.store = Store.create(recipe.store, exist_ok=True)
            self.run_prefix = free_run_prefix(self.store, self.run_prefix)
        self.online = None
        if getattr(recipe, "reward", None) is not None:
            if self.store is None:
                raise UsageError("a reward recipe needs `store`: every online score is stored beside its rollout")
            from omrl.annotate.reward import load_reward_recipe
            from omrl.train.online_reward import OnlineReward

            reward = load_reward_recipe(recipe.reward)
            # The cache folder of `omrl annotate` unless the recipe shares one: a reply is asked once.
            self.online = OnlineReward(reward, reward.cache or self.store.cache_dir("judge"))
        self.calls = 0
        self.episodes = 0
        self.stored = 0
        self.annotations = 0
        self.statuses: dict[str, int] = {}
        self.seconds: list[float] = []  # per step: play + scoring + storing (TRL's step_time is the update only)
        self.scoring_tail: list[float] = []  # per step: seconds scoring went on after the last episode ended

    def summary(self) -> dict[str, Any]:
        return {"calls": self.calls, "episodes": self.episodes, "stored": self.stored, "statuses": self.statuses,
                "run_prefix": self.run_prefix,
                "rollout_s": [round(x, 3) for x in self.seconds],
                **({"annotations": self.annotations, "scoring_tail_s": [round(x, 3) for x in self.scoring_tail]}
                   if self.online is not None else {})}

    def close(self) -> None:
        """Close the engines kept between steps (call once training is over; a shared pool stays open)."""
        if self.owns_pool:
            asyncio.run(self.pool.close())

    def reward_steps(self) -> list[dict[str, Any]]:
        """Per rollout step: scored, dropped and failed rollouts and missing components ([] without a recipe)."""
        return list(self.online.steps) if self.online is not None else []

    def __call__(self, prompts: list[str], trainer: Any) -> dict[str, list]:
        started = time.perf_counter()
        step = int(trainer.state.global_step)
        settings = self.settings(step, len(prompts))
        policy = self.policy(trainer, settings)
        episodes, scored = asyncio.run(self._play(prompts, policy, settings, step))
        self.calls += 1
        step_advantages = self._step_credit(episodes, scored)  # before storing: it writes turns' info.credit
        self._store(episodes, scored)  # before the all-failed check: a broken setup's rows are kept to inspect
        self.seconds.append(time.perf_counter() - started)
        out = self._to_trl(episodes, step, scored)
        if step_advantages is not None:
            from omrl.train.grpo_credit import STEP_ADVANTAGES

            out[STEP_ADVANTAGES] = step_advantages
        return out

    def _step_credit(self, episodes: list[Any], scored: Any) -> list[list[float]] | None:
        """With the recipe's step_credit: per-token step advantages of the step's rollouts (whole groups,
        from the rewards TRL is given), also written into each turn's info["credit"]; else None."""
        if self.recipe.step_credit is None:
            return None
        from omrl.policies.hf import token_trace
        from omrl.train.grpo_credit import rollout_step_advantages

        rows = [e.row for e in episodes]
        rewards = [scored.rewards.get(r["id"]) if scored is not None else r["reward"] for r in rows]
        masks = [(token_trace(e.context) or {}).get("env_mask") or [] for e in episodes]
        return rollout_step_advantages(rows, masks, self.recipe.step_credit, rewards)

    def policy(self, trainer: Any, settings: Any) -> Any:
        """The live model as a policy: generation through TRL's vLLM engine when the trainer has one
        (use_vllm), else through transformers; both give the same token traces."""
        options = {"max_new_tokens": settings.max_new_tokens} if settings.max_new_tokens else {}
        name = f"{self.recipe.run_name}@round{self.recipe.round}"
        if getattr(trainer.args, "use_vllm", False):
            from omrl.policies.vllm import VLLMPolicy

            return VLLMPolicy.from_trainer(trainer, name=name, **options)
        from omrl.policies.hf import HFPolicy

        return HFPolicy(trainer.accelerator.unwrap_model(trainer.model), self.tokenizer, name=name, **options)

    def settings(self, step: int, episodes: int):
        """The step's RolloutSettings: the recipe's, every episode of the step in flight (one generation
        batch), and a base seed of its own per (round, step) from which each episode derives its seed."""
        from dataclasses import replace

        from omrl.rollout import episode_seed

        base = self.recipe.rollout
        seed = episode_seed(base.seed, f"grpo/round-{self.recipe.round}", step)
        return replace(base, seed=seed, concurrency=max(base.concurrency, episodes))

    def _run_id(self, step: int) -> str:
        # One run id per step: (run, round, task) is then exactly the GRPO group TRL normalises over.
        return f"{self.run_prefix}/step-{step:05d}"

    async def _play(self, prompts: list[str], policy: Any, settings: Any, step: int) -> tuple[list[Any], Any]:
        from collections import Counter

        from omrl.rollout import play_episodes

        seen: dict[str, int] = {}
        jobs = []
        for task_id in prompts:
            if task_id not in self.tasks:
                raise UsageError(f"rollout prompt {task_id!r} is not a task id of {self.recipe.tasks}")
            sample = seen.get(task_id, 0)
            seen[task_id] = sample + 1
            jobs.append((self.tasks[task_id], sample))
        scoring = self.online.step(step, self.recipe.round, Counter(prompts)) if self.online is not None else None
        try:
            episodes = await play_episodes(jobs, self.make_env, policy, settings, run_id=self._run_id(step),
                                           round=self.recipe.round, source="collected:grpo",
                                           metadata={"grpo_step": step, "grpo_round": self.recipe.round},
                                           on_episode=scoring.on_episode if scoring is not None else None,
                                           pool=self.pool)
        except BaseException:
            if scoring is not None:
                await scoring.cancel()
            raise
        if scoring is None:
            return episodes, None
        played = time.perf_counter()
        scored = await scoring.finish()
        self.scoring_tail.append(time.perf_counter() - played)  # the part of scoring not overlapped with play
        return episodes, scored

    def _store(self, episodes: list[Any], scored: Any = None) -> None:
        if self.store is not None and episodes:
            self.store.append([e.row for e in episodes])
            self.stored += len(episodes)
        if self.store is not None and scored is not None and scored.annotations:
            # After the rows they score, in one part: a step's scores are committed together.
            self.store.append(scored.annotations, table="annotations")
            self.annotations += len(scored.annotations)

    def _to_trl(self, episodes: list[Any], step: int, scored: Any = None) -> dict[str, list]:
        from omrl.policies.hf import token_trace

        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [],
                                "omrl_reward": [], "omrl_success": [], "omrl_trajectory_id": []}
        for episode in episodes:
            row = episode.row
            self.statuses[row["status"]] = self.statuses.get(row["status"], 0) + 1
            trace = token_trace(episode.context)
            if not trace or not trace["completion_ids"]:
                # No token was sampled (the env failed at reset): an unscorable, loss-free placeholder.
                eos = self.tokenizer.eos_token_id
                trace = {"prompt_ids": (trace or {}).get("prompt_ids") or [eos], "completion_ids": [eos],
                         "env_mask": [0], "logprobs": [0.0]}
            out["prompt_ids"].append(trace["prompt_ids"])
            out["completion_ids"].append(trace["completion_ids"])
            out["logprobs"].append(trace["logprobs"])
            out["env_mask"].append(trace["env_mask"])
            # A failed episode has reward None: TRL leaves it out of its group's baseline (never a 0); so has
            # a rollout whose combined reward is missing.
            out["omrl_reward"].append(scored.rewards.get(row["id"]) if scored is not None else row["reward"])
            out["omrl_success"].append(row["success"])
            out["omrl_trajectory_id"].append(row["id"])
        self.episodes += len(episodes)
        failed = [e.row for e in episodes if is_failed(e.row["status"])]
        if episodes and len(failed) == len(episodes):
            # Nothing to learn from and a setup that is broken: stop loudly (the rows are stored to inspect).
            raise RuntimeError(f"GRPO step {step}: all {len(episodes)} rollouts failed; first error "
                               f"({failed[0]['status']}): {failed[0]['error']}")
        if scored is not None and episodes and all(r is None for r in out["omrl_reward"]):
            # Every sample lacks a reward: training on nothing is a broken judge or recipe; say why.
            raise RuntimeError(f"GRPO step {step}: no rollout has a reward ({scored.dropped} lacking a component, "
                               f"{scored.failed} failed; missing {dict(scored.missing)}); first error: "
                               f"{scored.first_error}")
        return out


def free_run_prefix(store: Any, prefix: str) -> str:
    """`prefix`, or `prefix/attempt-N` when an earlier run (killed and resumed, or re-run) already stored
    rollouts under it: the same step would otherwise get the same trajectory ids as different episodes.
    Shared by GRPO and PPO (runs named `<prefix>/step-NNNNN`)."""
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
