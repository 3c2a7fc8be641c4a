"""`omrl import`: bring trajectory data made elsewhere (ShareGPT, OpenAI, SWE-agent, ...) into a store."""

from __future__ import annotations

from pathlib import Path

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn
from rich.table import Table

from omrl.cli.common import console, user_errors
from omrl.formats import FORMATS


@click.command("import")
@click.argument("src", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--store", "store_path", required=True, type=click.Path(file_okay=False),
              help="Store to import into (created when missing).")
@click.option("--format", "fmt", type=click.Choice(["auto", *FORMATS]), default="auto", show_default=True,
              help="Source format; auto decides from the extension and the keys of the first record.")
@click.option("--skip-errors", is_flag=True, help="Skip bad records (counted and reported) instead of stopping.")
@user_errors
def import_cmd(src: tuple[str, ...], store_path: str, fmt: str, skip_errors: bool) -> None:
    """Import trajectory files into a store; importing the same file again adds nothing.

    Each record becomes one trajectory (env `import:<format>`, run `import:<file stem>`), messages in
    OpenAI form with linked tool calls; rewards and success only where the source states them.

    Example:  omrl import trajs.json run.traj --store my-store --skip-errors
    """
    from omrl.formats.importer import import_files
    from omrl.store import Store

    store = Store.create(store_path)
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        files = progress.add_task("files", total=len(src))
        records = progress.add_task("records", total=None)

        def on_file(path) -> None:
            progress.update(files, description=f"importing {path.name}", advance=0)
            progress.reset(records, total=None, description="records")

        reports = import_files(src, store, fmt=fmt, skip_errors=skip_errors,
                               on_record=lambda: progress.advance(records), on_file=on_file)
        progress.advance(files, len(src))
    table = Table(title=f"imported into {store_path}")
    for name in ("file", "format", "records", "imported", "already in store", "skipped"):
        table.add_column(name, justify="left" if name in ("file", "format", "skipped") else "right")
    for r in reports:
        skipped = ", ".join(f"{reason}: {n}" for reason, n in r.skipped.most_common()) or "0"
        table.add_row(Path(r.path).name, r.format, str(r.records), str(r.imported), str(r.already_present), skipped)
    console.print(table)
    for r in reports:
        for example in r.examples:
            console.print(f"[yellow]skipped[/yellow] {example}", highlight=False, markup=True)
