"""`omrl demo`: the learning demo, the shipped recipes/quickstart.yaml run fresh through `omrl train iterate`."""

from __future__ import annotations

import click

from omrl.cli.common import user_errors


@click.command()
@click.option("--recipe", "-r", default="shipped:quickstart", show_default=True, metavar="PATH",
              help="Iterate recipe of the demo (YAML), or a shipped one by name (omrl recipes list).")
@click.option("--out-dir", default=None, help="Where the run goes (default: the recipe's output_dir).")
@click.option("--verbose", is_flag=True, help="Show TRL's own logs, bars and warnings beside omrl's progress.")
@click.argument("overrides", nargs=-1)
@user_errors
def demo(recipe: str, out_dir: str | None, verbose: bool, overrides: tuple[str, ...]) -> None:
    """Run the learning demo (fresh) and print held-out success per stage: expert, base, SFT, GRPO rounds,
    more SFT. KEY=VALUE arguments override the recipe (dots for sections).

    Example:  omrl demo grpo.max_steps=10 rounds=1
    """
    from omrl.train.iterate.demo import run_demo

    run_demo(recipe, (*overrides, *([f"output_dir={out_dir}"] if out_dir else [])), verbose=verbose)
