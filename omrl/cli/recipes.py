"""`omrl recipes list|copy`: the recipes shipped with omrl (as torchtune's `tune ls` / `tune cp`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import click

from omrl.cli.common import console, user_errors
from omrl.errors import UsageError


@click.group()
def recipes() -> None:
    """The recipes shipped with omrl: training (sft, grpo, ppo, rft, iterate), reward, judge rubrics,
    import mappings and accelerate configs. Any command that takes a recipe path also takes
    shipped:NAME.

    \b
    Example:  omrl recipes copy quickstart && omrl train iterate -r quickstart.yaml rounds=1
    """


def summary(path: Path) -> str:
    """A recipe's first comment line (its description), or '' when it starts without one."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            return line.strip().lstrip("#").strip() if line.lstrip().startswith("#") else ""
    return ""


@recipes.command("list")
@user_errors
def list_() -> None:
    """List the shipped recipes, each with its first comment line.

    Example:  omrl recipes list
    """
    from rich.table import Table

    from omrl.shipped import resolve_recipe, shipped_recipes

    table = Table(title="shipped recipes (use as shipped:NAME, or omrl recipes copy NAME)")
    table.add_column("name", no_wrap=True)
    table.add_column("what it is", overflow="fold")
    for name in shipped_recipes():
        table.add_row(name, summary(Path(resolve_recipe(f"shipped:{name}"))))
    console.print(table)


@recipes.command("copy")
@click.argument("name")
@click.argument("dest", required=False, type=click.Path())
@click.option("--force", is_flag=True, help="Overwrite DEST when it exists.")
@user_errors
def copy(name: str, dest: str | None, force: bool) -> None:
    """Copy the shipped recipe NAME to DEST (default: NAME's file name in the current folder) to edit.

    Example:  omrl recipes copy judges/correctness my_judge.yaml
    """
    from omrl.shipped import resolve_recipe

    source = Path(resolve_recipe(f"shipped:{name.removeprefix('shipped:')}"))
    target = Path(dest) if dest else Path(source.name)
    if target.is_dir():
        target = target / source.name
    if target.exists() and not force:
        raise UsageError(f"{target} exists; pass --force to overwrite it")
    shutil.copyfile(source, target)
    console.print(f"copied shipped:{name.removeprefix('shipped:')} to {target}")
