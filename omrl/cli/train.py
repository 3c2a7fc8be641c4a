"""`omrl train sft|grpo|ppo|rft|iterate`: run a training recipe (YAML) with optional key=value overrides.

One command per registered trainer (omrl.train.trainer.TRAINERS: its recipe class, train function and help),
made when first asked for, so `omrl train --help` imports no trainer; iterate (the orchestrator) is its own.
"""

from __future__ import annotations

import json
import sys

import click

from omrl.cli.common import console, err_console, user_errors


def _load(recipe: str | None, overrides: tuple[str, ...], cls: type):
    from omrl.config import load_recipe

    return load_recipe(recipe, cls, overrides)


def _recipe_options(func):
    func = click.argument("overrides", nargs=-1)(func)
    func = click.option("--recipe", "-r", type=click.Path(dir_okay=False), default=None,
                        help="YAML recipe, or shipped:NAME (omrl recipes list); key=value arguments override its keys "
                             "(dots for sections).")(func)
    func = click.option("--print-config", is_flag=True, help="Print the resolved settings and exit.")(func)
    func = click.option("--verbose", is_flag=True,
                        help="TRL's own logs, bars and warnings beside omrl's progress.")(func)
    return func


def _shown(verbose: bool):
    """(the libraries' output context, the reporter) a training command runs inside: omrl's progress on stderr,
    TRL's printer, bars and warnings off unless `verbose`."""
    from omrl.progress import terminal_reporter
    from omrl.train.trainer_progress import quiet_libraries

    return quiet_libraries(not verbose), terminal_reporter(console=err_console)


def _print_config(config) -> None:
    from omrl.config import to_dict

    console.print_json(json.dumps(to_dict(config), default=str))


def _close_process_group() -> None:
    """End a run of several processes (torchrun, accelerate launch) together: a process group left to the
    interpreter's exit can abort a rank ("terminate called without an active exception")."""
    distributed = sys.modules.get("torch.distributed")
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        distributed.barrier()
        distributed.destroy_process_group()


def trainer_command(name: str) -> click.Command:
    """`omrl train NAME`: load the registered trainer's recipe, train it with a reporter, print its summary."""
    from omrl.train.trainer import TRAINERS

    entry = TRAINERS.load(name)

    @_recipe_options
    @user_errors
    def run(recipe: str | None, overrides: tuple[str, ...], print_config: bool, verbose: bool) -> None:
        config = _load(recipe, overrides, entry.recipe)
        if print_config:
            return _print_config(config)
        libraries, reporter = _shown(verbose)
        with libraries, reporter:
            result = entry.train(config, reporter=reporter)
        _close_process_group()
        if not result.main:  # several processes: the main one reports for all of them
            return
        for line in filter(None, result.summary.splitlines()):
            console.print(line, highlight=False, markup=False)
        console.print(f"checkpoint [bold]{result.checkpoint}[/bold]")

    return click.command(name, help=entry.help)(run)


class TrainGroup(click.Group):
    """`omrl train`: a command per TRAINERS entry (made on first use) and iterate."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        from omrl.train.trainer import TRAINERS

        return [*TRAINERS.builtins, *super().list_commands(ctx)]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        from omrl.train.trainer import TRAINERS

        return trainer_command(name) if name in TRAINERS.builtins else super().get_command(ctx, name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # The trainers' lines come from the registry, so listing them imports none.
        from omrl.train.trainer import TRAINERS

        rows = [(name, entry.summary) for name, entry in TRAINERS.builtins.items()]
        rows += [(name, self.commands[name].get_short_help_str()) for name in super().list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=TrainGroup)
def train() -> None:
    """Train on stored experience: sft, grpo, ppo, rft (rejection sampling), iterate (rounds of all).

    Example:  omrl train sft --recipe shipped:sft_tiny epochs=3
    """


@train.command("iterate")
@_recipe_options
@user_errors
def iterate(recipe: str | None, overrides: tuple[str, ...], print_config: bool, verbose: bool) -> None:
    """Iterative rounds: collect -> [annotate ->] filter -> GRPO (-> SFT on best) -> held-out eval; resumes.

    With reward=RECIPE each round's collection is annotated by its metrics and judges, the filter ranks by
    it and GRPO is scored online by it.

    \b
    Example:  omrl train iterate --recipe shipped:iterate_grid rounds=2 [reward=shipped:reward]
    """
    from omrl.train.config.iterate import IterateRecipe
    from omrl.train.iterate.evaluation import round_table
    from omrl.train.iterate.run import run_iterate

    config = _load(recipe, overrides, IterateRecipe)
    if print_config:
        return _print_config(config)
    libraries, reporter = _shown(verbose)
    with libraries, reporter:
        results = run_iterate(config, reporter=reporter)
    console.print(round_table(results))
    console.print(f"results: {config.output_dir}/results.json")
