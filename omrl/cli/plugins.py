"""`omrl plugins`: what is registered under each pluggable kind, and which installed package provides it."""

from __future__ import annotations

import click

from omrl.cli.common import console, user_errors


@click.command()
@click.option("--all", "show_all", is_flag=True, help="Also list omrl's own built-ins.")
@user_errors
def plugins(show_all: bool) -> None:
    """List the environments, import and export formats, metrics and policies installed packages register
    (entry-point groups omrl.envs, omrl.formats, omrl.exporters, omrl.metrics, omrl.policies).

    Example:  omrl plugins --all
    """
    from rich.table import Table

    from omrl.plugins import BUILTIN_PROVIDER, registries

    table = Table(title="plugins" if not show_all else "registered components")
    for column in ("group", "name", "from", "target"):
        table.add_column(column, overflow="fold")
    rows = 0
    for registry in registries():
        for name, entry in sorted(registry.entries().items()):
            if show_all or entry.provider != BUILTIN_PROVIDER:
                table.add_row(registry.group, name, entry.provider, entry.target)
                rows += 1
    if rows:
        console.print(table)
    else:
        console.print("no plugins installed (a package adds them through the entry-point groups omrl.envs, "
                      "omrl.formats, omrl.exporters, omrl.metrics and omrl.policies; see examples/omrl-plugin-example)")
