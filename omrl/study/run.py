"""`omrl study run` as an API: every method of a study trained per condition and seed, tuned on dev, the test set
scored once through the ledger, the seed-level figures (omrl.study.figures) written to OUT/study.json.

    result = run_study(load_study("my_study.yaml"), "runs/my_study", base=Path("."))

- Runs: the study's `recipe` (an iterate recipe, default shipped:quickstart) with the study's env, env_options
  and task sets, then the condition's overrides (any iterate key: rollout.env_options.noise, sft.epochs ...). Per condition and
  seed, iterate round 0 (expert demos on train, the recipe's model or the tiny model from its config, SFT:
  Comparison.prepare), then each method from that SFT checkpoint (RL and rft with `start: base`: from the
  starting model): base and sft train nothing, more_sft continues SFT on the demos, rft is omrl's
  RFT trainer (collect.samples attempts on the first collect.tasks train tasks), grpo / step_credit / ppo_turn /
  ppo_token are compare.train_method, iterate is `rounds` rounds of iterate's collect -> select -> GRPO.
- Budget: optimizer_steps gives RL methods max_steps (PPO: batches of ppo_epochs x minibatches updates, rounded
  down, at least 1; iterate: grpo.max_steps per round, the budget over its rounds, rounded down, at least 1),
  more_sft max_steps (TRL stops there, whatever the epochs), rft sft.max_steps; a grid may
  not tune the key the budget sets; other units are refused (UsageError). Every run records optimizer steps
  (PPO: its updates), tokens trained (TRL's num_tokens; PPO counts none), environment steps (turns played) and
  seconds; tuning runs are totalled apart, the shared SFT stage's seconds per seed too.
- Tuning, on seed 0 only (a study's grid is key -> values): per condition each grid point (their product, declared order) is
  trained and scored on dev with the primary metric (greedy or sampled); the first best is trained on every
  seed (seed 0's is its tuning run). best_rl_on_dev: the RL method with the best mean dev score over seeds.
- Test: once a condition is tuned and every seed scored on dev, each of its (method, seed) runs is recorded in the
  TestLedger under frozen_hash, then scored, and OUT/study.json is written with the conditions done so far
  (`pending_conditions` names the rest); under changed settings the run is refused before it trains, and the
  ledger refuses the scoring, unless `rescore`.
- Resume: a condition's runs live in OUT/conditions/NAME-DIGEST (its recipe and task sets), each recorded in
  its benchmark_state.json as it finishes and skipped next time; a change that trains nothing new (the
  primary contrast) reuses them. A failed run raises, never a score of 0 (no known outcome: StudyRunError).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omrl.errors import UsageError
from omrl.store.study_folder import STUDY_FILE, condition_folder
from omrl.study.check import report_head
from omrl.study.compare import (
    RL_METHODS,
    Comparison,
    label,
    optimizer_steps,
    tokens_trained,
    train_method,
    tuned_settings,
)
from omrl.study.figures import study_result
from omrl.study.ledger import RescoreRefused, TestLedger
from omrl.study.overlap import Screened
from omrl.study.plan import budget_settings, check_runnable, flatten, grid_points, unflatten
from omrl.study.spec import TRAINS_NOTHING, StudySpec, settings_hash
from omrl.study.tasksets import env_options, screened_task_sets

RL_METHOD_OF = {"grpo": "grpo", "step_credit": "grpo_step_credit", "ppo_turn": "ppo_turn",
                "ppo_token": "ppo_token"}  # a study's kind -> compare.RL_METHODS
RFT_KEYS = ("samples", "threshold", "keep_per_group")  # rft grid keys of the RFT recipe itself (the rest: sft.*)
Log = Callable[[str], None]


class StudyRunError(UsageError):
    """A run that gave no figure (an evaluation with no known outcome): an error, never a score of 0."""


# ---------------------------------------------------------------- the runs of one condition

def digest(value: Any) -> str:
    """12 hex digits of sha256 over `value` as canonical JSON."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def base_recipe(spec: StudySpec, base: Path | None = None) -> dict[str, Any]:
    """The iterate recipe (as a mapping) every run of the study starts from: the study's `recipe` (a path
    relative to `base`, the study file's folder, or shipped:NAME; its `model`, or the tiny model when it names
    none) with the study's environment and options; every dev task evaluated."""
    from omrl.config import read_yaml
    from omrl.study.spec import task_source

    source, _ = task_source(spec.recipe, base)  # the same path rule as the task sets, without a row slice
    data = read_yaml(source)
    data["rollout"] = {**data.get("rollout", {}), "env": spec.env, "env_options": env_options(spec)}
    data["eval"] = {**data.get("eval", {}), "tasks": 0}
    return data


def condition_bench(spec: StudySpec, condition: Any, out: Path, screened: Screened,
                    base: Path | None = None) -> Comparison:
    """The Comparison of one condition: its folder named by its recipe and task sets (a change of either is
    a new folder, never a mix), the screened task sets written there."""
    from omrl.tasks import write_tasks

    recipe = base_recipe(spec, base)
    overrides = [f"{key}={json.dumps(value)}" for key, value in flatten(condition.overrides).items()]
    sets = {split: getattr(screened, split) for split in ("train", "dev", "test")}
    rows = {split: [t.to_row() for t in tasks] for split, tasks in sets.items()}
    folder = condition_folder(out, condition.name, digest([recipe, overrides, rows]))
    files = {split: folder / "tasks" / f"{split}.parquet" for split in sets}
    for split, tasks in sets.items():
        if not files[split].exists():
            write_tasks(tasks, files[split])
    recipe = {**recipe, "train_tasks": str(files["train"]), "eval_tasks": str(files["dev"])}
    return Comparison(folder, recipe, overrides, list(range(spec.seeds)), sets["test"])


def run_name(method: Any, settings: dict[str, Any]) -> str:
    """A run's name in the state file and its folder: the method's name and its settings (budget included)."""
    text = label(settings)
    return f"{method.name}-{text}" if text else method.name


def env_steps(store: Any, run_id: str) -> int:
    """Environment steps (turns) of the episodes stored under run `run_id` and its sub-runs."""
    from omrl.store.query import quote_literal

    rows = store.sql(f"SELECT COALESCE(SUM(num_turns), 0) AS n FROM trajectories WHERE run_id = "
                     f"{quote_literal(run_id)} OR starts_with(run_id, {quote_literal(run_id + '/')})").to_pylist()
    return int(rows[0]["n"]) if rows else 0


def compute(updates: int, tokens: int | None, turns: int, seconds: float) -> dict[str, Any]:
    """A run's compute in every budget unit: optimizer steps, tokens trained, environment steps, seconds."""
    return {"optimizer_steps": updates, "tokens": tokens, "env_steps": turns, "seconds": round(seconds, 1)}


def train_run(bench: Comparison, method: Any, seed: int, settings: dict[str, Any]) -> dict[str, Any]:
    """The run of `method` on `seed` with dotted `settings` (grid point and budget), trained once from the seed's
    SFT checkpoint, or its starting model with `start: base` (recorded, skipped when done): {run, checkpoint,
    settings, compute}."""
    sft = bench.prepare(seed)
    name = run_name(method, settings)
    if method.kind in TRAINS_NOTHING:  # a checkpoint of the shared stages itself: nothing more is trained
        checkpoint = sft["checkpoint"] if method.kind == "sft" else bench.base(seed)
        return {"run": name, "checkpoint": checkpoint, "settings": {}, "compute": compute(0, 0, 0, 0.0)}
    start = sft["checkpoint"] if method.start == "sft" else bench.base(seed)
    record = bench.record(f"seed{seed}/train/{name}", lambda: _train(bench, method, seed, name, settings, start))
    return {"run": name, "checkpoint": record["checkpoint"], "settings": settings, "compute": record["compute"]}


def _train(bench: Comparison, method: Any, seed: int, name: str, settings: dict[str, Any],
           start: str) -> dict[str, Any]:
    """Train one run from checkpoint `start` (see train_run); its record for the state file."""
    recipe, store = bench.recipes[seed], bench.stores[seed]
    folder = Path(recipe.output_dir) / "study" / name
    started = time.monotonic()
    if method.kind == "more_sft":
        from omrl.train.algorithms.sft import train_sft
        from omrl.train.iterate.run import demo_where

        more = recipe.sft.to_recipe(seed=recipe.seed, model=start, store=str(store.path), where=demo_where(recipe),
                                    output_dir=str(folder), **unflatten(settings))
        trained = train_sft(more, store=store)
        done = compute(optimizer_steps(trained), tokens_trained(trained), 0, time.monotonic() - started)
        return {"checkpoint": str(trained.checkpoint), "compute": done}
    if method.kind == "rft":
        return _train_rft(recipe, store, name, settings, start, folder, started)
    if method.kind == "iterate":
        return _train_iterate(recipe, store, name, settings, start, folder, started)
    trained = train_method(recipe, RL_METHOD_OF[method.kind], rl_settings(method.kind, settings), start,
                           store.path, folder, name)
    done = compute(trained["optimizer_steps"], trained["tokens"], env_steps(store, trained["run_prefix"]),
                   time.monotonic() - started)
    return {"checkpoint": trained["checkpoint"], "run_prefix": trained["run_prefix"], "compute": done}


def rl_settings(kind: str, settings: dict[str, Any]) -> dict[str, Any]:
    """Dotted settings as train_method takes them: nested, step credit's tuned keys over the method's fixed ones."""
    nested = unflatten(settings)
    fixed = RL_METHODS[RL_METHOD_OF[kind]][1]
    if "step_credit" in nested and "step_credit" in fixed:
        nested["step_credit"] = {**fixed["step_credit"], **nested["step_credit"]}
    return nested


def _train_rft(recipe: Any, store: Any, name: str, settings: dict[str, Any], start: str, folder: Path,
               started: float) -> dict[str, Any]:
    """RFT from checkpoint `start`: the recipe's collect.samples attempts on its first collect.tasks training
    tasks (seeded as round 1), the best successes kept, SFT on them with the recipe's sft section."""
    from omrl.config import from_dict, to_dict
    from omrl.tasks import load_tasks, write_tasks
    from omrl.train.config.iterate import round_seed
    from omrl.train.config.rft import RFTRecipe
    from omrl.train.trainer import TRAINERS

    nested = unflatten(settings)
    own = {key: nested.pop(key) for key in RFT_KEYS if key in nested}
    tasks = load_tasks(recipe.train_tasks)[: recipe.collect.tasks or None]
    tasks_file = write_tasks(tasks, folder / "tasks.parquet")
    values = {"model": start, "tasks": str(tasks_file), "output_dir": str(folder), "store": str(store.path),
              "seed": recipe.seed + 1, "round": 1, "run_id": name, "samples": recipe.collect.samples,
              "rollout": {**to_dict(recipe.rollout), "seed": round_seed(recipe.rollout.seed, 1)},
              # the grid's other keys (learning_rate, sft.epochs ...) tune the SFT on the kept attempts
              "sft": {**to_dict(recipe.sft), **nested.pop("sft", {}), **nested}, **own}
    trained = TRAINERS.load("rft").train(from_dict(RFTRecipe, values, where=f"rft run {name}"), store=store)
    done = compute(optimizer_steps(trained), tokens_trained(trained), env_steps(store, name),
                   time.monotonic() - started)
    return {"checkpoint": str(trained.checkpoint), "compute": done, "attempts": trained.rollouts}


def _train_iterate(recipe: Any, store: Any, name: str, settings: dict[str, Any], start: str, folder: Path,
                   started: float) -> dict[str, Any]:
    """Iterate from checkpoint `start`: `rounds` rounds, each iterate's collect -> select (the tasks whose group
    is not flat) -> GRPO for grpo.max_steps on them, from the last round's checkpoint; every rollout stored under
    run `name`/round-N."""
    from omrl.config import from_dict, merge, to_dict
    from omrl.tasks import load_tasks
    from omrl.train.config.iterate import IterateRecipe
    from omrl.train.iterate.run import collect_and_select

    values = merge(merge(to_dict(recipe), unflatten(settings)),  # the grid point and the budget over the recipe
                   {"algorithm": "grpo", "collect": {"enabled": True}, "output_dir": str(folder)})
    run = from_dict(IterateRecipe, values, where=f"iterate run {name}")
    train_tasks = load_tasks(run.train_tasks)
    checkpoint, steps, tokens = start, 0, 0
    for r in range(1, run.rounds + 1):
        round_dir = folder / f"round-{r}"
        tasks_file, _ = collect_and_select(run, checkpoint, train_tasks, store, r, round_dir, f"{name}/round-{r}")
        trained = train_method(run, "grpo", {"tasks": tasks_file}, checkpoint, store.path, round_dir / "grpo",
                               f"{name}/round-{r}/grpo", round_=r)
        checkpoint = trained["checkpoint"]
        steps += trained["optimizer_steps"]
        tokens = tokens + trained["tokens"] if tokens is not None and trained["tokens"] is not None else None
    done = compute(steps, tokens, env_steps(store, name), time.monotonic() - started)
    return {"checkpoint": checkpoint, "compute": done}


def evaluate(bench: Comparison, seed: int, split: str, run: dict[str, Any]) -> dict[str, Any]:
    """A run's success on dev or test, greedy and sampled where evaluated, with each task's success:
    {greedy, sampled, per_task: {mode: {task: success}}}; StudyRunError when no outcome is known."""
    record = bench.evaluate(seed, split, run["run"], run["checkpoint"])
    results = record["results"]
    figures = {"sampled": results.get("success"), "greedy": results.get("greedy_success")}
    for mode in ("sampled", "greedy") if bench.recipes[seed].eval.greedy else ("sampled",):
        if figures[mode] is None or not record["per_task"].get(mode):
            raise StudyRunError(f"seed {seed}, run {run['run']}: no {mode} {split} episode has a known outcome "
                                f"({results.get(f'{mode}_episodes' if mode == 'greedy' else 'episodes')} "
                                "episodes): the run failed, it is not a score of 0")
    return {**figures, "per_task": record["per_task"]}


def dev_score(dev: dict[str, Any], metric: str) -> float:
    """What tuning maximises: dev success on the primary contrast's metric (the headline's figure)."""
    if dev.get(metric) is None:
        raise StudyRunError(f"no {metric} dev success: the recipe evaluates greedily only with eval.greedy true")
    return dev[metric]


def tune(bench: Comparison, spec: StudySpec, method: Any, log: Log) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the chosen grid point, every point's record) of `method`: each point trained on seed 0 at the study's
    budget and scored on dev by the primary metric; the first best wins."""
    recipe, metric = bench.recipes[0], spec.primary.metric
    chosen, best, rows = {}, None, []
    for point in grid_points(method.grid):
        run = train_run(bench, method, 0, {**point, **budget_settings(spec, method.kind, recipe, point)})
        dev = evaluate(bench, 0, "dev", run)
        score = dev_score(dev, metric)
        rows.append({"settings": point, "run": run["run"], "dev_greedy": dev["greedy"], "dev_sampled": dev["sampled"],
                     "dev_score": score, "compute": run["compute"]})
        log(f"tune {run['run']} (seed 0): dev {metric} {score:.1%}")
        if best is None or score > best:
            chosen, best = point, score
    return chosen, rows


def run_condition(bench: Comparison, spec: StudySpec, log: Log) -> dict[str, Any]:
    """Tuning on seed 0, then every method's chosen settings on every seed, scored on dev; per method {kind,
    chosen, trained_with (an RL method's tuned knobs as its runs had them), tuning, runs: {seed: {run,
    checkpoint, settings, compute, dev}}}."""
    methods: dict[str, Any] = {}
    for method in spec.methods:
        chosen, tuning = tune(bench, spec, method, log)
        knobs = (tuned_settings(bench.recipes[0], RL_METHOD_OF[method.kind], rl_settings(method.kind, chosen))
                 if method.kind in RL_METHOD_OF else None)
        methods[method.name] = {"kind": method.kind, "chosen": chosen, "trained_with": knobs, "tuning": tuning,
                                "runs": {}}
    for seed in range(spec.seeds):
        for method in spec.methods:
            entry = methods[method.name]
            recipe = bench.recipes[seed]
            settings = {**entry["chosen"], **budget_settings(spec, method.kind, recipe, entry["chosen"])}
            run = train_run(bench, method, seed, settings)
            entry["runs"][seed] = {**run, "dev": evaluate(bench, seed, "dev", run)}
            log(f"seed {seed} {run['run']}: dev {spec.primary.metric} {run_dev(entry, seed, spec):.1%}")
    return methods


def run_dev(entry: dict[str, Any], seed: int, spec: StudySpec) -> float:
    """A method's dev score on one seed (the primary metric)."""
    return entry["runs"][seed]["dev"][spec.primary.metric]


def score_tests(bench: Comparison, spec: StudySpec, condition: str, methods: dict[str, Any], ledger: TestLedger,
                settings: str, rescore: bool, log: Log) -> None:
    """Each (method, seed) of a condition scored on test, recorded in the ledger before it is scored."""
    for name, entry in methods.items():
        for seed, run in entry["runs"].items():
            ledger.record(settings, {"condition": condition, "method": name, "seed": seed, "run": run["run"]},
                          rescore=rescore)
            run["test"] = evaluate(bench, seed, "test", run)
            log(f"seed {seed} {run['run']}: test {spec.primary.metric} {run['test'][spec.primary.metric]:.1%}")


# ---------------------------------------------------------------- the study

def preflight(ledger: TestLedger, settings: str, rescore: bool) -> None:
    """RescoreRefused before anything trains when the test set was scored under other settings (the ledger would
    refuse the scoring at the end: the runs would be wasted)."""
    hashes = list(dict.fromkeys(e["settings_hash"] for e in ledger.entries()))
    if hashes and settings not in hashes and not rescore:
        raise RescoreRefused(f"{ledger.path}: the test set was scored under settings {hashes[0]}; these settings "
                             f"are {settings}: pass --rescore (rescore=True) to score it again (test_scorings "
                             f"becomes {len(hashes) + 1})")


def frozen_hash(spec: StudySpec, base: Path | None, screened: Screened) -> str:
    """What the test ledger keys scorings by: the study file's settings_hash and the contents of the files it
    names (its recipe, its task sets as screened), so editing a named file after the test set was scored is a
    change of settings too, not a redo."""
    rows = {split: [t.to_row() for t in getattr(screened, split)] for split in ("train", "dev", "test")}
    return f"{settings_hash(spec)}-{digest([base_recipe(spec, base), rows])}"


def run_study(spec: StudySpec, out: str | Path, base: Path | None = None, rescore: bool = False, *,
              on_report: Callable[[dict[str, Any]], None] | None = None, log: Log | None = None) -> dict[str, Any]:
    """Run (or resume) `spec` into folder `out` (its relative task paths read from `base`) and return what
    OUT/study.json holds (as JSON: seed keys are text). `on_report` gets the overlap report first (OverlapError
    before it on a held-out task seen in train, unless drop_overlaps); `log` gets a line per tuning point and
    run. RescoreRefused when the test set was scored under other settings, unless `rescore`."""
    from omrl.rollout import shared_engines

    say = log or (lambda message: None)
    started = time.monotonic()
    out = Path(out)
    check_runnable(spec)
    screened, fingerprints = screened_task_sets(spec, base)
    report = {**report_head(spec), **screened.report}
    if on_report is not None:
        on_report(report)
    settings = frozen_hash(spec, base, screened)
    ledger = TestLedger(out)
    preflight(ledger, settings, rescore)
    benches, trained = {}, {}
    result: dict[str, Any] = {}
    with shared_engines():
        for condition in spec.conditions:  # in declared order: the primary's condition is best declared first
            name = condition.name
            benches[name] = condition_bench(spec, condition, out, screened, base)
            say(f"condition {name}: runs in {benches[name].out}")
            trained[name] = run_condition(benches[name], spec, say)
            # every choice of this condition is frozen now (tuned, dev-scored on every seed), and nothing a later
            # condition chooses reads test: its test set is scored here, so a study cut short by its budget
            # still has finished conditions to report (study.json says which are pending)
            score_tests(benches[name], spec, name, trained[name], ledger, settings, rescore, say)
            stages = {done: sft_stage(bench) for done, bench in benches.items()}
            result = study_result(spec, report, trained, fingerprints, ledger, stages)
            result["ledger_hash"] = settings  # settings_hash plus the named files' contents (frozen_hash)
            result["minutes"] = round((time.monotonic() - started) / 60, 2)
            result = write_result(out, result)
    return result


def write_result(out: Path, result: dict[str, Any]) -> dict[str, Any]:
    """OUT/study.json written whole (a crash mid-write leaves the previous file), returned as the file holds it
    (seeds as text keys): the API and study.json agree."""
    text = json.dumps(result, indent=1, default=str)
    out.mkdir(parents=True, exist_ok=True)
    partial = out / f"{STUDY_FILE}.tmp"
    partial.write_text(text)
    partial.replace(out / STUDY_FILE)
    return json.loads(text)


def sft_stage(bench: Comparison) -> dict[int, dict[str, Any]]:
    """Per seed the cost of the SFT every method starts from (shared, so in no method's budget)."""
    return {seed: {"seconds": record.get("train_s"), "epochs": record.get("epochs")}
            for seed, record in sorted(bench.prepared.items())}
