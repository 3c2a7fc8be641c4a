"""A study's runs in one of its seed stores, grouped by method for the runs page.

    rows = study_runs(reader.runs()["rounds"], store_path)   # [] for a store with no study runs

`omrl study run` names every run after its method (omrl.study.run.run_name: METHOD-SETTINGS) and stores, per
seed, the training rollouts under that name (GRPO/PPO: NAME/round-1/step-N; RFT: NAME) and each evaluation as
stage SPLIT-NAME (omrl.train.iterate.evaluation.eval_run_id: eval-SPLIT-NAME-MODE_tT); SFT and the base model are evaluated as iterate stages
(eval-dev-sft-..., eval-test-base-...). A row per (method, run): training episodes and success, dev and test
success sampled and greedy. The seed is the store's (its folder is OUT/conditions/NAME-DIGEST/seed-N/store).

    seeds = study_seeds(store_path)   # every seed of this store's condition, once OUT/study.json has it

Every seed side by side (each method's test success on the primary metric per seed, its mean and t interval, and
its dev mean) comes from OUT/study.json, written once the condition's test set is scored; `omrl report OUT`
draws the whole study.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omrl.schema.outcomes import SuccessCounts
from omrl.store.query import quote_literal
from omrl.store.study_folder import STUDY_FILE, condition_name, condition_of_store, store_seed, study_out
from omrl.train.iterate.evaluation import parse_eval_run_id

_SPLITS = ("dev", "test")
MAX_SEEDS = 1000  # columns of the every-seed table


def study_runs(rounds: list[dict[str, Any]], store_path: str | Path | None = None) -> list[dict[str, Any]]:
    """Rows of the runs page's per-run-and-round table grouped by the study run they belong to: {method, run,
    seed, train_episodes, train_success, dev_sampled, dev_greedy, test_sampled, test_greedy, where (a filter of
    the trajectory list on the run's episodes)}; [] when the store holds no study evaluation (eval-dev-...)."""
    runs: dict[str, dict[str, Any]] = {}
    evals: dict[str, list[str]] = {}  # run -> the run ids of its evaluations
    counts: dict[tuple[str, str], list[int]] = {}  # (run, column) -> [episodes, solved, known, failed, unknown]
    for row in rounds:
        run_id = str(row.get("run_id") or "")
        split, run, column = _study_eval(run_id)
        if split is not None:
            evals.setdefault(run, []).append(run_id)
        elif run_id.startswith("eval-") or run_id == "demos" or row.get("expert"):
            continue  # an iterate stage's own evaluation (the expert's, round 0's) or the demos
        else:
            run, column = run_id.split("/")[0], "train"
        entry = runs.setdefault(run, {"method": run.split("-")[0], "run": run, "train_episodes": 0})
        n, failed, unknown = int(row.get("n") or 0), int(row.get("failed") or 0), int(row.get("unknown_success") or 0)
        if column == "train":
            entry["train_episodes"] += n
        known = n - failed - unknown
        # the row's rate is over its known episodes (omrl.schema.outcomes), rounded for display: its solved count
        solved = round(float(row["success_rate"]) * known) if row.get("success_rate") is not None else 0
        for i, value in enumerate((n, solved, known, failed, unknown)):
            counts.setdefault((run, column), [0] * 5)[i] += value
    if not evals:
        return []
    seed = store_seed(store_path)
    out = []
    for run, entry in runs.items():
        rates = {column: SuccessCounts(*totals).rate for (name, column), totals in counts.items() if name == run}
        out.append({**entry, "seed": seed, "train_success": rates.get("train"), "where": _where(run, evals.get(run, [])),
                    **{f"{split}_{mode}": rates.get(f"{split}_{mode}") for split in _SPLITS
                       for mode in ("sampled", "greedy")}})
    return sorted(out, key=lambda r: (r["method"], r["run"]))


def study_seeds(store_path: str | Path | None) -> dict[str, Any] | None:
    """Every seed of the study condition this seed store belongs to, from OUT/study.json: {study, condition, metric,
    seeds, rows: [{method, kind, per_seed: [test success or None, seed by seed], mean, half_width, dev_mean}]};
    None for a store that is not a study's seed store or whose condition is not done yet; {error} for a study.json
    that cannot be read."""
    condition_folder = condition_of_store(store_path)
    if condition_folder is None:
        return None
    path = study_out(condition_folder) / STUDY_FILE
    if not path.is_file():
        return None
    try:
        study = json.loads(path.read_text(encoding="utf-8"))
        metric = study["primary"]["metric"]
        condition = condition_name(condition_folder)
        methods = (study["conditions"].get(condition) or {}).get("methods")
        if not methods:
            return None  # the condition's test set is not scored yet
        seeds = int(study["seeds"])
        if not 0 < seeds <= MAX_SEEDS:  # a crafted file does not make a page of a million columns
            raise ValueError(f"seeds {seeds} is not between 1 and {MAX_SEEDS}")
        rows = []
        for name, entry in methods.items():
            test, dev = entry["test"].get(metric) or {}, entry["dev"].get(metric) or {}
            per_seed = test.get("per_seed", {})
            rows.append({"method": name, "kind": entry["kind"], "mean": test.get("mean"),
                         "half_width": test.get("half_width"), "dev_mean": dev.get("mean"),
                         "per_seed": [per_seed.get(str(seed), per_seed.get(seed)) for seed in range(seeds)]})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return {"error": f"{path}: {type(exc).__name__}: {exc}"}
    return {"study": study.get("study"), "condition": condition, "metric": metric, "seeds": seeds, "rows": rows}


def _study_eval(run_id: str) -> tuple[str | None, str, str]:
    """(split, run, column) of a study's dev or test evaluation run id; (None, "", "") for any other."""
    parsed = parse_eval_run_id(run_id)
    if parsed is None:
        return None, "", ""
    stage, mode = parsed
    split, _, run = stage.partition("-")
    return (split, run, f"{split}_{mode}") if split in _SPLITS and run else (None, "", "")


def _where(run: str, evals: list[str]) -> str:
    """The trajectory list's filter for one study run: its training rollouts and its evaluations."""
    name = quote_literal(run)
    parts = [f"run_id = {name}", f"starts_with(run_id, {quote_literal(run + '/')})"]
    if evals:
        parts.append(f"run_id IN ({', '.join(quote_literal(e) for e in sorted(evals))})")
    return " OR ".join(parts)
