"""The documentation's promises: the generated CLI reference covers every command of the `omrl` group, the
recipe reference every registered trainer, and README.md stays a short front door without issue numbers."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import click

from omrl.cli.main import cli

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "scripts" / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _all_commands(group: click.Group, ctx: click.Context, path: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every command path under `group`, walked here apart from the generator's own walk."""
    found = set()
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        found.add((*path, name))
        if isinstance(command, click.Group):
            found |= _all_commands(command, click.Context(command, info_name=name, parent=ctx), (*path, name))
    return found


def test_cli_reference_lists_every_command_and_subcommand(tmp_path):
    _generator().generate(tmp_path)
    text = (tmp_path / "cli.md").read_text(encoding="utf-8")
    headings = set(re.findall(r"^## (omrl(?: [\w-]+)*)$", text, re.M))
    commands = _all_commands(cli, click.Context(cli, info_name="omrl"))
    assert {("train", "sft"), ("store", "check"), ("models", "fetch")} <= commands  # the walk reaches subcommands
    missing = sorted(" ".join(("omrl", *path)) for path in commands if " ".join(("omrl", *path)) not in headings)
    assert missing == []
    # each section holds that command's own help
    assert "Usage: omrl train sft [OPTIONS]" in text and "Usage: omrl store check [OPTIONS]" in text


def test_recipe_reference_has_every_trainer_and_typed_keys(tmp_path):
    generator = _generator()
    generator.generate(tmp_path)
    text = (tmp_path / "recipes.md").read_text(encoding="utf-8")
    for name in ("sft", "grpo", "ppo", "rft", "iterate", "reward", "judge rubric", "import mapping"):
        assert f"\n## {name}\n" in text, name
    # a key with its type, default and the help from its field's metadata
    assert re.search(r"^\| `learning_rate` \| float \| `[\d.e-]+` \| .+ \|$", text, re.M)
    assert "| `lora.r` | int |" in text  # nested sections flattened with dots


def test_readme_is_a_short_front_door():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    assert not re.search(r"\bissues?\s+#?\d+|#\d+\b", text, re.I), "README names an issue number"
    assert "make test" in text and "make demo" in text  # .ci/run runs the test command README gives
