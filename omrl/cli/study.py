"""`omrl study check` and `omrl study run`: a study file (omrl.study.spec) checked before anything runs, and run."""

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
              omrl study run shipped:studies/quick --out runs/study-quick
              omrl study status runs/study-quick
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


@study.command("run")
@click.argument("study_file", metavar="STUDY")
@click.argument("overrides", nargs=-1)
@click.option("--out", "out", required=True, type=click.Path(file_okay=False),
              help="the study's folder: its runs (resumed), test_ledger.jsonl and study.json")
@click.option("--rescore", is_flag=True,
              help="score the test set again under changed settings (the ledger counts a second scoring)")
@click.option("--verbose", is_flag=True, help="TRL's own logs beside omrl's lines")
@user_errors
def run(study_file: str, overrides: tuple[str, ...], out: str, rescore: bool, verbose: bool) -> None:
    """Run STUDY (a YAML file or shipped:NAME; KEY=VALUE overrides after it) into --out: per condition and seed
    expert demos, SFT, then every method from that SFT checkpoint at the study's budget, each tuned on dev (seed
    0) and scored once on test (recorded in the test ledger first). Prints the overlap report (one JSON line),
    a table of test success per method and condition (mean +- t interval over seeds, per seed) and one JSON
    line of headline figures; OUT/study.json holds them all. A killed run started again skips finished runs;
    changed settings are refused once the test set was scored, unless --rescore.

    \b
    Example:  omrl study run shipped:studies/quick --out runs/study-quick
              omrl study run my_study.yaml --out runs/my-study seeds=3 --rescore
    """
    from rich.console import Console

    from omrl.study.check import report_head, study_folder_of
    from omrl.study.figures import headline, study_table
    from omrl.study.overlap import OverlapError
    from omrl.study.run import run_study
    from omrl.study.spec import load_study
    from omrl.train.trainer_progress import quiet_libraries

    spec = load_study(study_file, overrides)
    errors = Console(stderr=True, soft_wrap=True)
    try:
        with quiet_libraries(not verbose):
            result = run_study(spec, out, study_folder_of(study_file), rescore=rescore,
                               on_report=lambda report: click.echo(json.dumps(report)),
                               log=lambda line: errors.print(line, style="dim", markup=False, highlight=False))
    except OverlapError as exc:
        click.echo(json.dumps({**report_head(spec), **(exc.report or {}), "refused": True}))
        raise
    Console(soft_wrap=True).print(study_table(result))
    click.echo(json.dumps(headline(result)))


@study.command("status")
@click.argument("out", metavar="OUT", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="one JSON line instead of the lines")
@user_errors
def status(out: str, as_json: bool) -> None:
    """Where the study in folder OUT stands (`omrl study run ... --out OUT`, running or stopped): per condition
    the trainings and dev and test evaluations finished and their hours, the last one finished, the runs in
    progress (the process working on each, minutes since it started) and claims left by a process that is gone
    (the next `omrl study run` takes them over); the test scorings and, once study.json is written, the
    conditions still pending. Reads only.

    \b
    Example:  omrl study status runs/study-quick
              omrl study status runs/study-quick --json
    """
    from omrl.study.status import study_status

    result = study_status(out)
    if as_json:
        click.echo(json.dumps(result))
        return
    pending = result["pending_conditions"]
    click.echo(f"{out}: test set scored under {result['test_scorings']} setting(s); pending conditions: "
               f"{'unknown until study.json is written' if pending is None else ', '.join(pending) or 'none'}")
    for name, condition in result["conditions"].items():
        click.echo(f"{name}: {condition['trained']} trained, {condition['dev_evaluations']} dev and "
                   f"{condition['test_evaluations']} test evaluations, {condition['hours']:.2f} h; last finished: "
                   f"{condition['last_finished'] or '-'}")
        for run in condition["running"]:
            click.echo(f"  running: {run['key']} (pid {run['pid']}, {run['minutes']:g} min)")
        for run in condition["stale_claims"]:
            click.echo(f"  stale claim: {run['key']} (pid {run['pid']} is gone; the next omrl study run takes it over)")
