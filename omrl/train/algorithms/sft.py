"""Supervised fine-tuning on stored trajectories with TRL's SFTTrainer.

    result = train_sft(SFTRecipe(model="runs/tiny", store="runs/demos", output_dir="runs/sft"))
    result.checkpoint, result.losses, result.details["train_tokens"]   # an omrl.train.trainer.TrainResult

The bridge pre-tokenizes the store (loss only on trainable assistant turns, long trajectories split at turn
boundaries; rows whose turns carry the ids the policy sampled are trained on those ids, one example per turn:
`token_source`, omrl.train.data.token_bridge) and feeds it in token-budget batches: examples of nearly equal length,
as many per batch as fit in `token_budget` padded tokens (longest x count), so padding stays small and short
examples travel in big batches. The loss is a mean over the trained tokens of each optimizer step (TRL/transformers normalise by
`num_items_in_batch`), so a batch's weight follows its token count, not its example count. `batching: trl`
instead hands TRL the conversational dataset with `assistant_only_loss` and TRL's default random batches of
`batch_size` (only when every assistant turn is trainable: TRL's masks cannot leave one out).
With `lora.enabled` only LoRA adapters train; they are saved in output_dir/adapter, merged into output_dir's
checkpoint with `lora.merge` (omrl.models.adapters). TRL scores the loss with its fused LM head, so the batch's
full-vocabulary logits are never held.
Runs unchanged under `accelerate launch` (DDP, FSDP, DeepSpeed; see docs/training.md).
The TrainResult's `details`: the bridge report (`bridge`), `train_tokens` (real, non-pad tokens fed on this
process, all epochs), `padded_tokens` (fed including padding), `fed_padding_fraction`, `batches`, `world_size`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from omrl.errors import UsageError
from omrl.progress import Reporter
from omrl.train.config.sft import SFTRecipe, trl_config
from omrl.train.trainer import Trainer, TrainResult


def build_dataset(recipe: SFTRecipe, tokenizer, store: Any = None):
    """(train dataset, bridge report) of `store` (default the recipe's) as the recipe's batching mode wants it."""
    from omrl.train.data.bridge import BridgeReport, chat_dataset, load_rows, sft_dataset

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


def trained_rollout(store: Any, where: str | None) -> dict[str, Any]:
    """The rollout settings the trained rows show (omrl.rollout.checkpoint_settings.settings_shown_by)."""
    from omrl.rollout.checkpoint_settings import settings_shown_by
    from omrl.store import Store
    from omrl.store.query import select_where

    store = store if isinstance(store, Store) else Store(store)
    return settings_shown_by(select_where(store, where or None, columns="env, metadata").to_pylist())


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

    from omrl.train.data.bridge import TokenBudgetBatchSampler

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
    from transformers import AutoTokenizer
    from trl import SFTTrainer

    from omrl.config import from_dict, to_dict
    from omrl.models.adapters import save_checkpoint
    from omrl.models.load import load_model
    from omrl.models.real import resolve_model
    from omrl.rollout.checkpoint_settings import save_rollout_settings
    from omrl.train.trainer_progress import reporter_callback

    if isinstance(recipe, dict):
        recipe = from_dict(SFTRecipe, recipe)
    started = time.monotonic()
    torch.manual_seed(recipe.seed)
    path = resolve_model(recipe.model)  # a known name (hf:NAME) -> its folder in omrl's model cache
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = load_model(path)
    dataset, report = build_dataset(recipe, tokenizer, store)
    kwargs = dict(model=model, args=trl_config(recipe), train_dataset=dataset, processing_class=tokenizer,
                  peft_config=recipe.lora.peft_config(),
                  callbacks=[reporter_callback(reporter, "sft")] if reporter is not None else None)
    if recipe.batching == "bridge":
        from omrl.train.data.bridge import default_token_budget

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
    if trainer.is_world_process_zero():  # with LoRA: out/adapter, and the merged model at out when lora.merge
        save_checkpoint(trainer.model, tokenizer, out, merge=recipe.lora.merge)
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
        # What the rows show of how they were played (env, max_turns); the rest is named missing in the file.
        save_rollout_settings(out, trained_rollout(store if store is not None else recipe.store, recipe.where),
                              trainer="sft")
    return result


def _bridge_summary(report: dict[str, Any]) -> str:
    from omrl.train.data.bridge import BridgeReport

    return BridgeReport(**report).summary()


TRAINER = Trainer("sft", SFTRecipe, train_sft, """Supervised fine-tuning (TRL SFTTrainer) on a store's trainable assistant turns.

    \b
    Example:  omrl train sft --recipe shipped:sft_tiny store=runs/demos where="success"
    """)
