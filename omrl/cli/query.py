"""`omrl query`: read-only SQL over a store."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from collections.abc import Callable

import click
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from omrl.cli.common import Seconds, arrow_to_rich, arrow_values, console, query_limits, user_errors
from omrl.errors import UsageError
from omrl.store import open_store


def _json_default(value):
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


@click.command()
@click.argument("store", type=click.Path(file_okay=False))
@click.argument("sql", required=False)
@click.option("--search", "search_text", default=None, metavar="TEXT",
              help='Find messages holding all these words and "quoted phrases" (index-backed, exact; a word '
                   "matches a whole token, a term with * a pattern: palin*, *palindrome*); "
                   "with SQL, the hits are the view search_hits (trajectory_id, position, role, snippet), "
                   "without it they are printed.")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json", "parquet"]), default="table",
              show_default=True, help="Output format; json writes one object per line.")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write to this file instead of stdout.")
@click.option("--max-rows", type=click.IntRange(min=0), default=50, show_default=True,
              help="Rows shown in table format (the rest are counted, not kept).")
@click.option("--timeout", type=Seconds(), default=60.0, show_default=True,
              help="Stop the query once it runs this many seconds (time spent writing its rows out, e.g. into a pipe, does not count).")
@user_errors
@query_limits
def query(store: str, sql: str | None, search_text: str | None, fmt: str, out: str | None, max_rows: int,
          timeout: float) -> None:
    """Run read-only SQL over a store (SQL "-" reads it from stdin), or a text search.

    Views: trajectories, messages, turns, tool_calls, annotations, latest_annotations, scores, groups,
    and search_hits with --search. The query sees only these views: no files, no network, no
    extensions; it writes nothing. The result streams to the output (the table shows its first rows).

    \b
    Examples:
      omrl query demo-store "SELECT env, avg(reward) FROM trajectories GROUP BY env"
      omrl query demo-store --search '"stack trace" segfault'
      omrl query demo-store --search segfault "SELECT t.env, count(*) AS n FROM search_hits h
          JOIN trajectories t ON t.id = h.trajectory_id GROUP BY t.env"
      omrl query big-store "SELECT * FROM messages" --format parquet --out messages.parquet --query-memory 4GB
    """
    if sql is None and search_text is None:
        raise click.UsageError("give SQL, --search TEXT, or both")
    if sql == "-":
        sql = sys.stdin.read()
    if fmt == "parquet" and not out:
        raise click.UsageError("--format parquet needs --out FILE")
    if fmt == "table" and not out:
        head = _Head(max_rows)
        _run(open_store(store), sql, search_text, timeout, head)
        if sql is None and head.total == 0:  # a search that found nothing says so, and why words may miss
            console.print("0 hits (words match whole tokens: palindrome does not match is_palindrome; "
                          "*palindrome* matches inside words, palin* their start)", highlight=False)
            return
        console.print(arrow_to_rich(head.table(), max_rows=max_rows, total=head.total))
        return
    writer = _Writer("csv" if fmt == "table" else fmt, out)
    try:
        _run(open_store(store), sql, search_text, timeout, writer)
        writer.finish()
    finally:
        writer.discard()  # a failed query leaves no half-written --out file
    if out:
        click.echo(f"wrote {writer.rows} rows to {out}", err=True)


def _run(store, sql: str | None, search_text: str | None, timeout: float,
         sink: Callable[[pa.RecordBatch], None]) -> None:
    # DuckDB and the index load only when a query runs, not for --help
    from omrl.store.query import stream_query
    from omrl.store.search import hits_view, search

    if search_text is None:
        return stream_query(store, sql, sink, timeout=timeout)
    if sql is None:
        hits = search(store, search_text)
        for batch in hits.to_batches() or [pa.RecordBatch.from_pylist([], schema=hits.schema)]:
            sink(batch)
        return None
    with hits_view(store, search_text) as con:  # the one confined connection, plus the hits
        return stream_query(store, sql, sink, con=con, timeout=timeout)


class _Head:
    """The first `n` rows of a streamed result (the table format), and how many rows it had."""

    def __init__(self, n: int):
        self.n, self.total, self.batches, self.schema = n, 0, [], None

    def __call__(self, batch: pa.RecordBatch) -> None:
        self.schema = batch.schema
        kept = sum(b.num_rows for b in self.batches)
        if kept < self.n:
            self.batches.append(batch.slice(0, self.n - kept))
        self.total += batch.num_rows

    def table(self) -> pa.Table:
        return pa.Table.from_batches(self.batches, schema=self.schema)


class _Writer:
    """Streamed batches written as CSV, JSON lines or Parquet to stdout or to `out` (through a temporary
    file renamed into place by `finish`)."""

    def __init__(self, fmt: str, out: str | None):
        self.fmt, self.out, self.rows, self.started = fmt, out, 0, False
        self.partial = f"{out}.partial" if out else None
        self.file = open(self.partial, "wb") if self.partial and fmt != "parquet" else None  # noqa: SIM115
        self.parquet: pq.ParquetWriter | None = None

    def __call__(self, batch: pa.RecordBatch) -> None:
        try:
            self._write(batch)
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise UsageError(f"--format {self.fmt} cannot hold this result ({exc}); CAST the column to "
                             "VARCHAR or use --format json") from None
        self.started = True
        self.rows += batch.num_rows

    def _write(self, batch: pa.RecordBatch) -> None:
        if self.fmt == "parquet":
            if self.parquet is None:
                self.parquet = pq.ParquetWriter(self.partial, batch.schema, compression="zstd")
            self.parquet.write_batch(batch)
        else:
            text = _render(pa.Table.from_batches([batch]), self.fmt, header=not self.started)
            if self.file is not None:
                self.file.write(text.encode("utf-8"))
            else:
                click.echo(text, nl=False)

    def _close(self) -> None:
        for handle in (self.parquet, self.file):
            if handle is not None:
                handle.close()
        self.parquet = self.file = None

    def finish(self) -> None:
        self._close()
        if self.partial:
            os.replace(self.partial, self.out)
            self.partial = None

    def discard(self) -> None:
        self._close()
        if self.partial:
            with contextlib.suppress(OSError):
                os.unlink(self.partial)


def _render(result: pa.Table, fmt: str, header: bool = True) -> str:
    if fmt == "csv":
        buffer = io.BytesIO()
        pacsv.write_csv(_flatten_nested(result), buffer, pacsv.WriteOptions(include_header=header))
        return buffer.getvalue().decode()
    columns = [arrow_values(c) for c in result.columns]
    lines = [json.dumps(dict(zip(result.column_names, row, strict=True)), default=_json_default,
                        ensure_ascii=False) for row in zip(*columns, strict=True)]
    return "".join(line + "\n" for line in lines)


def _flatten_nested(table: pa.Table) -> pa.Table:
    """CSV holds only flat text and numbers: lists, structs, maps, unions and extension types are written as
    JSON text, binary as text (undecodable bytes escaped), intervals as text."""
    columns = []
    for column in table.columns:
        kind = column.type
        if (pa.types.is_nested(kind) or isinstance(kind, pa.BaseExtensionType) or pa.types.is_interval(kind)
                or pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
                or pa.types.is_fixed_size_binary(kind)):
            column = pa.array([_text(v) for v in arrow_values(column)], pa.string())
        columns.append(column)
    return pa.Table.from_arrays(columns, names=table.column_names)


def _text(value) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return json.dumps(value, default=_json_default, ensure_ascii=False)
