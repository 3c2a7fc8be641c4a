"""Held-out evaluation of an iterate stage (omrl.train.iterate.run, omrl.study.compare): sampled and greedy success
and reward of a checkpoint or the scripted expert, the 95% interval over tasks, and the results table.

    row = evaluate_checkpoint(recipe, "runs/sft", eval_tasks, store, "sft", round=0)
    console.print(round_table([row]))
"""

from __future__ import annotations

import contextlib
import math
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omrl.train.config.iterate import IterateRecipe


def evaluate_checkpoint(recipe: IterateRecipe, checkpoint: str, tasks: list, store, stage: str,
                        round: int, samples: int | None = None) -> dict[str, Any]:
    """Held-out success and mean reward of `checkpoint`: sampled, and greedy when the recipe asks; played in
    this process, or served by vLLM for the evaluation (eval.engine)."""
    with checkpoint_player(recipe, checkpoint, recipe.eval.engine, recipe.eval.concurrency) as policy:
        return _evaluate(recipe, policy, tasks, store, stage, round, samples, greedy=recipe.eval.greedy)


@contextlib.contextmanager
def checkpoint_player(recipe: IterateRecipe, checkpoint: str, engine: str, concurrency: int) -> Iterator[Any]:
    """The policy that plays `checkpoint` in a stage (an evaluation: eval.engine; a round's collection:
    collect.engine): HFPolicy in this process (engine hf: rft.checkpoint_policy), or an `openai:` policy against
    vLLM serving the checkpoint on 127.0.0.1 with `concurrency` sequences at once, started here and stopped (its
    whole process group) when the stage ends (engine vllm)."""
    from omrl.train.algorithms.rft import checkpoint_policy

    if engine == "hf":
        yield checkpoint_policy(checkpoint, recipe.rollout)
        return
    from omrl.models.real import resolve_model
    from omrl.policies import make_policy
    from omrl.serve.vllm import VLLMServer

    folder = resolve_model(checkpoint)
    served = Path(folder).name  # the trajectories' model: the checkpoint's folder name
    with VLLMServer(folder, served, max_model_len=recipe.eval.max_model_len, max_num_seqs=concurrency) as server:
        server.start(progress=lambda line: print(line, file=sys.stderr, flush=True))
        yield make_policy(f"openai:{served}", base_url=server.base_url, api_key="EMPTY",
                          max_tokens=recipe.rollout.max_new_tokens)


def evaluate_expert(recipe: IterateRecipe, tasks: list, store, stage: str = "expert") -> dict[str, Any]:
    """The scripted expert's own held-out success (in the rollout's environment, its noise included)."""
    from omrl.policies.scripted import ScriptedPolicy

    row = _evaluate(recipe, ScriptedPolicy(), tasks, store, stage, 0, None, greedy=False)
    noise = recipe.rollout.env_options.get("noise")
    row["greedy_success"] = None
    row["note"] = "scripted expert" + (f", {noise:.0%} random moves" if isinstance(noise, (int, float)) else "")
    return row


def _evaluate(recipe: IterateRecipe, policy: Any, tasks: list, store, stage: str, round: int,
              samples: int | None, greedy: bool) -> dict[str, Any]:
    import asyncio
    from dataclasses import replace

    from omrl.rollout import evaluate
    from omrl.rollout.executor import executor_for

    settings = recipe.eval
    base = replace(recipe.rollout, concurrency=settings.concurrency)
    k = samples or settings.samples
    out: dict[str, Any] = {"stage": stage, "tasks": len(tasks), "samples": k}
    modes = [("", settings.temperature, k)]
    if greedy:
        modes.append(("greedy_", 0.0, 1))
    for prefix, temperature, n in modes:
        _seed_torch(recipe.seed)
        run_id = eval_run_id(stage, "greedy" if prefix else "sampled", temperature)
        result = asyncio.run(evaluate(None, tasks, policy, store, samples=n, round=round, run_id=run_id,
                                      settings=replace(base, temperature=temperature),
                                      executor=executor_for(recipe.ray)))
        metrics = next(iter(result.metrics.values()), {})
        out[f"{prefix}success"] = rounded(metrics.get("success_rate"))
        out[f"{prefix}mean_reward"] = rounded(metrics.get("mean_reward"))  # None when every episode failed
        out[f"{prefix}episodes"] = metrics.get("episodes")
        if not prefix:
            out["success_ci95"] = success_ci95(store, run_id, round)
    return out


def eval_run_id(stage: str, mode: str, temperature: float) -> str:
    """The run id of a stage's held-out evaluation in `mode` (sampled or greedy) at `temperature`."""
    return f"eval-{stage}-{mode}_t{temperature:g}"


def parse_eval_run_id(run_id: str) -> tuple[str, str] | None:
    """(stage, mode) of a run id eval_run_id made; None for any other run id."""
    match = _EVAL_RUN.match(run_id)
    return (match["stage"], match["mode"]) if match else None


_EVAL_RUN = re.compile(r"^eval-(?P<stage>.+)-(?P<mode>greedy|sampled)_t[\d.e+-]+$")


def eval_run_ids(recipe: IterateRecipe, stage: str) -> dict[str, str]:
    """{"sampled": run id, "greedy": run id} of the stage's evaluation as the recipe plays it."""
    return {"sampled": eval_run_id(stage, "sampled", recipe.eval.temperature), "greedy": eval_run_id(stage, "greedy", 0.0)}


def _seed_torch(seed: int) -> None:
    import torch

    torch.manual_seed(seed)


def rounded(x: float | None) -> float | None:
    """`x` to 4 places (None stays None): how the results rows keep figures."""
    return None if x is None else round(x, 4)


def task_success(store, run_id: str, round_: int) -> dict[str, float]:
    """Each task's success rate in one run (omrl.schema's definition), for the tasks with a known outcome."""
    from omrl.schema import SUCCESS_SQL
    from omrl.store.query import quote_literal

    rates = store.sql(f"SELECT task_id, {SUCCESS_SQL} FROM trajectories WHERE run_id = {quote_literal(run_id)} "
                      f"AND round = {int(round_)} GROUP BY task_id ORDER BY task_id").to_pylist()
    return {r["task_id"]: r["success_rate"] for r in rates if r["success_rate"] is not None}


def interval(values: list[float]) -> float:
    """Half-width of a normal 95% interval on the mean of `values` (0.0 for fewer than two)."""
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return 1.96 * math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))


def success_ci95(store, run_id: str, round_: int) -> float:
    """Half-width of a 95% interval on success, counting tasks (not episodes) as the independent units."""
    return round(interval(list(task_success(store, run_id, round_).values())), 4)


def round_table(results: list[dict[str, Any]]):
    """A rich table of the per-stage results (columns that no stage has are left out)."""
    from rich.table import Table

    table = Table(title="held-out results (success: sampled at the eval temperature, +-95% over tasks)")
    columns = [("stage", "stage"), ("tasks", "tasks"), ("success", "success"), ("success_ci95", "+-95%"),
               ("mean_reward", "reward"), ("greedy_success", "greedy success"),
               ("greedy_mean_reward", "greedy reward"), ("grpo_tasks", "grpo tasks"),
               ("train_success", "train success"), ("judge_calls", "judge calls"),
               ("judge_cost_usd", "judge $"), ("train_s", "train s"), ("minutes", "minutes")]
    present = [(c, title) for c, title in columns if any(r.get(c) is not None for r in results)]
    for c, title in present:
        table.add_column(title, justify="left" if c == "stage" else "right")
    for r in results:
        table.add_row(*(_fmt(c, r.get(c)) for c, _ in present))
    return table


_PERCENT = {"success", "success_ci95", "greedy_success", "train_success"}


def _fmt(column: str, value: Any) -> str:
    if value is None:
        return "-"
    if column in _PERCENT:
        return f"{value:.1%}"
    if column in ("train_s", "minutes"):
        return f"{value:.1f}"
    if column == "judge_cost_usd":
        return f"{value:.4f}"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def stage_summary(results: dict[str, Any]) -> str:
    """One line of a stage's results (evaluate_checkpoint's): success (greedy), reward."""
    greedy = results.get("greedy_success")
    return (f"success {_fmt('success', results.get('success'))}"
            + ("" if greedy is None else f" (greedy {greedy:.1%})")
            + f", reward {_fmt('mean_reward', results.get('mean_reward'))}")
