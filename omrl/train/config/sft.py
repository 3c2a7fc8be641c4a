"""The SFT recipe (omrl.train.algorithms.sft): its settings section, the full recipe and TRL's SFTConfig of it.

    recipe = load_recipe("recipes/sft_tiny.yaml", SFTRecipe)       # SFTSection's settings + model, store, ...
    sft = IterateRecipe.sft.to_recipe(model="runs/tiny", store="runs/demos", output_dir="runs/sft")
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from omrl.errors import UsageError
from omrl.train.config.base import ModelSettings, TrainerRun, section_recipe, section_values
from omrl.train.data.bridge import MaskSource
from omrl.train.data.token_bridge import TokenSource


@dataclass(kw_only=True)
class SFTSection(ModelSettings):
    """The SFT settings of a stage (omrl/train/config/sft.py); the run sets model, store, output_dir, where and
    seed."""

    max_length: int = field(default=1024, metadata={"help": "context length in tokens"})
    overflow: Literal["split", "drop"] = field(default="split", metadata={
        "help": "longer trajectories: split (at turns) or drop"})
    batch_size: int = field(default=8, metadata={"help": "examples per device per step (bridge: on average)"})
    token_budget: int = field(default=0, metadata={
        "help": "bridge: padded tokens per batch (longest x count); 0 = batch_size x mean example length"})
    grad_accum: int = field(default=1, metadata={"help": "gradient accumulation steps"})
    epochs: int = field(default=1, metadata={"help": "passes over the data"})
    max_steps: int = field(default=-1, metadata={"help": "stop after N optimizer steps (-1: run all epochs)"})
    learning_rate: float = field(default=5e-4, metadata={"help": "peak learning rate"})
    lr_scheduler_type: str = field(default="linear", metadata={"help": "transformers scheduler name"})
    warmup_steps: int = field(default=0, metadata={"help": "linear warmup steps"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    batching: Literal["bridge", "trl"] = field(default="bridge", metadata={
        "help": "bridge (token-budget, pre-tokenized) or trl"})
    mask_source: MaskSource = field(default="auto", metadata={"help": "auto, template or incremental loss masks"})
    token_source: TokenSource = field(default="auto", metadata={
        "help": "bridge: auto (rows with sampled completion ids train on them, one example per turn; others "
                "rendered), stored (only such rows) or render (re-tokenise every row); omrl.train.data.token_bridge"})
    logging_steps: int = field(default=10, metadata={"help": "log every N steps"})
    use_cpu: bool | None = field(default=None, metadata={"help": "force CPU; default: CPU when no GPU"})
    bf16: bool | None = field(default=None, metadata={"help": "bfloat16 training; default: on GPUs that have it"})
    quiet: bool = field(default=False, metadata={"help": "no progress bar"})
    trl: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "more settings of TRL's SFTConfig, passed as given (e.g. {max_grad_norm: 0.5}); a key that is "
                "not an SFTConfig field, or one omrl sets from the keys above, is refused at load time"})

    def __post_init__(self) -> None:
        if self.token_budget < 0:
            raise UsageError(f"token_budget must be >= 0, not {self.token_budget}")
        if self.token_source == "stored" and self.batching == "trl":
            raise UsageError("token_source 'stored' needs batching: bridge (TRL re-tokenises the conversations)")
        if self.trl:  # a bad trl section is refused at load time (building the config checks it)
            trl_config(self if isinstance(self, SFTRecipe)
                       else SFTRecipe(model="-", store="-", output_dir="-", **section_values(self)))

    def to_recipe(self, **run: Any) -> SFTRecipe:
        """The full SFTRecipe: this section's settings and the run's keys (`run` wins)."""
        return section_recipe(self, SFTRecipe, run)


@dataclass(kw_only=True)
class SFTRecipe(SFTSection, TrainerRun):
    """Settings of one SFT run."""

    seed: int = field(default=0, metadata={"help": "seeds weights order and batches"})
    store: str = field(metadata={"help": "store whose trajectories are trained on"})
    where: str | None = field(default=None, metadata={"help": "SQL condition selecting trajectories"})


def _devices(recipe: SFTRecipe) -> tuple[bool, bool]:
    import torch

    use_cpu = recipe.use_cpu if recipe.use_cpu is not None else not torch.cuda.is_available()
    bf16 = recipe.bf16 if recipe.bf16 is not None else (not use_cpu and torch.cuda.is_bf16_supported())
    return use_cpu, bf16


def trl_config(recipe: SFTRecipe, **extra: Any):
    """TRL's SFTConfig for the recipe (CPU: use_cpu, no bf16; never reports to outside services): what omrl
    derives from the recipe's keys and `extra`, plus its `trl` section passed through."""
    from trl import SFTConfig

    from omrl.config import pass_through

    use_cpu, bf16 = _devices(recipe)
    bridge = recipe.batching == "bridge"
    return pass_through(SFTConfig, dict(
        output_dir=recipe.output_dir,
        per_device_train_batch_size=recipe.batch_size,
        gradient_accumulation_steps=recipe.grad_accum,
        num_train_epochs=recipe.epochs,
        max_steps=recipe.max_steps,
        learning_rate=recipe.learning_rate,
        lr_scheduler_type=recipe.lr_scheduler_type,
        warmup_steps=recipe.warmup_steps,
        weight_decay=recipe.weight_decay,
        seed=recipe.seed,
        data_seed=recipe.seed,
        max_length=recipe.max_length,
        assistant_only_loss=not bridge,
        logging_steps=recipe.logging_steps,
        save_strategy="no",
        report_to="none",
        use_cpu=use_cpu,
        bf16=bf16,
        disable_tqdm=recipe.quiet,
        log_level="warning" if recipe.quiet else "passive",
        dataset_num_proc=None,
        gradient_checkpointing=recipe.gradient_checkpointing,
        **extra,
    ), recipe.trl)
