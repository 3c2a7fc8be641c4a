"""`omrl report`: plots and a Markdown/HTML summary of a store and (optionally) a run's results.json."""

from __future__ import annotations

import click

from omrl.cli.common import console, user_errors


@click.command()
@click.argument("store", type=click.Path(exists=True, file_okay=False))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Folder to write.")
@click.option("--results", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A run's results.json (per-stage held-out success) to plot too.")
@user_errors
def report(store: str, out_dir: str, results: str | None) -> None:
    """Write per-round success/reward curves, distributions, report.md and report.html.

    Example:  omrl report runs/quickstart/store --out runs/quickstart/report --results runs/quickstart/results.json
    """
    from omrl.report import write_report

    paths = write_report(store, out_dir, results=results)
    for name, path in paths.items():
        console.print(f"{name}: {path}")
