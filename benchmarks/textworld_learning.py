"""Learning on TextWorldExpress Coin, as a study: recipes/studies/coin.yaml run by `omrl study` (omrl.study.run), its
figures printed as one JSON line.

    nice -n 19 python benchmarks/textworld_learning.py --out ~/omrl-studies/coin   # hours on 2 cores; resumable
    python benchmarks/textworld_learning.py --quick --out runs/coin-quick          # the CI run (coin_quick): minutes
    python benchmarks/textworld_learning.py --study my_study.yaml --out runs/mine   # any study file

Nothing here trains or scores: run_study does (tuning on dev, every seed, the test set scored once through the
study's ledger, resumable from OUT after any interruption), and this script reshapes OUT/study.json. The line
holds, per condition and method, each seed's held-out success (greedy and sampled, fractions), their seed-level
mean and 95% t interval, the paired two-level bootstrap difference to sft and to more_sft on the primary metric
(points, 95% interval), the seeds won against more_sft, each seed's compute (optimizer steps, tokens trained,
environment steps, seconds) and the method's tuning runs' compute; and the study's primary_contrast_points,
primary_contrast_ci95, seeds, distinct_test_tasks, test_train_overlap, dev_test_overlap, test_scorings and the
conditions still pending. `omrl report OUT` draws the table, the per-seed dots and the learning curves.

It replaces the earlier benchmark of the same name, whose held-out games repeated train games and whose test set
was scored in several runs while the design changed (docs/results/textworld_learning.md says what it showed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STUDY = "shipped:studies/coin"
QUICK = "shipped:studies/coin_quick"
STUDY_KEYS = ("study", "settings_hash", "primary", "best_rl_on_dev", "primary_contrast_points",
              "primary_contrast_ci95", "seeds", "distinct_test_tasks", "test_train_overlap", "dev_test_overlap",
              "test_scorings", "pending_conditions", "minutes")


def _points(figure: dict[str, Any] | None) -> dict[str, Any] | None:
    """A bootstrap difference (fractions) in points: {vs, points, ci95}."""
    from omrl.study.figures import in_points

    return {"vs": figure["method"], **in_points(figure)} if figure else None


def _interval(figure: dict[str, Any]) -> list[float] | None:
    width = figure["half_width"]
    return None if width is None else [round(figure["mean"] - width, 4), round(figure["mean"] + width, 4)]


def method_line(entry: dict[str, Any], tuning: dict[str, Any] | None) -> dict[str, Any]:
    """One method's figures from study.json (omrl.study.figures.method_figures) as the benchmark prints them."""
    test = entry["test"]
    return {"kind": entry["kind"], "chosen": entry["chosen"],
            "per_seed": {mode: {seed: round(v, 4) for seed, v in figure["per_seed"].items()}
                         for mode, figure in test.items()},
            "mean": {mode: round(figure["mean"], 4) for mode, figure in test.items()},
            "t_ci95": {mode: _interval(figure) for mode, figure in test.items()},
            "vs_sft": _points(entry.get("vs_sft")), "vs_more_sft": _points(entry.get("vs_more_sft")),
            "seeds_won_vs_more_sft": entry.get("seeds_won_vs_more_sft"),
            "compute": {seed: run["compute"] for seed, run in entry["runs"].items()},
            "tuning_compute": tuning}


def benchmark_line(study: dict[str, Any]) -> dict[str, Any]:
    """The one JSON line: the study's headline keys, then per condition and method its figures."""
    line = {key: study.get(key) for key in STUDY_KEYS}
    line["conditions"] = {
        name: {"best_rl_on_dev": condition["best_rl_on_dev"],
               "methods": {method: method_line(entry, (study.get("tuning_compute") or {}).get(name, {}).get(method))
                           for method, entry in condition["methods"].items()}}
        for name, condition in study["conditions"].items()}
    return line


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", default=None, help=f"a study file or shipped:studies/NAME (default {STUDY})")
    parser.add_argument("--quick", action="store_true", help=f"the tiny study of the CI run ({QUICK})")
    parser.add_argument("--out", default=None, help="the study's folder (default runs/textworld_learning[_quick])")
    parser.add_argument("--rescore", action="store_true", help="score the test set again under changed settings "
                                                               "(the ledger counts it: test_scorings grows)")
    args = parser.parse_args(argv)
    if args.quick and args.study:
        parser.error("--quick is a study of its own: give --quick or --study, not both")

    from omrl.study.check import study_folder_of
    from omrl.study.run import run_study
    from omrl.study.spec import load_study

    name = args.study or (QUICK if args.quick else STUDY)
    out = Path(args.out or ROOT / "runs" / ("textworld_learning_quick" if args.quick else "textworld_learning"))
    study = run_study(load_study(name), out, study_folder_of(name), rescore=args.rescore,
                      log=lambda message: print(message, file=sys.stderr, flush=True))
    line = benchmark_line(study)
    print(json.dumps(line))
    return line


if __name__ == "__main__":
    main()
