"""Learning on a TextWorld-family game: SFT, more SFT, GRPO, GRPO with step credit and PPO (token- and turn-level
GAE) on TextWorldExpress's Coin game, each RL method tuned on the dev games, two seeds, held-out test games.

    nice -n 10 python benchmarks/textworld_learning.py             # the full run (~130 min of runs, 2 idle cores)
    python benchmarks/textworld_learning.py --final-steps 128      # tuned at 32 steps, final runs of 128
    python benchmarks/textworld_learning.py --final-steps 128 --tune-at-final   # tuned and run at 128 steps
    python benchmarks/textworld_learning.py --quick                # the CI smoke run: every stage, tiny budgets
    python benchmarks/textworld_learning.py grpo.max_steps=12      # key=value overrides of recipes/textworld_coin.yaml

1. Per seed s: `omrl train iterate` on recipes/textworld_coin.yaml with rounds 0 and seed, tiny.seed and
   rollout.seed s: the expert (seed 0), the tiny base model (its tokenizer trained on the demos) and SFT on
   the gold paths, in OUT/seed-s, whose store receives every run of that seed.
2. Tuning, seed 0, on the dev games: every RL method starts from seed 0's SFT checkpoint and plays the same
   rollouts (grpo.max_steps x tasks_per_step x samples_per_task; PPO takes GRPO's numbers). The grid, small
   and stated in the output: the learning rates of --lr-grid for GRPO and step credit, of --ppo-lr-grid for PPO
   (8 optimizer steps per batch to GRPO's 1); then for PPO, one at a time from the best so far, each change of
   --ppo-grid (kept when it scores better); then for step credit the weights of --credit-weights (weight 0
   is GRPO at the same rate: the ablation), then the anchors of --credit-anchors. A run's dev score is the mean
   of its sampled and greedy success; the best wins (the first in grid order on a tie).
3. Final: each method's chosen settings on every seed (seed 0's tuning run is that run; with --final-steps N,
   every seed trains N steps with them instead: the tuning budget, grpo.max_steps, stays unless --tune-at-final
   makes every tuning run N steps too, so seed 0's final runs are again its tuning runs), evaluated once on
   the test games, sampled (eval.samples per game at temperature 1) and greedy; SFT; more SFT (the SFT run
   continued for as many epochs as the RL methods' mean training time buys); the expert.
4. Figures per method: the mean over seeds and a 95% interval over test games (each game's success averaged
   over seeds and samples); differences between methods are paired per game. best_rl_greedy_gain_points: the
   RL method with the best dev score minus SFT (greedy, test); ppo_vs_sft_greedy_points: the better PPO level
   (dev score) minus SFT. Step credit's diagnostics come from the stored turns (omrl.train.rl.step_credit
   credit_diagnostics: the SQL is there).

Prints ONE JSON line. OUT/benchmark.json holds it and, beside it, the per-step training success of every
final run (`curves`, left out of the printed line); OUT/report is `omrl report` with the benchmark's table and
plot. Every trained or evaluated run is recorded in OUT/benchmark_state.json as it finishes: a killed run
started again skips what is done (a run cut off midway is trained again).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RECIPE = ROOT / "recipes" / "textworld_coin.yaml"
TEST_TASKS = ROOT / "datasets" / "tasks" / "twx_coin_test.jsonl"
LR_GRID = "5e-4,1e-3"
# PPO takes ppo_epochs x minibatches optimizer steps per batch (8), GRPO one: at 5e-4 and 1e-3 its turn-level runs
# collapsed to 0% success within 32 steps, and from the converged SFT so did a token-level one at 3e-4 (unwhitened)
PPO_LR_GRID = "3e-5,1e-4,3e-4"
PPO_GRID = "ppo_epochs=1,whiten_advantages=false,target_kl=0.02"  # target_kl: a stop at 1.5 x 0.02 approx. KL
CREDIT_WEIGHTS = "2"
CREDIT_ANCHORS = "visited"  # the state and the rooms seen before it: the right move depends on what was searched
QUICK = ["demos.tasks=12", "sft.epochs=1", "sft.batch_size=8", "grpo.max_steps=2", "grpo.tasks_per_step=2",
         "grpo.samples_per_task=2", "grpo.warmup_steps=0", "ppo.minibatches=1", "eval.tasks=3", "eval.samples=1",
         "tiny.hidden=32", "tiny.vocab_size=600", "rollout.max_turns=4", "rollout.concurrency=4",
         "eval.concurrency=4"]
QUICK_ARGS = ["--lr-grid", "5e-4", "--ppo-lr-grid", "5e-4", "--ppo-grid", "ppo_epochs=1", "--credit-weights", "2",
              "--credit-anchors", "visited", "--test-tasks", "3"]


def _parse_grid(text: str) -> list[tuple[str, Any]]:
    """"a=1,b=false" -> [("a", 1), ("b", False)] (values as YAML scalars)."""
    from omrl.config import parse_overrides

    pairs = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, value = next(iter(parse_overrides([item]).items()))
        pairs.append((key, value))
    return pairs


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="key=value overrides of recipes/textworld_coin.yaml")
    parser.add_argument("--out", default="runs/textworld_learning", help="run folder (resumes)")
    parser.add_argument("--quick", action="store_true", help="tiny budgets and grids: checks the path, not the numbers")
    parser.add_argument("--seeds", default="0,1", help="seeds (each: its own base model, SFT and RL runs)")
    parser.add_argument("--lr-grid", default=LR_GRID, help="learning rates tried for GRPO and GRPO + step credit")
    parser.add_argument("--ppo-lr-grid", default=PPO_LR_GRID, help="learning rates tried for the PPO methods")
    parser.add_argument("--ppo-grid", default=PPO_GRID, help="PPO changes tried one at a time after the rate")
    parser.add_argument("--credit-weights", default=CREDIT_WEIGHTS, help="step-credit weights tried after the rate")
    parser.add_argument("--credit-anchors", default=CREDIT_ANCHORS,
                        help="step-credit anchors (step_credit.anchor) tried after the weights")
    parser.add_argument("--prepare-seed", type=int, default=None,
                        help="only make this seed's expert, base and SFT (a second process beside the main call)")
    parser.add_argument("--helper", action="store_true",
                        help="share the work of a main call on the same --out and arguments, started beside it: "
                             "runs are claimed one process at a time, this one takes methods and seeds in the "
                             "opposite order; it writes no results")
    parser.add_argument("--so-far", action="store_true",
                        help="train nothing: print what the runs recorded in --out so far (a run cut short)")
    parser.add_argument("--test-tasks", type=int, default=0, help="test games (0: all of twx_coin_test.jsonl)")
    parser.add_argument("--final-steps", type=int, default=0,
                        help="training steps of the final runs (0: grpo.max_steps, the tuning runs' budget; more: "
                             "every method tuned at grpo.max_steps, then trained this long on every seed)")
    parser.add_argument("--tune-at-final", action="store_true",
                        help="with --final-steps: every tuning run trains --final-steps steps too (the choice is made "
                             "at the budget it is used at; tuning costs final-steps / grpo.max_steps times more)")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args((QUICK_ARGS if "--quick" in argv else []) + argv)

    from benchmarks.lib.compare import Comparison, LoadMeter
    from omrl.rollout import shared_engines
    from omrl.tasks import load_tasks
    from omrl.train.rl.step_credit import ANCHORS

    started = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    if len(set(seeds)) != len(seeds):
        raise SystemExit("--seeds: distinct integers, e.g. 0,1")
    anchors = [x.strip() for x in args.credit_anchors.split(",") if x.strip()]
    if not set(anchors) <= set(ANCHORS):
        raise SystemExit(f"--credit-anchors: a comma-separated list of {', '.join(ANCHORS)}, got {args.credit_anchors!r}")
    grids = {"learning_rate": [float(x) for x in args.lr_grid.split(",") if x.strip()],
             "ppo_learning_rate": [float(x) for x in args.ppo_lr_grid.split(",") if x.strip()],
             "ppo": _parse_grid(args.ppo_grid),
             "step_credit.weight": [float(x) for x in args.credit_weights.split(",") if x.strip()],
             "step_credit.anchor": anchors}
    test = load_tasks(TEST_TASKS)[: args.test_tasks or None]
    bench = Comparison(out, RECIPE, (QUICK if args.quick else []) + list(args.overrides), seeds, test)
    if args.final_steps < 0:
        raise SystemExit("--final-steps: 0 (the recipe's grpo.max_steps) or a number of steps")
    if args.final_steps and args.final_steps != bench.recipes[seeds[0]].grpo.max_steps:
        bench.final = {"max_steps": args.final_steps}
    if args.tune_at_final:
        if not bench.final:
            raise SystemExit("--tune-at-final: give --final-steps, more than grpo.max_steps")
        bench.tuning_budget = bench.final
    if args.prepare_seed is not None:
        if args.prepare_seed not in seeds:
            raise SystemExit("--prepare-seed: one of --seeds")
        with shared_engines():
            record = bench.prepare(args.prepare_seed)
        print(json.dumps({"prepared_seed": args.prepare_seed, "sft": record["results"]}))
        return record
    if args.so_far:
        line, curves = so_far(bench)
        (out / "benchmark_so_far.json").write_text(json.dumps({**line, "curves": curves}, indent=1))
        _report(bench.stores[seeds[0]], out, bench.recipes[seeds[0]], out / "benchmark_so_far.json")
        print(json.dumps(line))
        return line
    with shared_engines(), LoadMeter(every=30.0) as load:  # one pool of game engines for every run of this call
        runs = play(bench, grids, helper=args.helper)
    if args.helper:
        print(json.dumps({"helper": "done", "minutes_this_call": round((time.monotonic() - started) / 60, 1)}))
        return {}
    line = summary(bench, runs, grids, quick=args.quick)
    line.update(minutes_this_call=round((time.monotonic() - started) / 60, 1), load_this_call=load.mean)
    (out / "benchmark.json").write_text(json.dumps({**line, "curves": runs["curves"]}, indent=1))
    _report(bench.stores[seeds[0]], out, bench.recipes[seeds[0]])
    print(json.dumps(line))
    return line


def play(bench, grids: dict[str, list], helper: bool = False) -> dict[str, Any]:
    """Every run of the benchmark (those recorded already are skipped): the first seed's SFT, tuning on its dev
    games, then per seed its SFT, the chosen settings, SFT continued, the test evaluations; diagnostics and curves.
    `helper`: take the methods and seeds in the opposite order (a second process sharing the work)."""
    from benchmarks.lib.compare import RL_METHODS, training_curve, tune
    from omrl.store.query import quote_literal
    from omrl.train.rl.step_credit import credit_diagnostics

    seeds, first = bench.seeds, bench.seeds[0]
    methods = list(reversed(RL_METHODS)) if helper else list(RL_METHODS)
    sft = {first: bench.prepare(first)}  # the other seeds' after tuning (--prepare-seed may make them meanwhile)
    chosen, tuning = {}, {}
    for method in methods:
        trainer = RL_METHODS[method][0]  # as tune() tells PPO from GRPO
        rates = grids["ppo_learning_rate" if trainer == "ppo" else "learning_rate"]
        chosen[method], tuning[method] = tune(bench, first, method, rates, grids["ppo"], grids["step_credit.weight"],
                                              grids["step_credit.anchor"], budget=bench.tuning_budget)
    tests: dict[str, dict[int, Any]] = {m: {} for m in ("expert", "sft", "sft_more", *RL_METHODS)}
    trained: dict[str, dict[int, Any]] = {m: {} for m in (*RL_METHODS, "sft_more")}
    tests["expert"][first] = bench.evaluate(first, "test", "expert", None)
    final = {m: {**chosen[m], **bench.final} for m in RL_METHODS}
    names = {"sft": "sft", "sft_more": bench.final_name("sft_more"),  # of the test records, per method
             **{m: bench.run_name(m, final[m]) for m in RL_METHODS}}
    for seed in reversed(seeds) if helper else seeds:
        sft[seed] = sft.get(seed) or bench.prepare(seed)
        tests["sft"][seed] = bench.evaluate(seed, "test", "sft", sft[seed]["checkpoint"])
        for method in methods:  # without bench.final, seed 0's final run is its tuning run
            trained[method][seed] = bench.train(seed, method, final[method])
            tests[method][seed] = bench.evaluate(seed, "test", names[method], trained[method][seed]["checkpoint"])
        # more SFT: the RL methods' mean training time on this seed, in this seed's SFT epochs
        rl_seconds = sum(trained[m][seed]["train_s"] for m in RL_METHODS) / len(RL_METHODS)
        epoch_s = max(sft[seed]["train_s"] / max(sft[seed]["epochs"], 1), 1e-6)
        trained["sft_more"][seed] = bench.more_sft(seed, max(1, round(rl_seconds / epoch_s)), rl_seconds)
        tests["sft_more"][seed] = bench.evaluate(seed, "test", names["sft_more"], trained["sft_more"][seed]["checkpoint"])
    tests = {m: [by_seed[s] for s in seeds if s in by_seed] for m, by_seed in tests.items()}  # in seed order
    trained = {m: [by_seed[s] for s in seeds] for m, by_seed in trained.items()}
    credit_runs = zip(seeds, trained["grpo_step_credit"], strict=True)
    diagnostics = credit_diagnostics([(bench.stores[s], f"starts_with(run_id, {quote_literal(r['run_prefix'] + '/')})")
                                      for s, r in credit_runs])
    curves = {m: [training_curve(bench.stores[s], r["run_prefix"]) for s, r in zip(seeds, trained[m], strict=True)]
              for m in RL_METHODS}
    return {"sft": sft, "chosen": chosen, "tuning": {m: tuning[m] for m in RL_METHODS}, "tests": tests,
            "trained": trained, "names": names, "diagnostics": diagnostics, "curves": curves}


def so_far(bench) -> tuple[dict[str, Any], dict[str, list]]:
    """The JSON line of a comparison cut short (complete: false): per method the test records made so far (over
    the seeds that have one), each seed's SFT on the dev games, every dev-tuning point, and the greedy gains over
    SFT on the seeds where both were tested; and the per-step training success of every recorded RL run."""
    from benchmarks.lib.compare import RL_METHODS, dev_score, training_curve
    from benchmarks.lib.compare_figures import paired_points, summarise
    from omrl.store import Store
    from omrl.train.iterate.state import IterateState

    for seed, recipe in bench.recipes.items():
        bench.stores[seed] = Store(Path(recipe.output_dir) / "store")

    records = {r["stage"]: r for r in bench._fresh().data["stages"]}
    tested = {name: {s: records[f"seed{s}/test/{bench.final_name(name)}"] for s in bench.seeds
                     if f"seed{s}/test/{bench.final_name(name)}" in records} for name in ("expert", "sft", "sft_more")}
    for method in RL_METHODS:  # a test record named by a final-budget run of the method (the latest recorded)
        tested[method] = {}
        for key, record in records.items():
            seed, split, name = key.split("/", 2)
            run = records.get(f"{seed}/train/{name}", {})
            at_final = run.get("settings", {}).get("max_steps") == bench.final.get("max_steps")
            if split == "test" and run.get("method") == method and at_final and int(seed[4:]) in bench.seeds:
                tested[method][int(seed[4:])] = record
        tested[method] = {s: tested[method][s] for s in bench.seeds if s in tested[method]}
    methods = {name: {**summarise(list(by_seed.values())), "seeds": list(by_seed)}
               for name, by_seed in tested.items() if by_seed}
    sft_dev = {}
    for seed, recipe in bench.recipes.items():
        path = Path(recipe.output_dir) / "state.json"
        done = IterateState(path).done("sft") if path.exists() else None
        if done is not None:
            sft_dev[seed] = {k: done["results"].get(k) for k in ("success", "greedy_success", "tasks")} | {
                "train_s": done.get("train_s"), "epochs": done.get("epochs")}
    first = bench.seeds[0]
    dev = [{"run": key.split("/", 2)[2], "dev_sampled": r["results"].get("success"),
            "dev_greedy": r["results"].get("greedy_success"), "dev_score": round(dev_score(r), 4)}
           for key, r in records.items() if key.startswith(f"seed{first}/dev/")]
    trains = {key.split("/", 2)[2] + f" (seed {key[4:key.index('/')]})": {"train_s": r.get("train_s"),
                                                                          "rollouts": r.get("rollouts")}
              for key, r in records.items() if "/train/" in key}
    gains = {}
    for name in (*RL_METHODS, "sft_more"):
        common = [s for s in tested[name] if s in tested["sft"]]
        if common:
            gains[name] = {"seeds": common, **paired_points([tested[name][s] for s in common],
                                                            [tested["sft"][s] for s in common], "greedy")}
    curves: dict[str, list] = {}
    for key, r in records.items():
        if "/train/" in key and r.get("run_prefix"):
            seed = int(key[4:key.index("/")])
            curves.setdefault(key.split("/", 2)[2], []).append(training_curve(bench.stores[seed], r["run_prefix"]))
    loads = [r["load"] for r in records.values() if r.get("load") is not None]
    return {"benchmark": "textworld_learning", "complete": False, "seeds": bench.seeds,
            "test_games": len(bench.test), "dev_games": len(bench.dev), "rollouts_per_tuning_run": bench.rollouts,
            "final_runs": bench.final or "the tuning budget",
            "tuning_runs": bench.tuning_budget or "the recipe's budget",
            "sft_dev": sft_dev, "dev_tuning": dev, "training": trains, "methods": methods,
            "greedy_gain_over_sft_points": gains,
            "wall_minutes_recorded": round(sum(r.get("seconds", 0.0) for r in records.values()) / 60, 1),
            "load_mean": round(sum(loads) / len(loads), 1) if loads else None, "cores": os.cpu_count()}, curves


def summary(bench, runs: dict[str, Any], grids: dict[str, list], quick: bool) -> dict[str, Any]:
    """The benchmark's JSON line (without the curves) from its runs."""
    from benchmarks.lib.compare import RL_METHODS, tuned_settings
    from benchmarks.lib.compare_figures import paired_points, summarise

    seeds, first = bench.seeds, bench.seeds[0]
    recipe = bench.recipes[first]
    sft, chosen, tuning, tests, trained = (runs[k] for k in ("sft", "chosen", "tuning", "tests", "trained"))
    methods: dict[str, Any] = {}
    for method, records in tests.items():
        row = summarise(records)
        if method == "expert":
            row.update(greedy=None, greedy_ci95=None, training_rollouts=0, wall_s=None, hyperparameters=None)
        elif method == "sft":
            row.update(training_rollouts=0, demos=len(bench.demo_tasks), wall_s=[sft[s]["train_s"] for s in seeds],
                       hyperparameters={"learning_rate": recipe.sft.learning_rate, "epochs": recipe.sft.epochs})
        elif method == "sft_more":
            more = trained[method]
            spent = ", ".join(f"{r['rl_train_s']:.0f}" for r in more)
            row.update(training_rollouts=0, wall_s=[r["train_s"] for r in more],
                       hyperparameters={"epochs": [r["epochs"] for r in more]},
                       note=f"SFT continued for the RL methods' mean training time ({spent} s per seed) in SFT epochs")
        else:
            row.update(training_rollouts=trained[method][0]["rollouts"], wall_s=[r["train_s"] for r in trained[method]],
                       hyperparameters=tuned_settings(recipe, method, chosen[method]), grid=tuning[method])
        methods[method] = row

    def dev_best(method: str) -> float:
        return max(p["dev_score"] for p in tuning[method])

    def gain(method: str, baseline: str = "sft", mode: str = "greedy") -> dict[str, float | None]:
        return paired_points(tests[method], tests[baseline], mode)

    best_rl = max(RL_METHODS, key=dev_best)  # chosen on the dev games, like every setting
    best_ppo = max(("ppo_token", "ppo_turn"), key=dev_best)
    best_gain, ppo_gain = gain(best_rl), gain(best_ppo)
    rate = chosen["grpo_step_credit"]["learning_rate"]
    ablation = [{"weight": p["settings"].get("step_credit", {}).get("weight", 1.0) if method != "grpo" else 0.0,
                 "learning_rate": rate, **{k: p[k] for k in ("dev_sampled", "dev_greedy", "dev_score")}}
                for method in ("grpo", "grpo_step_credit") for p in tuning[method]
                if p["settings"]["learning_rate"] == rate and p["stage"] != "step_credit.anchor"]
    records = bench.state.data["stages"]
    loads = [r["load"] for r in records if r.get("load") is not None]
    iterate_s = sum(stage.get("seconds", 0.0) for s in seeds
                    for stage in json.loads((Path(bench.recipes[s].output_dir) / "state.json").read_text())["stages"])
    return {
        "benchmark": "textworld_learning", "quick": quick, "env": "twx", "game": "coin",
        "params": {**recipe.rollout.env_options, "game_params": bench.dev[0].payload.get("params"),
                   "step_limit": bench.dev[0].payload.get("step_limit")},
        "seeds": seeds, "test_games": len(bench.test), "dev_games": len(bench.dev),
        "eval": {"samples": recipe.eval.samples, "temperature": recipe.eval.temperature, "greedy": 1},
        "model": {"hidden": recipe.tiny.hidden, "layers": recipe.tiny.layers, "vocab_size": recipe.tiny.vocab_size},
        "rollouts_per_rl_method": trained["grpo"][0]["rollouts"], "rollouts_per_tuning_run": bench.rollouts,
        "final_runs": bench.final or "the tuning budget",
        "tuning_runs": bench.tuning_budget or "the recipe's budget",
        "grid": {"learning_rate": grids["learning_rate"], "ppo_learning_rate": grids["ppo_learning_rate"],
                 "ppo": [f"{k}={v}" for k, v in grids["ppo"]],
                 "step_credit.weight": [1.0, *grids["step_credit.weight"]],
                 "step_credit.anchor": ["state", *grids["step_credit.anchor"]],
                 "selection": "dev games, seed 0: mean of sampled and greedy success"},
        "methods": methods,
        "best_rl_method": best_rl,
        "best_rl_greedy_gain_points": best_gain["points"], "best_rl_greedy_gain_ci95": best_gain["ci95"],
        "best_ppo": best_ppo,
        "ppo_vs_sft_greedy_points": ppo_gain["points"], "ppo_vs_sft_greedy_ci95": ppo_gain["ci95"],
        "step_credit_vs_grpo_points": {mode: gain("grpo_step_credit", "grpo", mode) for mode in ("sampled", "greedy")},
        "step_credit_diagnostics": runs["diagnostics"],
        "step_credit_weight_ablation": ablation,
        "greedy_failures": {m: greedy_failures(bench, runs["names"][m]) for m in ("sft", "sft_more", *RL_METHODS)},
        "return_moves": return_moves(bench, first, {"sft": sft[first]["checkpoint"],
                                                    **{m: trained[m][0]["checkpoint"] for m in ("sft_more", *RL_METHODS)}}),
        "wall_minutes_total": round((sum(r.get("seconds", 0.0) for r in records) + iterate_s) / 60, 1),
        "load_mean": round(sum(loads) / len(loads), 1) if loads else None, "cores": os.cpu_count(),
    }


# How greedy episodes fail, from the game's state key after each turn (omrl/envs/twx/engine.py): a turn "stalls" when
# the state it led to is the one before it (a move into a wall, look, inventory); a failed episode "loops" when
# its last 4 turns led to at most 2 states (stuck in one room, or back and forth between two).
GREEDY_FAILURES_SQL = """
WITH t AS (
  SELECT trajectory_id, "index" AS k, json_extract_string(info, '$.state') AS state,
         lag(json_extract_string(info, '$.state')) OVER (PARTITION BY trajectory_id ORDER BY "index") AS before,
         count(*) OVER (PARTITION BY trajectory_id) - "index" AS from_end
  FROM turns WHERE run_id = {run}
), e AS (
  SELECT tr.id, tr.success, count(DISTINCT t.state) FILTER (WHERE t.from_end <= 4) AS last_states
  FROM trajectories tr JOIN t ON t.trajectory_id = tr.id WHERE tr.run_id = {run} GROUP BY tr.id, tr.success
)
SELECT (SELECT count(*) FROM e) AS episodes, (SELECT count(*) FROM e WHERE NOT success) AS failed,
       (SELECT count(*) FROM e WHERE NOT success AND last_states <= 2) AS failed_looping,
       (SELECT count(*) FROM t WHERE before IS NOT NULL) AS moves,
       (SELECT count(*) FROM t WHERE state = before) AS stalled
"""


def greedy_failures(bench, name: str) -> list[dict[str, Any]]:
    """Per seed, how the greedy test episodes of `name` fail: failed share, the share of failures that loop
    between two states, the share of turns that stall (GREEDY_FAILURES_SQL)."""
    from omrl.store.query import quote_literal
    from omrl.train.iterate.evaluation import eval_run_ids

    out = []
    for seed in bench.seeds:
        run = eval_run_ids(bench.recipes[seed], f"test-{name}")["greedy"]
        row = bench.stores[seed].sql(GREEDY_FAILURES_SQL.format(run=quote_literal(run))).to_pylist()[0]
        episodes, failed, moves = row["episodes"], row["failed"], row["moves"]
        out.append({"seed": seed, "failed": round(failed / episodes, 4) if episodes else None,
                    "failures_looping": round(row["failed_looping"] / failed, 4) if failed else None,
                    "turns_stalled": round(row["stalled"] / moves, 4) if moves else None})
    return out


def return_moves(bench, seed: int, checkpoints: dict[str, str]) -> dict[str, Any]:
    """Does a policy use the episode's history? In SFT's sampled test episodes of `seed`, at each episode's first
    return to a room: every checkpoint's mean probability of the move made there on the first visit, in the first
    visit's context and in the return's (equal: the move depends on the room alone, and greedy play can loop)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from omrl.store.query import quote_literal
    from omrl.train.iterate.evaluation import eval_run_ids

    run = eval_run_ids(bench.recipes[seed], "test-sft")["sampled"]
    rows = bench.stores[seed].sql(f"SELECT messages FROM trajectories WHERE run_id = {quote_literal(run)} "
                                  "ORDER BY id").to_pylist()
    cases = []  # (messages, index of the first visit's move, index of the return's reply)
    for row in rows:
        messages, first_move = row["messages"], {}
        for k, message in enumerate(messages):
            if message["role"] != "assistant" or not (message["content"] or "").startswith("move"):
                continue
            room = next((line for line in (messages[k - 1]["content"] or "").splitlines()
                         if line.startswith("You are in")), None)
            if room in first_move:
                cases.append((messages, first_move[room], k))
                break
            if room is not None:
                first_move[room] = k
    out: dict[str, Any] = {"seed": seed, "episodes": len(rows), "returns": len(cases)}
    for name, checkpoint in checkpoints.items():
        policy = (AutoModelForCausalLM.from_pretrained(checkpoint).eval(), AutoTokenizer.from_pretrained(checkpoint))
        first = [_reply_probability(*policy, m[:i], m[i]["content"]) for m, i, _ in cases]
        back = [_reply_probability(*policy, m[:j], m[i]["content"]) for m, i, j in cases]
        out[name] = {"first_visit": round(sum(first) / len(first), 4), "return": round(sum(back) / len(back), 4)
                     } if cases else None
    return out


def _reply_probability(model, tokenizer, messages: list[dict[str, Any]], reply: str) -> float:
    """The model's probability of answering `messages` with `reply` and its end-of-turn token."""
    import math

    import torch

    from omrl.schema.messages import to_chat_template

    prompt = tokenizer.apply_chat_template(to_chat_template(messages), tokenize=False, add_generation_prompt=True)
    start = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    ids = tokenizer(prompt + reply + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logp = model(torch.tensor([ids])).logits[0].log_softmax(-1)
    return math.exp(sum(float(logp[i - 1, ids[i]]) for i in range(start, len(ids))))


def _report(store, out: Path, recipe, benchmark: Path | None = None) -> None:
    """omrl report of seed 0's store with the benchmark's table and per-step plot."""
    from omrl.report import write_report

    write_report(store, out / "report", results=Path(recipe.output_dir) / "results.json",
                 benchmark=benchmark or out / "benchmark.json")


if __name__ == "__main__":
    main()
