"""Every shipped recipe starts with the command that runs it, comments its keys and loads into its config."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from omrl.recipes import RecipeError, describe, load_recipe, parse_overrides

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
TRAINING = sorted(p for p in RECIPES.glob("*.yaml") if not p.name.startswith("reward"))
ACCELERATE = sorted((RECIPES / "accelerate").glob("*.yaml"))


def config_class(command: str):
    from omrl.train.grpo import GRPORecipe
    from omrl.train.iterate import IterateRecipe
    from omrl.train.rft import RFTRecipe
    from omrl.train.sft import SFTRecipe

    for verb, cls in (("sft", SFTRecipe), ("grpo", GRPORecipe), ("rft", RFTRecipe), ("iterate", IterateRecipe)):
        if re.search(rf"omrl train {verb}\b", command):
            return cls
    return None


@pytest.mark.parametrize("path", TRAINING + ACCELERATE, ids=lambda p: p.name)
def test_recipe_starts_with_its_command_and_comments_keys(path):
    lines = path.read_text().splitlines()
    header = []
    for line in lines:  # the leading comment block must name the command that runs the recipe
        if not line.startswith("#"):
            break
        header.append(line)
    assert header and re.search(r"\b(omrl \w+|make \w+|accelerate launch)\b", "\n".join(header)), lines[0]
    if path in ACCELERATE or config_class(lines[0]) is not None:
        for line in lines:
            if re.match(r"^\s*[\w.]+:", line):
                assert "#" in line, f"{path.name}: key without a comment: {line!r}"


@pytest.mark.parametrize("path", TRAINING, ids=lambda p: p.name)
def test_training_recipe_loads_into_its_config(path):
    pytest.importorskip("trl")
    command = path.read_text().splitlines()[0]
    cls = config_class(command)
    if cls is None:
        pytest.skip(f"{path.name} is run by {command!r}, not by omrl train (validated by its own command)")
    config = load_recipe(path, cls)
    assert config is not None


@pytest.mark.parametrize("path", ACCELERATE, ids=lambda p: p.name)
def test_accelerate_configs_are_valid_yaml(path):
    data = yaml.safe_load(path.read_text())
    assert data["distributed_type"] in ("MULTI_GPU", "FSDP", "DEEPSPEED", "MULTI_CPU")
    assert data["num_processes"] >= 1


def test_overrides_convert_types_and_nest():
    from omrl.train.sft import SFTRecipe

    config = load_recipe(RECIPES / "sft_tiny.yaml", SFTRecipe,
                         ["learning_rate=1e-4", "lora.r=4", "lora.enabled=true", "where=reward > 0.5",
                          "use_cpu=yes", "lora.target_modules=q_proj,v_proj"])
    assert config.learning_rate == 1e-4 and isinstance(config.learning_rate, float)
    assert config.lora.r == 4 and config.lora.enabled is True and config.use_cpu is True
    assert config.where == "reward > 0.5" and config.lora.target_modules == ["q_proj", "v_proj"]
    assert parse_overrides(["a.b.c=1", "a.d=x"]) == {"a": {"b": {"c": 1}, "d": "x"}}


def test_unknown_and_bad_keys_are_named():
    from omrl.train.sft import SFTRecipe

    with pytest.raises(RecipeError, match="unknown key learnin_rate"):
        load_recipe(RECIPES / "sft_tiny.yaml", SFTRecipe, ["learnin_rate=1"])
    with pytest.raises(RecipeError, match="unknown key lora.rank"):
        load_recipe(RECIPES / "sft_tiny.yaml", SFTRecipe, ["lora.rank=1"])
    with pytest.raises(RecipeError, match="epochs must be int, not .two."):
        load_recipe(RECIPES / "sft_tiny.yaml", SFTRecipe, ["epochs=two"])
    with pytest.raises(RecipeError, match="missing required key output_dir"):
        load_recipe({"model": "m", "store": "s"}, SFTRecipe)
    with pytest.raises(RecipeError, match="batching must be"):
        load_recipe(RECIPES / "sft_tiny.yaml", SFTRecipe, ["batching=fast"])
    with pytest.raises(RecipeError, match="not key=value"):
        parse_overrides(["epochs"])


def test_every_setting_has_help():
    from omrl.train.grpo import GRPORecipe
    from omrl.train.iterate import IterateRecipe
    from omrl.train.rft import RFTRecipe
    from omrl.train.sft import SFTRecipe

    for cls in (SFTRecipe, GRPORecipe, RFTRecipe, IterateRecipe):
        for key, _default, text in describe(cls):
            assert text, f"{cls.__name__}.{key} has no help"


def test_train_cli_prints_resolved_config():
    from click.testing import CliRunner

    from omrl.cli.main import cli

    result = CliRunner().invoke(cli, ["train", "sft", "--recipe", str(RECIPES / "sft_tiny.yaml"), "--print-config",
                                      "epochs=2"])
    assert result.exit_code == 0, result.output
    assert '"epochs": 2' in result.output
    result = CliRunner().invoke(cli, ["train", "sft", "--recipe", str(RECIPES / "sft_tiny.yaml"), "bogus=1"])
    assert result.exit_code != 0 and "unknown key bogus" in result.output


def test_rollout_settings_are_a_section_of_every_training_recipe():
    pytest.importorskip("trl")
    from omrl.rollout import RolloutSettings
    from omrl.train.grpo import GRPORecipe
    from omrl.train.iterate import IterateRecipe
    from omrl.train.rft import RFTRecipe

    for name, cls in (("grpo_grid", GRPORecipe), ("rft_grid", RFTRecipe), ("iterate_grid", IterateRecipe)):
        config = load_recipe(RECIPES / f"{name}.yaml", cls, ["rollout.max_turns=4", "rollout.env_options.noise=0"])
        assert isinstance(config.rollout, RolloutSettings)
        assert config.rollout.max_turns == 4 and config.rollout.env_options == {"noise": 0}
        assert config.rollout.max_new_tokens == 8  # the rest as the file says
        assert {k for k, _, _ in describe(cls)} >= {f"rollout.{k}" for k in ("env", "max_turns", "seed")}


@pytest.mark.parametrize("path", TRAINING, ids=lambda p: p.name)
def test_training_recipe_names_its_data_so_it_runs_from_any_folder(path, tmp_path, monkeypatch):
    """Task sets and rubrics are shipped names, not paths relative to a checkout (omrl demo from a wheel)."""
    from omrl.annotate.rubric import load_rubric
    from omrl.tasks import load_tasks

    monkeypatch.chdir(tmp_path)
    data = yaml.safe_load(path.read_text())
    sources = [data[key] for key in ("tasks", "train_tasks", "eval_tasks") if data.get(key)]
    rubrics = re.findall(r"rubric:\s*(\S+)", path.read_text())
    for source in sources:
        assert str(source).startswith("shipped:") and load_tasks(source), (path.name, source)
    for rubric in rubrics:
        assert rubric.startswith("shipped:") and load_rubric(rubric).criteria, (path.name, rubric)


def test_shipped_recipes_resolve_by_name_only():
    from omrl.shipped import resolve_recipe, shipped_recipes

    names = shipped_recipes()
    assert {"quickstart", "sft_tiny", "judges/grid_goal", "accelerate/ddp"} <= set(names)
    assert Path(resolve_recipe("shipped:quickstart")).resolve() == RECIPES / "quickstart.yaml"
    assert Path(resolve_recipe("shipped:judges/grid_goal.yaml")).resolve() == RECIPES / "judges" / "grid_goal.yaml"
    assert resolve_recipe("my.yaml") == "my.yaml"
    for bad in ("shipped:nope", "shipped:../pyproject", "shipped:/etc/passwd", "shipped:"):
        with pytest.raises(FileNotFoundError, match="shipped:quickstart"):
            resolve_recipe(bad)
    from omrl.train.iterate import IterateRecipe

    assert load_recipe("shipped:quickstart", IterateRecipe) == load_recipe(RECIPES / "quickstart.yaml", IterateRecipe)


def test_recipes_cli_lists_and_copies(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from omrl.cli.main import cli

    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    listed = runner.invoke(cli, ["recipes", "list"], terminal_width=200)
    assert listed.exit_code == 0, listed.output
    assert "quickstart" in listed.output and "judges/grid_goal" in listed.output
    assert "The learning demo" in listed.output  # quickstart's first comment line

    copied = runner.invoke(cli, ["recipes", "copy", "quickstart"])
    assert copied.exit_code == 0, copied.output
    assert (tmp_path / "quickstart.yaml").read_bytes() == (RECIPES / "quickstart.yaml").read_bytes()
    again = runner.invoke(cli, ["recipes", "copy", "quickstart"])
    assert again.exit_code == 1 and "--force" in again.output
    (tmp_path / "mine").mkdir()
    into = runner.invoke(cli, ["recipes", "copy", "shipped:judges/grid_goal", "mine", "--force"])
    assert into.exit_code == 0 and (tmp_path / "mine" / "grid_goal.yaml").is_file(), into.output
    unknown = runner.invoke(cli, ["recipes", "copy", "quickstrat"])
    assert unknown.exit_code == 1 and "shipped:quickstart" in unknown.output
