"""Iterative training: [expert eval ->] base eval -> expert demos -> SFT -> eval -> rounds of (collect ->
filter -> GRPO [-> SFT on the best] -> eval) [-> compute-matched more-SFT baseline -> eval], every
stage's data in one store with its round number. The one orchestrator: the learning demo
(recipes/quickstart.yaml, `omrl demo`) is an iterate recipe.

    results = run_iterate(load_recipe("recipes/quickstart.yaml", IterateRecipe))

Each round r collects `collect.samples` attempts per training task with the current checkpoint (round r
in the store), drops tasks whose group is flat (every attempt scored the same: no GRPO signal), and runs
GRPO (omrl.train.grpo, rollouts by omrl's agent loop) on the tasks that are left; GRPO writes its own
rollout groups to the store with the same round. Held-out evaluation after every stage gives
`results.json`: [{"stage": "expert" | "base" | "sft" | "grpo-1" ... | "sft-more", "success", "success_ci95",
"mean_reward", "greedy_success", "greedy_mean_reward", "tasks", "samples", "train_s", "minutes", ...}].
With `collect.enabled: false` a round is GRPO alone on the whole training file (TRL draws the tasks).
The baselines: `baseline.expert` scores the scripted expert itself on the held-out tasks (the imitation
ceiling); `baseline.more_sft` continues SFT from the SFT checkpoint for the wall time the GRPO rounds
took (in SFT epochs, or `more_sft_epochs`): without it a GRPO gain can be SFT that had not finished.

Update step: `algorithm: grpo` (default; the `grpo` section, with `step_credit` for GiGPO-style step
credit) or `algorithm: ppo` (the `ppo` section: a critic and GAE, omrl/train/ppo.py): the registered trainer
of that name (omrl.train.trainer.TRAINERS) with its section; its stages are named grpo-N or ppo-N.

Rewards: with `reward` (a reward recipe, omrl/annotate/reward.py) a round is collect -> annotate (the
recipe's metrics and judges score the collection, then its combined reward; every score stored) ->
filter (ranked by it) -> GRPO (scored online by the same recipe) -> eval; the round's results carry the
judge's calls, cache hits, tokens and cost.

Ray: with `ray: auto|HOST:PORT|local` every collect and eval stage (demos, each round's collection, the
held-out evaluations) plays its episodes on a Ray cluster through the executor it is given
(omrl.executor.executor_for: a RayExecutor, the rollout section's ray_* knobs), and the annotate stage's judges run
there as `omrl annotate --ray` does; training (and the online judging inside GRPO) stays in this process.

Resume: `state.json` in output_dir lists finished stages with their checkpoint and results; a killed run
started again skips them and continues from the last finished stage (collection inside a stage resumes
too: trajectory ids are deterministic).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omrl.errors import UsageError
from omrl.progress import QUIET, Reporter
from omrl.recipes import section
from omrl.rollout import RolloutSettings
from omrl.train.grpo import GRPORecipe
from omrl.train.ppo import PPORecipe
from omrl.train.rft import SFTSection

GRPOSection = section(GRPORecipe, "GRPOSection",
                      ("model", "tasks", "output_dir", "store", "round", "split", "seed", "rollout"),
                      "The GRPO settings of an iterate round (omrl/train/grpo.py); the run sets the checkpoint, "
                      "tasks, folders, round, seed and rollout.")
PPOSection = section(PPORecipe, "PPOSection",
                     ("model", "tasks", "output_dir", "store", "round", "split", "seed", "rollout"),
                     "The PPO settings of an iterate round with algorithm: ppo (omrl/train/ppo.py); the run sets "
                     "the checkpoint, tasks, folders, round, seed and rollout.")
ALGORITHMS = ("grpo", "ppo")  # the TRAINERS an iterate round's update step may be (each has its section)


@dataclass
class TinySettings:
    hidden: int = field(default=128, metadata={"help": "hidden size of the tiny model"})
    layers: int = field(default=2, metadata={"help": "transformer layers"})
    seed: int = field(default=0, metadata={"help": "seed of the random initial weights"})
    vocab_size: int = field(default=1024, metadata={"help": "BPE vocabulary size of the tokenizer trained on the spot"})
    corpus: str = field(default="default", metadata={
        "help": "what the tokenizer is trained on: default (chat format and the shipped environments' words) or "
                "demos (that plus the text of the expert demonstrations, collected first: the game's own words "
                "become single tokens, so observations are short)"})

    def __post_init__(self) -> None:
        if self.corpus not in ("default", "demos"):
            raise UsageError(f"tiny.corpus must be default or demos, got {self.corpus!r}")


@dataclass
class DemoSettings:
    enabled: bool = field(default=True, metadata={"help": "collect scripted-expert demos and SFT on them first"})
    tasks: int = field(default=0, metadata={"help": "how many training tasks get demos (0 = all)"})
    samples: int = field(default=1, metadata={"help": "expert episodes per task"})
    only_success: bool = field(default=True, metadata={"help": "SFT only on demos that reached the goal"})


@dataclass
class CollectSettings:
    enabled: bool = field(default=True, metadata={
        "help": "collect and filter before each GRPO round; false: GRPO on the whole training file"})
    tasks: int = field(default=64, metadata={"help": "training tasks attempted per round (0 = all)"})
    samples: int = field(default=8, metadata={"help": "attempts per task: the group size"})


@dataclass
class FilterSettings:
    drop_flat: bool = field(default=True, metadata={"help": "train GRPO only on tasks whose group is not flat"})
    sft_best: bool = field(default=False, metadata={"help": "also SFT on the best attempt of each group"})
    min_reward: float = field(default=1.0, metadata={"help": "reward an attempt needs to join the SFT set"})
    reward_recipe: str | dict[str, Any] | None = field(default=None, metadata={
        "help": "combined-reward recipe (omrl annotate) ranking attempts; None = the run's `reward` (else env reward)"})


@dataclass
class EvalSettings:
    tasks: int = field(default=0, metadata={"help": "held-out tasks evaluated (0 = all)"})
    samples: int = field(default=4, metadata={"help": "sampled episodes per task"})
    temperature: float = field(default=1.0, metadata={"help": "temperature of the sampled evaluation"})
    greedy: bool = field(default=True, metadata={"help": "also evaluate greedily (temperature 0, 1 episode)"})
    concurrency: int = field(default=256, metadata={"help": "episodes in flight (one evaluation is one batch)"})
    base_samples: int | None = field(default=None, metadata={
        "help": "sampled episodes per task for the starting checkpoint (None = samples); an untrained model "
                "plays to the turn limit: slow, and scores 0"})


@dataclass
class BaselineSettings:
    expert: bool = field(default=False, metadata={
        "help": "stage 'expert': the scripted expert's own held-out success (the imitation ceiling)"})
    more_sft: bool = field(default=False, metadata={
        "help": "stage 'sft-more': SFT from the SFT checkpoint for GRPO's wall time, evaluated like the rest"})
    more_sft_epochs: int | None = field(default=None, metadata={
        "help": "epochs of the more-SFT run; None = GRPO's measured seconds / the SFT run's seconds per epoch"})


def _iterate_rollout():
    return RolloutSettings(env="grid", max_turns=16, max_new_tokens=16, concurrency=64)


@dataclass
class IterateRecipe:
    """Settings of an iterative run (the learning demo is one)."""

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
    algorithm: str = field(default="grpo", metadata={
        "help": "the update step of each round: grpo (the grpo section; step_credit there for GiGPO-style "
                "step credit) or ppo (the ppo section: a critic and GAE); stages are named grpo-N or ppo-N"})
    grpo: GRPOSection = field(default_factory=GRPOSection, metadata={
        "help": "GRPO settings of each round (omrl.train.grpo); rollouts as the rollout section says"})
    ppo: PPOSection = field(default_factory=PPOSection, metadata={
        "help": "PPO settings of each round with algorithm: ppo (omrl.train.ppo); rollouts as the rollout section says"})
    sft_best: SFTSection = field(default_factory=SFTSection, metadata={"help": "SFT settings of the best-of SFT"})
    eval: EvalSettings = field(default_factory=EvalSettings, metadata={"help": "held-out evaluation"})
    baseline: BaselineSettings = field(default_factory=BaselineSettings, metadata={
        "help": "reference rows: the expert, and compute-matched more SFT"})
    threads: int | None = field(default=None, metadata={
        "help": "torch CPU threads (None: torch's default); 1 is fastest for the tiny model on a busy box"})
    report: bool = field(default=False, metadata={"help": "write the omrl report into output_dir/report at the end"})
    reward: str | dict[str, Any] | None = field(default=None, metadata={
        "help": "reward recipe (path or mapping, omrl/annotate/reward.py): its metrics and judges annotate each "
                "round's collection (annotate stage), the filter ranks by it and GRPO trains on it online, "
                "unless filter.reward_recipe / grpo.reward say otherwise; None: the env reward"})
    ray: str | None = field(default=None, metadata={
        "help": "play the collect and eval stages' episodes (demos, each round's collection, every held-out "
                "evaluation) on a Ray cluster: auto (the running one), HOST:PORT or local (start one here), as "
                "omrl collect --ray does, with the rollout section's ray_num_cpus / ray_resources / ray_workers "
                "(each worker loads its own copy of the checkpoint: a low ray_num_cpus lets it batch many "
                "episodes); the annotate stage's judges run there too; training stays in this process. None: every "
                "stage in this process. Needs "
                "`pip install omrl[ray]`"})

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise UsageError(f"algorithm must be one of {', '.join(ALGORITHMS)}, got {self.algorithm!r}")
        if self.algorithm == "ppo" and (self.reward is not None or self.grpo.reward is not None):
            # PPO trains on the environment's reward; judged rewards reach GRPO and RFT only (for now).
            raise UsageError("algorithm: ppo trains on the environment reward; remove reward / grpo.reward, "
                             "or use algorithm: grpo")
        if self.ray is not None:  # without Ray installed: say so at load time, not after SFT
            from omrl.distributed.ray_executor import require_ray

            require_ray()
        if self.reward is not None:  # a broken recipe is refused at load time, not after SFT
            from omrl.annotate.reward import load_reward_recipe

            load_reward_recipe(self.reward)

    @property
    def filter_reward(self) -> str | dict[str, Any] | None:
        """The recipe the round's annotate stage runs and its filter ranks by."""
        return self.filter.reward_recipe if self.filter.reward_recipe is not None else self.reward


def grpo_recipe(recipe: IterateRecipe, values: dict[str, Any], round: int):
    """The GRPORecipe of one round: the grpo section, the run's rollout section seeded for the round, `values`."""
    return update_recipe(recipe, "grpo", values, round)


def update_recipe(recipe: IterateRecipe, algorithm: str, values: dict[str, Any], round: int):
    """The recipe of round `round`'s update step (`algorithm`: grpo or ppo): its section of the iterate recipe,
    the run's rollout section seeded for the round, the run's reward where the section takes one, `values`."""
    from omrl.recipes import to_dict

    section = getattr(recipe, algorithm)
    rollout = {**to_dict(recipe.rollout), "seed": _round_seed(recipe.rollout.seed, round)}
    takes_reward = hasattr(section, "reward")  # GRPO trains on judged rewards; PPO on the env's
    if takes_reward and section.reward is None and recipe.reward is not None and "reward" not in values:
        values = {**values, "reward": recipe.reward}
    return section.to_recipe(seed=recipe.seed + round, rollout=rollout, **values)


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
                        round: int, samples: int | None = None) -> dict[str, Any]:
    """Held-out success and mean reward of `checkpoint`: sampled, and greedy when the recipe asks."""
    from omrl.train.rft import checkpoint_policy  # the collect stage's too (rft.collect_with_model)

    policy = checkpoint_policy(checkpoint, recipe.rollout)
    return _evaluate(recipe, policy, tasks, store, stage, round, samples, greedy=recipe.eval.greedy)


def collect_round(recipe: IterateRecipe, checkpoint: str, tasks: list, store, r: int):
    """The collect stage of round `r`: `collect.samples` attempts per task with `checkpoint` (run round-r,
    seeded for the round), in this process or on Ray (`recipe.ray`); resumes like omrl collect."""
    from dataclasses import replace

    from omrl.executor import executor_for
    from omrl.train.rft import collect_with_model

    settings = replace(recipe.rollout, seed=_round_seed(recipe.rollout.seed, r))
    return collect_with_model(checkpoint, tasks, store, settings, samples=recipe.collect.samples, round=r,
                              run_id=f"round-{r}", executor=executor_for(recipe.ray))


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

    from omrl.executor import executor_for
    from omrl.rollout import evaluate

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
        out[f"{prefix}success"] = _round(metrics.get("success_rate"))
        out[f"{prefix}mean_reward"] = _round(metrics.get("mean_reward"))  # None when every episode failed
        out[f"{prefix}episodes"] = metrics.get("episodes")
        if not prefix:
            out["success_ci95"] = success_ci95(store, run_id, round)
    return out


def eval_run_id(stage: str, mode: str, temperature: float) -> str:
    """The run id of a stage's held-out evaluation in `mode` (sampled or greedy) at `temperature`."""
    return f"eval-{stage}-{mode}_t{temperature:g}"


def eval_run_ids(recipe: IterateRecipe, stage: str) -> dict[str, str]:
    """{"sampled": run id, "greedy": run id} of the stage's evaluation as the recipe plays it."""
    return {"sampled": eval_run_id(stage, "sampled", recipe.eval.temperature), "greedy": eval_run_id(stage, "greedy", 0.0)}


def _seed_torch(seed: int) -> None:
    import torch

    torch.manual_seed(seed)


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def task_success(store, run_id: str, round_: int) -> dict[str, float]:
    """Each task's success rate in one run (omrl.schema's definition), for the tasks with a known outcome."""
    from omrl.schema import SUCCESS_SQL
    from omrl.store.query import quote_literal

    rates = store.sql(f"SELECT task_id, {SUCCESS_SQL} FROM trajectories WHERE run_id = {quote_literal(run_id)} "
                      f"AND round = {int(round_)} GROUP BY task_id ORDER BY task_id").to_pylist()
    return {r["task_id"]: r["success_rate"] for r in rates if r["success_rate"] is not None}


def success_ci95(store, run_id: str, round_: int) -> float:
    """Half-width of a 95% interval on success, counting tasks (not episodes) as the independent units."""
    import math

    means = list(task_success(store, run_id, round_).values())
    if len(means) < 2:
        return 0.0
    mean = sum(means) / len(means)
    var = sum((m - mean) ** 2 for m in means) / (len(means) - 1)
    return round(1.96 * math.sqrt(var / len(means)), 4)


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


def stage_summary(row: dict[str, Any]) -> str:
    """One line: success (greedy), reward."""
    greedy = row.get("greedy_success")
    return (f"success {_fmt('success', row.get('success'))}"
            + ("" if greedy is None else f" (greedy {greedy:.1%})")
            + f", reward {_fmt('mean_reward', row.get('mean_reward'))}")


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

    from omrl.recipes import from_dict, to_dict
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
    (out / "recipe.json").write_text(json.dumps(to_dict(recipe), indent=1))
    store = Store.create(recipe.store or out / "store")
    state = IterateState(out / "state.json")
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

        from omrl.executor import executor_for
        from omrl.policies.scripted import ScriptedPolicy
        from omrl.rollout import collect

        demo_settings = replace(recipe.rollout, max_new_tokens=None)
        return asyncio.run(collect(None, _subset(train_tasks, recipe.demos.tasks), ScriptedPolicy(), store,
                                   demo_settings, samples=recipe.demos.samples, round=0, run_id="demos",
                                   executor=executor_for(recipe.ray)))

    # Stage "base": the starting checkpoint (built offline when none is given) and its held-out score.
    if not state.done("base"):
        with shown("base", "starting checkpoint: build and evaluate"):
            model = recipe.model
            if model is None:
                from omrl.models import build_tiny_model, default_corpus

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
        from omrl.train.sft import train_sft

        with shown("sft", f"expert demonstrations, then SFT ({recipe.sft.epochs} epochs)"):
            collect_demos()
            demos = demo_success(store)
            sft = recipe.sft.to_recipe(seed=recipe.seed, model=state.checkpoint, store=str(store.path),
                                       where=where, output_dir=str(out / "sft"))
            trained = train_sft(sft, store=store, reporter=reporter)
            results = evaluate_checkpoint(recipe, str(trained.checkpoint), eval_tasks, store, "sft", round=0)
            results["expert_success"] = _round(demos)
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
        from omrl.train.sft import train_sft

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
    from omrl.tasks import write_tasks
    from omrl.train.sft import train_sft
    from omrl.train.trainer import TRAINERS

    round_dir = out / f"round-{r}"
    run_id = f"round-{r}"
    where = f"run_id = {quote_literal(run_id)} AND round = {r}"
    extra: dict[str, Any] = {}
    if recipe.collect.enabled:
        tasks = _subset(_rotate(train_tasks, (r - 1) * max(recipe.collect.tasks, 0)), recipe.collect.tasks)
        collected = collect_round(recipe, checkpoint, tasks, store, r)
        if recipe.filter_reward is not None:
            from omrl.executor import executor_for

            extra["annotate"] = annotate_round(store, recipe.filter_reward, where=where, round=r,
                                               executor=executor_for(recipe.ray))
        informative, flat = informative_tasks(store, round_dir / "informative", where=where,
                                              drop_flat=recipe.filter.drop_flat,
                                              reward_recipe=recipe.filter_reward)
        grpo_tasks = [t for t in tasks if t.id in informative]
        per_step = getattr(recipe, recipe.algorithm).tasks_per_step
        if len(grpo_tasks) < per_step:  # too few informative groups: an update step needs full steps
            grpo_tasks = tasks
        tasks_file = str(write_tasks(grpo_tasks, round_dir / "grpo_tasks.jsonl"))
        extra.update(grpo_tasks=len(grpo_tasks), train_success=_round(collected.success_rate),
                     train_mean_reward=_round(collected.mean_reward), flat_groups=flat)
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
        from omrl.train.rft import select_best

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


def annotate_round(store, reward: str | dict[str, Any], *, where: str, round: int,
                   executor: Any = None) -> dict[str, Any]:
    """The annotate stage of a round: the reward recipe's metrics and judges (through `executor`, default
    this process), then its
    combined reward, over the round's collection. Resumable: stored ok annotations are skipped and judge replies are cached, so
    a run killed here and started again asks the judge nothing it already answered."""
    from omrl.annotate.runner import annotate_with_recipe
    from omrl.executor import LOCAL

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
