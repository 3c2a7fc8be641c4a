"""The PPO recipe (omrl.train.algorithms.ppo): its settings section and the full recipe.

    recipe = load_recipe("recipes/ppo_grid.yaml", PPORecipe, ["level=turn"])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from omrl.errors import UsageError
from omrl.rollout import RolloutSettings
from omrl.train.config.base import RLSettings, TasksRun, section_recipe

GAELevel = Literal["token", "turn"]  # what GAE steps over (omrl.train.rl.gae)
Critic = Literal["head", "separate"]


def _ppo_rollout():
    return RolloutSettings(env="grid", max_turns=14, max_new_tokens=8, concurrency=64)


@dataclass(kw_only=True)
class PPOSection(RLSettings):
    """The PPO settings of an iterate round with algorithm: ppo (omrl/train/config/ppo.py); the run sets the
    checkpoint, tasks, folders, round, seed and rollout."""

    run_name: str = field(default="ppo", metadata={"help": "run id prefix of the stored rollouts"})
    max_steps: int = field(default=50, metadata={"help": "PPO steps (one rollout batch each)"})
    tasks_per_step: int = field(default=8, metadata={"help": "distinct tasks per step, drawn without replacement"})
    samples_per_task: int = field(default=4, metadata={"help": "episodes per task and step"})
    level: GAELevel = field(default="token", metadata={
        "help": "GAE level: token (every model token a step) or turn (one value and advantage per assistant turn)"})
    gamma: float = field(default=1.0, metadata={"help": "discount per trainable step (token or turn)"})
    lam: float = field(default=0.95, metadata={"help": "GAE lambda"})
    critic: Critic = field(default="head", metadata={
        "help": "head: a linear value head on the policy's last hidden state; separate: its own model + head"})
    critic_model: str | None = field(default=None, metadata={
        "help": "checkpoint of the separate critic (default: the starting model)"})
    ppo_epochs: int = field(default=4, metadata={"help": "passes over each rollout batch"})
    minibatches: int = field(default=2, metadata={"help": "minibatches per pass (episodes split evenly)"})
    learning_rate: float = field(default=1e-4, metadata={"help": "AdamW learning rate (policy and critic)"})
    warmup_steps: int = field(default=0, metadata={"help": "linear warmup, in PPO steps"})
    critic_warmup_steps: int = field(default=0, metadata={
        "help": "first PPO steps that train only the critic (the policy is left unchanged), so the policy's "
                "first updates see a fitted baseline instead of a zero-initialised one"})
    clip_range: float = field(default=0.2, metadata={"help": "ratio clipping of the surrogate"})
    clip_range_value: float = field(default=0.2, metadata={"help": "value clipping around the old values"})
    vf_coef: float = field(default=0.5, metadata={"help": "weight of the value loss"})
    entropy_coef: float = field(default=0.0, metadata={"help": "weight of the entropy bonus"})
    beta: float = field(default=0.0, metadata={"help": "KL-to-reference penalty in the reward; 0 loads no reference"})
    whiten_advantages: bool = field(default=True, metadata={"help": "whiten advantages over trainable tokens"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient-norm clipping"})
    target_kl: float | None = field(default=None, metadata={
        "help": "stop a batch's remaining updates once a minibatch's approximate KL to the rollout policy exceeds "
                "1.5 x target_kl (null: every epoch and minibatch runs)"})
    gradient_checkpointing: bool = field(default=False, metadata={
        "help": "recompute the policy's layer activations in the backward pass: less memory, more compute"})
    logprob_chunk: int = field(default=0, metadata={
        "help": "score the completion tokens this many at a time, each chunk's vocabulary logits recomputed in the "
                "backward pass, so the full-vocabulary logits of the batch are never held (0: all at once)"})
    logging_steps: int = field(default=1, metadata={"help": "print every N steps (everything is logged to JSON)"})
    quiet: bool = field(default=False, metadata={"help": "no progress lines"})

    def __post_init__(self) -> None:
        if self.ppo_epochs < 1 or self.minibatches < 1 or self.tasks_per_step < 1 or self.samples_per_task < 1:
            raise UsageError("ppo_epochs, minibatches, tasks_per_step and samples_per_task must be at least 1")
        if self.logprob_chunk < 0:
            raise UsageError(f"logprob_chunk must be 0 or more, got {self.logprob_chunk}")
        if self.critic_warmup_steps < 0:
            raise UsageError(f"critic_warmup_steps must be 0 or more, got {self.critic_warmup_steps}")
        if self.target_kl is not None and not self.target_kl > 0:
            raise UsageError(f"target_kl must be above 0 (or null), got {self.target_kl}")

    def to_recipe(self, **run: Any) -> PPORecipe:
        """The full PPORecipe: this section's settings and the run's keys (`run` wins)."""
        return section_recipe(self, PPORecipe, run)


@dataclass(kw_only=True)
class PPORecipe(PPOSection, TasksRun):
    """Settings of one PPO run (multi-turn, on a tasks file; rollouts by omrl's episode runner)."""

    output_dir: str = field(metadata={"help": "where the trained policy (and critic/) is saved"})
    rollout: RolloutSettings = field(default_factory=_ppo_rollout, metadata={
        "help": "how rollouts are played (omrl.rollout.RolloutSettings); a step plays all its episodes at once"})
    store: str | None = field(default=None, metadata={"help": "store that receives every step's rollouts"})
    seed: int = field(default=0, metadata={
        "help": "seeds torch, the task draw and minibatches (rollout.seed: episodes)"})
