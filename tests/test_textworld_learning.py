"""benchmarks/textworld_learning.py, a thin wrapper of `omrl study`: the quick Coin study (every method kind, two
conditions, two seeds, real TextWorldExpress games, real trainers) run as users run the benchmark, its one JSON
line, and a second call that finds every run done and scores nothing again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from omrl.envs.twx import TwxEnv
from omrl.study.ledger import TestLedger

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "textworld_learning.py"
METHODS = ("sft", "more_sft", "rft", "grpo", "step_credit", "ppo_turn")

pytestmark = [pytest.mark.slow,  # a quick study of every method kind
              pytest.mark.skipif(TwxEnv.unavailable() is not None, reason=str(TwxEnv.unavailable()))]
pytest.importorskip("trl")


def _benchmark(*args: str) -> dict:
    """The benchmark in its own process, as users run it: its one JSON line (the last of its output)."""
    result = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_quick_coin_study_prints_the_figures_a_reviewer_reads_and_resumes(tmp_path):
    out = tmp_path / "run"
    line = _benchmark("--quick", "--out", str(out))
    assert line["study"] == "coin_quick" and line["seeds"] == 2 and line["test_scorings"] == 1
    assert line["test_train_overlap"] == 0 and line["dev_test_overlap"] == 0 and line["distinct_test_tasks"] == 6
    assert line["pending_conditions"] == [] and list(line["conditions"]) == ["detours", "few_demos"]
    study = json.loads((out / "study.json").read_text())
    for name, condition in line["conditions"].items():
        assert tuple(condition["methods"]) == METHODS
        assert condition["best_rl_on_dev"] in ("grpo", "step_credit", "ppo_turn")
        for method, row in condition["methods"].items():
            for mode in ("greedy", "sampled"):  # each seed's held-out success, its mean and t interval
                seeds = row["per_seed"][mode]
                assert list(seeds) == ["0", "1"] and all(0.0 <= v <= 1.0 for v in seeds.values())
                assert row["mean"][mode] == pytest.approx(sum(seeds.values()) / 2, abs=1e-4)
                low, high = row["t_ci95"][mode]
                assert low <= row["mean"][mode] <= high
            # the same figures as study.json's, in points where they are differences
            figures = study["conditions"][name]["methods"][method]
            assert row["per_seed"]["greedy"] == pytest.approx(figures["test"]["greedy"]["per_seed"], abs=1e-4)
            for other in ("sft", "more_sft"):
                if method == other:
                    assert row[f"vs_{other}"] is None
                    continue
                diff = row[f"vs_{other}"]
                assert diff["vs"] == other
                assert diff["points"] == pytest.approx(100 * figures[f"vs_{other}"]["difference"], abs=0.01)
                assert diff["ci95"][0] <= diff["points"] <= diff["ci95"][1]
            compute = row["compute"]
            assert list(compute) == ["0", "1"]
            if method != "sft":  # every other method trains at the matched budget: 2 optimizer steps
                assert all(c["optimizer_steps"] == 2 and c["seconds"] > 0 for c in compute.values()), method
                assert row["tuning_compute"]["runs"] == 1 and row["tuning_compute"]["optimizer_steps"] == 2
            if method in ("rft", "grpo", "step_credit", "ppo_turn"):  # they play episodes to learn from
                assert all(c["env_steps"] > 0 for c in compute.values()), method
    primary = line["conditions"]["detours"]["methods"][line["best_rl_on_dev"]]["vs_more_sft"]
    assert line["primary_contrast_points"] == pytest.approx(primary["points"], abs=0.01)
    assert line["primary_contrast_ci95"] == pytest.approx(primary["ci95"], abs=0.01)
    # a second call: every run found done, the test set not scored again
    entries = TestLedger(out).entries()
    again = _benchmark("--quick", "--out", str(out))
    assert TestLedger(out).entries() == entries and again["test_scorings"] == 1
    assert again["conditions"] == line["conditions"]


def test_quick_and_a_study_file_together_are_refused(tmp_path):
    result = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--study", "shipped:studies/coin",
                             "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "--quick or --study, not both" in result.stderr
    assert not (tmp_path / "run").exists()
