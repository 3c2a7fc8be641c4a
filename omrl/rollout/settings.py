"""How episodes are played: RolloutSettings, the one set of rollout knobs, and what follows from them
(an episode's turn budget, a cluster worker's placement).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omrl.rollout.executor import Placement

DEFAULT_MAX_TURNS = 16  # for environments that declare no `default_max_turns` of their own


@dataclass
class RolloutSettings:
    """How episodes are played: the one set of rollout knobs behind collect, eval, GRPO, RFT and iterate.

    The CLI flags of `omrl collect` / `omrl eval` and the `rollout` section of every training recipe
    are these fields; `flag` in the metadata names the CLI flag.
    """

    env: str = field(default="grid", metadata={
        "help": "environment name (see `omrl envs`) or package.module:ClassName", "flag": "--env"})
    env_options: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "keyword arguments of the environment's constructor", "flag": "--env-option"})
    max_turns: int | None = field(default=None, metadata={
        "help": "assistant turns before the episode is truncated (unset: the environment's own "
                f"`default_max_turns`, else {DEFAULT_MAX_TURNS})", "flag": "--max-turns"})
    max_new_tokens: int | None = field(default=None, metadata={
        "help": "completion token limit per turn (unset: the policy's own)", "flag": "--max-tokens",
        "aliases": ("--max-new-tokens",)})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature", "flag": "--temperature"})
    seed: int | None = field(default=0, metadata={
        "help": "base seed; each episode derives its own from (seed, task, sample)", "flag": "--seed"})
    model_call_timeout: float | None = field(default=None, metadata={
        "help": "seconds per model request, each retry has its own (unset: the policy's own)",
        "flag": "--model-call-timeout", "cli_default": 120.0})
    turn_timeout: float | None = field(default=None, metadata={
        "help": "seconds per turn (model + environment steps)", "flag": "--turn-timeout"})
    episode_timeout: float | None = field(default=None, metadata={
        "help": "seconds per episode", "flag": "--episode-timeout"})
    concurrency: int = field(default=8, metadata={
        "help": "episodes in flight at once (batched generation needs many); with --ray: per Ray worker",
        "flag": "--concurrency"})
    # Where a cluster plays the episodes (omrl collect/eval --ray): what each environment holds there.
    ray_num_cpus: float = field(default=1.0, metadata={
        "help": "with --ray: CPUs one environment in flight holds on the cluster (a worker reserves this times "
                "its episodes in flight; a worker that would not fit on a node plays fewer at once)",
        "flag": "--ray-num-cpus"})
    ray_resources: dict[str, float] = field(default_factory=dict, metadata={
        "help": "with --ray: custom Ray resources one environment in flight holds (NAME=AMOUNT)",
        "flag": "--ray-resource"})
    ray_workers: int | None = field(default=None, metadata={
        "help": "with --ray: Ray workers (actors) playing episodes, each with its own environments and policy "
                "(unset: as many as the cluster's CPUs hold)", "flag": "--ray-workers"})


def turn_budget(settings: RolloutSettings, env: Any) -> int:
    """`settings.max_turns`, or when unset the environment's `default_max_turns` (a game that needs 60
    moves says so), else DEFAULT_MAX_TURNS."""
    if settings.max_turns is not None:
        return settings.max_turns
    declared = getattr(env, "default_max_turns", None)
    return declared if isinstance(declared, int) and declared >= 1 else DEFAULT_MAX_TURNS


def placement(settings: RolloutSettings) -> Placement:
    """Where a cluster plays episodes: each environment in flight holds ray_num_cpus and ray_resources."""
    return Placement(in_flight=settings.concurrency, unit="episodes", unit_cpus=settings.ray_num_cpus,
                     unit_resources=dict(settings.ray_resources), workers=settings.ray_workers)
