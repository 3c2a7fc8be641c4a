"""Where rows live in a table's parts, and reads of a few of them: the viewer's indexed lookups.

A part never changes once written (a compaction only removes it), so a key -> (part, row group, row) index
stays right until the list of parts changes; the reader builds a new one then. Reading one row costs the
decode of its row group's columns asked for (message text sits in per-row-group dictionary pages, so one
row cannot be had for less), so the last few row groups read are kept. Reads decode in the calling thread,
not in pyarrow's shared thread pool: a slow query's scans, which fill that pool, hold up no page read here.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from omrl.schema import conform

Location = tuple[str, int, int]  # (part path, row group, row in the group)


def scan_keys(parts: Iterable, columns: list[str]) -> Iterator[tuple[Location, list[Any]]]:
    """(location, [value of each column]) of every row of these parts, reading only `columns` (a column a
    part lacks reads as None)."""
    for part in parts:
        file = pq.ParquetFile(part)
        present = [c for c in columns if c in file.schema_arrow.names]
        for rg in range(file.num_row_groups):
            data = file.read_row_group(rg, columns=present, use_threads=False)
            n = data.num_rows
            values = [data.column(c).to_pylist() if c in present else [None] * n for c in columns]
            for row, item in enumerate(zip(*values, strict=True)):
                yield (str(part), rg, row), list(item)


OPEN_FILES = 8  # parts kept open (footer parsed once): a page's rows are mostly in the newest parts


class RowGroups:
    """Rows read by location, the last `keep` row groups (per column set) kept decoded."""

    def __init__(self, table: str, keep: int = 2):
        self.table = table  # the store table the parts belong to (for conform)
        self.keep = keep
        self._cache: OrderedDict[tuple[str, int, tuple[str, ...] | None], pa.Table] = OrderedDict()
        self._files: OrderedDict[str, pq.ParquetFile] = OrderedDict()

    def clear(self) -> None:
        self._cache.clear()
        while self._files:
            self._files.popitem()[1].close()

    def _file(self, part: str) -> pq.ParquetFile:
        if part in self._files:
            self._files.move_to_end(part)
            return self._files[part]
        file = self._files[part] = pq.ParquetFile(part)
        while len(self._files) > OPEN_FILES:
            self._files.popitem(last=False)[1].close()
        return file

    def _group(self, part: str, rg: int, columns: tuple[str, ...] | None) -> pa.Table:
        key = (part, rg, columns)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        file = self._file(part)
        wanted = None if columns is None else [c for c in columns if c in file.schema_arrow.names]
        data = file.read_row_group(rg, columns=wanted, use_threads=False)
        self._cache[key] = data
        while len(self._cache) > self.keep:
            self._cache.popitem(last=False)
        return data

    def read(self, locations: list[Location], columns: list[str] | None = None) -> list[dict[str, Any]]:
        """The rows at these locations, in their order, as dicts of `columns` (None: all), conformed to
        the table's schema (an old part's missing columns read as None). FileNotFoundError when a
        compaction removed a part since the index was built."""
        chosen = None if columns is None else tuple(columns)
        wanted: dict[tuple[str, int], list[int]] = {}
        for at, (part, rg, _) in enumerate(locations):
            wanted.setdefault((part, rg), []).append(at)
        out: list[dict[str, Any] | None] = [None] * len(locations)
        for (part, rg), positions in wanted.items():
            rows = pa.array([locations[p][2] for p in positions], type=pa.int64())
            data = self._group(part, rg, chosen).take(rows)
            picked = conform(data, self.table).to_pylist()
            for p, row in zip(positions, picked, strict=True):
                out[p] = row if chosen is None else {c: row.get(c) for c in chosen}
        return out  # type: ignore[return-value]
