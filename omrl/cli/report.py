"""`omrl report`: plots and a Markdown/HTML summary of a store, a run's results.json and its trainer logs; or of a
study folder (`omrl study run --out FOLDER`, holding study.json)."""

from __future__ import annotations

import click

from omrl.cli.common import EXISTING_STORE, console, user_errors


@click.command()
@click.argument("store", type=EXISTING_STORE, metavar="STORE_OR_STUDY")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Folder to write.")
@click.option("--results", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A run's results.json (per-stage held-out success) to plot too.")
@click.option("--runs", "runs", multiple=True, type=click.Path(exists=True),
              help="A training output folder searched recursively for omrl_grpo.json / omrl_ppo.json "
                   "(per-step reward, success, loss, entropy; PPO: value loss, explained variance, clip "
                   "fraction, approx KL). Repeatable; an iterate run's out folder finds every round.")
@click.option("--benchmark", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A learning benchmark's benchmark.json (benchmarks/hard_task.py): its table of methods "
                   "and its training success per step, per method and seed.")
@user_errors
def report(store: str, out_dir: str, results: str | None, runs: tuple[str, ...], benchmark: str | None) -> None:
    """Write a store's per-round and per-step curves, judge agreement, report.md and report.html.

    A study folder (one holding study.json, written by omrl study run --out FOLDER) gives study.md and study.html
    instead: the primary contrast and its 95% interval, a table per condition (seed-level mean and t interval,
    per seed, bootstrap differences to sft and more_sft, seeds won, compute), a per-seed dot plot and the
    learning curves of the runs' stored rollouts (--results, --runs and --benchmark are for stores).

    \b
    Example:  omrl report runs/quickstart/store --out runs/quickstart/report \\
                --results runs/quickstart/results.json --runs runs/quickstart
              omrl report runs/hard_task/store --out report --benchmark runs/hard_task/benchmark.json

    \b
    Example:  omrl study run shipped:studies/quick --out runs/study-quick
              omrl report runs/study-quick --out runs/study-quick/report
    """
    from omrl.report import write_report
    from omrl.report.study import is_study_folder, write_study_report

    if is_study_folder(store):
        given = [name for name, value in (("--results", results), ("--runs", runs), ("--benchmark", benchmark))
                 if value]
        if given:
            raise click.UsageError(f"{store} is a study folder (it holds study.json): {', '.join(given)} "
                                   "apply to a store's report only")
        paths = write_study_report(store, out_dir)
    else:
        paths = write_report(store, out_dir, results=results, runs=list(runs), benchmark=benchmark)
    for name, path in paths.items():
        console.print(f"{name}: {path}")
