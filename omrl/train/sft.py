"""Supervised fine-tuning on stored trajectories with TRL's SFTTrainer.

    result = train_sft(SFTRecipe(model="runs/tiny", store="runs/demos", output_dir="runs/sft"))
    result.checkpoint, result.losses, result.details["train_tokens"]   # an omrl.train.trainer.TrainResult

The bridge pre-tokenizes the store (loss only on trainable assistant turns, long trajectories split at turn
boundaries; rows whose turns carry the ids the policy sampled are trained on those ids, one example per turn:
`token_source`, omrl.train.token_bridge) and feeds it in token-budget batches: examples of nearly equal length,
as many per batch as fit in `token_budget` padded tokens (longest x count), so padding stays small and short
examples travel in big batches. The loss is a mean over the trained tokens of each optimizer step (TRL/transformers normalise by
`num_items_in_batch`), so a batch's weight follows its token count, not its example count. `batching: trl`
instead hands TRL the conversational dataset with `assistant_only_loss` and TRL's default random batches of
`batch_size` (only when every assistant turn is trainable: TRL's masks cannot leave one out).
Runs unchanged under `accelerate launch` (DDP, FSDP, DeepSpeed; see docs/training.md).
The TrainResult's `details`: the bridge report (`bridge`), `train_tokens` (real, non-pad tokens fed on this
process, all epochs), `padded_tokens` (fed including padding), `fed_padding_fraction`, `batches`, `world_size`.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omrl.errors import UsageError
from omrl.progress import Reporter
from omrl.train.token_bridge import check_token_source
from omrl.train.trainer import Trainer, TrainResult


@dataclass
class LoraSettings:
    enabled: bool = field(default=False, metadata={"help": "train LoRA adapters (peft) instead of all weights"})
    r: int = field(default=16, metadata={"help": "adapter rank"})
    alpha: int = field(default=32, metadata={"help": "adapter scaling (alpha / r)"})
    dropout: float = field(default=0.05, metadata={"help": "dropout on the adapter input"})
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"],
                                      metadata={"help": "module names to adapt; 'all-linear' = every linear layer"})
    merge: bool = field(default=True, metadata={"help": "merge adapters into the weights when saving"})


@dataclass
class SFTRecipe:
    """Settings of one SFT run."""

    model: str = field(metadata={"help": "starting checkpoint folder (model + tokenizer)"})
    store: str = field(metadata={"help": "store whose trajectories are trained on"})
    output_dir: str = field(metadata={"help": "where the trained checkpoint is saved"})
    where: str | None = field(default=None, metadata={"help": "SQL condition selecting trajectories"})
    max_length: int = field(default=1024, metadata={"help": "context length in tokens"})
    overflow: str = field(default="split", metadata={"help": "longer trajectories: split (at turns) or drop"})
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
    seed: int = field(default=0, metadata={"help": "seeds weights order and batches"})
    batching: str = field(default="bridge", metadata={"help": "bridge (token-budget, pre-tokenized) or trl"})
    mask_source: str = field(default="auto", metadata={"help": "auto, template or incremental loss masks"})
    token_source: str = field(default="auto", metadata={
        "help": "bridge: auto (rows with sampled completion ids train on them, one example per turn; others "
                "rendered), stored (only such rows) or render (re-tokenise every row); omrl.train.token_bridge"})
    logging_steps: int = field(default=10, metadata={"help": "log every N steps"})
    use_cpu: bool | None = field(default=None, metadata={"help": "force CPU; default: CPU when no GPU"})
    bf16: bool | None = field(default=None, metadata={"help": "bfloat16 training; default: on GPUs that have it"})
    gradient_checkpointing: bool = field(default=False, metadata={"help": "trade compute for memory"})
    lora: LoraSettings = field(default_factory=LoraSettings, metadata={"help": "LoRA adapters"})
    quiet: bool = field(default=False, metadata={"help": "no progress bar"})
    trl: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "more settings of TRL's SFTConfig, passed as given (e.g. {max_grad_norm: 0.5}); a key that is "
                "not an SFTConfig field, or one omrl sets from the keys above, is refused at load time"})

    def __post_init__(self) -> None:
        if self.batching not in ("bridge", "trl"):
            raise UsageError(f"batching must be 'bridge' or 'trl', not {self.batching!r}")
        if self.overflow not in ("split", "drop"):
            raise UsageError(f"overflow must be 'split' or 'drop', not {self.overflow!r}")
        if self.mask_source not in ("auto", "template", "incremental"):
            raise UsageError(f"mask_source must be auto, template or incremental, not {self.mask_source!r}")
        if self.token_budget < 0:
            raise UsageError(f"token_budget must be >= 0, not {self.token_budget}")
        check_token_source(self.token_source)
        if self.token_source == "stored" and self.batching == "trl":
            raise UsageError("token_source 'stored' needs batching: bridge (TRL re-tokenises the conversations)")
        if self.trl:  # a bad trl section is refused at load time (building the config checks it)
            trl_config(self)


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
        **({"gradient_checkpointing": True} if recipe.gradient_checkpointing else {}),
        **extra,
    ), recipe.trl, owned=("gradient_checkpointing",))


def build_dataset(recipe: SFTRecipe, tokenizer, store: Any = None):
    """(train dataset, bridge report) of `store` (default the recipe's) as the recipe's batching mode wants it."""
    from omrl.train.bridge import BridgeReport, chat_dataset, load_rows, sft_dataset

    store = store if store is not None else recipe.store
    if recipe.batching == "bridge":
        return sft_dataset(store, tokenizer, where=recipe.where, max_length=recipe.max_length,
                           overflow=recipe.overflow, mask_source=recipe.mask_source,
                           token_source=recipe.token_source)
    report = BridgeReport()
    rows = load_rows(store, recipe.where, report=report)
    for row in rows:
        for message in row.get("messages") or []:
            if message["role"] == "assistant" and message.get("trainable") is False:
                raise UsageError(f"trajectory {row['id']!r} has an untrainable assistant turn; TRL's "
                                 "assistant_only_loss would train it: use batching: bridge")
    if not rows:
        raise UsageError(f"no trajectories to train on ({report.summary()})")
    report.examples = len(rows)
    return chat_dataset(rows).remove_columns(["id"]), report


class CountingCollator:
    """Wraps a collator and counts the real and padded tokens of every batch it builds (what the model sees)."""

    def __init__(self, inner):
        self.inner = inner
        self.real = self.padded = self.batches = 0

    def __call__(self, examples):
        batch = self.inner(examples)
        mask = batch["attention_mask"]
        self.real += int(mask.sum())
        self.padded += mask.numel()
        self.batches += 1
        return batch


def bridge_trainer_class():
    """SFTTrainer whose training batches come from the bridge's token-budget batch sampler."""
    from torch.utils.data import DataLoader
    from trl import SFTTrainer

    from omrl.train.bridge import TokenBudgetBatchSampler

    class BridgeSFTTrainer(SFTTrainer):
        def __init__(self, *args, token_budget: int, **kwargs):
            super().__init__(*args, **kwargs)
            # Lengths of the prepared dataset (after TRL's truncation), so the budget holds for what is fed.
            lengths = [len(ids) for ids in self.train_dataset["input_ids"]]
            self.batch_sampler = TokenBudgetBatchSampler(lengths, token_budget, seed=self.args.data_seed or 0)

        def get_train_dataloader(self):
            dataset = self._remove_unused_columns(self.train_dataset, description="training")
            loader = DataLoader(dataset, batch_sampler=self.batch_sampler, collate_fn=self.data_collator,
                                num_workers=self.args.dataloader_num_workers,
                                pin_memory=self.args.dataloader_pin_memory)
            # Under DDP accelerate hands every process every world_size-th batch (batch_size None: sizes vary).
            return self.accelerator.prepare(loader)

    return BridgeSFTTrainer


def train_sft(recipe: SFTRecipe | dict[str, Any], *, store: Any = None,
              reporter: Reporter | None = None) -> TrainResult:
    """Run SFT as the recipe says on `store` (an open Store or a path; default the recipe's), its steps shown by
    `reporter`; save model + tokenizer (+ omrl_sft.json) to output_dir (omrl.train.trainer's contract)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTTrainer

    from omrl.config import from_dict, to_dict
    from omrl.models.real import resolve_model
    from omrl.train.reporting import reporter_callback

    if isinstance(recipe, dict):
        recipe = from_dict(SFTRecipe, recipe)
    started = time.monotonic()
    torch.manual_seed(recipe.seed)
    path = resolve_model(recipe.model)  # a known name (hf:NAME) -> its folder in omrl's model cache
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    dataset, report = build_dataset(recipe, tokenizer, store)
    peft_config = None
    if recipe.lora.enabled:
        from peft import LoraConfig

        targets = recipe.lora.target_modules
        peft_config = LoraConfig(r=recipe.lora.r, lora_alpha=recipe.lora.alpha, lora_dropout=recipe.lora.dropout,
                                 target_modules=targets[0] if targets == ["all-linear"] else targets,
                                 task_type="CAUSAL_LM")
    kwargs = dict(model=model, args=trl_config(recipe), train_dataset=dataset, processing_class=tokenizer,
                  peft_config=peft_config,
                  callbacks=[reporter_callback(reporter, "sft")] if reporter is not None else None)
    if recipe.batching == "bridge":
        from omrl.train.bridge import default_token_budget

        lengths = [len(ids) for ids in dataset["input_ids"]]
        budget = recipe.token_budget or default_token_budget(lengths, recipe.batch_size)
        trainer = bridge_trainer_class()(**kwargs, token_budget=budget)
        report.token_budget = budget
        report.batches_per_epoch = len(trainer.batch_sampler)
        report.padding_fraction = trainer.batch_sampler.padding_fraction()
    else:
        trainer = SFTTrainer(**kwargs)
    counter = trainer.data_collator = CountingCollator(trainer.data_collator)
    try:
        output = trainer.train()
    finally:
        if reporter is not None:
            reporter.finish()
    out = Path(recipe.output_dir)
    trained = trainer.model
    if recipe.lora.enabled and recipe.lora.merge:
        trained = trained.merge_and_unload()
    if trainer.is_world_process_zero():
        out.mkdir(parents=True, exist_ok=True)
        trained.save_pretrained(out)
        tokenizer.save_pretrained(out)
    history = [e for e in trainer.state.log_history if "loss" in e]
    losses = [e["loss"] for e in history]
    details = {"bridge": report.to_dict(), "train_tokens": counter.real, "padded_tokens": counter.padded,
               "fed_padding_fraction": 1 - counter.real / counter.padded if counter.padded else None,
               "batches": counter.batches, "world_size": trainer.args.world_size}
    result = TrainResult("sft", out, steps=int(trainer.state.global_step), wall_s=time.monotonic() - started,
                         history=history, metrics=dict(output.metrics), details=details,
                         summary=f"bridge: {_bridge_summary(details['bridge'])}\nfinal loss "
                                 f"{losses[-1] if losses else float('nan'):.4f}")
    if trainer.is_world_process_zero():
        record = {"recipe": to_dict(recipe), "bridge": details["bridge"], "losses": losses,
                  "train_tokens": counter.real, "padded_tokens": counter.padded,
                  "fed_padding_fraction": details["fed_padding_fraction"], "batches": counter.batches,
                  "duration_s": result.wall_s, "metrics": result.metrics,
                  "world_size": trainer.args.world_size}
        (out / "omrl_sft.json").write_text(json.dumps(record, indent=1, default=str))
    return result


def _bridge_summary(report: dict[str, Any]) -> str:
    from omrl.train.bridge import BridgeReport

    return BridgeReport(**report).summary()


TRAINER = Trainer("sft", SFTRecipe, train_sft, """Supervised fine-tuning (TRL SFTTrainer) on a store's trainable assistant turns.

    Example:  omrl train sft --recipe recipes/sft_tiny.yaml store=runs/demos where="success"
    """)
