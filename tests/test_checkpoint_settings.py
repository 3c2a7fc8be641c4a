"""A trained checkpoint carries its rollout settings (omrl_rollout.json, omrl.rollout.checkpoint_settings):
`omrl eval` / `omrl collect --policy hf:CKPT` play with them for every flag not given, say so, and a flag wins."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

pytest.importorskip("trl")

from omrl.cli.main import cli  # noqa: E402
from omrl.rollout.checkpoint_settings import (  # noqa: E402
    SETTINGS_FILE,
    read_rollout_settings,
    save_rollout_settings,
    settings_shown_by,
)
from tests.train_helpers import demo_store  # noqa: E402


@pytest.fixture(scope="module")
def grpo_checkpoint(tmp_path_factory):
    """One GRPO step on grid with rollout settings that are not the CLI's defaults."""
    from omrl.models.tiny import build_tiny_model
    from omrl.rollout import RolloutSettings
    from omrl.train.algorithms.grpo import train_grpo
    from omrl.train.config.grpo import GRPORecipe

    root = tmp_path_factory.mktemp("grpo")
    model = build_tiny_model(root / "tiny", hidden=64, layers=2)
    rollout = RolloutSettings(env="grid", env_options={"action_format": "tool", "noise": 0.0}, max_turns=3,
                              max_new_tokens=6, temperature=0.7, concurrency=4)
    recipe = GRPORecipe(model=str(model), tasks="shipped:grid_train", output_dir=str(root / "out"), rollout=rollout,
                        max_steps=1, tasks_per_step=2, samples_per_task=2, warmup_steps=0, logging_steps=1,
                        quiet=True)
    return train_grpo(recipe).checkpoint


def _played_settings(monkeypatch, command: str, checkpoint, *flags: str):
    """The RolloutSettings `omrl COMMAND` hands the engine, and its output (the engine faked: nothing is played)."""
    import omrl.rollout

    seen = {}

    async def fake(env_spec, tasks, policy, store, settings=None, **kwargs):
        seen["settings"] = settings
        return SimpleNamespace(metrics={}, collect=SimpleNamespace(retried=0), statuses={}, success_rate=None,
                               round=0, played=0, skipped=0, written=0, retried=0, already_stored=0, errors=0)

    monkeypatch.setattr(omrl.rollout, "evaluate" if command == "eval" else "collect", fake)
    store = ["--store", str(checkpoint.parent / f"store-{command}")] if command == "collect" else []
    out = CliRunner().invoke(cli, [command, "--tasks", "shipped:grid_eval", "--policy", f"hf:{checkpoint}",
                                   "--limit", "1", "--no-progress", *store, *flags])
    assert out.exit_code == 0, out.output
    return seen["settings"], out.output


@pytest.mark.slow
def test_a_grpo_checkpoint_is_evaluated_with_its_rollout_settings_unless_a_flag_says_otherwise(
        grpo_checkpoint, monkeypatch):
    record = json.loads((grpo_checkpoint / SETTINGS_FILE).read_text())
    assert record == {"trainer": "grpo", "env": "grid", "env_options": {"action_format": "tool", "noise": 0.0},
                      "max_turns": 3, "max_new_tokens": 6, "temperature": 0.7, "missing": []}

    settings, output = _played_settings(monkeypatch, "eval", grpo_checkpoint, "--env", "grid")
    assert (settings.env_options, settings.max_turns, settings.max_new_tokens, settings.temperature) == (
        {"action_format": "tool", "noise": 0.0}, 3, 6, 0.7)
    assert "using the checkpoint's rollout settings: env_options={'action_format': 'tool', 'noise': 0.0}, " \
           "max_turns=3, max_new_tokens=6, temperature=0.7" in output

    # A flag wins, also one given at its default value (--temperature 1.0), and an env option key by key.
    settings, output = _played_settings(monkeypatch, "eval", grpo_checkpoint, "--env", "grid", "--max-turns", "5",
                                        "--temperature", "1.0", "--env-option", "noise=0.5")
    assert (settings.env_options, settings.max_turns, settings.max_new_tokens, settings.temperature) == (
        {"action_format": "tool", "noise": 0.5}, 5, 6, 1.0)
    assert "using the checkpoint's rollout settings: env_options={'action_format': 'tool'}, max_new_tokens=6" \
           in output and "max_turns=3" not in output

    settings, _ = _played_settings(monkeypatch, "collect", grpo_checkpoint, "--env", "grid", "--max-tokens", "9")
    assert (settings.max_turns, settings.max_new_tokens, settings.temperature) == (3, 9, 0.7)

    # Trained on grid, played on math: none of it applies, and the command says why.
    settings, output = _played_settings(monkeypatch, "eval", grpo_checkpoint, "--env", "math")
    assert (settings.env_options, settings.max_turns, settings.temperature) == ({}, None, 1.0)
    assert "trained on env grid: its rollout settings are not used for --env math" in output


@pytest.mark.slow
def test_an_sft_checkpoint_saves_what_its_rows_show_and_names_the_rest_missing(tmp_path):
    from omrl.models.tiny import cached_tiny_model
    from omrl.train.algorithms.sft import train_sft
    from omrl.train.config.sft import SFTRecipe

    store = demo_store(tmp_path / "s")
    result = train_sft(SFTRecipe(model=str(cached_tiny_model()), store=str(store.path),
                                 output_dir=str(tmp_path / "out"), batch_size=4, max_steps=1, quiet=True))
    record = json.loads((result.checkpoint / SETTINGS_FILE).read_text())
    # demo rows name no environment and no turn budget: SFT says it knows none of the settings.
    assert record == {"trainer": "sft", "missing": ["env", "env_options", "max_turns", "max_new_tokens",
                                                    "temperature"]}


def test_rows_give_what_they_agree_on_and_a_sandbox_opt_out_is_never_saved(tmp_path):
    rows = [{"env": "grid", "metadata": json.dumps({"max_turns": 14})},
            {"env": "grid", "metadata": json.dumps({"max_turns": 14, "seed": 3})}]
    assert settings_shown_by(rows) == {"env": "grid", "max_turns": 14}
    assert settings_shown_by([*rows, {"env": "math", "metadata": None}]) == {"env": None, "max_turns": None}
    save_rollout_settings(tmp_path, {"env": "code", "env_options": {"unsafe_no_sandbox": True, "timeout_s": 5}},
                          trainer="sft")
    assert read_rollout_settings(tmp_path) == {"env": "code", "env_options": {"timeout_s": 5}}
    assert read_rollout_settings(tmp_path / "nothing") is None
