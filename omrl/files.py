"""Reading omrl-format record files (JSONL, JSON list, Parquet) for `omrl store append`, errors naming the line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omrl import readers
from omrl.schema import NORMALIZERS, SchemaError
from omrl.store import Store

SUFFIXES = (".jsonl", ".ndjson", ".json", ".parquet")


def iter_records(path: str | Path) -> Iterator[tuple[str, Any]]:
    """Yield (where, record) from a .jsonl, .json (a list) or .parquet file; `where` names the line, item or row.

    A file that cannot be read raises SchemaError naming the file and the line, item or row group.
    """
    for record in readers.iter_records(path, allowed=SUFFIXES, error=SchemaError):
        yield record.where, record.value


def append_file(store: Store, path: str | Path, table: str = "trajectories") -> int:
    """Validate every record of a file, then append them to a store as one part; returns the row count.

    Validation runs over the whole file before anything is written and the rows go in one atomic append,
    so a bad row (or a crash) leaves the store unchanged.
    """
    store.table_dir(table)  # an unknown table name fails here (StoreError listing the tables), before reading
    normalize = NORMALIZERS[table]
    rows = []
    for where, record in iter_records(path):
        try:
            rows.append(normalize(record))
        except SchemaError as exc:
            raise SchemaError(f"{where}: {exc}") from None
    if rows:
        store.append(rows, table=table)
    return len(rows)
