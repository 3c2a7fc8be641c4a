"""Helpers shared by the CLI verbs: opening stores, printing tables, turning errors into clean exits."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import click
import pyarrow as pa
from rich.console import Console
from rich.table import Table

from omrl.schema import SchemaError
from omrl.store import StoreError

console = Console()
err_console = Console(stderr=True)


def user_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Report expected failures (bad input, missing store, refused SQL) as one clean error line."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("default")
                warnings.showwarning = _show_warning
                return func(*args, **kwargs)
        # ValueError covers omrl.query.QueryError (refused SQL), whose import would load DuckDB for `--help`.
        except (StoreError, SchemaError, FileNotFoundError, ValueError) as exc:
            raise click.ClickException(str(exc)) from None

    return wrapper


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
