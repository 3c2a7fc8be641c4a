"""Environments' typed constructor options (`--env-option KEY=VALUE`, omrl/envs/options.py) and the built-ins
coming from omrl's entry points (pyproject.toml) like plugins do."""

from __future__ import annotations

import dataclasses
import inspect
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from omrl.cli.main import cli
from omrl.config import RecipeError
from omrl.envs import BUILTIN_NAMES, ENVIRONMENTS, EnvironmentRegistry, EnvSpecError, env_class, env_options
from omrl.tasks import write_tasks

ROOT = Path(__file__).resolve().parents[1]


def test_good_values_are_read_and_converted_to_the_declared_types():
    assert env_options("grid", {"noise": "0.5", "seed": "3", "slack": "1", "action_format": "tool"}) == {
        "noise": 0.5, "seed": 3, "slack": 1, "action_format": "tool"}
    assert env_options("grid", {"seed": "null"}) == {"seed": None}
    assert env_options("code", {"test_command": '["python", "-m", "pytest"]', "unsafe_no_sandbox": "true"}) == {
        "test_command": ["python", "-m", "pytest"], "unsafe_no_sandbox": True}
    assert env_options("http", {"id_key": "1", "timeout_s": "5"}) == {"id_key": "1", "timeout_s": 5.0}  # text stays text
    assert env_options("miniwob", {"time_limit_s": "60"}) == {"time_limit_s": 60.0}
    assert env_options("grid", {}) == {}


def test_an_unknown_key_is_one_line_naming_the_option_and_the_environment():
    with pytest.raises(RecipeError) as caught:
        env_options("grid", {"nosie": "0.5"})
    message = str(caught.value)
    assert "'grid'" in message and "nosie" in message and "known keys: action_format, noise, seed, slack" in message
    assert "\n" not in message


def test_a_wrong_type_is_one_line_naming_the_option_and_the_environment():
    with pytest.raises(RecipeError, match=r"environment 'grid' \(--env-option\): noise must be float, not 'fast'"):
        env_options("grid", {"noise": "fast"})
    with pytest.raises(RecipeError, match=r"environment 'math' .*max_calculator_calls must be an integer"):
        env_options("math", {"max_calculator_calls": "2.5"})
    with pytest.raises(RecipeError, match=r"environment 'twx' .*observation must be one of full, brief, not 'all'"):
        env_options("twx", {"observation": "all"})


def test_collect_refuses_a_wrong_option_before_playing(tmp_path):
    tasks = write_tasks([{"id": "t", "instruction": "Reach the goal.", "env": "grid",
                          "payload": '{"size": 3, "start": [1, 1], "goal": [3, 3]}'}], tmp_path / "t.jsonl")
    for option, expected in (("nosie=0.5", "unknown key nosie"), ("noise=fast", "noise must be float")):
        out = CliRunner().invoke(cli, ["collect", "--env", "grid", "--tasks", str(tasks), "--policy", "scripted",
                                       "--store", str(tmp_path / "s"), "--env-option", option])
        assert out.exit_code != 0 and expected in out.output and "'grid'" in out.output, out.output
        assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_each_builtin_declares_its_constructors_options(name):
    cls = env_class(name)
    fields = {f.name: f.default for f in dataclasses.fields(cls.options_class)}
    parameters = {p.name: p.default for p in list(inspect.signature(cls.__init__).parameters.values())[1:]
                  if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    assert fields == parameters


@pytest.fixture
def plugin_class(tmp_path, monkeypatch):
    (tmp_path / "untyped_envs.py").write_text(textwrap.dedent('''
        class FreeEnv:
            def __init__(self, **options):
                self.options = options
            def reset(self, task): ...
            def step(self, action): ...
            def close(self): ...
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "untyped_envs:FreeEnv"
    sys.modules.pop("untyped_envs", None)


def test_a_class_without_typed_options_gets_its_values_read_but_unchecked(plugin_class):
    assert env_options(plugin_class, {"n": "3", "name": "x", "flags": "[1, 2]"}) == {"n": 3, "name": "x",
                                                                                     "flags": [1, 2]}


def test_the_builtins_are_omrls_entry_points_as_declared_in_pyproject():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["omrl.envs"]
    assert set(declared) == set(BUILTIN_NAMES) and list(ENVIRONMENTS.builtins) == list(BUILTIN_NAMES)
    assert {name: entry.target for name, entry in ENVIRONMENTS.builtins.items()} == declared
    assert all(entry.provider == "omrl" for entry in ENVIRONMENTS.builtins.values())
    assert ENVIRONMENTS.plugin_names() == []  # omrl's own entry points are not taken for plugins


def test_a_builtin_missing_from_the_installed_metadata_is_a_clear_error():
    registry = EnvironmentRegistry((*BUILTIN_NAMES, "atlantis"))
    with pytest.raises(EnvSpecError, match=r"lacks the built-in environment\(s\) atlantis .*pip install -e"):
        registry.get("math")
