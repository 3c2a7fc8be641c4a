"""`omrl demo`: the learning demo (tiny model + grid env: expert SFT, then GRPO rounds, on the CPU)."""

from __future__ import annotations

import click

from omrl.cli.common import user_errors


@click.command()
@click.option("--recipe", default="recipes/quickstart.yaml", show_default=True, type=click.Path(dir_okay=False),
              help="Demo recipe (YAML).")
@click.option("--out-dir", default=None, help="Where the run goes (default: the recipe's out_dir).")
@user_errors
def demo(recipe: str, out_dir: str | None) -> None:
    """Run the learning demo and print held-out success for base, SFT and each GRPO round.

    Example:  omrl demo --recipe recipes/quickstart.yaml
    """
    from omrl.demo import DemoRecipe, run_demo

    run_demo(DemoRecipe.load(recipe, out_dir=out_dir))
