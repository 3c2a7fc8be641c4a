"""`omrl query`: read-only SQL over a store."""

from __future__ import annotations

import io
import json
import sys

import click
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from omrl.cli.common import arrow_to_rich, console, user_errors
from omrl.store import open_store


def _json_default(value):
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


@click.command()
@click.argument("store", type=click.Path(file_okay=False))
@click.argument("sql", required=False)
@click.option("--search", "search_text", default=None, metavar="TEXT",
              help='Find messages holding all these words and "quoted phrases" (index-backed, exact); '
                   "with SQL, the hits are the view search_hits (trajectory_id, position, role, snippet), "
                   "without it they are printed.")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json", "parquet"]), default="table",
              show_default=True, help="Output format; json writes one object per line.")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write to this file instead of stdout.")
@click.option("--max-rows", type=int, default=50, show_default=True, help="Rows shown in table format.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True,
              metavar="SECONDS", help="Stop the query once it runs this long.")
@user_errors
def query(store: str, sql: str | None, search_text: str | None, fmt: str, out: str | None, max_rows: int,
          timeout: float) -> None:
    """Run read-only SQL over a store (SQL "-" reads it from stdin), or a text search.

    Views: trajectories, messages, turns, tool_calls, annotations, latest_annotations, scores, groups,
    and search_hits with --search. The query sees only these views: no files, no network, no
    extensions; it writes nothing.

    \b
    Examples:
      omrl query demo-store "SELECT env, avg(reward) FROM trajectories GROUP BY env"
      omrl query demo-store --search '"stack trace" segfault'
      omrl query demo-store --search segfault "SELECT t.env, count(*) AS n FROM search_hits h
          JOIN trajectories t ON t.id = h.trajectory_id GROUP BY t.env"
    """
    if sql is None and search_text is None:
        raise click.UsageError("give SQL, --search TEXT, or both")
    if sql == "-":
        sql = sys.stdin.read()
    result = _run(open_store(store), sql, search_text, timeout)
    if fmt == "parquet":
        if not out:
            raise click.UsageError("--format parquet needs --out FILE")
        pq.write_table(result, out, compression="zstd")
        click.echo(f"wrote {result.num_rows} rows to {out}", err=True)
        return
    if fmt == "table" and not out:
        console.print(arrow_to_rich(result, max_rows=max_rows))
        return
    text = _render(result, "csv" if fmt == "table" else fmt)
    if out:
        with open(out, "w", encoding="utf-8") as f:
            f.write(text)
        click.echo(f"wrote {result.num_rows} rows to {out}", err=True)
    else:
        click.echo(text, nl=False)


def _run(store, sql: str | None, search_text: str | None, timeout: float) -> pa.Table:
    # DuckDB and the index load only when a query runs, not for --help
    from omrl.query import run_query
    from omrl.search import hits_view, search

    if search_text is None:
        return run_query(store, sql, timeout=timeout)
    if sql is None:
        return search(store, search_text)
    with hits_view(store, search_text) as con:  # the one confined connection, plus the hits
        return run_query(store, sql, con=con, timeout=timeout)


def _render(result: pa.Table, fmt: str) -> str:
    if fmt == "csv":
        buffer = io.BytesIO()
        pacsv.write_csv(_flatten_nested(result), buffer)
        return buffer.getvalue().decode()
    lines = [json.dumps(row, default=_json_default, ensure_ascii=False) for row in result.to_pylist()]
    return "".join(line + "\n" for line in lines)


def _flatten_nested(table: pa.Table) -> pa.Table:
    """CSV cannot hold lists or structs: write those cells as JSON text."""
    columns = []
    for column in table.columns:
        if pa.types.is_nested(column.type):
            column = pa.array([None if v is None else json.dumps(v, default=_json_default)
                               for v in column.to_pylist()], pa.string())
        columns.append(column)
    return pa.Table.from_arrays(columns, names=table.column_names)
