"""`omrl report`: plots and a Markdown/HTML summary of a store, a run's results.json and its trainer logs."""

from __future__ import annotations

import click

from omrl.cli.common import EXISTING_STORE, console, user_errors


@click.command()
@click.argument("store", type=EXISTING_STORE)
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Folder to write.")
@click.option("--results", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A run's results.json (per-stage held-out success) to plot too.")
@click.option("--runs", "runs", multiple=True, type=click.Path(exists=True),
              help="A training output folder searched recursively for omrl_grpo.json / omrl_ppo.json "
                   "(per-step reward, success, loss, entropy; PPO: value loss, explained variance, clip "
                   "fraction, approx KL). Repeatable; an iterate run's out folder finds every round.")
@click.option("--benchmark", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A learning benchmark's benchmark.json (benchmarks/textworld_learning.py): its table of methods "
                   "and its training success per step, per method and seed.")
@user_errors
def report(store: str, out_dir: str, results: str | None, runs: tuple[str, ...], benchmark: str | None) -> None:
    """Write per-round and per-step curves, judge-vs-environment agreement, report.md and report.html.

    \b
    Example:  omrl report runs/quickstart/store --out runs/quickstart/report \\
                --results runs/quickstart/results.json --runs runs/quickstart
              omrl report runs/textworld_learning/seed-0/store --out report \\
                --benchmark runs/textworld_learning/benchmark.json
    """
    from omrl.report import write_report

    paths = write_report(store, out_dir, results=results, runs=list(runs), benchmark=benchmark)
    for name, path in paths.items():
        console.print(f"{name}: {path}")
