"""omrl.shipped: a checkout's path to a shipped task set or recipe, missing where it is given (an installed
wheel, another folder), gets "did you mean shipped:NAME?"; every other source resolves as before."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from omrl.shipped import resolve_recipe, resolve_tasks, shipped_datasets_dir, shipped_recipes_dir


@pytest.fixture
def elsewhere(tmp_path, monkeypatch) -> Path:
    """An empty working folder: datasets/ and recipes/ are not beside it, as from a wheel."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(("resolve", "path", "name"), [
    (resolve_tasks, "datasets/tasks/math_arith.jsonl", "math_arith"),
    (resolve_tasks, "math_arith.jsonl", "math_arith"),
    (resolve_recipe, "recipes/quickstart.yaml", "quickstart"),
    (resolve_recipe, "recipes/judges/grid_goal.yaml", "judges/grid_goal"),
])
def test_a_missing_path_naming_a_shipped_one_gets_did_you_mean(elsewhere, resolve, path, name):
    with pytest.raises(FileNotFoundError, match=f"^{path}: no such file; did you mean shipped:{name}\\?$"):
        resolve(path)
    with pytest.raises(FileNotFoundError, match=f"did you mean shipped:{name}\\?"):
        resolve(Path(path))


def test_other_sources_resolve_as_before(elsewhere):
    assert resolve_tasks("nope/unknown.jsonl") == "nope/unknown.jsonl"  # no shipped set of that name
    assert resolve_tasks("gsm8k:main") == "gsm8k:main"  # a Hub dataset
    assert resolve_tasks("math_arith") == "math_arith"  # no .jsonl: a Hub name, not a file
    assert resolve_recipe("math_arith.yaml") == "math_arith.yaml"  # a task set's name is not a recipe's
    assert resolve_recipe("quickstart.yml") == "quickstart.yml"
    checkout = shipped_datasets_dir() / "tasks" / "math_arith.jsonl"
    assert resolve_tasks(checkout) == checkout  # an existing file is itself
    (elsewhere / "recipes").mkdir()
    (elsewhere / "recipes" / "quickstart.yaml").write_text("rounds: 1\n")
    assert resolve_recipe("recipes/quickstart.yaml") == "recipes/quickstart.yaml"  # the user's own copy
    assert resolve_recipe("shipped:quickstart") == shipped_recipes_dir() / "quickstart.yaml"


def test_the_commands_say_did_you_mean(elsewhere):
    from omrl.cli.main import cli
    from omrl.config import load_recipe
    from omrl.tasks import load_tasks
    from omrl.train.config.iterate import IterateRecipe

    with pytest.raises(FileNotFoundError, match="did you mean shipped:math_arith"):
        load_tasks("datasets/tasks/math_arith.jsonl")
    with pytest.raises(FileNotFoundError, match="did you mean shipped:quickstart"):
        load_recipe("recipes/quickstart.yaml", IterateRecipe)
    runner = CliRunner()
    collect = runner.invoke(cli, ["collect", "--env", "math", "--tasks", "datasets/tasks/math_arith.jsonl",
                                  "--policy", "scripted", "--store", "store"])
    assert collect.exit_code == 1, collect.output
    assert "datasets/tasks/math_arith.jsonl: no such file; did you mean shipped:math_arith?" in collect.output
    train = runner.invoke(cli, ["train", "sft", "--recipe", "recipes/sft_tiny.yaml", "--print-config"])
    assert train.exit_code == 1 and "did you mean shipped:sft_tiny?" in train.output, train.output
    assert not (elsewhere / "store").exists()
