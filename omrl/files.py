"""Reading omrl-format record files (JSONL, JSON list, Parquet) with errors that name the line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from omrl.schema import NORMALIZERS, SchemaError
from omrl.store import Store


def iter_records(path: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield (where, record) from a .jsonl, .json or .parquet file; `where` names the line or row."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    yield f"{path.name} line {number}", json.loads(line)
                except json.JSONDecodeError as exc:
                    raise SchemaError(f"{path.name} line {number}: not valid JSON ({exc.msg})") from None
    elif suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, list):
            raise SchemaError(f"{path.name}: expected a JSON list of records")
        for number, record in enumerate(data):
            yield f"{path.name} item {number}", record
    elif suffix == ".parquet":
        parquet = pq.ParquetFile(path)
        offset = 0
        for batch in parquet.iter_batches(batch_size=4096):
            for number, record in enumerate(batch.to_pylist(), offset):
                yield f"{path.name} row {number}", record
            offset += batch.num_rows
    else:
        raise SchemaError(f"{path.name}: unsupported file type {suffix!r}; use .jsonl, .json or .parquet")


def append_file(store: Store, path: str | Path, table: str = "trajectories", batch_rows: int = 5000) -> int:
    """Validate every record of a file, then append them to a store; returns the row count.

    Validation runs over the whole file before anything is written, so a bad row leaves the store unchanged.
    """
    normalize = NORMALIZERS[table]
    rows = []
    for where, record in iter_records(path):
        try:
            rows.append(normalize(record))
        except SchemaError as exc:
            raise SchemaError(f"{where}: {exc}") from None
    for start in range(0, len(rows), batch_rows):
        store.append(rows[start:start + batch_rows], table=table)
    return len(rows)
