"""Store: a folder of Parquet parts that is also a Hugging Face dataset.

    STORE/README.md                       dataset card (configs: trajectories, annotations)
    STORE/omrl.json                       manifest: schema version, lineage, the listing of every part
    STORE/data/<table>/part-*.parquet     immutable parts, one per append (or per compaction)
    STORE/data/trajectories/.side/        flat side data of each part (omrl.store.layout), not in the card

The store knows its parts: omrl.json lists each one with its rows, size and SHA-256, and those of its
side files (omrl.store.manifest). Every commit is whole and goes through one store-wide write lock: an
append of any size is one part (temporary file, fsync, rename; its side files first), its ids are checked
against the store's under the lock (ids are unique per store, whoever writes), and then the manifest that
lists it is written: that write is the commit. The dataset card is rewritten from the listing right after.
A compaction writes its merged part, commits a listing with it in place of the parts it replaces, and
only then removes them. What a killed writer leaves (a part never listed, a compaction's inputs) is
removed by the next writer. A listed part that is missing, cut short or unreadable makes reads fail with
its name (`omrl store check` lists every problem, `--repair` fixes what can be fixed and drops lost parts
only with `--accept-loss`), so a lost file never silently means fewer rows. Stores written before the
listing existed are read as before (their folders listed) and get the listing at their first commit.
Once small parts accumulate, an append compacts them (CompactPolicy).

A store may also live under an S3-compatible prefix (`s3://bucket/prefix`): every file operation goes
through `self.storage` (omrl.store.storage; omrl.store.s3 explains the commit protocol there: whole-object PUTs,
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
import uuid
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from omrl.errors import OmrlError, UsageError
from omrl.schema import conform, utcnow
from omrl.schema.arrow import to_table
from omrl.schema.rows import UncheckedRow
from omrl.store.card import dataset_card
from omrl.store.commit import PART_INDEXES, StoreWriter
from omrl.store.durable import fsync_path, is_stale
from omrl.store.layout import CompactPolicy
from omrl.store.location import storage_for
from omrl.store.manifest import (
    MANIFEST,
    TABLES,
    PartProblem,
    StoreError,
    listing,
    manifest_bytes,
    new_manifest,
)
from omrl.store.parts import REPLACES_KEY
from omrl.store.storage import LOCAL, Storage, StorePath, local_path

if TYPE_CHECKING:  # a type only: omrl.store.check imports this module
    from omrl.store.check import RepairReport


# Killed writers' staging folders carry their pid (`.NAME.staging-<pid>-<rand>`).
_STAGING_PID = re.compile(r"\.(?:staging|creating|replaced)-(\d+)-[0-9a-f]+$")


class AutoCompactWarning(UserWarning):
    """An automatic compaction that failed after its append was committed (the append stands)."""


@dataclass(frozen=True)
class Appended:
    """What one append committed: the new part (None when nothing was written) and the row counts."""

    part: StorePath | None
    written: int
    skipped: int = 0  # rows whose id the store already held (only with skip_existing)


class Store(StoreWriter):
    """A trajectory store at `path`. Use `Store.create` for a new one, `Store(path)` for an existing one."""

    @classmethod
    def create(cls, path: str | os.PathLike[str], exist_ok: bool = True, description: str = "",
               lineage: dict[str, Any] | None = None) -> Store:
        """Create a store folder (or open it when it exists and exist_ok); safe when processes race."""
        root, storage = storage_for(path)
        if not storage.local:
            return cls._create_remote(root, storage, exist_ok, description, lineage)
        root = local_path(root)
        if (root / MANIFEST).is_file():
            return cls._open_created(root, exist_ok)
        try:
            _refuse_foreign(root)
        except StoreError:
            if (root / MANIFEST).is_file():  # a racing process renamed its new store in since the check above
                return cls._open_created(root, exist_ok)
            raise
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
        else:
            fsync_path(root.parent)
            return cls(root)
        return cls._open_created(root, exist_ok)  # a racing process created it first: the store asked for

    @classmethod
    def _open_created(cls, root: Path, exist_ok: bool) -> Store:
        """The store already at `root`, for `create` (refused unless exist_ok)."""
        if not exist_ok:
            raise StoreError(f"{root} already holds a store")
        store = cls(root)
        store.sync_card()
        return store

    @classmethod
    def _create_remote(cls, root: StorePath, storage: Storage, exist_ok: bool, description: str,
                       lineage: dict[str, Any] | None) -> Store:
        """Create a store under an S3 prefix: the card, then the manifest, which is what makes it a store.

        The manifest is PUT only if absent (If-None-Match), so of racing creators one wins and the
        others open its store; a crash before it leaves no store, only a card the next create replaces.
        """
        if storage.exists(root / MANIFEST):
            if not exist_ok:
                raise StoreError(f"{root} already holds a store")
            store = cls(root)
            store.sync_card()
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
        root = local_path(root)
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
    def _lay_out(storage: Storage, root: StorePath, name: str, description: str,
                 lineage: dict[str, Any] | None) -> None:
        """Write a new store's card and manifest (the manifest last: it is what makes `root` a store)."""
        if storage.local:  # S3 has no folders: a table's prefix exists once it holds a part
            for table in TABLES:
                local_path(root / "data" / table).mkdir(parents=True, exist_ok=True)
        manifest = manifest_bytes(new_manifest(utcnow().isoformat(), [lineage] if lineage else []))
        storage.write_bytes(root / "README.md", dataset_card(name, description).encode())
        # Written new: in a fresh local staging folder, and on S3 only if absent (racing creators: one wins)
        storage.write_new(root / MANIFEST, lambda f: f.write(manifest))

    def append(self, rows: Iterable[UncheckedRow] | pa.Table, table: str = "trajectories",
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
            manifest = self._upgraded(self.manifest)
            scan = self._scan(table, manifest, unlisted=True)
            # A lost part's ids are unknown: appending could store them twice (repair first).
            self._refuse_damage(table, scan, "nothing appended")
            self._finish_cleanup(table, scan, temporary=False)  # temporary files: compact and repair
            existing = self._ids_locked(table, scan.live)
            present = pa.array([i in existing for i in data.column("id").to_pylist()], pa.bool_())
            skipped = pc.sum(present).as_py() or 0
            if skipped and not skip_existing:
                sample = data.filter(present).column("id").slice(0, 3).to_pylist()
                raise StoreError(f"{skipped} of {data.num_rows} {table} rows have ids the store already holds "
                                 f"(e.g. {', '.join(sample)}); nothing written")
            if skipped:
                data = data.filter(pc.invert(present))
            if data.num_rows == 0:  # all there: still heal a card a killed writer left stale (sync_card)
                self._rewrite_card(self._live_names(manifest))
                return Appended(None, 0, skipped)
            record = self._write_part(data, table, metadata, store_id=manifest["store_id"])
            assert scan.records is not None  # the manifest is upgraded: it has a listing
            self._commit(manifest, {table: [*scan.records, record]}, wrote_part=True)
            part = self.table_dir(table) / record.name
        # No search index here: building it cost more than the append itself. Compaction (automatic or
        # `omrl store compact`) and `omrl store check --repair` build it; searches scan unindexed parts.
        self._auto_compact(table, policy)
        return Appended(part, data.num_rows, skipped)

    def check(self) -> list[PartProblem]:
        """Every problem of the store's files (omrl.store.check): lost, damaged or unlisted parts and side
        files, a broken card, ids held twice."""
        from omrl.store.check import check_store

        return check_store(self)

    def repair(self, accept_loss: bool = False) -> RepairReport:
        """Fix what can be fixed (omrl.store.check.repair_store) and return what was done; a lost part is
        dropped from the listing only with `accept_loss`."""
        from omrl.store.check import repair_store

        return repair_store(self, accept_loss)

    def compact(self, table: str = "trajectories", min_parts: int = 2, policy: CompactPolicy | None = None,
                wait: bool = True, index: bool = True) -> StorePath | None:
        """Merge all readable parts into one, keeping the first copy of any repeated id; crash-safe.

        The merged part names the parts it replaces and is renamed in before they are removed, so a
        crash in between hides them from readers, and the next writer (or compaction) removes them.
        With `policy` (automatic compaction) only its small parts are merged, once there are enough of
        them; without `wait`, a compaction another process is running already makes this one return None.
        The merged part gets its search index; without `policy`, parts left as they are get theirs too.
        With `index` false no index is built (searches scan the part until omrl.store.search.build_missing).
        Parts whose row groups are already of a useful size are spliced (pages copied, omrl.store.splice).
        """
        with self._lock(f"compact-{table}", wait=wait) as locked:
            if not locked:
                return None
            with self._lock("write"):
                scan = self._scan(table, self.manifest, unlisted=True)
                self._refuse_damage(table, scan, "nothing compacted")
                self._finish_cleanup(table, scan)
            parts = scan.live
            # Appends refuse repeated ids, so only old stores hold them; the full check is for `omrl store compact`.
            duplicated = policy is None and bool(self._duplicate_problems(table))
            if policy is not None:
                parts = policy.small(parts)
            if len(parts) < min_parts and not duplicated:
                if policy is None and table == "trajectories" and index:
                    for part_index in PART_INDEXES:  # nothing to merge: `omrl store compact` still makes search fast
                        part_index.complete(self)
                return None
            # Merge outside the write lock: appends go on meanwhile, as new parts this one does not replace.
            # Parts of the current schema with row groups of a useful size are spliced (their pages copied,
            # omrl.store.splice); others are decoded and written again, as are parts holding repeated ids.
            spliced = None if duplicated else self._splice_sources(parts, table)
            data = None
            if spliced is None:
                data = pa.concat_tables([conform(self._read_parquet(p), table) for p in parts])
                if duplicated:
                    data = _first_of_each_id(data)
            names = {p.name for p in parts}
            with self._lock("write"):
                manifest = self._upgraded(self.manifest)
                listed = listing(manifest)
                assert listed is not None  # the manifest is upgraded: it has a listing
                records = listed[table]
                if not names <= {r.name for r in records}:  # the compaction lock keeps repair out: a bug
                    raise StoreError(f"{self.table_dir(table)}: parts changed during the compaction; nothing "
                                     "compacted, run it again")
                at = next(i for i, r in enumerate(records) if r.name in names)
                replaces = {REPLACES_KEY: json.dumps(sorted(names)).encode()}
                if spliced is None:
                    merged = self._write_part(data, table, replaces, store_id=manifest["store_id"])
                else:
                    merged = self._write_spliced(spliced, table, replaces, store_id=manifest["store_id"])
                kept = [r for r in records if r.name not in names]
                kept.insert(at, merged)  # where the first merged part was: rows keep their order
                self._commit(manifest, {table: kept}, wrote_part=True)
                for p in parts:
                    self._remove_part(p)
            new = self.table_dir(table) / merged.name
            del data, spliced  # the index reads the part (a row group's texts at a time): no need to hold every row
            if table == "trajectories" and index:
                for part_index in PART_INDEXES:
                    part_index.compacted(self, new)
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

    def _auto_compact(self, table: str, policy: CompactPolicy) -> StorePath | None:
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

    def select(self, where: str | None = None, columns: list[str] | None = None) -> pa.Table:
        """The trajectories matching the user's SQL `where` (one checked condition; None: all), as `read`
        returns them; the condition runs in DuckDB (omrl.store.query.select)."""
        from omrl.store.query import select

        return select(self, where, columns)

    def sql(self, query: str) -> pa.Table:
        """Run read-only SQL over the store's views; returns Arrow."""
        from omrl.store.query import run_query

        return run_query(self, query)

    def connect(self):
        """A DuckDB connection with the store's views (trajectories, messages, ...)."""
        from omrl.store.query import connect

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
