"""Iterative training: base eval -> expert demos -> SFT -> eval -> rounds of (collect -> filter -> GRPO
[-> SFT on the best] -> eval), every stage's data in one store with its round number.

    results = run_iterate(load_recipe("recipes/quickstart.yaml", IterateRecipe))

Each round r collects `collect.samples` attempts per training task with the current checkpoint (round r
in the store), drops tasks whose group is flat (every attempt scored the same: no GRPO signal), and runs
GRPO (omrl.train.grpo, rollouts by omrl's agent loop) on the tasks that are left; GRPO writes its own
rollout groups to the store with the same round. Held-out evaluation after every stage gives
`results.json`: [{"stage": "base" | "sft" | "grpo-1" ..., "success", "mean_reward", "tasks", ...}].

Resume: `state.json` in output_dir lists finished stages with their checkpoint and results; a killed run
started again skips them and continues from the last finished stage (collection inside a stage resumes
too: trajectory ids are deterministic).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from omrl.recipes import section
from omrl.rollout import RolloutSettings
from omrl.train.grpo import GRPORecipe
from omrl.train.rft import SFTSection

GRPOSection = section(GRPORecipe, "GRPOSection",
                      ("model", "tasks", "output_dir", "store", "round", "split", "seed", "rollout"),
                      "The GRPO settings of an iterate round (omrl/train/grpo.py); the run sets the checkpoint, "
                      "tasks, folders, round, seed and rollout.")


@dataclass
class TinySettings:
    hidden: int = field(default=128, metadata={"help": "hidden size of the tiny model"})
    layers: int = field(default=2, metadata={"help": "transformer layers"})
    seed: int = field(default=0, metadata={"help": "seed of the random initial weights"})


@dataclass
class DemoSettings:
    enabled: bool = field(default=True, metadata={"help": "collect scripted-expert demos and SFT on them first"})
    tasks: int = field(default=0, metadata={"help": "how many training tasks get demos (0 = all)"})
    samples: int = field(default=1, metadata={"help": "expert episodes per task"})
    only_success: bool = field(default=True, metadata={"help": "SFT only on demos that reached the goal"})


@dataclass
class CollectSettings:
    tasks: int = field(default=64, metadata={"help": "training tasks attempted per round (0 = all)"})
    samples: int = field(default=8, metadata={"help": "attempts per task: the group size"})


@dataclass
class FilterSettings:
    drop_flat: bool = field(default=True, metadata={"help": "train GRPO only on tasks whose group is not flat"})
    sft_best: bool = field(default=False, metadata={"help": "also SFT on the best attempt of each group"})
    min_reward: float = field(default=1.0, metadata={"help": "reward an attempt needs to join the SFT set"})
    reward_recipe: str | None = field(default=None, metadata={
        "help": "combined-reward recipe (omrl annotate) ranking attempts; None = env reward"})


@dataclass
class EvalSettings:
    tasks: int = field(default=0, metadata={"help": "held-out tasks evaluated (0 = all)"})
    samples: int = field(default=4, metadata={"help": "sampled episodes per task"})
    temperature: float = field(default=1.0, metadata={"help": "temperature of the sampled evaluation"})
    greedy: bool = field(default=True, metadata={"help": "also evaluate greedily (temperature 0, 1 episode)"})
    concurrency: int = field(default=256, metadata={"help": "episodes in flight (one evaluation is one batch)"})


def _iterate_rollout():
    return RolloutSettings(env="grid", max_turns=16, max_new_tokens=16, concurrency=64)


@dataclass
class IterateRecipe:
    """Settings of an iterative run (the learning demo is one)."""

    # Where the rollout knobs lived before the `rollout` section (old recipes still load).
    LEGACY_KEYS: ClassVar[dict[str, str]] = {
        "env": "rollout.env", "env_options": "rollout.env_options",
        **{f"collect.{k}": f"rollout.{k}" for k in ("temperature", "max_turns", "max_new_tokens", "concurrency")},
        **{f"eval.{k}": f"rollout.{k}" for k in ("max_turns", "max_new_tokens")},
        **{f"grpo.{k}": f"rollout.{k}" for k in ("temperature", "max_turns", "max_new_tokens")}}

    output_dir: str = field(metadata={"help": "run folder: checkpoints, store, state.json, results.json"})
    train_tasks: str = field(metadata={"help": "training tasks file"})
    eval_tasks: str = field(metadata={"help": "held-out tasks file"})
    rollout: RolloutSettings = field(default_factory=_iterate_rollout, metadata={
        "help": "how every stage plays episodes (omrl.rollout.RolloutSettings); round r seeds with seed + r"})
    model: str | None = field(default=None, metadata={"help": "starting checkpoint; None = build the tiny model"})
    tiny: TinySettings = field(default_factory=TinySettings, metadata={"help": "the tiny model, when model is None"})
    store: str | None = field(default=None, metadata={"help": "store of every stage's data (default output_dir/store)"})
    rounds: int = field(default=3, metadata={"help": "GRPO rounds"})
    seed: int = field(default=0, metadata={"help": "seeds the training stages (rollout.seed: the episodes)"})
    demos: DemoSettings = field(default_factory=DemoSettings, metadata={"help": "expert demonstrations"})
    sft: SFTSection = field(default_factory=SFTSection, metadata={"help": "SFT settings of the demo SFT"})
    collect: CollectSettings = field(default_factory=CollectSettings, metadata={"help": "per-round collection"})
    filter: FilterSettings = field(default_factory=FilterSettings, metadata={"help": "per-round selection"})
    grpo: GRPOSection = field(default_factory=GRPOSection, metadata={
        "help": "GRPO settings of each round (omrl.train.grpo); rollouts as the rollout section says"})
    sft_best: SFTSection = field(default_factory=SFTSection, metadata={"help": "SFT settings of the best-of SFT"})
    eval: EvalSettings = field(default_factory=EvalSettings, metadata={"help": "held-out evaluation"})


def grpo_recipe(recipe: IterateRecipe, values: dict[str, Any], round: int):
    """The GRPORecipe of one round: the grpo section, the run's rollout section seeded for the round, `values`."""
    from omrl.recipes import to_dict

    rollout = {**to_dict(recipe.rollout), "seed": _round_seed(recipe.rollout.seed, round)}
    return recipe.grpo.to_recipe(seed=recipe.seed + round, rollout=rollout, **values)


def _round_seed(seed: int | None, round: int) -> int | None:
    return None if seed is None else seed + round


class IterateState:
    """state.json: finished stages in order, each with its checkpoint and results; written atomically."""

    def __init__(self, path: Path):
        self.path = path
        self.data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"stages": []}

    def done(self, stage: str) -> dict[str, Any] | None:
        return next((s for s in self.data["stages"] if s["stage"] == stage), None)

    def finish(self, stage: str, **record: Any) -> None:
        self.data["stages"].append({"stage": stage, **record})
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.path)

    @property
    def checkpoint(self) -> str | None:
        for stage in reversed(self.data["stages"]):
            if stage.get("checkpoint"):
                return stage["checkpoint"]
        return None


def _subset(tasks: list, n: int) -> list:
    return tasks if n <= 0 else tasks[:n]


def evaluate_checkpoint(recipe: IterateRecipe, checkpoint: str, tasks: list, store, stage: str,
                        round: int) -> dict[str, Any]:
    """Held-out success and mean reward of `checkpoint`: sampled, and greedy when the recipe asks."""
    import asyncio
    from dataclasses import replace

    from omrl.policies.hf import HFPolicy
    from omrl.rollout import evaluate

    settings = recipe.eval
    base = replace(recipe.rollout, concurrency=settings.concurrency)
    out: dict[str, Any] = {"stage": stage, "tasks": len(tasks)}
    modes = [("", settings.temperature, settings.samples)]
    if settings.greedy:
        modes.append(("greedy_", 0.0, 1))
    for prefix, temperature, samples in modes:
        options = {"max_new_tokens": base.max_new_tokens} if base.max_new_tokens else {}
        policy = HFPolicy(checkpoint, name=checkpoint, **options)
        result = asyncio.run(evaluate(None, tasks, policy, store, samples=samples, round=round,
                                      run_id=f"eval-{stage}-{prefix or 'sampled_'}t{temperature:g}",
                                      settings=replace(base, temperature=temperature), progress=False))
        metrics = next(iter(result.metrics.values()), {})
        out[f"{prefix}success"] = metrics.get("success_rate")
        out[f"{prefix}mean_reward"] = metrics.get("mean_reward")
        out[f"{prefix}episodes"] = metrics.get("episodes")
    return out


def round_table(results: list[dict[str, Any]]):
    """A rich table of the per-stage results."""
    from rich.table import Table

    table = Table(title="held-out results")
    columns = ["stage", "success", "mean_reward", "greedy_success", "greedy_mean_reward", "tasks",
               "grpo_tasks", "train_success"]
    present = [c for c in columns if any(c in r for r in results)]
    for c in present:
        table.add_column(c, justify="left" if c == "stage" else "right")
    for r in results:
        table.add_row(*(_fmt(r.get(c)) for c in present))
    return table


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def run_iterate(recipe: IterateRecipe | dict[str, Any], *,
                on_stage: Callable[[str, dict[str, Any]], None] | None = None, console=None) -> list[dict[str, Any]]:
    """Run (or resume) the whole iterative recipe; returns the per-stage results also written to results.json.

    `on_stage(stage, record)` is called after each stage is recorded as finished (tests use it to kill a run).
    """
    from omrl.query import quote_literal
    from omrl.recipes import from_dict, to_dict
    from omrl.store import Store
    from omrl.tasks import load_tasks, write_tasks
    from omrl.train.rft import collect_with_model
    from omrl.train.sft import train_sft

    if isinstance(recipe, dict):
        recipe = from_dict(IterateRecipe, recipe)
    out = Path(recipe.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "recipe.json").write_text(json.dumps(to_dict(recipe), indent=1))
    store = Store.create(recipe.store or out / "store")
    state = IterateState(out / "state.json")
    train_tasks = load_tasks(recipe.train_tasks)
    eval_tasks = _subset(load_tasks(recipe.eval_tasks), recipe.eval.tasks)
    if not train_tasks or not eval_tasks:
        raise ValueError("iterate needs training and held-out tasks")

    def finish(stage: str, **record: Any) -> None:
        state.finish(stage, **record)
        results = [s["results"] for s in state.data["stages"] if s.get("results")]
        (out / "results.json").write_text(json.dumps(results, indent=1))
        if console is not None and record.get("results"):
            console.print(round_table(results))
        if on_stage is not None:
            on_stage(stage, record)

    # Stage "base": the starting checkpoint (built offline when none is given) and its held-out score.
    if not state.done("base"):
        model = recipe.model
        if model is None:
            from omrl.models import build_tiny_model

            model = str(build_tiny_model(out / "base", hidden=recipe.tiny.hidden, layers=recipe.tiny.layers,
                                         seed=recipe.tiny.seed))
        finish("base", checkpoint=model,
               results=evaluate_checkpoint(recipe, model, eval_tasks, store, "base", round=0))

    # Stage "sft": scripted-expert demonstrations, then SFT on them.
    if recipe.demos.enabled and not state.done("sft"):
        import asyncio
        from dataclasses import replace

        from omrl.policies.scripted import ScriptedPolicy
        from omrl.rollout import collect

        demo_tasks = _subset(train_tasks, recipe.demos.tasks)
        demo_settings = replace(recipe.rollout, max_new_tokens=None)
        demos = asyncio.run(collect(None, demo_tasks, ScriptedPolicy(), store, demo_settings,
                                    samples=recipe.demos.samples, round=0, run_id="demos", progress=False))
        where = "run_id = 'demos'" + (" AND success" if recipe.demos.only_success else "")
        sft = recipe.sft.to_recipe(seed=recipe.seed, model=state.checkpoint, store=str(store.path), where=where,
                                   output_dir=str(out / "sft"))
        trained = train_sft(sft)
        results = evaluate_checkpoint(recipe, str(trained.checkpoint), eval_tasks, store, "sft", round=0)
        results["expert_success"] = demos.success_rate
        finish("sft", checkpoint=str(trained.checkpoint), results=results, sft_losses=trained.losses[-3:])

    for r in range(1, recipe.rounds + 1):
        stage = f"grpo-{r}"
        if state.done(stage):
            continue
        checkpoint = state.checkpoint
        round_dir = out / f"round-{r}"
        tasks = _subset(_rotate(train_tasks, (r - 1) * max(recipe.collect.tasks, 0)), recipe.collect.tasks)
        run_id = f"round-{r}"
        from dataclasses import replace

        round_settings = replace(recipe.rollout, seed=_round_seed(recipe.rollout.seed, r))
        collected = collect_with_model(checkpoint, tasks, store, round_settings, samples=recipe.collect.samples,
                                       round=r, run_id=run_id, progress=False)
        where = f"run_id = {quote_literal(run_id)} AND round = {r}"
        informative, flat = informative_tasks(store, round_dir / "informative", where=where,
                                              drop_flat=recipe.filter.drop_flat,
                                              reward_recipe=recipe.filter.reward_recipe)
        grpo_tasks = [t for t in tasks if t.id in informative]
        per_step = recipe.grpo.tasks_per_step
        if len(grpo_tasks) < per_step:  # too few informative groups this round: GRPO still needs full steps
            grpo_tasks = tasks
        tasks_file = write_tasks(grpo_tasks, round_dir / "grpo_tasks.jsonl")
        from omrl.train.grpo import train_grpo

        grpo = grpo_recipe(recipe, {"model": checkpoint, "tasks": str(tasks_file),
                                    "output_dir": str(round_dir / "grpo"), "store": str(store.path), "round": r},
                           round=r)
        checkpoint = str(train_grpo(grpo))
        if recipe.filter.sft_best:
            from omrl.train.rft import select_best

            kept = round_dir / "best"
            if kept.exists():
                import shutil

                shutil.rmtree(kept)
            selection = select_best(store, kept, where=where, threshold=recipe.filter.min_reward, keep_per_group=1,
                                    reward_recipe=recipe.filter.reward_recipe)
            if sum(selection.kept.values()):
                best = recipe.sft_best.to_recipe(seed=recipe.seed + r, model=checkpoint, store=str(kept),
                                                 output_dir=str(round_dir / "sft_best"))
                checkpoint = str(train_sft(best).checkpoint)
        results = evaluate_checkpoint(recipe, checkpoint, eval_tasks, store, stage, round=r)
        results.update(grpo_tasks=len(grpo_tasks), train_success=collected.success_rate,
                       train_mean_reward=collected.mean_reward, flat_groups=flat)
        finish(stage, checkpoint=checkpoint, results=results)
    return [s["results"] for s in state.data["stages"] if s.get("results")]


def informative_tasks(store, out: Path, *, where: str, drop_flat: bool, reward_recipe: str | None
                      ) -> tuple[set[str], int]:
    """(task ids whose group is left after dropping flat groups, number of flat groups) among `where`.

    Runs omrl.curate's filter_store (so the selection is recorded in `out`'s omrl.json like any filter);
    an existing `out` from a killed run is rebuilt.
    """
    import shutil

    from omrl.curate.filters import FilterOptions, filter_store
    from omrl.query import select_ids
    from omrl.store import Store

    if out.exists():
        shutil.rmtree(out)
    result = filter_store(store, out, FilterOptions(where=where, drop_flat_groups=drop_flat,
                                                    reward_recipe=reward_recipe))
    kept = Store(result.stores["train"])
    tasks = {r["task_id"] for r in kept.sql("SELECT DISTINCT task_id FROM trajectories").to_pylist()}
    flat = len(select_ids(store, where, view="groups", column="group_id")) - len(
        {r["group_id"] for r in kept.sql("SELECT DISTINCT group_id FROM trajectories").to_pylist()})
    return tasks, flat if drop_flat else 0


def _rotate(items: list, offset: int) -> list:
    """Items starting at `offset` (wrapping), so successive rounds see different training tasks."""
    if not items:
        return items
    k = offset % len(items)
    return items[k:] + items[:k]
