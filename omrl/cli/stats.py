"""`omrl stats`: summary of a store."""

from __future__ import annotations

import json

import click

from omrl.cli.common import arrow_to_rich, console, user_errors
from omrl.report.stats import store_stats
from omrl.store import open_store


@click.command()
@click.argument("store", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the tables as one JSON object.")
@user_errors
def stats(store: str, as_json: bool) -> None:
    """Summarise a store: counts by env, status, round and source; reward and success.

    Example:  omrl stats demo-store
    """
    tables = store_stats(open_store(store))
    if as_json:
        click.echo(json.dumps({name: t.to_pylist() for name, t in tables.items()}, default=str))
        return
    for name, table in tables.items():
        console.print(arrow_to_rich(table, title=name))
