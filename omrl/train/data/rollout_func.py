"""TRL's `rollout_func` for GRPO, played by omrl's rollout step (omrl/train/data/rollout_step.py, PPO's too:
omrl.rollout.play_episodes, online scoring, storing, the all-failed stop), never a second loop inside the trainer.

Contract (trl 1.16 GRPOTrainer): `rollout_func(prompts, trainer) -> dict` with, per prompt, one
episode's `prompt_ids`, `completion_ids` and `logprobs`; extra keys go to the reward functions except
`env_mask`, which TRL uses as its tool mask (1 = the model's tokens, 0 = tokens the environment or the
chat template added: no loss on them). The prompts are task ids, each repeated `num_generations` times
in a row, so consecutive episodes of one task form one GRPO group.

With a reward recipe (GRPORecipe.reward) each group is scored by omrl/train/data/online_reward.py as its last
episode finishes (judge calls overlap the episodes still playing); the step's rows and then its
annotations are appended to the store, and the combined reward (None when missing: left out of the
group's baseline) is what TRL sees. A step in which no rollout has a reward stops with the first error.
"""

from __future__ import annotations

from typing import Any

from omrl.envs.base import Task
from omrl.errors import UsageError
from omrl.progress import Reporter
from omrl.train.data.rollout_step import Played, RolloutStep


class AgentRollout:
    """Callable passed to GRPOTrainer as rollout_func: the step's prompts as (task, sample) jobs played by the
    run's RolloutStep (`rollouts`), then GRPO's step credit and TRL's token columns."""

    def __init__(self, recipe: Any, tasks: list[Task], tokenizer: Any, *, store: Any = None,
                 reporter: Reporter | None = None) -> None:
        self.recipe = recipe
        self.tasks = {t.id: t for t in tasks}
        self.tokenizer = tokenizer
        self.rollouts = RolloutStep(recipe, "grpo", store=store, reporter=reporter)

    def close(self) -> None:
        """Close the engines kept between steps (call once training is over; a shared pool stays open)."""
        self.rollouts.close()

    def __call__(self, prompts: list[str], trainer: Any) -> dict[str, list]:
        step = int(trainer.state.global_step)
        policy = self.policy(trainer, self.rollouts.settings(step, len(prompts)))
        credit: dict[str, Any] = {}

        def step_credit(played: Played) -> None:  # before storing: it writes turns' info.credit
            credit["advantages"] = self._step_credit(played)

        played = self.rollouts.run(step, self._jobs(prompts), policy, before_store=step_credit)
        out = self._to_trl(played)
        if credit["advantages"] is not None:
            from omrl.train.rl.grpo_credit import STEP_ADVANTAGES

            out[STEP_ADVANTAGES] = credit["advantages"]
        return out

    def _jobs(self, prompts: list[str]) -> list[tuple[Task, int]]:
        """Each prompt (a task id) as (task, sample): the k-th repeat of a task is its sample k."""
        seen: dict[str, int] = {}
        jobs = []
        for task_id in prompts:
            if task_id not in self.tasks:
                raise UsageError(f"rollout prompt {task_id!r} is not a task id of {self.recipe.tasks}")
            sample = seen.get(task_id, 0)
            seen[task_id] = sample + 1
            jobs.append((self.tasks[task_id], sample))
        return jobs

    def _step_credit(self, played: Played) -> list[list[float]] | None:
        """With the recipe's step_credit: per-token step advantages of the step's rollouts (whole groups,
        from the rewards TRL is given), also written into each turn's info["credit"]; else None."""
        if self.recipe.step_credit is None:
            return None
        from omrl.policies.hf import token_trace
        from omrl.train.rl.grpo_credit import rollout_step_advantages

        rows = [e.row for e in played.episodes]
        masks = [(token_trace(e.context) or {}).get("env_mask") or [] for e in played.episodes]
        return rollout_step_advantages(rows, masks, self.recipe.step_credit, played.rewards())

    def policy(self, trainer: Any, settings: Any) -> Any:
        """The live model as a policy: generation through TRL's vLLM engine when the trainer has one
        (use_vllm), else through transformers; both give the same token traces."""
        options = {"max_new_tokens": settings.max_new_tokens} if settings.max_new_tokens else {}
        name = self.rollouts.policy_name
        if getattr(trainer.args, "use_vllm", False):
            from omrl.policies.vllm import VLLMPolicy

            return VLLMPolicy.from_trainer(trainer, name=name, **options)
        from omrl.policies.hf import HFPolicy

        return HFPolicy(trainer.accelerator.unwrap_model(trainer.model), self.tokenizer, name=name, **options)

    def _to_trl(self, played: Played) -> dict[str, list]:
        from omrl.policies.hf import token_trace

        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [],
                                "omrl_reward": [], "omrl_success": [], "omrl_trajectory_id": []}
        for episode, reward in zip(played.episodes, played.rewards(), strict=True):
            row = episode.row
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
            out["omrl_reward"].append(reward)
            out["omrl_success"].append(row["success"])
            out["omrl_trajectory_id"].append(row["id"])
        return out
