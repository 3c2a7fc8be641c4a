"""Helpers shared by the CLI verbs: opening stores, printing tables, turning errors into clean exits."""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from typing import Any

import click
import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console
from rich.segment import Segment
from rich.table import Table

from omrl.errors import OmrlError, missing_extra
from omrl.schema.redact import redact


class _Console(Console):
    """A console that wraps only on a terminal: piped output keeps each line whole (`| grep` works) and a
    piped table takes its natural width instead of folding its cells at 80 columns."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.soft_wrap = not self.is_terminal

    def _render_buffer(self, buffer: Any) -> str:
        # Every line omrl prints passes here: secrets it knows of never reach the terminal (omrl.schema.redact),
        # whether one styled piece holds a secret or colour codes do not split it.
        pieces = [Segment(redact(text), style, control) for text, style, control in buffer]
        return redact(super()._render_buffer(pieces))

    def print(self, *objects: Any, **options: Any) -> None:
        tables = [o for o in objects if isinstance(o, Table)]
        if not tables or self.is_terminal:
            return super().print(*objects, **options)
        width = self.width
        try:
            self.width = max([width] + [self.measure(t, options=self.options.update_width(10**6)).maximum
                                        for t in tables])
            return super().print(*objects, **options)
        finally:
            self.width = width


console = _Console()
err_console = _Console(stderr=True)

# What a user causes and can fix: omrl's own errors, and files, folders or connections that are missing,
# refused or failing. Any other exception is a bug and keeps its traceback.
USER_ERRORS = (OmrlError, OSError)


def debug_enabled() -> bool:
    """`omrl --debug VERB` (or OMRL_DEBUG=1): show the traceback of every error, user errors included."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx and ctx.meta.get("omrl.debug")) or os.environ.get("OMRL_DEBUG", "") not in ("", "0")


def user_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Report user errors (OmrlError, OSError) as one clean error line; let bugs show their traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("default")
                warnings.showwarning = _show_warning
                return func(*args, **kwargs)
        except USER_ERRORS as exc:
            if debug_enabled():
                raise
            raise click.ClickException(error_line(exc)) from None
        except ModuleNotFoundError as exc:  # an optional package's extra is not installed: say which
            line = missing_extra(exc)
            if line is None or debug_enabled():
                raise
            raise click.ClickException(line) from None

    return wrapper


def error_line(exc: BaseException) -> str:
    """The message of a user error; an OSError from the system as "PATH: reason"."""
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None and not isinstance(exc, OmrlError):
        return redact(f"{exc.filename}: {exc.strerror}")
    return redact(str(exc)) or type(exc).__name__


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    err_console.print(f"[yellow]warning:[/yellow] {message}", highlight=False)


def arrow_values(column: pa.Array | pa.ChunkedArray) -> list[Any]:
    """The Python values of an Arrow column; a value Python cannot hold (a date past year 9999, a
    timestamp of DuckDB's infinity) comes as Arrow's text for it, inside lists and structs too."""
    try:
        return column.to_pylist()
    except (OverflowError, ValueError, pa.ArrowException):
        pass
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    return [_value(chunk.slice(i, 1)) for chunk in chunks for i in range(len(chunk))]


def _value(one: pa.Array) -> Any:
    """The value of a one-element array, as arrow_values gives it."""
    try:
        return one.to_pylist()[0]
    except (OverflowError, ValueError, pa.ArrowException):
        pass
    kind = one.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return None if one.null_count else arrow_values(pc.list_flatten(one))
    if pa.types.is_struct(kind):
        return None if one.null_count else {kind.field(k).name: _value(pc.struct_field(one, [k]))
                                            for k in range(kind.num_fields)}
    try:
        return pc.cast(one, pa.string())[0].as_py()
    except (pa.ArrowException, ValueError):
        return f"<{kind} value>"


def arrow_to_rich(table: pa.Table, title: str | None = None, max_rows: int = 50, max_width: int = 60,
                  total: int | None = None) -> Table:
    """A rich table of the first rows of an Arrow table, long cells shortened; `total`: the rows of the
    whole result when `table` holds only its first ones."""
    out = Table(title=title, show_lines=False)
    for name in table.column_names:
        out.add_column(name, overflow="fold")
    shown = table.slice(0, max_rows)
    for row in zip(*(arrow_values(c) for c in shown.columns), strict=True):
        out.add_row(*(_cell(v, max_width) for v in row))
    total = table.num_rows if total is None else total
    if total > shown.num_rows:
        out.caption = f"{shown.num_rows} of {total} rows shown"
    return out


def _cell(value: Any, max_width: int) -> str:
    if value is None:
        return "[dim]null[/dim]"
    if isinstance(value, float):
        text = f"{value:.4g}"
    else:
        text = str(value)
    text = text.replace("[", r"\[")
    return text if len(text) <= max_width else text[: max_width - 1] + "…"


class StorePath(click.Path):
    """A store argument: a local folder (checked like click.Path) or an `s3://bucket/prefix` URL, passed on
    as given (the store checks that one exists when it opens it: omrl.store.location)."""

    name = "store"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value.startswith("s3://"):
            return value
        return super().convert(value, param, ctx)


EXISTING_STORE = StorePath(exists=True, file_okay=False)


class LocalOutput(click.Path):
    """An output folder or file written locally: an s3:// URL is refused (derived stores and exports are
    staged and renamed into place on local disk; Path() would make `s3:/bucket/...` a local folder)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value.startswith("s3://"):
            self.fail(f"{value}: outputs are written to local folders only (S3 stores take appends, "
                      "queries and compaction); write it locally, then copy it", param, ctx)
        return super().convert(value, param, ctx)


LOCAL_OUTPUT = LocalOutput()


class Seconds(click.ParamType):
    """A time limit in seconds: finite, positive and at most omrl.store.query_limits.MAX_TIMEOUT_S (inf and nan refused)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from omrl.store.query_limits import QueryError, check_timeout  # the store loads when a command runs

        try:
            return check_timeout(float(value))
        except (TypeError, ValueError, QueryError):
            self.fail(f"{value!r} is not a time limit; give a positive number of seconds, e.g. 30", param, ctx)


def _memory_option(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    from omrl.store.query_limits import QueryError, parse_memory

    try:
        return None if value is None else parse_memory(value)
    except QueryError as exc:
        raise click.BadParameter(str(exc).split(": ", 1)[-1], ctx, param) from None


def _threads_option(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    from omrl.store.query_limits import QueryError, parse_threads

    try:
        return None if value is None else parse_threads(value)
    except QueryError as exc:
        raise click.BadParameter(str(exc).split(": ", 1)[-1], ctx, param) from None


def query_limits(func: Callable[..., Any]) -> Callable[..., Any]:
    """--query-memory and --query-threads on a command that queries a store: the limits of every DuckDB
    connection it makes while it runs (omrl.store.query_limits.limits_in_force). Put it under @user_errors."""

    @functools.wraps(func)
    def wrapper(*args: Any, query_memory: int | None = None, query_threads: int | None = None,
                **kwargs: Any) -> Any:
        from omrl.store.query_limits import limits_in_force

        with limits_in_force(query_memory, query_threads):
            return func(*args, **kwargs)

    wrapper = click.option(
        "--query-threads", metavar="N", callback=_threads_option, expose_value=True,
        help="Threads of each query (DuckDB's); default: every CPU, or OMRL_QUERY_THREADS.")(wrapper)
    return click.option(
        "--query-memory", metavar="SIZE", callback=_memory_option,
        help="Memory cap of each query and of its result, e.g. 2GB, 512MB or 10% (of this machine's); "
             "default: 25%, or OMRL_QUERY_MEMORY.")(wrapper)
