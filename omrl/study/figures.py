"""A study's figures (omrl.study.run writes them to study.json): per condition and method the per-seed dev and test
success, the seed-level mean and t interval (omrl.study.stats), the paired two-level bootstrap differences to sft
and more_sft, the seeds won against more SFT, best_rl_on_dev and the primary contrast; the table and the
headline line `omrl study run` prints.

A method's runs, as omrl.study.run.run_condition makes them: {kind, chosen, tuning, runs: {seed: {run,
settings, compute, dev, test}}}, dev and test each {greedy, sampled, per_task: {mode: {task id: success}}}.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from omrl.study.ledger import TestLedger
from omrl.study.spec import BEST_RL_ON_DEV, RL_KINDS, StudySpec, settings_hash
from omrl.study.stats import bootstrap_difference, seeds_won, summarise

MODES = ("greedy", "sampled")


def results_of(entry: dict[str, Any], split: str, mode: str) -> dict[int, dict[str, float]]:
    """{seed: {task: success}} of a method on a split in a mode, for omrl.study.stats."""
    return {seed: run[split]["per_task"][mode] for seed, run in entry["runs"].items()
            if run[split]["per_task"].get(mode)}


def best_rl_on_dev(methods: dict[str, Any], metric: str) -> str | None:
    """The RL method with the best mean dev score over seeds (the first declared on a tie); None without one."""
    best, score = None, None
    for name, entry in methods.items():
        if entry["kind"] not in RL_KINDS:
            continue
        mean = sum(run["dev"][metric] for run in entry["runs"].values()) / len(entry["runs"])
        if score is None or mean > score:
            best, score = name, mean
    return best


def method_figures(methods: dict[str, Any], name: str, groups: dict[str, dict[str, str]],
                   metric: str) -> dict[str, Any]:
    """A method's figures: per seed dev and test success, the seed-level mean and t interval per split and mode,
    the paired bootstrap differences to base, sft and more_sft where the study has them (the contrast's metric)
    and the seeds won vs more_sft."""
    entry = methods[name]
    figures: dict[str, Any] = {key: entry[key] for key in ("kind", "chosen", "trained_with", "tuning")}
    for split in ("dev", "test"):
        figures[split] = {mode: summarise(results_of(entry, split, mode), groups[split])
                          for mode in MODES if results_of(entry, split, mode)}
    figures["runs"] = {seed: {"run": run["run"], "settings": run["settings"], "compute": run["compute"],
                              **{f"{split}_{mode}": run[split][mode] for split in ("dev", "test") for mode in MODES}}
                       for seed, run in entry["runs"].items()}
    test = results_of(entry, "test", metric)
    for kind in ("base", "sft", "more_sft"):
        other = next((n for n, e in methods.items() if e["kind"] == kind), None)
        if other is not None and other != name:
            figures[f"vs_{kind}"] = {"method": other, **bootstrap_difference(test, results_of(methods[other], "test",
                                                                                             metric), groups["test"])}
            if kind == "more_sft":
                figures["seeds_won_vs_more_sft"] = seeds_won(test, results_of(methods[other], "test", metric),
                                                             groups["test"])
    return figures


def primary_contrast(spec: StudySpec, conditions: dict[str, dict[str, Any]],
                     groups: dict[str, dict[str, str]]) -> dict[str, Any]:
    """The declared contrast, a minus b on test in its condition, in points: {a, b, points, ci95 (points)}."""
    methods = conditions[spec.primary.condition]
    metric = spec.primary.metric
    names = {side: (best_rl_on_dev(methods, metric) if getattr(spec.primary, side) == BEST_RL_ON_DEV
                    else getattr(spec.primary, side)) for side in ("a", "b")}
    diff = bootstrap_difference(results_of(methods[names["a"]], "test", metric),
                                results_of(methods[names["b"]], "test", metric), groups["test"])
    return {"a": names["a"], "b": names["b"], **in_points(diff)}


def in_points(diff: dict[str, Any]) -> dict[str, Any]:
    """A bootstrap difference (fractions, omrl.study.stats) in points: {points, ci95}, 2 decimals."""
    return {"points": round(100 * diff["difference"], 2), "ci95": [round(100 * x, 2) for x in diff["ci"]]}


def study_table(result: dict[str, Any]) -> Any:
    """A rich table, method x condition: test success on the primary metric, mean +- t interval, and per seed."""
    from rich.table import Table

    metric = result["primary"]["metric"]
    table = Table(title=f"{result['study']}: test {metric} success, mean +- 95% t interval over "
                        f"{result['seeds']} seeds (per seed)")
    table.add_column("method")
    conditions = result["conditions"]
    for condition in conditions:
        table.add_column(condition, justify="right")
    names = list(next(iter(conditions.values()))["methods"])
    for name in names:
        cells = []
        for condition in conditions.values():
            figure = condition["methods"][name]["test"].get(metric)
            if figure is None:
                cells.append("-")
                continue
            width = figure["half_width"]
            seeds = ", ".join(f"{v:.0%}" for v in figure["per_seed"].values())
            cells.append(f"{figure['mean']:.1%} ± {'-' if width is None else f'{width:.1%}'} ({seeds})")
        table.add_row(name, *cells)
    return table


HEADLINE = ("study", "settings_hash", "primary", "best_rl_on_dev", "primary_contrast_points", "primary_contrast_ci95",
            "seeds", "distinct_test_tasks", "test_train_overlap", "dev_test_overlap", "test_scorings",
            "pending_conditions", "minutes")


def headline(result: dict[str, Any]) -> dict[str, Any]:
    """The fields of a study's one-line summary."""
    return {key: result.get(key) for key in HEADLINE}


def study_result(spec: StudySpec, report: dict[str, Any], trained: dict[str, dict[str, Any]],
                 fingerprints: dict[str, dict[str, str]], ledger: TestLedger,
                 sft_stages: dict[str, dict[int, Any]]) -> dict[str, Any]:
    """What study.json holds: the spec, its hash, the overlap report, per condition done the shared SFT stage's
    cost per seed, best_rl_on_dev and per method its figures (method_figures), the primary contrast (None until
    its condition is done), the conditions still pending and the ledger's count of test scorings."""
    metric = spec.primary.metric
    conditions = {name: {"best_rl_on_dev": best_rl_on_dev(methods, metric), "sft_stage": sft_stages[name],
                         "methods": {m: method_figures(methods, m, fingerprints, metric) for m in methods}}
                  for name, methods in trained.items()}
    # a study cut short: the primary's condition may not be done yet (no contrast to report, not a 0)
    contrast = (primary_contrast(spec, trained, fingerprints) if spec.primary.condition in trained
                else {"a": None, "b": None, "points": None, "ci95": None})
    tuning = {name: {m: _total([row["compute"] for row in entry["tuning"]]) for m, entry in methods.items()}
              for name, methods in trained.items()}
    return {"study": spec.name, "settings_hash": settings_hash(spec), "spec": dataclasses.asdict(spec),
            "overlap": report, "primary": {**dataclasses.asdict(spec.primary), "a_resolved": contrast["a"],
                                           "b_resolved": contrast["b"]},
            "best_rl_on_dev": conditions.get(spec.primary.condition, {}).get("best_rl_on_dev"),
            "primary_contrast_points": contrast["points"], "primary_contrast_ci95": contrast["ci95"],
            "seeds": spec.seeds, "distinct_test_tasks": report["distinct_test_tasks"],
            "test_train_overlap": report["test_train_overlap"], "dev_test_overlap": report["dev_test_overlap"],
            "test_scorings": ledger.test_scorings, "conditions": conditions,
            "pending_conditions": [c.name for c in spec.conditions if c.name not in trained], "tuning_compute": tuning,
            "tuning_note": "grid points trained on seed 0 only; seed 0's final run is its chosen tuning run"}


def _total(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The compute of several runs added up per unit (tokens None when any run's are unknown)."""
    tokens = [r["tokens"] for r in runs]
    return {"optimizer_steps": sum(r["optimizer_steps"] for r in runs),
            "tokens": None if any(t is None for t in tokens) else sum(tokens),
            "env_steps": sum(r["env_steps"] for r in runs), "seconds": round(sum(r["seconds"] for r in runs), 1),
            "runs": len(runs)}
