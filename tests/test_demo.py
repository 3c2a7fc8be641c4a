"""The learning demo is recipes/quickstart.yaml run through omrl.train.iterate.run: here on a tiny budget (the
full demo is `make demo`, minutes long). Checks the stages, results.json's shape and the console."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("trl")

from omrl.config import load_recipe  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STAGES = ["expert", "base", "sft", "grpo-1", "grpo-2", "sft-more"]
ROW_KEYS = {"stage", "tasks", "samples", "success", "success_ci95", "mean_reward", "greedy_success", "minutes"}


def tiny_budget(tmp_path, tiny) -> list[str]:
    tasks = ROOT / "datasets" / "tasks"
    return [f"output_dir={tmp_path / 'quickstart'}", f"model={tiny}", f"train_tasks={tasks / 'grid_train.jsonl'}",
            f"eval_tasks={tasks / 'grid_eval.jsonl'}", "report=false", "rollout.max_turns=4",
            "demos.tasks=8", "sft.epochs=1", "sft.batch_size=4", "sft.logging_steps=1",
            "grpo.max_steps=2", "grpo.tasks_per_step=2", "grpo.samples_per_task=2", "grpo.warmup_steps=0",
            "grpo.logging_steps=1", "eval.tasks=3", "eval.samples=2", "baseline.more_sft_epochs=null"]


def test_quickstart_is_an_iterate_recipe_with_the_demo_stages_and_its_settings():
    from omrl.train.config.iterate import IterateRecipe

    recipe = load_recipe(ROOT / "recipes" / "quickstart.yaml", IterateRecipe)
    assert recipe.baseline.expert and recipe.baseline.more_sft and recipe.rounds == 2
    # the old quickstart's hyper-parameters, so the demo's table (docs/results/demo.md) stays comparable
    assert (recipe.sft.epochs, recipe.sft.learning_rate, recipe.sft.batch_size) == (8, 1e-3, 32)
    assert (recipe.grpo.max_steps, recipe.grpo.learning_rate, recipe.grpo.samples_per_task) == (30, 2e-4, 8)
    assert (recipe.rollout.max_turns, recipe.rollout.max_new_tokens, recipe.rollout.env_options["noise"]) == (14, 4, 0.3)
    assert (recipe.eval.tasks, recipe.eval.samples, recipe.eval.base_samples) == (200, 4, 1)
    assert not recipe.collect.enabled and not recipe.demos.only_success


@pytest.mark.slow
def test_demo_runs_the_quickstart_through_iterate_and_writes_the_results_table(tmp_path, capsys):
    from omrl.models.tiny import cached_tiny_model
    from omrl.train.iterate.demo import run_demo

    tiny = cached_tiny_model(hidden=32)
    results = run_demo(str(ROOT / "recipes" / "quickstart.yaml"), tiny_budget(tmp_path, tiny))
    run = tmp_path / "quickstart"
    assert [r["stage"] for r in results] == STAGES
    assert json.loads((run / "results.json").read_text()) == results
    for row in results:
        assert set(row) >= ROW_KEYS, row["stage"]
        assert 0.0 <= row["success"] <= 1.0 and row["tasks"] == 3
        assert row["mean_reward"] is not None and row["success_ci95"] >= 0.0
    by_stage = {r["stage"]: r for r in results}
    assert by_stage["expert"]["greedy_success"] is None and "random moves" in by_stage["expert"]["note"]
    assert by_stage["base"]["samples"] == 1  # eval.base_samples
    for stage in ("sft", "grpo-1", "grpo-2", "sft-more"):
        assert by_stage[stage]["greedy_success"] is not None and by_stage[stage]["samples"] == 2
        assert by_stage[stage]["train_s"] > 0
    assert "GRPO trained" in by_stage["sft-more"]["note"]
    minutes = [r["minutes"] for r in results]
    assert minutes == sorted(minutes)
    state = json.loads((run / "state.json").read_text())
    assert [s["stage"] for s in state["stages"]] == STAGES
    # the more-SFT run starts from the SFT checkpoint, not from the last GRPO round
    more = json.loads((run / "sft-more" / "omrl_sft.json").read_text())["recipe"]
    assert more["model"] == str(run / "sft") or Path(more["model"]) == run / "sft"
    # the console: stage lines and the table, not TRL's dict logs or loading bars
    out = capsys.readouterr()
    shown = out.out + out.err
    assert "grpo-2" in shown and "sft-more" in shown and "held-out results" in shown
    assert "{'loss'" not in shown and "'reward'" not in shown and "Loading weights" not in shown

    # a second run is fresh (the demo wipes output_dir), not a resume of the first
    again = run_demo(str(ROOT / "recipes" / "quickstart.yaml"), [*tiny_budget(tmp_path, tiny), "rounds=1",
                                                                 "baseline.more_sft=false"])
    assert [r["stage"] for r in again] == ["expert", "base", "sft", "grpo-1"]


@pytest.mark.slow
def test_demo_command_takes_overrides_and_rejects_unknown_keys(tmp_path):
    from click.testing import CliRunner

    from omrl.cli.main import cli

    result = CliRunner().invoke(cli, ["demo", "--recipe", str(ROOT / "recipes" / "quickstart.yaml"),
                                      "sft.epoch=3"])
    assert result.exit_code != 0 and "sft.epoch" in result.output
    result = CliRunner().invoke(cli, ["train", "iterate", "--recipe", str(ROOT / "recipes" / "quickstart.yaml"),
                                      "--print-config", "grpo.max_steps=7"])
    assert result.exit_code == 0, result.output
    config = json.loads(result.output)
    assert config["grpo"]["max_steps"] == 7 and config["grpo"]["learning_rate"] == 2e-4  # the rest kept
    assert config["baseline"]["more_sft"] is True
