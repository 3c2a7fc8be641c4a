"""The rejection-sampling fine-tuning recipe (omrl.train.algorithms.rft).

    recipe = load_recipe("recipes/rft_grid.yaml", RFTRecipe, ["samples=8", "threshold=1.0"])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omrl.rollout import RolloutSettings
from omrl.train.config.base import TasksRun
from omrl.train.config.sft import SFTSection


def _rft_rollout():
    return RolloutSettings(env="grid", max_turns=16, max_new_tokens=32, concurrency=64)


@dataclass(kw_only=True)
class RFTRecipe(TasksRun):
    """Settings of one rejection-sampling fine-tuning run."""

    model: str = field(metadata={"help": "checkpoint that samples the attempts and is fine-tuned"})
    output_dir: str = field(metadata={"help": "run folder: checkpoint, stores, record"})
    seed: int = field(default=0, metadata={"help": "seeds SFT (rollout.seed: the attempts)"})
    tasks: str = field(metadata={"help": "tasks file (Parquet or JSONL)"})
    rollout: RolloutSettings = field(default_factory=_rft_rollout, metadata={
        "help": "how the attempts are played (omrl.rollout.RolloutSettings)"})
    store: str | None = field(default=None, metadata={"help": "store for the attempts (default output_dir/store)"})
    round: int = field(default=0, metadata={"help": "round number stored with the attempts"})
    run_id: str = field(default="rft", metadata={"help": "run id of the collected attempts"})
    samples: int = field(default=8, metadata={"help": "attempts per task (the group)"})
    threshold: float = field(default=1.0, metadata={"help": "minimum reward of a kept attempt"})
    keep_per_group: int = field(default=1, metadata={"help": "best attempts kept per task"})
    reward_recipe: str | dict[str, Any] | None = field(default=None, metadata={
        "help": "combined-reward recipe (path or mapping, as `omrl annotate`): its metrics and judges annotate the "
                "attempts, then the best by its combined reward are kept; None = env reward"})
    sft: SFTSection = field(default_factory=SFTSection, metadata={"help": "SFT settings (see omrl.train.config.sft)"})
