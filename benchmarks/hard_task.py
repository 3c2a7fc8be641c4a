"""The harder task (walled grid): SFT, GRPO, GRPO with step credit and PPO, the same rollouts each.

    nice -n 10 python benchmarks/hard_task.py                  # the full table (tens of minutes on 2 busy cores)
    python benchmarks/hard_task.py --quick                     # a smoke run of the whole path (minutes)
    python benchmarks/hard_task.py grpo.max_steps=20 ...       # key=value overrides of recipes/hard_grid.yaml
    nice -n 10 python benchmarks/hard_task.py eval.tasks=200 eval.samples=4   # the table's evaluation (docs/results/hard_task.md)

1. `omrl train iterate` on recipes/hard_grid.yaml: the expert's held-out success, the tiny base model,
   SFT on the expert's demos, one GRPO round (stages expert, base, sft, grpo-1).
2. From the same SFT checkpoint, with the same GRPO settings and rollout seeds (omrl.study.compare.train_method):
   GRPO with step credit (omrl/train/rl/grpo_credit.py; GiGPO weight and gamma from --weight/--gamma), and PPO
   (the recipe's `ppo` section, turn-level GAE) with max_steps x tasks_per_step x samples_per_task rollouts, as
   GRPO.
3. Each is evaluated on the held-out walled tasks, sampled (eval.samples per task, temperature 1) and greedy.

GRPO with step credit is train_grpo with the recipe's `step_credit` section (rollout_func hands TRL the
per-token step advantages; omrl/train/rl/grpo_credit.py's trainer adds them to TRL's episode advantage).

Prints ONE JSON line: success per method, and points against SFT (the baseline measured in this run).
The same line is written to OUT/benchmark.json (the iterate stages' rows are in OUT/results.json; the
two extra stages resume from OUT/benchmark_state.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

QUICK = ["demos.tasks=16", "sft.epochs=1", "sft.batch_size=8", "grpo.max_steps=2", "grpo.tasks_per_step=2",
         "grpo.samples_per_task=4", "grpo.warmup_steps=0", "eval.tasks=6", "eval.samples=2", "tiny.hidden=32"]


def _row(results: dict, keep=("success", "greedy_success", "mean_reward", "greedy_mean_reward", "success_ci95",
                              "train_s")) -> dict:
    return {k: results.get(k) for k in keep}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="key=value overrides of recipes/hard_grid.yaml")
    parser.add_argument("--out", default="runs/hard_task", help="run folder (resumes the iterate stages)")
    parser.add_argument("--quick", action="store_true", help="tiny budgets: checks the path, not the numbers")
    parser.add_argument("--weight", type=float, default=1.0, help="step-credit weight (GiGPO's omega)")
    parser.add_argument("--gamma", type=float, default=0.95, help="step-credit discount per turn")
    parser.add_argument("--ppo-lr", type=float, default=None, help="PPO learning rate (default: the recipe's ppo section)")
    args = parser.parse_args(argv)

    from omrl.config import load_recipe
    from omrl.rollout import shared_engines
    from omrl.store import Store
    from omrl.study.compare import train_method
    from omrl.tasks import load_tasks
    from omrl.train.config.iterate import IterateRecipe
    from omrl.train.iterate.evaluation import evaluate_checkpoint
    from omrl.train.iterate.run import run_iterate
    from omrl.train.iterate.state import IterateState

    started = time.monotonic()
    out = Path(args.out)
    overrides = (QUICK if args.quick else []) + [f"output_dir={out}"] + list(args.overrides)
    recipe = load_recipe(ROOT / "recipes" / "hard_grid.yaml", IterateRecipe, overrides)
    stages = {r["stage"]: r for r in run_iterate(recipe)}
    sft = IterateState(out / "state.json").done("sft")["checkpoint"]
    state = IterateState(out / "benchmark_state.json")  # iterate's own state stays its own (its resume reads it)
    store = Store(out / "store")
    eval_tasks = load_tasks(recipe.eval_tasks)
    eval_tasks = eval_tasks[: recipe.eval.tasks] if recipe.eval.tasks > 0 else eval_tasks
    rollouts = recipe.grpo.max_steps * recipe.grpo.tasks_per_step * recipe.grpo.samples_per_task

    with shared_engines():
        if not state.done("grpo-credit"):
            run = train_method(recipe, "grpo_step_credit", {"step_credit": {"weight": args.weight, "gamma": args.gamma}},
                               sft, store.path, out / "grpo-credit", "grpo-credit")
            results = evaluate_checkpoint(recipe, run["checkpoint"], eval_tasks, store, "grpo-credit", round=1)
            results["train_s"] = run["train_s"]
            state.finish("grpo-credit", checkpoint=run["checkpoint"], results=results)
        if not state.done("ppo"):
            run = train_method(recipe, "ppo_turn", {} if args.ppo_lr is None else {"learning_rate": args.ppo_lr},
                               sft, store.path, out / "ppo", "ppo")
            results = evaluate_checkpoint(recipe, run["checkpoint"], eval_tasks, store, "ppo", round=1)
            results["train_s"] = run["train_s"]
            state.finish("ppo", checkpoint=run["checkpoint"], results=results)

    methods = {"expert": _row(stages["expert"]), "sft": _row(stages["sft"]), "grpo": _row(stages["grpo-1"]),
               "grpo_step_credit": _row(state.done("grpo-credit")["results"]), "ppo": _row(state.done("ppo")["results"])}

    def points(a, b):
        return None if a is None or b is None else round(100 * (a - b), 1)

    line = {
        "benchmark": "hard_task", "task": "grid_walls", "quick": args.quick, "seed": recipe.seed,
        "rollouts_per_method": rollouts, "eval_tasks": len(eval_tasks), "eval_samples": recipe.eval.samples,
        "step_credit": {"weight": args.weight, "gamma": args.gamma},
        "methods": methods,
        "vs_sft_points": {m: {"sampled": points(methods[m]["success"], methods["sft"]["success"]),
                              "greedy": points(methods[m]["greedy_success"], methods["sft"]["greedy_success"])}
                          for m in ("grpo", "grpo_step_credit", "ppo")},
        "step_credit_vs_grpo_points": {
            "sampled": points(methods["grpo_step_credit"]["success"], methods["grpo"]["success"]),
            "greedy": points(methods["grpo_step_credit"]["greedy_success"], methods["grpo"]["greedy_success"])},
        "minutes_this_call": round((time.monotonic() - started) / 60, 1),
    }
    (out / "benchmark.json").write_text(json.dumps(line, indent=1))
    print(json.dumps(line))
    return line


if __name__ == "__main__":
    main()
