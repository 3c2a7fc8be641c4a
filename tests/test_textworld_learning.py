"""The TextWorld learning benchmark's quick variant (benchmarks/textworld_learning.py --quick) as a smoke test:
every stage on tiny budgets (two seeds, a grid point or two per method, real TextWorldExpress games, real
trainers), its JSON line, its report, and a second call that resumes everything instead of training again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from omrl.envs.twx import TwxEnv

ROOT = Path(__file__).resolve().parents[1]
RL = ("grpo", "grpo_step_credit", "ppo_token", "ppo_turn")

pytestmark = [pytest.mark.slow,  # a quick run of the learning benchmark
              pytest.mark.skipif(TwxEnv.unavailable() is not None, reason=str(TwxEnv.unavailable()))]
pytest.importorskip("trl")


def _benchmark(*args: str) -> dict:
    """The benchmark run as users run it, in its own process (its one JSON line, the last of its output):
    training in this process left state that changed a later test's sampling (tests/test_tokens_check.py)."""
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "textworld_learning.py"), *args],
                            capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_quick_run_tunes_trains_evaluates_reports_and_resumes(tmp_path):
    out = tmp_path / "run"
    line = _benchmark("--quick", "--out", str(out))
    assert line["quick"] is True and line["seeds"] == [0, 1]
    assert set(line["methods"]) == {"expert", "sft", "sft_more", *RL}
    assert line["rollouts_per_rl_method"] == 2 * 2 * 2  # max_steps x tasks_per_step x samples_per_task
    for name, row in line["methods"].items():
        for mode in ("sampled", "greedy"):
            if name == "expert" and mode == "greedy":
                assert row["greedy"] is None
                continue
            assert 0.0 <= row[mode] <= 1.0 and row[f"{mode}_ci95"] >= 0.0, (name, mode)
    for name in (*RL, "sft", "sft_more"):
        row = line["methods"][name]
        assert len(row["per_seed"]) == 2 and len(row["wall_s"]) == 2 and all(w > 0 for w in row["wall_s"])
    # every RL method: the same rollouts, its grid with dev scores, its choice one of the grid's points
    sizes = {"grpo": 1, "grpo_step_credit": 3, "ppo_token": 2, "ppo_turn": 2}  # quick: 1 rate, +1 PPO change, or
    # +1 weight and +1 anchor
    for name in RL:
        row = line["methods"][name]
        assert row["training_rollouts"] == line["rollouts_per_rl_method"]
        assert len(row["grid"]) == sizes[name]
        # the chosen settings: the best dev point's, over the method's own and the recipe's (e.g. PPO's level)
        best = max(row["grid"], key=lambda p: p["dev_score"])
        assert best["settings"].items() <= row["hyperparameters"].items()
        assert row["hyperparameters"]["learning_rate"] == best["settings"]["learning_rate"]
        if name.startswith("ppo_"):
            assert row["hyperparameters"]["level"] == name.removeprefix("ppo_")
        for point in row["grid"]:
            assert point["dev_score"] == pytest.approx((point["dev_sampled"] + point["dev_greedy"]) / 2, abs=1e-4)
    assert line["methods"]["sft_more"]["hyperparameters"]["epochs"][0] >= 1
    assert line["methods"]["sft"]["training_rollouts"] == 0 and line["methods"]["sft"]["demos"] == 12
    # the headline figures: differences of the table's greedy means (every game has an outcome on both seeds)
    best = line["best_rl_method"]
    assert best in RL and line["best_ppo"] in ("ppo_token", "ppo_turn")
    sft = line["methods"]["sft"]["greedy"]
    assert line["best_rl_greedy_gain_points"] == pytest.approx(100 * (line["methods"][best]["greedy"] - sft), abs=0.11)
    ppo = line["methods"][line["best_ppo"]]["greedy"]
    assert line["ppo_vs_sft_greedy_points"] == pytest.approx(100 * (ppo - sft), abs=0.11)
    credit = line["step_credit_vs_grpo_points"]["greedy"]["points"]
    assert credit == pytest.approx(100 * (line["methods"]["grpo_step_credit"]["greedy"]
                                          - line["methods"]["grpo"]["greedy"]), abs=0.11)
    # step credit's diagnostics come from the stored turns of both seeds' runs
    diagnostics = line["step_credit_diagnostics"]
    assert diagnostics["turns"] > 0 and sum(diagnostics["turns_by_group_size"].values()) == diagnostics["turns"]
    for key in ("share_in_step_group", "share_nonzero_step_advantage", "share_step_advantage_where_episode_advantage_0"):
        assert 0.0 <= diagnostics[key] <= 1.0
    # every game starts in the same room: the first turns of a group always share a step group
    assert diagnostics["share_in_step_group"] > 0
    assert sorted(a["weight"] for a in line["step_credit_weight_ablation"]) == [0.0, 1.0, 2.0]
    anchored = [p for p in line["methods"]["grpo_step_credit"]["grid"] if p["stage"] == "step_credit.anchor"]
    assert [p["settings"]["step_credit"]["anchor"] for p in anchored] == ["visited"]
    assert line["grid"]["step_credit.anchor"] == ["state", "visited"]
    # how greedy episodes fail, from the stored turns: the failed share is the table's greedy success, mirrored
    for name in ("sft", "sft_more", *RL):
        failures = line["greedy_failures"][name]
        assert [f["seed"] for f in failures] == [0, 1]
        for f, seed_row in zip(failures, line["methods"][name]["per_seed"], strict=True):
            assert f["failed"] == pytest.approx(1 - seed_row["greedy"], abs=1e-4), name
            assert all(f[k] is None or 0.0 <= f[k] <= 1.0 for k in ("failures_looping", "turns_stalled"))
    # whether the final policies use the history: at returns to a room in SFT's sampled test episodes of seed 0
    moves = line["return_moves"]
    assert moves["seed"] == 0 and moves["episodes"] == 3 * 1 and 0 <= moves["returns"] <= moves["episodes"]
    for name in ("sft", "sft_more", *RL):
        assert (moves[name] is None) == (moves["returns"] == 0), name
        assert moves[name] is None or all(0.0 < p <= 1.0 for p in moves[name].values()), name
    # the file: the line plus per-step training success of every final RL run, both seeds
    saved = json.loads((out / "benchmark.json").read_text())
    assert {k: v for k, v in saved.items() if k != "curves"} == line
    for name in RL:
        assert len(saved["curves"][name]) == 2
        assert all([step for step, _ in curve] == [0, 1] or [step for step, _ in curve] == [1, 2]
                   for curve in saved["curves"][name])
    report = (out / "report" / "report.md").read_text()
    assert "## Benchmark: textworld_learning" in report and "benchmark.png" in report
    assert all(f"| {name} |" in report for name in line["methods"])
    assert (out / "report" / "benchmark.png").stat().st_size > 0
    # a second call finds every run recorded: nothing is trained or evaluated again
    stages = json.loads((out / "benchmark_state.json").read_text())["stages"]
    again = _benchmark("--quick", "--out", str(out))
    assert json.loads((out / "benchmark_state.json").read_text())["stages"] == stages
    timing = ("minutes_this_call", "load_this_call", "wall_minutes_total", "load_mean")
    assert {k: v for k, v in again.items() if k not in timing} == {k: v for k, v in line.items() if k not in timing}
    # --final-steps: the same tuning, then final runs trained longer under their own names; SFT's and the
    # expert's test records are kept
    longer = _benchmark("--quick", "--out", str(out), "--final-steps", "3")
    assert longer["rollouts_per_rl_method"] == 3 * 2 * 2 and longer["rollouts_per_tuning_run"] == 2 * 2 * 2
    assert longer["final_runs"] == {"max_steps": 3} and line["final_runs"] == "the tuning budget"
    for name in RL:
        assert longer["methods"][name]["grid"] == line["methods"][name]["grid"]  # tuned once
        assert longer["methods"][name]["training_rollouts"] == 3 * 2 * 2
    added = [s["stage"] for s in json.loads((out / "benchmark_state.json").read_text())["stages"][len(stages):]]
    for seed in (0, 1):
        assert f"seed{seed}/test/sft_more-max_steps3" in added
        for name in RL:  # a test record is named by the run tested: its method, chosen settings, final steps
            trains = {s.split("/", 2)[2] for s in added if s.startswith(f"seed{seed}/train/{name}-")}
            tests = {s.split("/", 2)[2] for s in added if s.startswith(f"seed{seed}/test/{name}-")}
            assert len(trains) == 1 and tests == trains and next(iter(trains)).endswith("-max_steps3"), name
        assert f"seed{seed}/train/sft_more-max_steps3" in added
        assert sum(stage.startswith(f"seed{seed}/train/") for stage in added) == len(RL) + 1
    assert not any(stage.endswith(("/test/sft", "/test/expert")) or "/dev/" in stage for stage in added)
    assert longer["methods"]["sft"] == line["methods"]["sft"]
    curves = json.loads((out / "benchmark.json").read_text())["curves"]
    assert all(len(curve) == 3 for name in RL for curve in curves[name])  # a point per training step
    # --so-far (a run cut short) reads the same records: the final runs' under their final names
    partial = _benchmark("--quick", "--out", str(out), "--final-steps", "3", "--so-far")
    assert partial["complete"] is False and partial["final_runs"] == {"max_steps": 3}
    for name in ("sft", "sft_more", *RL):
        assert partial["methods"][name]["seeds"] == [0, 1]
        for mode in ("sampled", "greedy"):
            assert partial["methods"][name][mode] == longer["methods"][name][mode], (name, mode)
    assert partial["greedy_gain_over_sft_points"]["grpo"]["points"] == pytest.approx(
        100 * (longer["methods"]["grpo"]["greedy"] - longer["methods"]["sft"]["greedy"]), abs=0.11)
    # --tune-at-final: the grid again, every point trained 3 steps and scored on dev under its own name; seed 0's
    # final runs are tuning runs (some made by the call above already), so seed 0 trains nothing outside the grid
    before = len(json.loads((out / "benchmark_state.json").read_text())["stages"])
    tuned = _benchmark("--quick", "--out", str(out), "--final-steps", "3", "--tune-at-final")
    assert tuned["tuning_runs"] == {"max_steps": 3} and longer["tuning_runs"] == "the recipe's budget"
    assert tuned["rollouts_per_tuning_run"] == tuned["rollouts_per_rl_method"] == 3 * 2 * 2
    stages = [s["stage"] for s in json.loads((out / "benchmark_state.json").read_text())["stages"]]
    dev = {s.split("/", 2)[2] for s in stages[before:] if s.startswith("seed0/dev/")}
    assert all(name.endswith("-max_steps3") for name in dev)
    assert len(dev) == sum(len(tuned["methods"][name]["grid"]) for name in RL)
    seed0_final = {s.split("/", 2)[2] for s in stages if s.startswith("seed0/train/") and s.endswith("-max_steps3")}
    assert seed0_final - {"sft_more-max_steps3"} == dev
    assert not any(stage.endswith(("/test/sft", "/test/expert")) for stage in stages[before:])



def test_an_unknown_step_credit_anchor_is_refused_before_any_run(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "textworld_learning.py"), "--quick",
                             "--out", str(tmp_path / "run"), "--credit-anchors", "visited,history"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and "--credit-anchors" in result.stderr and "history" in result.stderr
    assert not (tmp_path / "run" / "benchmark_state.json").exists()


def test_tune_at_final_without_a_longer_final_budget_is_refused_before_any_run(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "textworld_learning.py"), "--quick",
                             "--out", str(tmp_path / "run"), "--tune-at-final"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and "--tune-at-final: give --final-steps" in result.stderr
    state = tmp_path / "run" / "benchmark_state.json"
    assert not state.exists() or json.loads(state.read_text())["stages"] == []
    assert not (tmp_path / "run" / "seed-0").exists()
