"""`omrl study check`: a study file (omrl.study.spec) checked before anything runs."""

from __future__ import annotations

import json

import click

from omrl.cli.common import user_errors


@click.group()
def study() -> None:
    """Studies a reviewer accepts: methods compared at a matched budget over seeds, on held-out tasks that are
    new by fingerprint, the test set scored once, the primary contrast declared in the study file.

    \b
    Example:  omrl study check shipped:studies/grid
    """


@study.command("check")
@click.argument("study_file", metavar="STUDY")
@click.argument("overrides", nargs=-1)
@user_errors
def check(study_file: str, overrides: tuple[str, ...]) -> None:
    """Load STUDY (a YAML file or shipped:NAME; KEY=VALUE overrides after it), fingerprint its train, dev and
    test tasks and print one JSON line: the settings hash and the overlap report (distinct_test_tasks,
    test_train_overlap, dev_test_overlap, ...). Exits non-zero when a dev or test task is seen in train or
    the other held-out split, unless the study sets drop_overlaps (then they are dropped and counted).

    \b
    Example:  omrl study check shipped:studies/grid
              omrl study check my_study.yaml drop_overlaps=true seeds=3
    """
    from omrl.study.check import check_study, report_head, study_folder_of
    from omrl.study.overlap import OverlapError
    from omrl.study.spec import load_study

    spec = load_study(study_file, overrides)
    try:
        report = check_study(spec, study_folder_of(study_file))
    except OverlapError as exc:
        click.echo(json.dumps({**report_head(spec), **(exc.report or {}), "refused": True}))
        raise
    click.echo(json.dumps(report))
