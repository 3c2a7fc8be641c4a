"""Rejection-sampling fine-tuning: sample N attempts per task, keep the best of each group above a threshold, SFT.

    result = train_rft(RFTRecipe(model="runs/sft", tasks="datasets/tasks/grid_train.jsonl",
                                 output_dir="runs/rft", rollout=RolloutSettings(env="grid")))
    result.checkpoint, result.rollouts["attempts"], result.rollouts["kept"]   # an omrl.train.trainer.TrainResult

The attempts land in the store (round `round`, run `run_id`), the kept ones in a filtered sibling store
whose omrl.json records the selection (omrl.curate.filter_store), so the SFT set can be rebuilt.
With `reward_recipe` the attempts are annotated first (omrl.annotate.runner.annotate_with_recipe: the
recipe's metrics and judges, then its combined reward, every score stored; resumable) and ranked by it.
The SFT stage is omrl.train.algorithms.sft with the recipe's `sft` section: `sft.lora` trains LoRA adapters
(saved in output_dir/checkpoint/adapter, merged into the checkpoint with `sft.lora.merge`).
The TrainResult is the SFT stage's (steps, history, metrics) with `rollouts`: attempts, kept, dropped,
success_rate, mean_reward of the collection.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from omrl.errors import UsageError
from omrl.progress import Reporter
from omrl.train.config.rft import RFTRecipe
from omrl.train.trainer import Trainer, TrainResult


def checkpoint_policy(model: str, settings) -> Any:
    """The HFPolicy playing checkpoint `model` (batched), with the rollout settings' token budget."""
    from omrl.policies.hf import HFPolicy

    options = {"max_new_tokens": settings.max_new_tokens} if settings.max_new_tokens else {}
    return HFPolicy(model, name=str(model), **options)


def collect_with_model(model: str, tasks: list, store, settings, *, samples: int, round: int, run_id: str,
                       reporter: Any = None, executor: Any = None):
    """Play tasks x samples episodes with the checkpoint into `store`, as `settings`
    (omrl.rollout.RolloutSettings) say, through `executor` (omrl.rollout.executor; default this process), shown by
    `reporter` (omrl.progress; default nothing); omrl.rollout.collect owns the episodes and the writing."""
    from omrl.progress import QUIET
    from omrl.rollout import collect
    from omrl.rollout.executor import LOCAL

    return asyncio.run(collect(None, tasks, checkpoint_policy(model, settings), store, settings, samples=samples,
                               round=round, run_id=run_id, reporter=reporter or QUIET, executor=executor or LOCAL))


def select_best(source, out: str | Path, *, where: str, threshold: float, keep_per_group: int,
                reward_recipe: str | dict[str, Any] | None = None):
    """The best `keep_per_group` attempts of each group with reward >= threshold, as a filtered store."""
    from omrl.curate.filters import FilterOptions, filter_store

    options = FilterOptions(where=where, status=None, best_of_n=keep_per_group, min_reward=threshold,
                            reward_recipe=reward_recipe)
    return filter_store(source, out, options)


def train_rft(recipe: RFTRecipe | dict[str, Any], *, store: Any = None,
              reporter: Reporter | None = None) -> TrainResult:
    """Collect into `store` (default the recipe's, else output_dir/store), select the best of each group, SFT
    on them, the collection and the SFT steps shown by `reporter`; omrl.train.trainer's contract."""
    from omrl.config import from_dict, to_dict
    from omrl.rollout.checkpoint_settings import save_rollout_settings
    from omrl.store.query import quote_literal
    from omrl.tasks import load_tasks
    from omrl.train.algorithms.sft import train_sft
    from omrl.train.trainer import open_store

    if isinstance(recipe, dict):
        recipe = from_dict(RFTRecipe, recipe)
    started = time.monotonic()
    out = Path(recipe.output_dir)
    store = open_store(store, recipe.store or out / "store")
    tasks = load_tasks(recipe.tasks, split=recipe.split)
    if not tasks:
        raise UsageError(f"{recipe.tasks}: no tasks")
    collected = collect_with_model(recipe.model, tasks, store, recipe.rollout, samples=recipe.samples,
                                   round=recipe.round, run_id=recipe.run_id, reporter=reporter)
    where = f"run_id = {quote_literal(recipe.run_id)} AND round = {int(recipe.round)}"
    annotated = None
    if recipe.reward_recipe is not None:
        from omrl.annotate.runner import annotate_with_recipe

        annotated = annotate_with_recipe(store, recipe.reward_recipe, where=where, run_id=f"{recipe.run_id}/annotate",
                                         metadata={"round": recipe.round})
    kept_path = out / "kept"
    if kept_path.exists():  # a re-run rebuilds the selection from the (resumed) collection
        import shutil

        shutil.rmtree(kept_path)
    selection = select_best(store, kept_path, where=where, threshold=recipe.threshold,
                            keep_per_group=recipe.keep_per_group, reward_recipe=recipe.reward_recipe)
    kept = sum(selection.kept.values())
    if kept == 0:
        raise UsageError(f"no attempt reached reward {recipe.threshold} "
                         f"({collected.total} attempts, success rate {collected.success_rate}); lower threshold")
    sft = recipe.sft.to_recipe(seed=recipe.seed, model=recipe.model, store=str(kept_path),
                               output_dir=str(out / "checkpoint"))
    trained = train_sft(sft, reporter=reporter)
    # The attempts' settings, not the SFT rows' partial view of them: what `omrl eval --policy hf:CKPT` plays with.
    save_rollout_settings(trained.checkpoint, recipe.rollout, trainer="rft")
    rollouts = {"attempts": collected.total, "kept": kept, "dropped": dict(selection.dropped),
                "success_rate": collected.success_rate, "mean_reward": collected.mean_reward}
    (out / "omrl_rft.json").write_text(json.dumps({"recipe": to_dict(recipe), **rollouts,
                                                   "annotate": annotated.table() if annotated else None,
                                                   "judge": vars(annotated.judge) if annotated and annotated.judge
                                                   else None,
                                                   "checkpoint": str(trained.checkpoint)}, indent=1))
    return replace(trained, trainer="rft", wall_s=time.monotonic() - started, rollouts=rollouts,
                   summary=f"{collected.total} attempts (success {collected.success_rate}), kept {kept}")


TRAINER = Trainer("rft", RFTRecipe, train_rft, """Rejection-sampling fine-tuning: N attempts per task, [annotate,] keep the best above a threshold, SFT.

    With reward_recipe=RECIPE the attempts are first annotated by its metrics and judges and ranked by its
    combined reward.

    Example:  omrl train rft --recipe shipped:rft_grid samples=8 threshold=1.0
    """)
