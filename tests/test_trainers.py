"""One trainer contract (omrl.train.trainer): every registered trainer is `train(recipe, *, store, reporter)
-> TrainResult`; `omrl train` is generated from TRAINERS; GRPO and PPO share one rollout step."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from omrl.cli.main import cli
from omrl.train.trainer import TRAINERS, TrainResult


class Seen:
    """A reporter (omrl.progress) that records what a trainer told it."""

    def __init__(self) -> None:
        self.started: list[tuple[str, int | None]] = []
        self.advanced: dict[str, int] = {}  # label -> units advanced
        self.fields: list[dict] = []
        self.logs: list[str] = []
        self.finished = 0

    def start(self, label, total=None):
        self.started.append((label, total))

    def advance(self, n=1, **fields):
        label = self.started[-1][0] if self.started else None
        self.advanced[label] = self.advanced.get(label, 0) + n
        if fields:
            self.fields.append(fields)

    def log(self, message):
        self.logs.append(message)

    def finish(self, summary=None):
        self.finished += 1


def test_every_trainer_is_registered_with_its_recipe_and_a_command_help():
    from omrl.train.config.grpo import GRPORecipe
    from omrl.train.config.ppo import PPORecipe
    from omrl.train.config.rft import RFTRecipe
    from omrl.train.config.sft import SFTRecipe

    assert TRAINERS.names() == ["grpo", "ppo", "rft", "sft"]
    recipes = {name: TRAINERS.load(name).recipe for name in TRAINERS.names()}
    assert recipes == {"grpo": GRPORecipe, "ppo": PPORecipe, "rft": RFTRecipe, "sft": SFTRecipe}
    for name in TRAINERS.names():
        entry = TRAINERS.load(name)
        assert entry.name == name and "Example:  omrl train " + name in entry.help
    with pytest.raises(Exception, match="unknown trainer 'dpo'"):
        TRAINERS.load("dpo")


def test_omrl_train_lists_the_registry_without_importing_a_trainer():
    code = ("import sys; from click.testing import CliRunner; from omrl.cli.main import cli\n"
            "out = CliRunner().invoke(cli, ['train', '--help']).output\n"
            "print('LOADED', sorted(m for m in sys.modules if m in ('omrl.train.algorithms.sft', 'omrl.train.algorithms.grpo', "
            "'omrl.train.algorithms.ppo', 'omrl.train.algorithms.rft', 'torch', 'trl')))\nprint(out)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "LOADED []" in out
    for name in ("sft", "grpo", "ppo", "rft", "iterate"):
        assert f"  {name} " in out
    assert TRAINERS.get("ppo").summary in out


def test_generated_commands_load_their_trainers_recipe(tmp_path):
    result = CliRunner().invoke(cli, ["train", "ppo", "--print-config", "model=m", "tasks=t.jsonl",
                                      f"output_dir={tmp_path}", "level=turn"])
    assert result.exit_code == 0, result.output
    config = json.loads(result.output)
    assert config["level"] == "turn" and config["critic"] == "head"  # a PPORecipe, the rest its defaults
    bad = CliRunner().invoke(cli, ["train", "sft", "--print-config", "model=m", "store=s", "output_dir=o",
                                   "level=turn"])
    assert bad.exit_code != 0 and "level" in bad.output  # an SFTRecipe has no such key


# ---------------------------------------------------------------- every trainer trains through the contract

torch = pytest.importorskip("torch")
pytest.importorskip("trl")


def _letter_tasks(tmp_path, n=4):
    from omrl.envs.base import Task
    from omrl.tasks import write_tasks

    return write_tasks([Task(id=f"t{i}", instruction="say", env="letter") for i in range(n)], tmp_path / "tasks.jsonl")


def _recipes(tmp_path) -> dict[str, dict]:
    """A one- or two-step recipe of every trainer on the tiny model (the same data each is tested with)."""
    from omrl.envs.grid import grid_tasks
    from omrl.models.tiny import cached_tiny_model
    from omrl.tasks import write_tasks
    from tests.train_helpers import demo_store

    tiny = str(cached_tiny_model(hidden=32))
    letter = {"env": "test_grpo:LetterEnv", "max_turns": 1, "max_new_tokens": 4}
    rl = {"model": tiny, "tasks": str(_letter_tasks(tmp_path)), "rollout": letter, "max_steps": 2,
          "tasks_per_step": 2, "samples_per_task": 2, "warmup_steps": 0, "logging_steps": 1, "quiet": True}
    return {
        "sft": {"model": tiny, "store": str(demo_store(tmp_path / "demos").path), "output_dir": str(tmp_path / "sft"),
                "max_steps": 2, "batch_size": 2, "logging_steps": 1, "quiet": True},
        "grpo": {**rl, "output_dir": str(tmp_path / "grpo"), "store": str(tmp_path / "grpo-store")},
        "ppo": {**rl, "output_dir": str(tmp_path / "ppo"), "store": str(tmp_path / "ppo-store")},
        "rft": {"model": tiny, "tasks": str(write_tasks(grid_tasks(2, seed=2), tmp_path / "grid.jsonl")),
                "output_dir": str(tmp_path / "rft"), "rollout": {"env": "grid", "max_turns": 2, "max_new_tokens": 4},
                "samples": 2, "threshold": -100.0,
                "sft": {"max_steps": 2, "batch_size": 2, "logging_steps": 1, "quiet": True}},
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sft", "grpo", "ppo", "rft"])
def test_every_trainer_returns_a_train_result_whose_checkpoint_loads_and_reports_its_steps(tmp_path, name):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    entry = TRAINERS.load(name)
    seen = Seen()
    result = entry.train(_recipes(tmp_path)[name], reporter=seen)
    assert isinstance(result, TrainResult) and result.trainer == name and result.main
    AutoModelForCausalLM.from_pretrained(result.checkpoint)  # a whole checkpoint: model and tokenizer
    AutoTokenizer.from_pretrained(result.checkpoint)
    assert result.steps == 2 and result.wall_s > 0 and result.summary
    assert len(result.history) == 2  # one logged entry per step (logging_steps 1)
    # The reporter was shown the steps: started with the step count, advanced once per optimizer step.
    label = "sft" if name == "rft" else name
    assert (label, 2) in seen.started and seen.advanced[label] == 2 and seen.finished >= 1
    shown = {key for fields in seen.fields for key in fields}
    assert shown & {"loss", "policy_loss"}
    if name in ("grpo", "ppo"):  # the rollout step's success so far, the rows it stored, its run prefix
        assert "success" in shown and "reward" in shown
        assert result.rollouts["stored"] == 2 * 2 * 2 and result.rollouts["run_prefix"] == f"{name}/round-1"
    if name == "rft":
        assert seen.started[0][0].startswith("collect") and result.rollouts["attempts"] == 4


@pytest.mark.slow
def test_a_store_handed_in_receives_the_rollouts_and_ppo_stops_when_every_rollout_failed(tmp_path):
    from omrl.store import Store
    from omrl.train.algorithms.ppo import train_ppo

    recipe = _recipes(tmp_path)["ppo"]
    store = Store.create(tmp_path / "given")
    result = train_ppo({**recipe, "store": None, "max_steps": 1}, store=store)
    assert result.rollouts["stored"] == 4 and store.count() == 4 and not (tmp_path / "ppo-store").exists()
    broken = {**recipe, "rollout": {**recipe["rollout"], "env": "test_grpo:BrokenEnv"}, "output_dir": str(tmp_path / "b")}
    with pytest.raises(RuntimeError, match="PPO step 0: all 4 rollouts failed.*env server went away"):
        train_ppo(broken)  # the one rollout step's stop, as GRPO's (tests/test_grpo.py)
    failed = Store(tmp_path / "ppo-store").sql("SELECT DISTINCT status FROM trajectories").to_pylist()
    assert failed == [{"status": "env_error"}]  # stored before stopping, to inspect


@pytest.mark.slow
def test_omrl_train_prints_the_results_summary_and_shows_no_trl_logs(tmp_path):
    recipe = _recipes(tmp_path)["sft"]
    result = CliRunner().invoke(cli, ["train", "sft", *(f"{k}={v}" for k, v in recipe.items())])
    assert result.exit_code == 0, result.output
    assert "final loss" in result.output and f"checkpoint {tmp_path / 'sft'}" in result.output
    assert "{'loss'" not in result.output  # TRL's printer is off: omrl's reporter shows the steps


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_iterate_runs_its_update_step_through_the_registered_trainer(tmp_path, monkeypatch, algorithm):
    """An iterate round hands its update step to TRAINERS[algorithm].train: the section's recipe for the round,
    the run's store and its reporter (the real trainers are trained above; here only the call is caught)."""
    import dataclasses
    import importlib
    from pathlib import Path

    from omrl.config import load_recipe
    from omrl.models.tiny import cached_tiny_model
    from omrl.store import Store
    from omrl.train.config.iterate import IterateRecipe
    from omrl.train.iterate.run import run_iterate

    tasks = Path(__file__).resolve().parents[1] / "datasets" / "tasks"
    config = load_recipe({
        "output_dir": str(tmp_path / "run"), "model": str(cached_tiny_model(hidden=32)), "rounds": 1,
        "train_tasks": str(tasks / "grid_train.jsonl"), "eval_tasks": str(tasks / "grid_eval.jsonl"),
        "algorithm": algorithm, "rollout": {"env": "grid", "max_turns": 2, "max_new_tokens": 4},
        "demos": {"enabled": False}, "collect": {"enabled": False}, "eval": {"tasks": 1, "samples": 1, "greedy": False},
    }, IterateRecipe)
    module = importlib.import_module(f"omrl.train.algorithms.{algorithm}")
    calls = []

    class Caught(RuntimeError):
        pass

    def caught(recipe, *, store=None, reporter=None):
        calls.append((recipe, store, reporter))
        raise Caught

    monkeypatch.setattr(module, "TRAINER", dataclasses.replace(module.TRAINER, train=caught))
    seen = Seen()
    with pytest.raises(Caught):
        run_iterate(config, reporter=seen)
    (recipe, store, reporter), = calls
    assert type(recipe) is TRAINERS.load(algorithm).recipe
    assert (recipe.round, recipe.seed, recipe.output_dir) == (1, 1, str(tmp_path / "run" / "round-1" / algorithm))
    assert recipe.rollout.seed == config.rollout.seed + 1 == 1  # the run's rollout section, seeded for round 1
    assert isinstance(store, Store) and store.path == Path(tmp_path / "run" / "store") and reporter is seen
    assert any(f"{algorithm}-1" in line for line in seen.logs)  # the stage's start was told to the reporter
