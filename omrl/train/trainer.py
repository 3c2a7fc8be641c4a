"""The one trainer contract: every trainer is `train(recipe, *, store=None, reporter=None) -> TrainResult`,
registered in TRAINERS with its recipe class.

    entry = TRAINERS.load("grpo")                      # Trainer: name, recipe class, train function, help
    result = entry.train(load_recipe("recipes/grpo_grid.yaml", entry.recipe), reporter=reporter)
    result.checkpoint, result.steps, result.history[-1], result.rollouts["run_prefix"]

- `recipe`: the trainer's recipe, or a mapping loaded as one.
- `store`: the store the trainer reads (sft) or writes its rollouts to (grpo, ppo; rft's attempts): an open
  Store or a path; None: the recipe's `store`.
- `reporter` (omrl.progress): shown the training steps as they go (start, one advance per optimizer step with
  loss / reward / success, finish); None: nothing is shown by omrl (TRL's own output is the recipe's `quiet`'s,
  and omrl.train.trainer_progress.quiet_libraries' when a command runs inside it).

`omrl train sft|grpo|ppo|rft` are generated from TRAINERS (omrl/cli/train.py), and iterate's update step
(`algorithm: grpo|ppo`) is the registered trainer of that name. The trainers still write their record
(omrl_sft.json, omrl_grpo.json, omrl_ppo.json, omrl_rft.json) beside the checkpoint for reports; callers use
the returned TrainResult.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omrl.plugins import Registry


@dataclass
class TrainResult:
    """What every trainer returns."""

    trainer: str  # the TRAINERS name: sft, grpo, ppo, rft
    checkpoint: Path  # the saved model + tokenizer folder
    steps: int  # optimizer steps taken
    wall_s: float  # seconds the whole call took
    history: list[dict[str, Any]] = field(default_factory=list)  # per logged step: TRL's log entries, PPO's stats
    metrics: dict[str, Any] = field(default_factory=dict)  # TRL's train metrics (train_runtime, ...); {} for PPO
    rollouts: dict[str, Any] = field(default_factory=dict)  # RL: stored, statuses, run_prefix, ...; rft: attempts
    details: dict[str, Any] = field(default_factory=dict)  # what only this trainer has (see each trainer)
    summary: str = ""  # one line on the run for the command line
    main: bool = True  # this is the main process (the one that reports, when several run)

    @property
    def losses(self) -> list[float]:
        """The logged training losses (TRL's `loss`), in step order."""
        return [entry["loss"] for entry in self.history if "loss" in entry]

    @property
    def train_s(self) -> float:
        """The trainer's own training time (TRL's train_runtime), else the whole call's, to 0.1 s."""
        return round(float(self.metrics.get("train_runtime") or self.wall_s), 1)


@dataclass(frozen=True)
class Trainer:
    """A registered trainer: its recipe class, its train function and its command's help."""

    name: str
    recipe: type
    train: Callable[..., TrainResult]
    help: str  # the `omrl train NAME` help: what it does, then an Example line


# name -> (module:attribute of its Trainer, one-line help known without importing the trainer)
TRAINERS = Registry("trainer", None, {
    "sft": ("omrl.train.algorithms.sft:TRAINER", "Supervised fine-tuning (TRL SFTTrainer) on a store's trainable turns."),
    "grpo": ("omrl.train.algorithms.grpo:TRAINER", "GRPO (TRL GRPOTrainer) on a tasks file, rollouts by omrl's agent loop."),
    "ppo": ("omrl.train.algorithms.ppo:TRAINER", "PPO for multi-turn agents: a critic, GAE over tokens or turns."),
    "rft": ("omrl.train.algorithms.rft:TRAINER", "Rejection-sampling fine-tuning: sample, keep the best above a threshold, SFT."),
})


def open_store(store: Any, recipe_store: Any) -> Any:
    """The Store a trainer writes to: `store` (an open Store or a path), else the recipe's path (created when
    missing); None when neither."""
    from omrl.store import Store

    target = store if store is not None else recipe_store
    if target is None or target == "":
        return None
    return target if isinstance(target, Store) else Store.create(target, exist_ok=True)
