"""Iterative training: [expert eval ->] base eval -> expert demos -> SFT -> eval -> rounds of (collect ->
filter -> GRPO [-> SFT on the best] -> eval) [-> compute-matched more-SFT baseline -> eval], every
stage's data in one store with its round number. The one orchestrator: the learning demo
(recipes/quickstart.yaml, `omrl demo`) is an iterate recipe (omrl/train/config/iterate.py); each stage's
held-out evaluation is omrl/train/iterate/evaluation.py.

    results = run_iterate(load_recipe("recipes/quickstart.yaml", IterateRecipe))

Each round r collects `collect.samples` attempts per training task with the current checkpoint (round r
in the store), drops tasks whose group is flat (every attempt scored the same: no GRPO signal), and runs
GRPO (omrl.train.algorithms.grpo, rollouts by omrl's agent loop) on the tasks that are left; GRPO writes its own
rollout groups to the store with the same round. Held-out evaluation after every stage gives
`results.json`: [{"stage": "expert" | "base" | "sft" | "grpo-1" ... | "sft-more", "success", "success_ci95",
"mean_reward", "greedy_success", "greedy_mean_reward", "tasks", "samples", "train_s", "minutes", ...}].
With `collect.enabled: false` a round is GRPO alone on the whole training file (TRL draws the tasks).
The baselines: `baseline.expert` scores the scripted expert itself on the held-out tasks (the imitation
ceiling); `baseline.more_sft` continues SFT from the SFT checkpoint for the wall time the GRPO rounds
took (in SFT epochs, or `more_sft_epochs`): without it a GRPO gain can be SFT that had not finished.

Update step: `algorithm: grpo` (default; the `grpo` section, with `step_credit` for GiGPO-style step
credit) or `algorithm: ppo` (the `ppo` section: a critic and GAE, omrl/train/algorithms/ppo.py): the registered trainer
of that name (omrl.train.trainer.TRAINERS) with its section; its stages are named grpo-N or ppo-N.

Rewards: with `reward` (a reward recipe, omrl/annotate/reward.py) a round is collect -> annotate (the
recipe's metrics and judges score the collection, then its combined reward; every score stored) ->
filter (ranked by it) -> GRPO (scored online by the same recipe) -> eval; the round's results carry the
judge's calls, cache hits, tokens and cost.

Ray: with `ray: auto|HOST:PORT|local` every collect and eval stage (demos, each round's collection, the
held-out evaluations) plays its episodes on a Ray cluster through the executor it is given
(omrl.rollout.executor.executor_for: a RayExecutor, the rollout section's ray_* knobs), and the annotate stage's judges run
there as `omrl annotate --ray` does; training (and the online judging inside GRPO) stays in this process.

Resume: `state.json` in output_dir lists finished stages with their checkpoint and results, and the recipe;
a killed run started again skips them and continues from the last finished stage (collection inside a stage
resumes too: trajectory ids are deterministic). Started again with a changed recipe it stops and names the
change (IterateState.check_recipe): only more rounds, threads, concurrency and logging may change.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from omrl.errors import UsageError
from omrl.progress import QUIET, Reporter
from omrl.train.config.iterate import IterateRecipe, round_seed, update_recipe
from omrl.train.iterate.evaluation import evaluate_checkpoint, evaluate_expert, rounded, stage_summary
from omrl.train.iterate.state import IterateState


def _subset(tasks: list, n: int) -> list:
    return tasks if n <= 0 else tasks[:n]


def collect_round(recipe: IterateRecipe, checkpoint: str, tasks: list, store, r: int, run_id: str | None = None):
    """The collect stage of round `r`: `collect.samples` attempts per task with `checkpoint` (run `run_id`,
    default round-r, seeded for the round), played in this process or served by vLLM (`collect.engine`), on Ray
    where the recipe says (`recipe.ray`); resumes like omrl collect."""
    import asyncio
    from dataclasses import replace

    from omrl.rollout import collect
    from omrl.rollout.executor import executor_for
    from omrl.train.iterate.evaluation import checkpoint_player

    settings = replace(recipe.rollout, seed=round_seed(recipe.rollout.seed, r))
    with checkpoint_player(recipe, checkpoint, recipe.collect.engine, settings.concurrency) as policy:
        return asyncio.run(collect(None, tasks, policy, store, settings, samples=recipe.collect.samples, round=r,
                                   run_id=run_id or f"round-{r}", executor=executor_for(recipe.ray)))


def run_iterate(recipe: IterateRecipe | dict[str, Any], *,
                on_stage: Callable[[str, dict[str, Any]], None] | None = None,
                reporter: Reporter | None = None) -> list[dict[str, Any]]:
    """Run (or resume) the whole iterative recipe; returns the per-stage results also written to results.json.

    `on_stage(stage, record)` is called after each stage is recorded as finished (tests use it to kill a run).
    `reporter` (omrl.progress) is told each stage as it starts and ends and shown the trainers' steps.
    """
    from omrl.rollout import shared_engines

    with shared_engines():  # reusable engines (JVMs, game interpreters) start once for the run, not per stage
        return _run_stages(recipe, on_stage=on_stage, reporter=reporter or QUIET)


def _run_stages(recipe: IterateRecipe | dict[str, Any], *, on_stage: Callable[[str, dict[str, Any]], None] | None,
                reporter: Reporter) -> list[dict[str, Any]]:
    """run_iterate's stages (see there)."""
    import contextlib
    import sys
    import time

    from omrl.config import from_dict, to_dict
    from omrl.store import Store
    from omrl.tasks import load_tasks

    if isinstance(recipe, dict):
        recipe = from_dict(IterateRecipe, recipe)
    if recipe.threads and "torch" not in sys.modules:  # OpenMP reads this once, at import
        os.environ.setdefault("OMP_NUM_THREADS", str(recipe.threads))
    if recipe.threads:
        import torch

        torch.set_num_threads(recipe.threads)
    out = Path(recipe.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = IterateState(out / "state.json")
    state.check_recipe(recipe)  # before anything is written
    (out / "recipe.json").write_text(json.dumps(to_dict(recipe), indent=1))
    store = Store.create(recipe.store or out / "store")
    train_tasks = load_tasks(recipe.train_tasks)
    eval_tasks = _subset(load_tasks(recipe.eval_tasks), recipe.eval.tasks)
    if not train_tasks or not eval_tasks:
        raise UsageError("iterate needs training and held-out tasks")
    clock = {"stage": time.monotonic()}

    def results_so_far() -> list[dict[str, Any]]:
        return [s["results"] for s in state.data["stages"] if s.get("results")]

    def finish(stage: str, **record: Any) -> None:
        seconds = time.monotonic() - clock["stage"]
        done_before = sum(s.get("seconds", 0.0) for s in state.data["stages"])
        if record.get("results") is not None:
            record["results"]["minutes"] = round((done_before + seconds) / 60, 2)
        state.finish(stage, seconds=round(seconds, 1), **record)
        results = results_so_far()
        (out / "results.json").write_text(json.dumps(results, indent=1))
        if record.get("results"):
            minutes = record["results"]["minutes"]
            reporter.log(f"[bold green]{stage}[/] {stage_summary(record['results'])}  [dim][{minutes:.1f} min][/]")
        if on_stage is not None:
            on_stage(stage, record)
        clock["stage"] = time.monotonic()

    @contextlib.contextmanager
    def shown(stage: str, description: str) -> Iterator[None]:
        """The stage's work, its start logged (finish logs its end)."""
        reporter.log(f"[bold cyan]{stage}[/] {description}")
        yield

    # Stage "expert": the scripted expert's own held-out success, the ceiling of imitation.
    if recipe.baseline.expert and not state.done("expert"):
        with shown("expert", f"scripted expert on {len(eval_tasks)} held-out tasks"):
            finish("expert", results=evaluate_expert(recipe, eval_tasks, store))

    def collect_demos():
        """The scripted expert's demonstrations (run 'demos'); resumes like collect: stored ones are kept."""
        import asyncio
        from dataclasses import replace

        from omrl.policies.scripted import ScriptedPolicy
        from omrl.rollout import collect
        from omrl.rollout.executor import executor_for

        demo_settings = replace(recipe.rollout, max_new_tokens=None)
        return asyncio.run(collect(None, _subset(train_tasks, recipe.demos.tasks), ScriptedPolicy(), store,
                                   demo_settings, samples=recipe.demos.samples, round=0, run_id="demos",
                                   executor=executor_for(recipe.ray)))

    # Stage "base": the starting checkpoint (built offline when none is given) and its held-out score.
    if not state.done("base"):
        with shown("base", "starting checkpoint: build and evaluate"):
            model = recipe.model
            if model is None:
                from omrl.models.tiny import build_tiny_model, default_corpus

                corpus = None
                if recipe.tiny.corpus == "demos":
                    collect_demos()
                    corpus = default_corpus() + demo_texts(store)
                model = str(build_tiny_model(out / "base", hidden=recipe.tiny.hidden, layers=recipe.tiny.layers,
                                             seed=recipe.tiny.seed, vocab_size=recipe.tiny.vocab_size,
                                             corpus=corpus))
            results = evaluate_checkpoint(recipe, model, eval_tasks, store, "base", round=0,
                                          samples=recipe.eval.base_samples)
            finish("base", checkpoint=model, results=results)

    # Stage "sft": scripted-expert demonstrations, then SFT on them.
    where = demo_where(recipe)
    if recipe.demos.enabled and not state.done("sft"):
        from omrl.train.algorithms.sft import train_sft

        with shown("sft", f"expert demonstrations, then SFT ({recipe.sft.epochs} epochs)"):
            collect_demos()
            demos = demo_success(store)
            sft = recipe.sft.to_recipe(seed=recipe.seed, model=state.checkpoint, store=str(store.path),
                                       where=where, output_dir=str(out / "sft"))
            trained = train_sft(sft, store=store, reporter=reporter)
            results = evaluate_checkpoint(recipe, str(trained.checkpoint), eval_tasks, store, "sft", round=0)
            results["expert_success"] = rounded(demos)
            results["train_s"] = trained.train_s
            finish("sft", checkpoint=str(trained.checkpoint), results=results, sft_losses=trained.losses[-3:],
                   train_s=results["train_s"], epochs=sft.epochs)

    for r in range(1, recipe.rounds + 1):
        stage = f"{recipe.algorithm}-{r}"
        if state.done(stage):
            continue
        steps = getattr(recipe, recipe.algorithm).max_steps
        with shown(stage, f"{recipe.algorithm.upper()} round {r} ({steps} steps)"):
            checkpoint, results = _rl_round(recipe, state.checkpoint, train_tasks, eval_tasks, store, out, r,
                                            reporter)
            finish(stage, checkpoint=checkpoint, results=results, train_s=results["train_s"])

    # Stage "sft-more": the compute-matched baseline, SFT continued from the SFT checkpoint for GRPO's time.
    sft_record = state.done("sft")
    if recipe.baseline.more_sft and sft_record and recipe.rounds and not state.done("sft-more"):
        from omrl.train.algorithms.sft import train_sft

        grpo_s = sum(state.done(f"{recipe.algorithm}-{r}").get("train_s", 0.0) for r in range(1, recipe.rounds + 1))
        epoch_s = max(sft_record.get("train_s", 0.0) / max(sft_record.get("epochs", 1), 1), 1e-6)
        matched = max(1, round(grpo_s / epoch_s))
        epochs = recipe.baseline.more_sft_epochs or matched
        with shown("sft-more", f"more SFT from the SFT checkpoint: {epochs} epochs (GRPO trained {grpo_s:.0f} s)"):
            more = recipe.sft.to_recipe(seed=recipe.seed, model=sft_record["checkpoint"], store=str(store.path),
                                        where=where, output_dir=str(out / "sft-more"), epochs=epochs)
            trained = train_sft(more, store=store, reporter=reporter)
            results = evaluate_checkpoint(recipe, str(trained.checkpoint), eval_tasks, store, "sft-more", round=0)
            results["train_s"] = trained.train_s
            results["note"] = (f"SFT checkpoint + {epochs} more epochs (GRPO trained {grpo_s:.0f} s = "
                               f"{grpo_s / epoch_s:.1f} SFT epochs)")
            finish("sft-more", checkpoint=None, results=results, train_s=results["train_s"])

    if recipe.report:
        try:  # the figures are a convenience: a plotting failure must not throw away the measured table
            from omrl.report import RUN_LOGS, write_report

            # The rounds' trainer logs (TRL's loss and entropy per step) when a round has trained.
            runs = [out] if any(next(out.rglob(name), None) for name in RUN_LOGS) else []
            write_report(store, out / "report", results=out / "results.json", runs=runs)
        except Exception as exc:  # noqa: BLE001 - said out loud, never silently
            reporter.log(f"[red]could not write the report[/]: {type(exc).__name__}: {exc}")
    return results_so_far()


def demo_where(recipe: IterateRecipe) -> str:
    """The SQL condition selecting what the demo SFT (and the more-SFT baseline) trains on."""
    return "run_id = 'demos'" + (" AND success" if recipe.demos.only_success else "")


def demo_texts(store) -> list[str]:
    """Every message text of the stored expert demonstrations (run 'demos'): a tokenizer corpus."""
    rows = store.sql("SELECT m.content FROM messages m WHERE m.run_id = 'demos' AND m.content IS NOT NULL")
    return [text for text in rows.column("content").to_pylist() if text]


def demo_success(store) -> float | None:
    """The success rate of the stored expert demonstrations (all of them, also those of an earlier call)."""
    from omrl.schema import SUCCESS_SQL

    rows = store.sql(f"SELECT {SUCCESS_SQL} FROM trajectories WHERE run_id = 'demos'").to_pylist()
    return rows[0]["success_rate"] if rows else None


def _rl_round(recipe: IterateRecipe, checkpoint: str, train_tasks: list, eval_tasks: list, store, out: Path,
              r: int, reporter: Reporter = QUIET) -> tuple[str, dict[str, Any]]:
    """One round: [collect -> [annotate ->] filter ->] the update step (the TRAINERS entry `recipe.algorithm`)
    [-> SFT on the best] -> held-out eval."""
    import time

    from omrl.store.query import quote_literal
    from omrl.train.algorithms.sft import train_sft
    from omrl.train.trainer import TRAINERS

    round_dir = out / f"round-{r}"
    run_id = f"round-{r}"
    where = f"run_id = {quote_literal(run_id)} AND round = {r}"
    extra: dict[str, Any] = {}
    if recipe.collect.enabled:
        tasks_file, extra = collect_and_select(recipe, checkpoint, train_tasks, store, r, round_dir, run_id)
    else:
        tasks_file = recipe.train_tasks
    started = time.monotonic()
    update = update_recipe(recipe, recipe.algorithm, {
        "model": checkpoint, "tasks": tasks_file, "output_dir": str(round_dir / recipe.algorithm),
        "store": str(store.path), "round": r}, round=r)
    trained = TRAINERS.load(recipe.algorithm).train(update, store=store, reporter=reporter)
    checkpoint = str(trained.checkpoint)
    extra.update(online_reward_totals(trained))
    if recipe.filter.sft_best and recipe.collect.enabled:
        from omrl.train.algorithms.rft import select_best

        kept = round_dir / "best"
        if kept.exists():
            import shutil

            shutil.rmtree(kept)
        selection = select_best(store, kept, where=where, threshold=recipe.filter.min_reward, keep_per_group=1,
                                reward_recipe=recipe.filter_reward)
        if sum(selection.kept.values()):
            best = recipe.sft_best.to_recipe(seed=recipe.seed + r, model=checkpoint, store=str(kept),
                                             output_dir=str(round_dir / "sft_best"))
            checkpoint = str(train_sft(best, reporter=reporter).checkpoint)
    train_s = round(time.monotonic() - started, 1)
    results = evaluate_checkpoint(recipe, checkpoint, eval_tasks, store, f"{recipe.algorithm}-{r}", round=r)
    results.update(extra, train_s=train_s)
    return checkpoint, results


def collect_and_select(recipe: IterateRecipe, checkpoint: str, train_tasks: list, store, r: int, round_dir: Path,
                       run_id: str) -> tuple[str, dict[str, Any]]:
    """Round `r`'s collection (run `run_id`) on the next `collect.tasks` training tasks, annotated where the
    recipe has a reward recipe, and the tasks the update step trains on: those whose group is not flat (all of
    them when fewer than one update step's worth are). Returns (their tasks file, the round's figures)."""
    from omrl.store.query import quote_literal
    from omrl.tasks import write_tasks

    where = f"run_id = {quote_literal(run_id)} AND round = {r}"
    extra: dict[str, Any] = {}
    tasks = _subset(_rotate(train_tasks, (r - 1) * max(recipe.collect.tasks, 0)), recipe.collect.tasks)
    collected = collect_round(recipe, checkpoint, tasks, store, r, run_id=run_id)
    if recipe.filter_reward is not None:
        from omrl.rollout.executor import executor_for

        extra["annotate"] = annotate_round(store, recipe.filter_reward, where=where, round=r,
                                           executor=executor_for(recipe.ray))
    informative, flat = informative_tasks(store, round_dir / "informative", where=where,
                                          drop_flat=recipe.filter.drop_flat, reward_recipe=recipe.filter_reward)
    grpo_tasks = [t for t in tasks if t.id in informative]
    per_step = getattr(recipe, recipe.algorithm).tasks_per_step
    if len(grpo_tasks) < per_step:  # too few informative groups: an update step needs full steps
        grpo_tasks = tasks
    tasks_file = str(write_tasks(grpo_tasks, round_dir / "grpo_tasks.jsonl"))
    extra.update(grpo_tasks=len(grpo_tasks), train_success=rounded(collected.success_rate),
                 train_mean_reward=rounded(collected.mean_reward), flat_groups=flat)
    return tasks_file, extra


def annotate_round(store, reward: str | dict[str, Any], *, where: str, round: int,
                   executor: Any = None) -> dict[str, Any]:
    """The annotate stage of a round: the reward recipe's metrics and judges (through `executor`, default
    this process), then its
    combined reward, over the round's collection. Resumable: stored ok annotations are skipped and judge replies are cached, so
    a run killed here and started again asks the judge nothing it already answered."""
    from omrl.annotate.runner import annotate_with_recipe
    from omrl.rollout.executor import LOCAL

    summary = annotate_with_recipe(store, reward, where=where, run_id=f"annotate/round-{round}",
                                   metadata={"grpo_round": round}, executor=executor or LOCAL)
    stats = summary.judge
    return {"written": sum(summary.written.values()), "errors": sum(summary.errors.values()),
            "already_done": sum(summary.already_done.values()), "reward_missing": summary.reward_missing,
            "judge_calls": stats.calls if stats else 0, "judge_cache_hits": stats.cache_hits if stats else 0}


def online_reward_totals(trained: Any) -> dict[str, Any]:
    """Judge calls, cache hits, cost and dropped rollouts of an update step's online reward ({} without one)."""
    summary = trained.details.get("reward_summary")
    if not summary:
        return {}
    judges = summary["judges"].values()
    costs = [j["cost_usd"] for j in judges if j["cost_usd"] is not None]
    return {"reward_dropped": summary["dropped"], "reward_missing": summary["missing"],
            "judge_calls": sum(j["calls"] for j in judges), "judge_cache_hits": sum(j["cache_hits"] for j in judges),
            "judge_tokens": sum(j["prompt_tokens"] + j["completion_tokens"] for j in judges),
            "judge_cost_usd": round(sum(costs), 6) if costs else None}


def informative_tasks(store, out: Path, *, where: str, drop_flat: bool, reward_recipe: str | None
                      ) -> tuple[set[str], int]:
    """(task ids whose group is left after dropping flat groups, number of flat groups) among `where`.

    Runs omrl.curate's filter_store (so the selection is recorded in `out`'s omrl.json like any filter);
    an existing `out` from a killed run is rebuilt.
    """
    import shutil

    from omrl.curate.filters import FilterOptions, filter_store
    from omrl.store import Store
    from omrl.store.query import select_ids

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
