"""`omrl show`: one trajectory, readably."""

from __future__ import annotations

import json

import click

from omrl.cli.common import console, user_errors
from omrl.store import open_store
from omrl.view.transcript import render_trajectory


@click.command()
@click.argument("store", type=click.Path(file_okay=False))
@click.argument("trajectory_id")
@click.option("--json", "as_json", is_flag=True, help="Print the raw row as JSON.")
@click.option("--max-chars", type=int, default=2000, show_default=True, help="Clip long messages.")
@user_errors
def show(store: str, trajectory_id: str, as_json: bool, max_chars: int) -> None:
    """Render one trajectory: messages by role, tool calls, observations, rewards.

    An id prefix is enough when it is unique.

    Example:  omrl show demo-store 3f2a9c
    """
    from omrl.store.views import quote_literal  # DuckDB loads only when a trajectory is shown, not for --help

    rows = open_store(store).sql(
        f"SELECT * FROM trajectories WHERE starts_with(id, {quote_literal(trajectory_id)}) LIMIT 2").to_pylist()
    if not rows:
        raise click.ClickException(f"no trajectory with id {trajectory_id!r} in {store}")
    if len(rows) > 1:
        raise click.ClickException(f"id prefix {trajectory_id!r} matches several trajectories; give more of it")
    if as_json:
        click.echo(json.dumps(rows[0], default=str, ensure_ascii=False, indent=2))
    else:
        # Wrapped even when piped: a game's or a tool's long lines stay whole inside their panels.
        console.print(render_trajectory(rows[0], max_chars=max_chars), soft_wrap=False)
