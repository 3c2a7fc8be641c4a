"""`omrl tasks`: import task datasets into a tasks file, show them, generate synthetic ones."""

from __future__ import annotations

import click
import pyarrow as pa

from omrl.cli.common import arrow_to_rich, console, user_errors


@click.group()
def tasks() -> None:
    """Import, inspect and generate task datasets (the input of `omrl collect`).

    Example:  omrl tasks import gsm8k_test.jsonl --out gsm8k.parquet
    """


@tasks.command("import")
@click.argument("src")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Tasks file to write (.parquet or .jsonl).")
@click.option("--id", "id_", help="Column holding task ids (default: id-like column, else generated from the row index).")
@click.option("--instruction", help="Column holding the instruction shown to the agent.")
@click.option("--answer", help="Column holding the gold answer.")
@click.option("--env", help="Environment name for every task (default: the format's, or an `env` column).")
@click.option("--split", help="Split name for every task (default: a `split` column, else train).")
@click.option("--format", "fmt", type=click.Choice(["auto", "plain", "gsm8k", "dbbench", "agentbench_os", "swebench"]),
              default=None, help="Source format; auto detects GSM8K, AgentBench DBBench and OS, and SWE-bench files.")
@click.option("--mapping", type=click.Path(exists=True, dir_okay=False),
              help="YAML file with keys id, instruction, answer, env, split, format (flags override it).")
@click.option("--source", type=click.Path(exists=True, file_okay=False),
              help="SWE-bench rows: folder with one checkout per instance_id at its base_commit (runs in --env swe).")
@user_errors
def import_(src: str, out: str, id_: str | None, instruction: str | None, answer: str | None, env: str | None,
            split: str | None, fmt: str | None, mapping: str | None, source: str | None) -> None:
    """Import SRC (JSONL, JSON, CSV, Parquet, a saved `datasets` folder or a Hub name) into a tasks file.

    \b
    Example:  omrl tasks import agentbench_dbbench_dev.jsonl --out sql.parquet
              omrl tasks import swe-bench-lite.json --source checkouts/ --out lite.jsonl   (then --env swe)
    """
    from omrl.tasks import TaskMapping, import_tasks, load_task_mapping

    flags = {"id": id_, "instruction": instruction, "answer": answer, "env": env, "split": split, "format": fmt,
             "source": source}
    base = load_task_mapping(mapping, **flags) if mapping else TaskMapping()
    with console.status(f"importing {src}"):
        table = import_tasks(src, out, mapping=base, **({} if mapping else flags))
    console.print(f"wrote {table.num_rows} tasks to {out}")
    _print_summary(table)


@tasks.command()
@click.argument("path")  # a file, or shipped:NAME
@click.option("--examples", default=3, show_default=True, help="How many example tasks to print.")
@user_errors
def show(path: str, examples: int) -> None:
    """Summarise a tasks file: counts per env and split, and a few examples.

    Example:  omrl tasks show shipped:code
    """
    from omrl.tasks import load_tasks, tasks_table

    table = tasks_table([t.to_row() for t in load_tasks(path)])
    console.print(f"{path}: {table.num_rows} tasks")
    _print_summary(table, examples)


@tasks.command()
@click.argument("kind", metavar="ENV")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Tasks file to write (.parquet or .jsonl).")
@click.option("--n", default=50, show_default=True, help="Number of tasks (code: at most the shipped projects).")
@click.option("--seed", default=0, show_default=True, help="Random seed (same seed, same tasks).")
@click.option("--split", default=None, help="Split name (default: the environment's first; `omrl envs` lists them).")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE",
              help="Generator option (repeatable; JSON values), e.g. --option walls=true for grid.")
@click.option("--package", "packages", multiple=True, metavar="NAME==VERSION",
              help="A package whose source the generator uses (repeatable; the swe generator's `packages`). Its "
                   "sdist is fetched from pip's index as a file and never built here; its tests run only in the "
                   "sandbox; its test dependencies are installed from wheels only (no package code runs).")
@click.option("--earlier", "earlier", multiple=True, metavar="NAME==VERSION",
              help="An earlier release of a --package: swe also tries its functions' earlier bodies as bugs.")
@user_errors
def generate(kind: str, out: str, n: int, seed: int, split: str | None, options: tuple[str, ...],
             packages: tuple[str, ...], earlier: tuple[str, ...]) -> None:
    """Generate tasks with environment ENV's own generator (math, shop, code, grid, swe, os, ...; see `omrl envs`).

    \b
    Example:  omrl tasks generate math --n 200 --seed 1 --out math.parquet
              omrl tasks generate swe --package more-itertools==10.2.0 --package toolz==0.12.1 --n 40 --out swe.jsonl
              omrl tasks generate swe --package more-itertools==10.2.0 --earlier more-itertools==10.1.0 --out swe.jsonl
    """
    from omrl.cli.collect import env_options
    from omrl.tasks import generate_tasks, write_tasks

    extra = {"packages": list(packages)} if packages else {}
    if earlier:
        extra["earlier"] = list(earlier)
    generated = generate_tasks(kind, n=n, seed=seed, split=split, **env_options(options, "--option"), **extra)
    write_tasks(generated, out)
    console.print(f"wrote {len(generated)} {kind} tasks to {out}")


def _print_summary(table: pa.Table, examples: int = 3) -> None:
    counts = table.group_by(["env", "split"]).aggregate([("id", "count")]).rename_columns(["env", "split", "tasks"])
    console.print(arrow_to_rich(counts.sort_by([("env", "ascending"), ("split", "ascending")]), title="tasks"))
    if examples:
        sample = table.select(["id", "instruction", "answer"]).slice(0, examples)
        console.print(arrow_to_rich(sample, title="examples", max_width=80))
