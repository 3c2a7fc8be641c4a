"""The keys training recipes share, declared once, and the section contract of iterate.

    TrainerRun: model, output_dir, seed          every trainer's recipe (SFT, GRPO, PPO, RFT)
    ModelSettings: lora, gradient_checkpointing  every trainer's section: which weights train, memory for compute
    TasksRun(TrainerRun): tasks, rollout, split, store, round        the ones that play episodes on a tasks file
    RLSettings: run_name, max_steps, tasks_per_step, samples_per_task, learning_rate, ...   online RL (GRPO, PPO)

A trainer's recipe is its section (the settings an iterate recipe may hold: SFTSection, GRPOSection,
PPOSection) plus the run keys (`class GRPORecipe(GRPOSection, TasksRun)`): what iterate sets for each stage is
exactly the run base's keys, and `section.to_recipe(**run)` is the full recipe. A class re-declares a shared key
only where its default or its help says something of its own (PPO saves a critic beside the policy). The
classes are keyword-only, so a recipe's required run keys may follow a section's defaults; dataclass
inheritance puts the run keys first in a recipe's fields (its --print-config, its JSON record).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from omrl.config import from_dict, to_dict
from omrl.rollout import RolloutSettings


@dataclass(kw_only=True)
class TrainerRun:
    """What every trainer's recipe has: the checkpoint it starts from, where it saves, its seed."""

    model: str = field(metadata={"help": "starting checkpoint folder (model + tokenizer)"})
    output_dir: str = field(metadata={"help": "where the trained checkpoint is saved"})
    seed: int = field(default=0, metadata={"help": "seeds torch and the sampler (rollout.seed: the episodes)"})


@dataclass
class LoraSettings:
    """LoRA adapters (peft) in place of a full fine-tune; the base weights stay frozen."""

    enabled: bool = field(default=False, metadata={"help": "train LoRA adapters (peft) instead of all weights"})
    r: int = field(default=16, metadata={"help": "adapter rank"})
    alpha: int = field(default=32, metadata={"help": "adapter scaling (alpha / r)"})
    dropout: float = field(default=0.05, metadata={"help": "dropout on the adapter input"})
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"],
                                      metadata={"help": "module names to adapt; 'all-linear' = every linear layer"})
    merge: bool = field(default=True, metadata={
        "help": "also save the adapters merged into the weights as output_dir's checkpoint (the adapter itself is "
                "always saved in output_dir/adapter; `omrl models merge` merges it later)"})

    def peft_config(self) -> Any:
        """peft's LoraConfig of these settings for a causal LM; None when LoRA is off."""
        if not self.enabled:
            return None
        from peft import LoraConfig

        targets = self.target_modules
        return LoraConfig(r=self.r, lora_alpha=self.alpha, lora_dropout=self.dropout,
                          target_modules=targets[0] if targets == ["all-linear"] else targets, task_type="CAUSAL_LM")


@dataclass(kw_only=True)
class ModelSettings:
    """What every trainer's section says about the weights it updates: all of them or LoRA adapters, and whether
    activations are recomputed in the backward pass to save memory."""

    lora: LoraSettings = field(default_factory=LoraSettings, metadata={"help": "LoRA adapters"})
    # TRL's SFTConfig and GRPOConfig default to True; omrl's SFT and GRPO have always run with it on.
    gradient_checkpointing: bool = field(default=True, metadata={
        "help": "recompute each layer's activations in the backward pass: less memory, about 20% more compute"})


@dataclass(kw_only=True)
class TasksRun(TrainerRun):
    """A trainer that plays episodes on a tasks file: the tasks, how they are played, where the rows go."""

    tasks: str = field(metadata={"help": "tasks file (Parquet or JSONL task rows)"})
    rollout: RolloutSettings = field(default_factory=RolloutSettings, metadata={
        "help": "how rollouts are played (omrl.rollout.RolloutSettings)"})
    split: str | None = field(default=None, metadata={"help": "keep only this split of the tasks file"})
    store: str | None = field(default=None, metadata={"help": "store that receives every rollout"})
    round: int = field(default=1, metadata={"help": "iteration round, stored with every rollout"})


@dataclass(kw_only=True)
class RLSettings(ModelSettings):
    """An online RL trainer's shared settings (GRPO, PPO): steps of `tasks_per_step` tasks x `samples_per_task`
    episodes, the optimizer's schedule, where it runs and what it shows."""

    run_name: str = field(default="rl", metadata={"help": "run id prefix of the stored rollouts"})
    max_steps: int = field(default=100, metadata={"help": "optimizer steps"})
    tasks_per_step: int = field(default=8, metadata={"help": "distinct tasks per step"})
    samples_per_task: int = field(default=8, metadata={"help": "episodes per task and step"})
    learning_rate: float = field(default=1e-4, metadata={"help": "peak learning rate"})
    warmup_steps: int = field(default=0, metadata={"help": "linear warmup steps"})
    beta: float = field(default=0.0, metadata={"help": "KL-to-reference coefficient; 0 loads no reference model"})
    logging_steps: int = field(default=10, metadata={"help": "log every N steps"})
    use_cpu: bool | None = field(default=None, metadata={"help": "force CPU; default: CPU when no GPU"})
    quiet: bool = field(default=False, metadata={"help": "no progress bar / logs"})


def section_values(section: Any) -> dict[str, Any]:
    """A section's (or recipe's) settings as given, sections kept as objects (not turned into mappings)."""
    return {f.name: getattr(section, f.name) for f in dataclasses.fields(section) if f.init}


def section_recipe(section: Any, recipe: type, run: dict[str, Any]) -> Any:
    """The full `recipe` of `section`'s settings and the run's keys (`run` wins), loaded and checked as a
    recipe file is (errors name the section class)."""
    return from_dict(recipe, {**to_dict(section), **run}, where=type(section).__name__)
