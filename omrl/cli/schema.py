"""`omrl schema`: print the schemas."""

from __future__ import annotations

import json

import click

from omrl.cli.common import console
from omrl.schema import SCHEMAS, json_schema


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the JSON Schema instead of the Arrow schema.")
@click.option("--table", type=click.Choice(sorted(SCHEMAS)), default=None,
              help="Only this table (default: both).")
def schema(as_json: bool, table: str | None) -> None:
    """Print the trajectory and annotation schemas (version 1).

    Example:  omrl schema --json --table trajectories > trajectory.schema.json
    """
    names = [table] if table else sorted(SCHEMAS)
    if as_json:
        out = json_schema(names[0]) if table else {name: json_schema(name) for name in names}
        click.echo(json.dumps(out, indent=2))
        return
    for name in names:
        console.rule(name)
        console.print(SCHEMAS[name].to_string(show_schema_metadata=False), highlight=False)
