"""Reading omrl-format record files (JSONL, JSON list, Parquet) for `omrl store append`, errors naming the line."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from omrl.schema import NORMALIZERS, SchemaError
from omrl.schema.rows import AnnotationRow, TrajectoryRow
from omrl.store import Appended, Store, readers

SUFFIXES = (".jsonl", ".ndjson", ".json", ".parquet")


def iter_records(path: str | Path) -> Iterator[tuple[str, Any]]:
    """Yield (where, record) from a .jsonl, .json (a list) or .parquet file; `where` names the line, item or row.

    A file that cannot be read raises SchemaError naming the file and the line, item or row group.
    """
    for record in readers.iter_records(path, allowed=SUFFIXES, error=SchemaError):
        yield record.where, record.value


def read_rows(path: str | Path, table: str = "trajectories") -> list[TrajectoryRow | AnnotationRow]:
    """Every record of an omrl-format file, validated; a bad record raises SchemaError naming its place."""
    normalize = NORMALIZERS[table]
    rows = []
    for where, record in iter_records(path):
        try:
            rows.append(normalize(record))
        except SchemaError as exc:
            raise SchemaError(f"{where}: {exc}") from None
    return rows


def append_files(store: Store, paths: Iterable[str | Path], table: str = "trajectories",
                 skip_existing: bool = False) -> Appended:
    """Validate every record of every file, then append them all as one part (whole or not at all).

    Ids must be unique across the files and new to the store, unless `skip_existing` drops those the
    store already holds; a bad record, a repeated id or a crash leaves the store unchanged.
    """
    store.table_dir(table)  # an unknown table name fails here (StoreError listing the tables), before reading
    rows = [row for path in paths for row in read_rows(path, table)]
    return store.append(rows, table=table, skip_existing=skip_existing)


def append_file(store: Store, path: str | Path, table: str = "trajectories", skip_existing: bool = False) -> int:
    """`append_files` for one file; returns the number of rows written."""
    return append_files(store, [path], table, skip_existing).written
