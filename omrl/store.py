"""Store: a folder of Parquet parts that is also a Hugging Face dataset.

    STORE/README.md                       dataset card (configs: trajectories, annotations)
    STORE/omrl.json                       manifest: schema version, lineage of derived stores
    STORE/data/<table>/part-*.parquet     immutable parts, one per append (or per compaction)

Appends are atomic (temporary file, fsync, rename); readers never see a half-written part. A part
that cannot be read is reported by name and skipped, so one bad file never takes a store down.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from omrl.schema import SCHEMA_VERSION, SCHEMAS, conform, to_table, utcnow

TABLES = ("trajectories", "annotations")
MANIFEST = "omrl.json"
# Parquet key listing the parts a compacted part replaces: readers skip those if a crash left them behind.
REPLACES_KEY = b"omrl.replaces"
# Row groups of about this many uncompressed bytes: DuckDB scans row groups in parallel, and a
# trajectory can be 20 KB or more, so a fixed row count would make groups of hundreds of megabytes.
T = TypeVar("T")
ROW_GROUP_BYTES = 32 * 1024 * 1024
MAX_ROW_GROUP_ROWS = 16_384
ZSTD_LEVEL = 3  # as fast to write as level 1 here, about 10% smaller
# Listings of parts a reader redoes when a concurrent compaction removed a part it was about to read.
RELIST_ATTEMPTS = 5


class StoreError(RuntimeError):
    """A store that does not exist or cannot be used; the message says which and why."""


class CorruptPartWarning(UserWarning):
    """A part file that could not be read and was skipped."""


@dataclass(frozen=True)
class PartProblem:
    path: Path
    error: str


@dataclass(frozen=True)
class _Footer:
    """What a part's footer says: why it cannot be read (None when it can), rows, parts it replaces."""

    error: str | None
    num_rows: int = 0
    replaces: frozenset[str] = frozenset()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def dataset_card(name: str, description: str = "") -> str:
    """The README.md that makes a store loadable with `datasets.load_dataset(path)`."""
    return f"""---
configs:
- config_name: trajectories
  default: true
  data_files:
  - split: train
    path: data/trajectories/part-*.parquet
- config_name: annotations
  data_files:
  - split: train
    path: data/annotations/part-*.parquet
tags:
- omrl
- agent-trajectories
- reinforcement-learning
---

# {name}

An [omrl](https://github.com/omrl/omrl) trajectory store (schema version {SCHEMA_VERSION}).
{description}

- `trajectories`: one row per attempt by one policy at one task, messages in OpenAI chat format.
- `annotations`: one row per (trajectory, annotator): metric scores and LLM-as-judge verdicts.

```python
from datasets import load_dataset
trajectories = load_dataset("path/or/hub-id", "trajectories", split="train")
```

Query it with SQL: `omrl query STORE "SELECT env, avg(reward) FROM trajectories GROUP BY env"`.
"""


def _row_group_rows(data: pa.Table) -> int:
    per_row = max(1, data.nbytes // max(1, data.num_rows))
    return max(64, min(MAX_ROW_GROUP_ROWS, ROW_GROUP_BYTES // per_row))


class Store:
    """A trajectory store at `path`. Use `Store.create` for a new one, `Store(path)` for an existing one."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        if not (self.path / MANIFEST).is_file():
            raise StoreError(f"{self.path} is not an omrl store (no {MANIFEST}); create one with `omrl store init`")
        self._footers: dict[tuple[str, int, int], _Footer] = {}

    # ------------------------------------------------------------ creation and manifest

    @classmethod
    def create(cls, path: str | os.PathLike[str], exist_ok: bool = True, description: str = "",
               lineage: dict[str, Any] | None = None) -> Store:
        """Create a store folder (or open it when it exists and exist_ok)."""
        root = Path(path)
        if (root / MANIFEST).is_file():
            if not exist_ok:
                raise StoreError(f"{root} already holds a store")
            return cls(root)
        if root.exists() and any(root.iterdir()):
            raise StoreError(f"{root} exists, is not empty and is not an omrl store")
        for table in TABLES:
            (root / "data" / table).mkdir(parents=True, exist_ok=True)
        manifest = {
            "format": "omrl-store",
            "schema_version": SCHEMA_VERSION,
            "created_at": utcnow().isoformat(),
            "lineage": [lineage] if lineage else [],
        }
        _write_atomic_bytes(root / "README.md", dataset_card(root.name, description).encode())
        _write_atomic_bytes(root / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())
        return cls(root)

    @property
    def manifest(self) -> dict[str, Any]:
        return json.loads((self.path / MANIFEST).read_text())

    @contextlib.contextmanager
    def _lock(self, name: str) -> Iterator[None]:
        """An exclusive advisory lock shared by all processes using this store."""
        with open(self.path / f".{name}.lock", "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def update_manifest(self, **changes: Any) -> dict[str, Any]:
        """Merge keys into omrl.json atomically; `lineage` entries are appended, not replaced."""
        with self._lock("manifest"):
            manifest = self.manifest
            for key, value in changes.items():
                if key == "lineage":
                    manifest.setdefault("lineage", []).append(value)
                else:
                    manifest[key] = value
            _write_atomic_bytes(self.path / MANIFEST, (json.dumps(manifest, indent=2, default=str) + "\n").encode())
            return manifest

    # ------------------------------------------------------------ writing

    def table_dir(self, table: str) -> Path:
        if table not in TABLES:
            raise StoreError(f"unknown table {table!r}; tables are {', '.join(TABLES)}")
        return self.path / "data" / table

    def append(self, rows: Iterable[dict[str, Any]] | pa.Table, table: str = "trajectories",
               metadata: dict[bytes, bytes] | None = None) -> Path | None:
        """Validate and write rows as one new part, atomically. Returns the part path (None if no rows)."""
        self.table_dir(table)  # an unknown table name fails here, with the list of tables
        data = conform(rows, table) if isinstance(rows, pa.Table) else to_table(list(rows), table)
        if data.num_rows == 0:
            return None
        return self._write_part(data, table, metadata)

    def _write_part(self, data: pa.Table, table: str, metadata: dict[bytes, bytes] | None = None) -> Path:
        directory = self.table_dir(table)
        directory.mkdir(parents=True, exist_ok=True)
        # Time first so parts sort in write order; pid and random suffix keep concurrent writers apart.
        name = f"part-{utcnow().strftime('%Y%m%dT%H%M%S%f')}-{os.getpid()}-{uuid.uuid4().hex[:8]}.parquet"
        final = directory / name
        tmp = directory / f".{name}.tmp"  # hidden and not *.parquet: no reader ever picks it up
        if metadata:
            data = data.replace_schema_metadata({**(data.schema.metadata or {}), **metadata})
        with open(tmp, "wb") as f:
            pq.write_table(data, f, compression="zstd", compression_level=ZSTD_LEVEL,
                           row_group_size=_row_group_rows(data))
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, final)
        _fsync_dir(directory)
        return final

    # ------------------------------------------------------------ reading

    def _all_parts(self, table: str) -> list[Path]:
        return sorted(self.table_dir(table).glob("part-*.parquet"))

    def _footer(self, path: Path) -> _Footer:
        """The part's footer, read once per name, size and mtime (every listing of parts needs it).

        Raises FileNotFoundError for a part a compaction has just removed: callers list the parts again.
        """
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns)
        footer = self._footers.get(key)
        if footer is None:
            try:
                meta = pq.read_metadata(path)
                replaces = (meta.metadata or {}).get(REPLACES_KEY)
                footer = _Footer(None, meta.num_rows, frozenset(json.loads(replaces)) if replaces else frozenset())
            except FileNotFoundError:
                raise
            except Exception as exc:  # any unreadable footer: truncated, garbage, wrong format
                footer = _Footer(f"{type(exc).__name__}: {exc}")
            self._footers[key] = footer
        return footer

    def _scan(self, table: str, warn: bool = True) -> tuple[list[Path], list[Path]]:
        """(live, leftover) readable parts; leftovers are inputs of a compaction that crashed before removing them."""
        footers = self._retry_on_vanished(lambda: [(p, self._footer(p)) for p in self._all_parts(table)])
        readable: list[Path] = []
        replaced: set[str] = set()
        for path, footer in footers:
            if footer.error is not None:
                if warn:
                    warnings.warn(f"skipping unreadable part {path}: {footer.error}", CorruptPartWarning, stacklevel=3)
                continue
            readable.append(path)
            replaced.update(footer.replaces)
        return ([p for p in readable if p.name not in replaced], [p for p in readable if p.name in replaced])

    @staticmethod
    def _retry_on_vanished(work: Callable[[], T]) -> T:
        """Run `work`, again when a part vanished under it: a compaction renames its new part in before it
        removes the old ones, so a fresh listing sees every row."""
        for _ in range(RELIST_ATTEMPTS - 1):
            try:
                return work()
            except FileNotFoundError:
                continue
        return work()

    def _each_part(self, table: str, read: Callable[[Path], T]) -> list[T]:
        """`read` applied to every live part, consistent even while another process compacts the table."""
        return self._retry_on_vanished(lambda: [read(p) for p in self.parts(table)])

    def parts(self, table: str = "trajectories", warn: bool = True) -> list[Path]:
        """Readable parts of a table. Unreadable ones are skipped with a warning; replaced ones silently."""
        return self._scan(table, warn)[0]

    def check(self) -> list[PartProblem]:
        """Every part file that cannot be read, or whose rows do not fit the schema."""
        problems = []
        for table in TABLES:
            for path in self._all_parts(table):
                try:
                    problem = self._footer(path).error
                except FileNotFoundError:
                    continue  # removed by a compaction since the listing: nothing left to check
                if problem is None:
                    try:
                        names = pq.read_table(path).column_names  # the footer can be fine while a page is truncated
                        if "id" not in names:
                            problem = "missing required column(s): id"
                    except Exception as exc:
                        problem = f"{type(exc).__name__}: {exc}"
                if problem is not None:
                    problems.append(PartProblem(path, problem))
        return problems

    def read(self, table: str = "trajectories", columns: list[str] | None = None) -> pa.Table:
        """All rows of a table as Arrow, in the current schema (older parts are conformed)."""
        def load(path: Path) -> pa.Table | None:
            try:
                return conform(pq.read_table(path), table)
            except FileNotFoundError:
                raise  # compacted away: _each_part lists the parts again
            except Exception as exc:
                warnings.warn(f"skipping unreadable part {path}: {exc}", CorruptPartWarning, stacklevel=2)
                return None

        pieces = [piece for piece in self._each_part(table, load) if piece is not None]
        data = pa.concat_tables(pieces) if pieces else SCHEMAS[table].empty_table()
        return data.select(columns) if columns else data

    def polars(self, table: str = "trajectories"):
        """All rows of a table as a polars DataFrame."""
        import polars as pl

        return pl.from_arrow(self.read(table))

    def dataset(self, table: str = "trajectories"):
        """All rows of a table as a Hugging Face `datasets.Dataset`."""
        import datasets

        return datasets.Dataset(self.read(table))

    def count(self, table: str = "trajectories") -> int:
        return sum(self._each_part(table, lambda p: self._footer(p).num_rows))

    def ids(self, table: str = "trajectories") -> set[str]:
        """The ids present in a table (cheap: reads one column)."""
        out: set[str] = set()
        for ids in self._each_part(table, lambda p: pq.read_table(p, columns=["id"]).column("id")):
            out.update(ids.to_pylist())
        return out

    # ------------------------------------------------------------ maintenance

    def compact(self, table: str = "trajectories", min_parts: int = 2) -> Path | None:
        """Merge all readable parts into one; crash-safe (the new part names the parts it replaces)."""
        with self._lock(f"compact-{table}"):
            parts, leftovers = self._scan(table)
            if len(parts) < min_parts:
                return None
            data = pa.concat_tables([conform(pq.read_table(p), table) for p in parts])
            # Leftovers are named too: once their old replacement is gone, nothing else would hide them.
            replaces = json.dumps(sorted(p.name for p in parts + leftovers)).encode()
            new = self._write_part(data, table, {REPLACES_KEY: replaces})
            for p in parts + leftovers:
                p.unlink(missing_ok=True)
            return new

    def sql(self, query: str) -> pa.Table:
        """Run read-only SQL over the store's views; returns Arrow."""
        from omrl.query import run_query

        return run_query(self, query)

    def connect(self):
        """A DuckDB connection with the store's views (trajectories, messages, ...)."""
        from omrl.query import connect

        return connect(self)


def open_store(path: str | os.PathLike[str], create: bool = False) -> Store:
    """Open a store, creating it first when `create` is true."""
    return Store.create(path) if create else Store(path)
