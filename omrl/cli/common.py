"""Helpers shared by the CLI verbs: opening stores, printing tables, turning errors into clean exits."""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from typing import Any

import click
import pyarrow as pa
from rich.console import Console
from rich.segment import Segment
from rich.table import Table

from omrl.errors import OmrlError
from omrl.redact import redact


class _Console(Console):
    """A console that wraps only on a terminal: piped output keeps each line whole (`| grep` works) and a
    piped table takes its natural width instead of folding its cells at 80 columns."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.soft_wrap = not self.is_terminal

    def _render_buffer(self, buffer: Any) -> str:
        # Every line omrl prints passes here: secrets it knows of never reach the terminal (omrl.redact),
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

    return wrapper


def error_line(exc: BaseException) -> str:
    """The message of a user error; an OSError from the system as "PATH: reason"."""
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None and not isinstance(exc, OmrlError):
        return redact(f"{exc.filename}: {exc.strerror}")
    return redact(str(exc)) or type(exc).__name__


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    err_console.print(f"[yellow]warning:[/yellow] {message}", highlight=False)


def arrow_to_rich(table: pa.Table, title: str | None = None, max_rows: int = 50, max_width: int = 60) -> Table:
    """A rich table of the first rows of an Arrow table, long cells shortened."""
    out = Table(title=title, show_lines=False)
    for name in table.column_names:
        out.add_column(name, overflow="fold")
    for row in table.slice(0, max_rows).to_pylist():
        out.add_row(*(_cell(v, max_width) for v in row.values()))
    if table.num_rows > max_rows:
        out.caption = f"{max_rows} of {table.num_rows} rows shown"
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
    as given (the store checks that one exists when it opens it: omrl.storage)."""

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
