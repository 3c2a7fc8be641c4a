"""Store: a folder of Parquet parts that is also a Hugging Face dataset.

    STORE/README.md                       dataset card (configs: trajectories, annotations)
    STORE/omrl.json                       manifest: schema version, lineage of derived stores
    STORE/data/<table>/part-*.parquet     immutable parts, one per append (or per compaction)
    STORE/data/trajectories/.side/        flat side data of each part (omrl.store_layout), not in the card

Every commit is whole and goes through one store-wide write lock: an append of any size is one part
(temporary file, fsync, rename), its ids are checked against the store's under the lock (ids are unique
per store, whoever writes), and the dataset card is rewritten to list exactly the live parts. A
compaction renames its merged part in before it removes the parts it replaces; a crash in between is
finished by the next writer. Derived stores are built in a hidden staging folder and renamed into
place whole (`Store.staged`). A part that cannot be read is reported by name and skipped, so one bad
file never takes a store down. Once small parts accumulate, an append compacts them (CompactPolicy).

A store may also live under an S3-compatible prefix (`s3://bucket/prefix`): every file operation goes
through `self.storage` (omrl.storage, which explains the commit protocol there: whole-object PUTs,
order of PUTs and deletes, a lease object for the lock). Create, append, read, SQL, check, repair and
compaction work the same there. Not on S3: derived stores (`staged`: filter, augment, export write
local folders) and text search (tantivy indexes need a local folder; none are built for S3 parts, and
`search` says so instead of scanning).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from omrl.durable import fsync_path, is_stale
from omrl.errors import OmrlError, UsageError
from omrl.schema import SCHEMA_VERSION, SCHEMAS, conform, to_table, utcnow
from omrl.storage import LOCAL, S3Path, Stat, Storage, storage_for
from omrl.store_layout import (
    SIDE_DIR,
    SIDE_KINDS,
    CompactPolicy,
    part_of_side,
    side_matches,
    side_path,
    side_tables,
    write_parquet,
)

TABLES = ("trajectories", "annotations")
MANIFEST = "omrl.json"
# Parquet key listing the parts a compacted part replaces: readers skip those if a crash left them behind.
REPLACES_KEY = b"omrl.replaces"
T = TypeVar("T")
# Listings of parts a reader redoes when a concurrent compaction removed a part it was about to read.
RELIST_ATTEMPTS = 5
# Writers put their pid in temporary names (`.part-<time>-<pid>-<rand>.parquet.tmp`, `.NAME.staging-<pid>-<rand>`).
_TMP_PID = re.compile(r"^\.part-\d{8}T\d{12}-(\d+)-[0-9a-f]+\.parquet\.tmp$")
_SIDE_TMP_PID = re.compile(r"^\.part-\d{8}T\d{12}-(\d+)-[0-9a-f]+\.\w+\.parquet\.tmp$")
_STAGING_PID = re.compile(r"\.(?:staging|creating|replaced)-(\d+)-[0-9a-f]+$")


class StoreError(OmrlError, RuntimeError):
    """A store that does not exist or cannot be used; the message says which and why."""


class CorruptPartWarning(UserWarning):
    """A part file that could not be read and was skipped."""


class AutoCompactWarning(UserWarning):
    """An automatic compaction that failed after its append was committed (the append stands)."""


class SearchIndexWarning(UserWarning):
    """A part whose text-search index could not be built (the part stands; searches scan it)."""


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


def dataset_card(name: str, description: str = "") -> str:
    """The README.md that makes a store loadable with `datasets.load_dataset(path)` (no parts yet)."""
    return f"""---
{_card_configs({table: [] for table in TABLES})}
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


def _card_configs(parts: dict[str, list[str]]) -> str:
    """The card's `configs:` block listing each table's live parts by name.

    Exact names, not a glob: a glob would also match the parts a crashed compaction left behind, and
    `load_dataset` would then return their rows twice. A table without parts keeps the glob (it matches
    nothing, as before).
    """
    lines = ["configs:"]
    for table in TABLES:
        lines.append(f"- config_name: {table}")
        if table == "trajectories":
            lines.append("  default: true")
        lines += ["  data_files:", "  - split: train"]
        names = parts.get(table) or []
        if names:
            lines.append("    path:")
            lines += [f"    - data/{table}/{name}" for name in names]
        else:
            lines.append(f"    path: data/{table}/part-*.parquet")
    return "\n".join(lines)


def _replace_card_configs(card: str, configs: str) -> str:
    """The card with its YAML `configs:` block replaced (the rest of the front matter and the text kept)."""
    match = re.match(r"^---\n(.*?)\n---\n", card, re.S)
    if match is None:  # no front matter (a hand-edited card): give it one
        return f"---\n{configs}\n---\n\n{card}"
    front = match.group(1)
    kept = re.sub(r"^configs:\n(?:[ -].*\n?)*", "", front + "\n", flags=re.M).strip("\n")
    return f"---\n{configs}" + (f"\n{kept}" if kept else "") + "\n---\n" + card[match.end():]


def _card_lists_parts(card: str, table: str) -> list[str] | None:
    """The part names a card lists for `table` (None when it lists a glob or nothing readable)."""
    match = re.search(rf"- config_name: {table}\n(?:  .*\n)*?  - split: train\n    path:(.*)\n((?:    - .*\n?)*)",
                      card)
    if match is None or match.group(1).strip():
        return None
    return re.findall(rf"    - data/{table}/(part-[^\s*]+\.parquet)", match.group(2))


@dataclass(frozen=True)
class Appended:
    """What one append committed: the new part (None when nothing was written) and the row counts."""

    part: Path | None
    written: int
    skipped: int = 0  # rows whose id the store already held (only with skip_existing)


class Store:
    """A trajectory store at `path`. Use `Store.create` for a new one, `Store(path)` for an existing one."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path: Path | S3Path
        self.storage: Storage
        self.path, self.storage = storage_for(path)  # local disk, or S3 for s3://bucket/prefix (omrl.storage)
        if not self.storage.exists(self.path / MANIFEST):
            raise StoreError(f"{self.path} is not an omrl store (no {MANIFEST}); create one with `omrl store init`")
        self._footers: dict[tuple[str, int, int], _Footer] = {}
        self._sides: dict[tuple[str, int, int, str, int], bool] = {}  # (side file stat, part, rows) -> it matches
        # table -> (the part keys whose ids are in the set, the set): the id check's index
        self._id_index: dict[str, tuple[frozenset[tuple[str, int, int]], set[str]]] = {}

    # ------------------------------------------------------------ creation and manifest

    @classmethod
    def create(cls, path: str | os.PathLike[str], exist_ok: bool = True, description: str = "",
               lineage: dict[str, Any] | None = None) -> Store:
        """Create a store folder (or open it when it exists and exist_ok); safe when processes race."""
        root, storage = storage_for(path)
        if not storage.local:
            return cls._create_remote(root, storage, exist_ok, description, lineage)
        if (root / MANIFEST).is_file():
            if not exist_ok:
                raise StoreError(f"{root} already holds a store")
            store = cls(root)
            store._sync_card()
            return store
        _refuse_foreign(root)
        staging = _new_staging(root, "creating")
        try:
            cls._lay_out(LOCAL, staging, root.name, description, lineage)
            os.rename(staging, root)  # replaces an empty folder; fails if another process got there first
        except OSError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            if not (root / MANIFEST).is_file():
                raise StoreError(f"{root} exists, is not empty and is not an omrl store") from None
            if not exist_ok:
                raise StoreError(f"{root} already holds a store") from None
            # A racing process created it first: that is the store the caller asked for.
        fsync_path(root.parent)
        return cls(root)

    @classmethod
    def _create_remote(cls, root: S3Path, storage: Storage, exist_ok: bool, description: str,
                       lineage: dict[str, Any] | None) -> Store:
        """Create a store under an S3 prefix: the card, then the manifest, which is what makes it a store.

        The manifest is PUT only if absent (If-None-Match), so of racing creators one wins and the
        others open its store; a crash before it leaves no store, only a card the next create replaces.
        """
        if storage.exists(root / MANIFEST):
            if not exist_ok:
                raise StoreError(f"{root} already holds a store")
            store = cls(root)
            store._sync_card()
            return store
        names = storage.list_names(root)
        if [n for n in names if n != "README.md"] or storage.list_names(root / "data" / TABLES[0]):
            raise StoreError(f"{root} exists, is not empty and is not an omrl store")
        try:
            cls._lay_out(storage, root, root.name, description, lineage)
        except FileExistsError:  # the manifest's conditional PUT: a racing process created it first
            if not exist_ok:
                raise StoreError(f"{root} already holds a store") from None
        except FileNotFoundError as exc:
            raise StoreError(f"cannot create a store at {root}: {exc} (does the bucket exist?)") from None
        return cls(root)

    @classmethod
    @contextlib.contextmanager
    def staged(cls, path: str | os.PathLike[str], description: str = "",
               lineage: dict[str, Any] | None = None, replace: bool = False) -> Iterator[Store]:
        """Build a new store in a hidden staging folder and rename it to `path` whole when the block ends.

        A crash or an error inside the block leaves no new store at `path` (the staging folder is
        removed, or by the next `staged` call when the process was killed): derived stores (filter,
        augment, export) are complete or absent, never half-written. With `replace`, a store already
        at `path` is swapped out only once the new one is complete.
        """
        root, storage = storage_for(path)
        if not storage.local:
            raise UsageError(f"{root}: derived stores (filter, augment, export output) are written to local "
                             "folders only; write it locally and copy it to S3")
        if (root / MANIFEST).is_file():
            if not replace:
                raise StoreError(f"{root} already holds a store; choose a new output folder")
        else:
            _refuse_foreign(root)
        staging = _new_staging(root, "staging")
        try:
            cls._lay_out(LOCAL, staging, root.name, description, lineage)
            store = cls(staging)
            yield store
            store._rewrite_card()
            old = None
            if replace and (root / MANIFEST).is_file():
                old = root.parent / f".{root.name}.replaced-{os.getpid()}-{uuid.uuid4().hex[:8]}"
                os.rename(root, old)
            try:
                os.rename(staging, root)
            except OSError as exc:
                if old is not None:
                    os.rename(old, root)  # put the previous store back
                if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    raise StoreError(f"{root} was created by someone else meanwhile; nothing written") from None
                raise
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        fsync_path(root.parent)
        store.path = root

    @staticmethod
    def _lay_out(storage: Storage, root: Path | S3Path, name: str, description: str,
                 lineage: dict[str, Any] | None) -> None:
        """Write a new store's card and manifest (the manifest last: it is what makes `root` a store)."""
        if storage.local:  # S3 has no folders: a table's prefix exists once it holds a part
            for table in TABLES:
                (root / "data" / table).mkdir(parents=True, exist_ok=True)
        manifest = {
            "format": "omrl-store",
            "schema_version": SCHEMA_VERSION,
            "created_at": utcnow().isoformat(),
            "lineage": [lineage] if lineage else [],
        }
        storage.write_bytes(root / "README.md", dataset_card(name, description).encode())
        manifest_bytes = (json.dumps(manifest, indent=2, default=str) + "\n").encode()
        # Written new: in a fresh local staging folder, and on S3 only if absent (racing creators: one wins)
        storage.write_new(root / MANIFEST, lambda f: f.write(manifest_bytes))

    @property
    def manifest(self) -> dict[str, Any]:
        return json.loads(self.storage.read_bytes(self.path / MANIFEST))

    @contextlib.contextmanager
    def _lock(self, name: str, wait: bool = True) -> Iterator[bool]:
        """An exclusive advisory lock shared by all processes using this store; yields whether it is held
        (always True when `wait`): flock on local disk, a lease object on S3 (omrl.storage)."""
        with self.storage.lock(self.path, name, wait) as held:
            yield held

    def update_manifest(self, **changes: Any) -> dict[str, Any]:
        """Merge keys into omrl.json atomically; `lineage` entries are appended, not replaced."""
        with self._lock("manifest"):
            manifest = self.manifest
            for key, value in changes.items():
                if key == "lineage":
                    manifest.setdefault("lineage", []).append(value)
                else:
                    manifest[key] = value
            self.storage.write_bytes(self.path / MANIFEST, (json.dumps(manifest, indent=2, default=str) + "\n").encode())
            return manifest

    # ------------------------------------------------------------ writing

    def table_dir(self, table: str) -> Path:
        if table not in TABLES:
            raise StoreError(f"unknown table {table!r}; tables are {', '.join(TABLES)}")
        return self.path / "data" / table

    def append(self, rows: Iterable[dict[str, Any]] | pa.Table, table: str = "trajectories",
               metadata: dict[bytes, bytes] | None = None, skip_existing: bool = False) -> Appended:
        """Validate rows and commit them as one new part, whole or not at all.

        Ids must be unique in the batch and new to the table: the check runs under the store's write
        lock, so concurrent writers can never double a row. With `skip_existing`, rows whose id the
        table already holds are dropped (a repeated or racing collect run); otherwise they are an error
        and nothing is written.
        """
        self.table_dir(table)  # an unknown table name fails here, with the list of tables
        policy = self.compact_policy  # bad settings refuse the append before anything is written
        data = conform(rows, table) if isinstance(rows, pa.Table) else to_table(list(rows), table)
        _refuse_repeated_ids(data)
        if data.num_rows == 0:
            return Appended(None, 0)
        with self._lock("write"):
            live, leftovers = self._scan(table, warn=False)
            self._finish_cleanup(table, leftovers, temporary=False)  # temporary files: compact and repair
            existing = self._ids_locked(table, live)
            present = pa.array([i in existing for i in data.column("id").to_pylist()], pa.bool_())
            skipped = pc.sum(present).as_py() or 0
            if skipped and not skip_existing:
                sample = data.filter(present).column("id").slice(0, 3).to_pylist()
                raise StoreError(f"{skipped} of {data.num_rows} {table} rows have ids the store already holds "
                                 f"(e.g. {', '.join(sample)}); nothing written")
            if skipped:
                data = data.filter(pc.invert(present))
            if data.num_rows == 0:
                return Appended(None, 0, skipped)
            part = self._write_part(data, table, metadata)
            self._rewrite_card({table: [p.name for p in live] + [part.name]})
            if self.manifest.get("schema_version", 1) < SCHEMA_VERSION:  # a v1 store now holds v2 parts
                self.update_manifest(schema_version=SCHEMA_VERSION)
        # No search index here: building it cost more than the append itself. Compaction (automatic or
        # `omrl store compact`) and `omrl store check --repair` build it; searches scan unindexed parts.
        self._auto_compact(table, policy)
        return Appended(part, data.num_rows, skipped)

    def _index(self, part: Path, data: pa.Table | None = None) -> None:
        """Build a compacted trajectories part's search index (omrl.search) outside the write lock. The part
        is committed already: a failure is a warning, and searches scan the part instead."""
        if not self.storage.local:  # tantivy needs a local folder: S3 stores are not indexed (_refuse_remote_search)
            return
        from omrl.search import build_index

        try:
            build_index(part, data)
        except FileNotFoundError:
            return  # compacted away meanwhile: the merged part gets its own index
        except Exception as exc:  # any failure of the index library: the committed part must stand
            warnings.warn(f"no search index for {part} (searches scan it instead): {type(exc).__name__}: {exc}",
                          SearchIndexWarning, stacklevel=3)

    def _index_missing(self) -> None:
        """Build the search index of every live trajectories part that lacks one (warnings as `_index`); none on
        S3, where missing_indexes lists nothing."""
        from omrl.search import missing_indexes

        for part in missing_indexes(self):
            self._index(part)

    def search(self, query: str, limit: int | None = None, *, snippets: bool = True) -> pa.Table:
        """Messages matching a text query (words and "phrases"; rules in omrl.search), exactly what a
        full scan finds: trajectory_id, position, role and (with `snippets`) snippet, ordered; at most
        `limit` rows. Without snippets no message text is read from an indexed part."""
        from omrl.search import search

        return search(self, query, limit, snippets=snippets)

    def cache_dir(self, name: str) -> Path:
        """A local folder for the store's caches (judge replies): inside a local store; for an S3 store,
        under ~/.cache/omrl/s3/BUCKET/PREFIX (a cache is per machine, never shared through the bucket)."""
        if self.storage.local:
            return self.path / "cache" / name
        return Path.home() / ".cache" / "omrl" / "s3" / self.path.key / name

    def _write_part(self, data: pa.Table, table: str, metadata: dict[bytes, bytes] | None = None) -> Path:
        """Write a part whole through the storage (local: temporary, fsync, rename; S3: one PUT); callers
        hold the write lock."""
        directory = self.table_dir(table)
        # Time first so parts sort in write order; pid and random suffix keep concurrent writers apart.
        name = f"part-{utcnow().strftime('%Y%m%dT%H%M%S%f')}-{os.getpid()}-{uuid.uuid4().hex[:8]}.parquet"
        final = directory / name
        if metadata:
            data = data.replace_schema_metadata({**(data.schema.metadata or {}), **metadata})
        if table == "trajectories":
            # Side files go in first: a crash before the part's rename leaves only an orphan (removed by
            # the next writer), never a part without its side data that a reader would then unnest.
            for kind, side in side_tables(data, name).items():
                self.storage.write_new(side_path(final, kind), lambda f, t=side: write_parquet(t, f, 1 << 20))
        # Row groups sized by bytes (store_layout.ROW_GROUP_BYTES), for appends and compactions alike.
        self.storage.write_new(final, lambda f: write_parquet(data, f))
        return final

    def _sync_card(self) -> None:
        """Rewrite the card if a writer was killed between renaming its part in and rewriting the card."""
        card = self._read_card() or ""
        for table in TABLES:
            listed = set(_card_lists_parts(card, table) or [])  # a glob (old stores) lists nothing by name
            if listed != {p.name for p in self.parts(table, warn=False)}:
                with self._lock("write"):
                    self._rewrite_card()
                return

    def _rewrite_card(self, known: dict[str, list[str]] | None = None) -> None:
        """List the live parts of every table in README.md (callers hold the write lock).

        `known`: the live part names of the tables a caller has just listed; the other tables keep the
        names the card lists (every commit rewrites the card under the same lock, so they are current).
        """
        card = self._read_card()
        if card is None:
            card = dataset_card(self.path.name)
        names = {}
        for table in TABLES:
            listed = _card_lists_parts(card, table) if known is not None else None
            if known is not None and table in known:
                names[table] = known[table]
            elif listed is not None:
                names[table] = listed
            else:
                names[table] = [p.name for p in self.parts(table, warn=False)]
        updated = _replace_card_configs(card, _card_configs(names))
        if updated != card:
            self.storage.write_bytes(self.path / "README.md", updated.encode())

    def _read_card(self) -> str | None:
        """The dataset card's text (None when there is none)."""
        try:
            return self.storage.read_bytes(self.path / "README.md").decode("utf-8")
        except FileNotFoundError:
            return None

    def _finish_cleanup(self, table: str, leftovers: list[Path] | None = None, temporary: bool = True) -> int:
        """Remove what crashed writers left: parts a compaction replaced (`leftovers`, listed here when
        None) and, with `temporary`, stale temporary files. Callers hold the write lock; returns the count."""
        removed = 0
        leftovers = self._scan(table, warn=False)[1] if leftovers is None else leftovers
        if leftovers:
            # A compaction killed after renaming its part in may not have rewritten the card yet: list the
            # live parts first, so the card never names a part that is gone (load_dataset would fail).
            self._rewrite_card()
        for path in leftovers:
            self._remove_part(path)
            removed += 1
        if temporary and self.storage.local:  # S3 writes have no temporaries (omrl.storage)
            for tmp in self.table_dir(table).glob(".part-*.tmp"):
                if is_stale(tmp, _TMP_PID):
                    tmp.unlink(missing_ok=True)
                    removed += 1
        return removed + self._remove_orphan_side_files(table, temporary)

    def _remove_orphan_side_files(self, table: str, temporary: bool) -> int:
        """Side files whose part is gone (a writer killed between them; callers hold the write lock, so
        no writer is between its side files and its part now) and, with `temporary`, stale side temporaries."""
        folder = self.table_dir(table) / SIDE_DIR
        names = self.storage.list_names(folder)
        if not names:
            return 0
        parts = set(self.storage.list_names(self.table_dir(table)))
        removed = 0
        for name in names:
            side = folder / name
            if name.startswith("."):
                orphan = temporary and self.storage.local and is_stale(side, _SIDE_TMP_PID)
            else:
                orphan = part_of_side(side) not in parts
            if orphan:
                self.storage.delete(side)
                removed += 1
        return removed

    def _remove_part(self, part: Path) -> None:
        """Delete a part and then what belongs to it (a crash in between leaves orphans, removed later)."""
        self.storage.delete(part)
        for kind in SIDE_KINDS:
            self.storage.delete(side_path(part, kind))
        if part.parent.name == "trajectories" and self.storage.local:  # S3 stores have no index (_index)
            from omrl.search import remove_index

            remove_index(part)

    def _ids_locked(self, table: str, parts: list[Path]) -> set[str]:
        """The ids of the live `parts`. Kept between commits and grown by the parts added since, so a
        long collect run does not re-read the store for each batch; rebuilt when a part went away."""
        live = {}
        for path in parts:
            st = self._stat(path)
            live[(str(path), st.st_size, st.st_mtime_ns)] = path
        known, ids = self._id_index.get(table, (frozenset(), set()))
        if not known <= live.keys():  # a compaction replaced parts: start again
            known, ids = frozenset(), set()
        for key in live.keys() - known:
            ids.update(self._read_parquet(live[key], columns=["id"]).column("id").to_pylist())
        self._id_index[table] = (frozenset(live), ids)
        return ids

    # ------------------------------------------------------------ reading

    def _all_parts(self, table: str) -> list[Path]:
        directory = self.table_dir(table)
        names = [n for n in self.storage.list_names(directory) if n.startswith("part-") and n.endswith(".parquet")]
        return [directory / name for name in names]

    def _stat(self, path: Path) -> Stat:
        """A part's size and mtime (local disk: asked again, FileNotFoundError when gone; S3: from the
        newest listing, Storage.part_stat)."""
        return self.storage.part_stat(path)

    def _read_parquet(self, path: Path, columns: list[str] | None = None) -> pa.Table:
        """A part (or side file) read through the store's storage; FileNotFoundError when it is gone."""
        return pq.read_table(self.storage.arrow_source(path, whole=True), columns=columns)

    def _footer(self, path: Path) -> _Footer:
        """The part's footer, read once per name, size and mtime (every listing of parts needs it).

        Raises FileNotFoundError for a part a compaction has just removed: callers list the parts again.
        """
        st = self._stat(path)
        key = (str(path), st.st_size, st.st_mtime_ns)
        footer = self._footers.get(key)
        if footer is None:
            try:
                meta = pq.read_metadata(self.storage.arrow_source(path, size=st.st_size))
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
        for attempt in range(RELIST_ATTEMPTS - 1):
            try:
                return work()
            except FileNotFoundError:
                time.sleep(0.01 * (attempt + 1))  # let the compaction finish its cleanup
        return work()

    def _each_part(self, table: str, read: Callable[[Path], T]) -> list[T]:
        """`read` applied to every live part, consistent even while another process compacts the table."""
        return self._retry_on_vanished(lambda: [read(p) for p in self.parts(table)])

    def parts(self, table: str = "trajectories", warn: bool = True) -> list[Path]:
        """Readable parts of a table. Unreadable ones are skipped with a warning; replaced ones silently."""
        return self._scan(table, warn)[0]

    def check(self) -> list[PartProblem]:
        """Every part file that cannot be read or whose rows do not fit the schema, and ids held twice."""
        problems = []
        for table in TABLES:
            for path in self._all_parts(table):
                try:
                    problem = self._footer(path).error
                except FileNotFoundError:
                    continue  # removed by a compaction since the listing: nothing left to check
                if problem is None:
                    try:
                        names = self._read_parquet(path).column_names  # the footer can be fine while a page is truncated
                        if "id" not in names:
                            problem = "missing required column(s): id"
                    except Exception as exc:
                        problem = f"{type(exc).__name__}: {exc}"
                if problem is not None:
                    problems.append(PartProblem(path, problem))
            problems += self._duplicate_problems(table)
        return problems

    def _duplicate_problems(self, table: str) -> list[PartProblem]:
        """Ids held by more than one row (stores written before ids were checked at commit)."""
        try:
            ids = pa.chunked_array(self._each_part(table, lambda p: self._read_parquet(p, columns=["id"]).column("id")),
                                   pa.string())
        except Exception:  # unreadable parts are reported above
            return []
        counts = pc.value_counts(ids)
        repeated = counts.filter(pc.greater(counts.field("counts"), 1))
        if len(repeated) == 0:
            return []
        extra = pc.sum(repeated.field("counts")).as_py() - len(repeated)
        sample = ", ".join(repeated.field("values").slice(0, 3).to_pylist())
        return [PartProblem(self.table_dir(table), f"{len(repeated)} {table} ids appear more than once "
                            f"({extra} extra rows, e.g. {sample}); `omrl store compact` keeps one copy of each")]

    def repair(self) -> int:
        """Finish interrupted cleanups (replaced parts, stale temporary files) and rewrite the card.

        Returns the number of files removed. Unreadable parts are left for the user to look at.
        """
        with self._lock("write"):
            removed = sum(self._finish_cleanup(table) for table in TABLES)
            self._rewrite_card()
        return removed

    def read(self, table: str = "trajectories", columns: list[str] | None = None) -> pa.Table:
        """All rows of a table as Arrow, in the current schema (older parts are conformed)."""
        def load(path: Path) -> pa.Table | None:
            try:
                return conform(self._read_parquet(path), table)
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
        for ids in self._each_part(table, lambda p: self._read_parquet(p, columns=["id"]).column("id")):
            out.update(ids.to_pylist())
        return out

    # ------------------------------------------------------------ maintenance

    def compact(self, table: str = "trajectories", min_parts: int = 2, policy: CompactPolicy | None = None,
                wait: bool = True) -> Path | None:
        """Merge all readable parts into one, keeping the first copy of any repeated id; crash-safe.

        The merged part names the parts it replaces and is renamed in before they are removed, so a
        crash in between hides them from readers, and the next writer (or compaction) removes them.
        With `policy` (automatic compaction) only its small parts are merged, once there are enough of
        them; without `wait`, a compaction another process is running already makes this one return None.
        The merged part gets its search index; without `policy`, parts left as they are get theirs too.
        """
        with self._lock(f"compact-{table}", wait=wait) as locked:
            if not locked:
                return None
            with self._lock("write"):
                self._finish_cleanup(table)
            parts = self.parts(table)
            # Appends refuse repeated ids, so only old stores hold them; the full check is for `omrl store compact`.
            duplicated = policy is None and bool(self._duplicate_problems(table))
            if policy is not None:
                parts = policy.small(parts)
            if len(parts) < min_parts and not duplicated:
                if policy is None and table == "trajectories":
                    self._index_missing()  # nothing to merge: `omrl store compact` still makes search fast
                return None
            # Merge outside the write lock: appends go on meanwhile, as new parts this one does not replace.
            data = pa.concat_tables([conform(self._read_parquet(p), table) for p in parts])
            if duplicated:
                data = _first_of_each_id(data)
            replaces = json.dumps(sorted(p.name for p in parts)).encode()
            with self._lock("write"):
                new = self._write_part(data, table, {REPLACES_KEY: replaces})
                self._rewrite_card()
                for p in parts:
                    self._remove_part(p)
            if table == "trajectories":
                self._index(new, data)
            return new

    @property
    def compact_policy(self) -> CompactPolicy:
        """When appends compact small parts (the manifest's "auto_compact"; defaults otherwise)."""
        try:
            return CompactPolicy.from_manifest(self.manifest)
        except (TypeError, ValueError) as exc:
            raise StoreError(f"{self.path / MANIFEST}: {exc}") from None

    def set_compact_policy(self, policy: CompactPolicy) -> None:
        """Store the automatic compaction settings in the manifest (for every process using the store)."""
        self.update_manifest(auto_compact={"small_parts": policy.small_parts,
                                           "small_part_bytes": policy.small_part_bytes})

    def _auto_compact(self, table: str, policy: CompactPolicy) -> Path | None:
        """Merge the small parts once the policy says there are enough (after a commit, outside its lock).

        The append before it is committed whatever happens here: a failure is a warning, not an error
        (the small parts stay, readable, and the next append tries again).
        """
        try:
            if not policy.small(self.parts(table, warn=False)):
                return None
            return self.compact(table, min_parts=policy.small_parts, policy=policy, wait=False)
        except (OSError, OmrlError, pa.ArrowException) as exc:
            warnings.warn(f"automatic compaction of {self.path} {table} failed (the append is committed; "
                          f"run `omrl store compact`): {type(exc).__name__}: {exc}", AutoCompactWarning, stacklevel=3)
            return None

    def _refuse_remote_search(self) -> None:
        """Text search reads parts and indexes from local disk (omrl.search): refused on an S3 store."""
        if not self.storage.local:
            raise UsageError(f"{self.path}: text search is not supported on S3 stores yet (no index is built "
                             "there); use SQL, e.g. `WHERE content ILIKE '%word%'` on the messages view")

    def _side_matches(self, side: Path, part_name: str, rows: int, size: int) -> bool:
        """Whether `side` is the readable side file of this part (store_layout.side_matches, through the storage)."""
        if self.storage.local:
            return side_matches(side, part_name, rows)
        try:
            with self.storage.arrow_source(side, size=size) as f:
                return side_matches(f, part_name, rows)
        except FileNotFoundError:
            return False

    def side_files(self, kind: str = "tool_calls") -> tuple[list[Path], list[Path]]:
        """(side files, parts without one) of the live trajectories parts: readers use the side files and
        unnest only the parts lacking one (v1 parts, a side file lost or damaged)."""
        def listing() -> tuple[list[Path], list[Path]]:
            sides, lacking = [], []
            # S3: one listing of the side folder instead of a HEAD per side file
            listed = None if self.storage.local else self.storage.list_stats(self.table_dir("trajectories") / SIDE_DIR)
            for part in self.parts("trajectories"):
                side = side_path(part, kind)
                rows = self._footer(part).num_rows  # FileNotFoundError when compacted away: listed again
                try:
                    st = self.storage.stat(side) if listed is None else listed[side.name]
                except (FileNotFoundError, KeyError):
                    lacking.append(part)
                    continue
                key = (str(side), st.st_size, st.st_mtime_ns, part.name, rows)
                if key not in self._sides:
                    self._sides[key] = self._side_matches(side, part.name, rows, st.st_size)
                (sides if self._sides[key] else lacking).append(side if self._sides[key] else part)
            return sides, lacking

        return self._retry_on_vanished(listing)

    def sql(self, query: str) -> pa.Table:
        """Run read-only SQL over the store's views; returns Arrow."""
        from omrl.query import run_query

        return run_query(self, query)

    def connect(self):
        """A DuckDB connection with the store's views (trajectories, messages, ...)."""
        from omrl.query import connect

        return connect(self)


def _refuse_foreign(root: Path) -> None:
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise StoreError(f"{root} exists, is not empty and is not an omrl store")


def _new_staging(root: Path, kind: str) -> Path:
    """A fresh hidden folder beside `root` (same file system, so it can be renamed into place); stale
    ones of killed processes are removed first."""
    root.parent.mkdir(parents=True, exist_ok=True)
    for old in root.parent.glob(f".{root.name}.*-*-*"):
        if not (_STAGING_PID.search(old.name) and is_stale(old, _STAGING_PID)):
            continue
        if ".replaced-" in old.name and not root.exists():
            os.rename(old, root)  # killed while swapping in a replacement: the previous store comes back
        else:
            shutil.rmtree(old, ignore_errors=True)
    staging = root.parent / f".{root.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    return staging


def _refuse_repeated_ids(data: pa.Table) -> None:
    counts = pc.value_counts(data.column("id"))
    repeated = counts.filter(pc.greater(counts.field("counts"), 1))
    if len(repeated):
        sample = ", ".join(map(str, repeated.field("values").slice(0, 3).to_pylist()))
        raise StoreError(f"{len(repeated)} ids occur more than once in the rows to append (e.g. {sample}); "
                         "ids must be unique, nothing written")


def _first_of_each_id(data: pa.Table) -> pa.Table:
    """The rows of `data` whose id has not occurred in an earlier row."""
    seen: set[str] = set()
    keep = []
    for value in data.column("id").to_pylist():
        keep.append(value not in seen)
        seen.add(value)
    return data.filter(pa.array(keep, pa.bool_()))


def open_store(path: str | os.PathLike[str], create: bool = False) -> Store:
    """Open a store, creating it first when `create` is true."""
    return Store.create(path) if create else Store(path)
