"""GRPO on a tasks file with TRL's `GRPOTrainer`, rollouts played by omrl's own agent loop.

    result = train_grpo(GRPORecipe(model="runs/sft", tasks="datasets/tasks/grid_train.jsonl",
                                   output_dir="runs/grpo-1", store="runs/store",
                                   rollout=RolloutSettings(env="grid", max_turns=14)))
    result.checkpoint, result.history, result.rollouts["run_prefix"]     # an omrl.train.trainer.TrainResult

Each training step TRL hands `rollout_func` (omrl/train/data/rollout_func.py) the step's prompts: task ids,
each repeated `samples_per_task` times. The RL trainers' one rollout step (omrl/train/data/rollout_step.py:
omrl.rollout.play_episodes, the episode runner collect uses too, environments made in threads and always
closed, a seed per episode) plays them as the recipe's
`rollout` section says, all in flight at once, with an `HFPolicy` wrapping the live model, whose token
traces become prompt_ids, completion_ids (model and environment tokens), env_mask (environment tokens
carry no loss) and logprobs. The environment's reward, or with `reward` the combined reward of a reward
recipe (omrl/train/data/online_reward.py: metrics and judges score each group as soon as its episodes finish,
while other groups still play; every score is a stored annotation), is the reward; a rollout without one
is left out of its group's baseline; the group-relative advantages are TRL's. After each step's play its rows
are appended to the store with their round and step, so GRPO data can be queried like any collection.
The TrainResult's `details` hold, with a reward recipe, `reward_steps` and `reward_summary` (as omrl_grpo.json).

With `lora.enabled` TRL wraps the model in peft's LoRA and only the adapters train; they are saved in
output_dir/adapter and, with `lora.merge`, merged into output_dir's checkpoint (omrl.models.adapters).
TRL scores the completions with its fused LM head (log-probs computed in tiles of the vocabulary projection),
so a step never holds the batch's full-vocabulary logits; `gradient_checkpointing` (on, TRL's default)
recomputes the layers' activations in the backward pass.

On a CPU generation runs through transformers (HFPolicy). On a GPU, `use_vllm: true` turns on TRL's
vLLM generation (`vllm_mode` colocate or server): rollout_func then hands the agent loop a VLLMPolicy
(omrl/policies/vllm.py) that calls `trainer.vllm_generation`, whose weights TRL syncs before each step;
the rest of the path is unchanged. Not yet run on a GPU in this project (scripts/gpu_check.py does it).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from omrl.errors import UsageError
from omrl.progress import Reporter
from omrl.train.config.grpo import GRPORecipe, trl_config
from omrl.train.trainer import Trainer, TrainResult


def _reward_funcs():
    """The reward TRL sees: the episode's reward computed during the rollout (NaN-free; None if failed)."""

    def omrl_reward(prompts, completions, omrl_reward, **kwargs):
        return [None if r is None or (isinstance(r, float) and math.isnan(r)) else float(r) for r in omrl_reward]

    return [omrl_reward]


def train_grpo(recipe: GRPORecipe | dict[str, Any], *, store: Any = None,
               reporter: Reporter | None = None) -> TrainResult:
    """Run GRPO as the recipe says, its rollouts into `store` (default the recipe's), its steps shown by
    `reporter`; save the checkpoint and omrl_grpo.json to output_dir (omrl.train.trainer's contract)."""
    import os

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    from datasets import Dataset
    from omrl.config import from_dict
    from omrl.models.adapters import save_checkpoint
    from omrl.models.load import load_model
    from omrl.models.real import resolve_model
    from omrl.rollout.checkpoint_settings import save_rollout_settings
    from omrl.tasks import load_tasks
    from omrl.train.data.rollout_func import AgentRollout
    from omrl.train.trainer_progress import reporter_callback

    if isinstance(recipe, dict):
        recipe = from_dict(GRPORecipe, recipe, where="grpo")
    started = time.monotonic()
    tasks = load_tasks(recipe.tasks, split=recipe.split)
    if not tasks:
        raise UsageError(f"{recipe.tasks}: no tasks" + (f" in split {recipe.split!r}" if recipe.split else ""))
    if len(tasks) < recipe.tasks_per_step:
        raise UsageError(f"{recipe.tasks}: {len(tasks)} tasks, fewer than tasks_per_step={recipe.tasks_per_step}")
    torch.manual_seed(recipe.seed)
    path = resolve_model(recipe.model)  # a known name (hf:NAME) -> its folder in omrl's model cache
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = load_model(path)
    rollout = AgentRollout(recipe, tasks, tokenizer, store=store, reporter=reporter)
    # The prompt column carries the task id; the agent loop renders the real prompt from env.reset.
    dataset = Dataset.from_dict({"prompt": [t.id for t in tasks]})
    trainer_class = GRPOTrainer
    if recipe.step_credit is not None:  # TRL's episode advantage + rollout_func's per-token step term
        from omrl.train.rl.grpo_credit import step_credit_trainer

        trainer_class = step_credit_trainer()  # a GRPOTrainer subclass
    callbacks = [reporter_callback(reporter, "grpo")] if reporter is not None else None
    try:
        trainer = trainer_class(model=model, reward_funcs=_reward_funcs(), args=trl_config(recipe),
                                train_dataset=dataset, processing_class=tokenizer, rollout_func=rollout,
                                callbacks=callbacks, peft_config=recipe.lora.peft_config())
        output = trainer.train()
    finally:
        rollout.close()
        if reporter is not None:
            reporter.finish()
    out = Path(recipe.output_dir)
    if recipe.lora.enabled:  # out/adapter, and the merged model at out when lora.merge
        save_checkpoint(trainer.accelerator.unwrap_model(trainer.model), tokenizer, out, merge=recipe.lora.merge)
    else:
        trainer.save_model(str(out))
        tokenizer.save_pretrained(str(out))
    rollouts = rollout.rollouts
    history = [entry for entry in trainer.state.log_history if "loss" in entry or "reward" in entry]
    record = {"recipe": asdict(recipe), "log": with_missing_counts(history, rollouts.reward_steps()),
              "rollouts": rollouts.summary()}
    if rollouts.online is not None:
        record["reward_steps"] = rollouts.reward_steps()
        record["reward_summary"] = rollouts.online.summary()
    (out / "omrl_grpo.json").write_text(json.dumps(record, indent=1, default=str))
    save_rollout_settings(out, recipe.rollout, trainer="grpo")  # what `omrl eval --policy hf:OUT` plays with
    details = {k: record[k] for k in ("reward_steps", "reward_summary") if k in record}
    return TrainResult("grpo", out, steps=int(trainer.state.global_step), wall_s=time.monotonic() - started,
                       history=record["log"], metrics=dict(output.metrics), rollouts=record["rollouts"],
                       details=details, summary=_summary(record))


def _summary(record: dict[str, Any]) -> str:
    """The command line's line on a GRPO run: rollouts stored, last reward; the online reward when judged."""
    rollouts = record["rollouts"]
    rewards = [e["reward"] for e in record["log"] if "reward" in e]
    line = f"{rollouts['episodes']} rollouts ({rollouts['stored']} stored)" + (
        f", last logged reward {rewards[-1]:.3f}" if rewards else "")
    summary = record.get("reward_summary")
    if not summary:
        return line
    judges = "; ".join(f"{name}: {j['calls']} calls, {j['cache_hits']} cached, "
                       f"{j['prompt_tokens'] + j['completion_tokens']} tokens"
                       + (f", ${j['cost_usd']:.4f}" if j.get("cost_usd") is not None else "")
                       for name, j in (summary.get("judges") or {}).items())
    return (line + f"\nreward: {summary.get('scored', 0)} rollouts scored, {summary.get('dropped', 0)} dropped, "
            f"missing {summary.get('missing') or 'none'}" + (f"; {judges}" if judges else ""))


def with_missing_counts(history: list[dict[str, Any]], steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """TRL's log entries, each with the missing reward components and dropped rollouts of the rollout steps it
    covers (an entry at optimizer step s covers rollout steps after the previous entry's, up to s - 1)."""
    if not steps:
        return history
    out, since = [], -1
    for entry in history:
        at = int(entry.get("step", 0)) - 1
        covered = [s for s in steps if since < s["step"] <= at]
        if "step" in entry:
            since = max(since, at)
        missing: dict[str, int] = {}
        for s in covered:
            for name, n in s["missing"].items():
                missing[name] = missing.get(name, 0) + n
        out.append({**entry, "reward_missing": missing, "reward_dropped": sum(s["dropped"] for s in covered)})
    return out


TRAINER = Trainer("grpo", GRPORecipe, train_grpo, """GRPO (TRL GRPOTrainer) on a tasks file, rollouts by omrl's agent loop, groups written to the store.

    With reward=RECIPE (a reward recipe, as `omrl annotate --reward-recipe`) its metrics and judges score
    each group online and every score is stored.

    \b
    Example:  omrl train grpo --recipe shipped:grpo_grid max_steps=50 [reward=shipped:reward]
    """)
