"""Reading a store: its listing held against its folders, the live parts, their rows.

A reader never takes the write lock. A compaction commits a listing with its merged part before it
removes the parts it replaces, so a reader that finds a part gone lists the parts again and sees every
row once.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from omrl.schema import SCHEMAS, conform
from omrl.store.layout import SIDE_DIR, side_matches, side_path
from omrl.store.location import storage_for
from omrl.store.manifest import MANIFEST, TABLES, PartProblem, PartRecord, StoreError, listing, parse_manifest
from omrl.store.s3 import S3Path
from omrl.store.storage import Stat, Storage, StorePath, local_path

# Parquet key listing the parts a compacted part replaces: readers of a store without a listing (and older
# omrl versions) skip those if a crash left them behind.
REPLACES_KEY = b"omrl.replaces"
# Parquet key of every part written for a listing, holding the store's id (omrl.json's store_id): such a
# part belongs to the store only once omrl.json lists it, so an unlisted one with this store's id is what a
# killed writer left (removed), not an older omrl's part or a file copied in from elsewhere (adopted).
LISTED_KEY = b"omrl.listed_in"


T = TypeVar("T")
# Tries of a read (or listing) whose part a concurrent compaction removed (or whose listing it changed).
RELIST_ATTEMPTS = 5


def _file_gone(exc: BaseException) -> bool:
    return isinstance(exc, FileNotFoundError)


def retry_vanished(work: Callable[[], T], vanished: Callable[[BaseException], bool] = _file_gone) -> T:
    """`work()`, run again (RELIST_ATTEMPTS times in all) while it fails because a part vanished under it
    (`vanished(exc)`; default: FileNotFoundError): a compaction renames its merged part in before it removes
    the parts it replaces, so `work` listing the parts afresh sees every row. The last failure is raised."""
    for attempt in range(RELIST_ATTEMPTS - 1):
        try:
            return work()
        except Exception as exc:
            if not vanished(exc):
                raise
            time.sleep(0.01 * (attempt + 1))  # let the compaction finish its cleanup
    return work()


class CorruptPartWarning(UserWarning):
    """A part file that could not be read and was skipped."""


@dataclass(frozen=True)
class _Footer:
    """What a part's footer says: why it cannot be used (None when it can), rows, parts it replaces, and
    the store whose listing it was written for (LISTED_KEY)."""

    error: str | None
    num_rows: int = 0
    replaces: frozenset[str] = frozenset()
    store_id: str | None = None


@dataclass
class _Scan:
    """A table's folder held against the manifest's listing of it."""

    records: list[PartRecord] | None  # the listing; None for a store from before the listing existed
    live: list[StorePath] = field(default_factory=list)  # listed (or, without a listing, found) and usable, in order
    missing: list[PartRecord] = field(default_factory=list)  # listed, not there
    damaged: list[PartProblem] = field(default_factory=list)  # there, but of the wrong size or unreadable
    leftovers: list[StorePath] = field(default_factory=list)  # unlisted, omrl's own: a killed commit, replaced parts
    strays: list[StorePath] = field(default_factory=list)  # unlisted, not omrl's: an older omrl's part, a file copied in

    @property
    def listed(self) -> bool:
        return self.records is not None


class StoreReader:
    """The reading half of a Store (omrl.store.store): its path, storage, manifest and live parts."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path: Path | S3Path
        self.storage: Storage
        self.path, self.storage = storage_for(path)  # local disk, or S3 for s3://bucket/prefix (omrl.store.location)
        try:
            self.manifest  # noqa: B018 - read once here, so a broken or too new manifest is refused at once
        except FileNotFoundError:
            raise StoreError(f"{self.path} is not an omrl store (no {MANIFEST}); create one with `omrl store init`"
                             ) from None
        self._footers: dict[tuple[str, int, int], _Footer] = {}
        self._sides: dict[tuple[str, int, int, str, int], bool] = {}  # (side file stat, part, rows) -> it matches
        # table -> (the part keys whose ids are in the set, the set): the id check's index
        self._id_index: dict[str, tuple[frozenset[tuple[str, int, int]], set[str]]] = {}

    @property
    def manifest(self) -> dict[str, Any]:
        """omrl.json, read now and checked (StoreError naming what is wrong; FileNotFoundError when absent)."""
        return parse_manifest(self.storage.read_bytes(self.path / MANIFEST), str(self.path / MANIFEST))

    def table_dir(self, table: str) -> StorePath:
        if table not in TABLES:
            raise StoreError(f"unknown table {table!r}; tables are {', '.join(TABLES)}")
        return self.path / "data" / table

    def cache_dir(self, name: str) -> Path:
        """A local folder for the store's caches (judge replies): inside a local store; for an S3 store,
        under ~/.cache/omrl/s3/BUCKET/PREFIX (a cache is per machine, never shared through the bucket)."""
        if isinstance(self.path, S3Path):  # the store's storage is S3 (omrl.store.location)
            return Path.home() / ".cache" / "omrl" / "s3" / self.path.key / name
        return self.path / "cache" / name

    def _all_parts(self, table: str) -> list[StorePath]:
        """Every part file in the table's folder, listed or not."""
        directory = self.table_dir(table)
        names = [n for n in self.storage.list_names(directory) if n.startswith("part-") and n.endswith(".parquet")]
        return [directory / name for name in names]

    def _stat(self, path: StorePath) -> Stat:
        """A part's size and mtime (local disk: asked again, FileNotFoundError when gone; S3: from the
        newest listing, Storage.part_stat)."""
        return self.storage.part_stat(path)

    def _read_parquet(self, path: StorePath, columns: list[str] | None = None) -> pa.Table:
        """A part (or side file) read through the store's storage, its page checksums verified;
        FileNotFoundError when it is gone."""
        return pq.read_table(self.storage.arrow_source(path, whole=True), columns=columns,
                             page_checksum_verification=True)

    def _footer(self, path: StorePath, st: Stat | None = None) -> _Footer:
        """The part's footer, read once per name, size and mtime (every listing of parts needs it).

        Raises FileNotFoundError for a part a compaction has just removed: callers list the parts again.
        """
        st = self._stat(path) if st is None else st
        key = (str(path), st.st_size, st.st_mtime_ns)
        footer = self._footers.get(key)
        if footer is None:
            try:
                meta = pq.read_metadata(self.storage.arrow_source(path, size=st.st_size))
                keys = meta.metadata or {}
                replaces = keys.get(REPLACES_KEY)
                store_id = keys.get(LISTED_KEY)
                footer = _Footer(None, meta.num_rows, frozenset(json.loads(replaces)) if replaces else frozenset(),
                                 store_id.decode(errors="replace") if store_id else None)
                if "id" not in meta.schema.to_arrow_schema().names:  # not a store part: its rows have no identity
                    footer = _Footer("it has no id column (not a part omrl wrote)")
            except FileNotFoundError:
                raise
            except Exception as exc:  # any unreadable footer: truncated, garbage, wrong format
                footer = _Footer(f"{type(exc).__name__}: {exc}")
            self._footers[key] = footer
        return footer

    def _scan(self, table: str, manifest: dict[str, Any], unlisted: bool = False) -> _Scan:
        """The table's folder against `manifest`'s listing; with `unlisted`, files it does not list are
        sorted into leftovers (omrl's own, to remove) and strays (to report). Without a listing (an old
        store): every readable part not replaced by another is live, as before the listing existed."""
        directory = self.table_dir(table)
        stats = {name: st for name, st in self.storage.list_stats(directory).items()
                 if name.startswith("part-") and name.endswith(".parquet")}
        listed = listing(manifest)
        scan = _Scan(None if listed is None else listed[table])
        if scan.records is None:
            # As before the listing: a part is there once renamed in (a killed first commit's part too:
            # the upgrade then lists it), unless a compaction replaced it.
            readable: list[StorePath] = []
            replaced: set[str] = set()
            for name in sorted(stats):
                path = directory / name
                footer = self._footer(path, stats[name])
                if footer.error is not None:
                    scan.damaged.append(PartProblem(path, footer.error))
                else:
                    readable.append(path)
                    replaced |= footer.replaces
            scan.live = [p for p in readable if p.name not in replaced]
            scan.leftovers += [p for p in readable if p.name in replaced]
            return scan
        for record in scan.records:
            path = directory / record.name
            st = stats.get(record.name)
            if st is None:
                scan.missing.append(record)
                continue
            footer = self._footer(path, st)
            if st.st_size != record.file.bytes:
                scan.damaged.append(PartProblem(path, f"it is {st.st_size} bytes, {MANIFEST} lists "
                                                      f"{record.file.bytes} (cut short or replaced)"))
            elif footer.error is not None:
                scan.damaged.append(PartProblem(path, footer.error))
            else:
                scan.live.append(path)
        if unlisted:
            names = {r.name for r in scan.records}
            replaced = set().union(*(self._footer(p, stats[p.name]).replaces for p in scan.live))
            for name in sorted(set(stats) - names):
                path = directory / name
                footer = self._footer(path, stats[name])
                ours = footer.error is None and (footer.store_id == manifest["store_id"] or name in replaced)
                (scan.leftovers if ours else scan.strays).append(path)
        return scan

    def _current_scan(self, table: str, unlisted: bool = False) -> _Scan:
        """`_scan` against the newest manifest, consistent while another process compacts the table (its
        commit lists the merged part before it removes the parts it replaces)."""
        def attempt() -> _Scan:
            for wait in range(RELIST_ATTEMPTS):
                manifest = self.manifest
                scan = self._scan(table, manifest, unlisted)
                if not scan.missing or self.manifest == manifest:  # the listing stood still: really missing
                    return scan
                time.sleep(0.01 * (wait + 1))
            return scan

        return retry_vanished(attempt)

    def _refuse_damage(self, table: str, scan: _Scan, outcome: str) -> None:
        """Raise StoreError naming the listed parts of `scan` that are missing or damaged, if any."""
        problems = [PartProblem(self.table_dir(table) / r.name, f"missing ({MANIFEST} lists it with {r.rows} rows)")
                    for r in scan.missing] + (scan.damaged if scan.listed else [])
        if not problems:
            return
        shown = "; ".join(f"{p.path}: {p.error}" for p in problems[:3])
        more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
        raise StoreError(f"{shown}{more}. {outcome}: the store has lost or damaged parts. Restore the file(s), "
                         f"or drop them with `omrl store check {self.path} --repair --accept-loss` (their rows "
                         "are then gone)")

    def _each_part(self, table: str, read: Callable[[StorePath], T]) -> list[T]:
        """`read` applied to every live part, consistent even while another process compacts the table."""
        return retry_vanished(lambda: [read(p) for p in self.parts(table)])

    def parts(self, table: str = "trajectories", warn: bool = True) -> list[StorePath]:
        """The live parts of a table, in order. StoreError when a listed part is missing or damaged (the
        message names it). A store without a listing skips unreadable parts, with a warning unless `warn`
        is false."""
        scan = self._current_scan(table)
        if not scan.listed:
            if warn:
                for problem in scan.damaged:
                    warnings.warn(f"skipping unreadable part {problem.path}: {problem.error}", CorruptPartWarning,
                                  stacklevel=3)
            return scan.live
        self._refuse_damage(table, scan, "nothing read")
        return scan.live

    @property
    def listed(self) -> bool:
        """Whether omrl.json lists the store's parts (False for a store written before the listing existed)."""
        return listing(self.manifest) is not None

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

    def read(self, table: str = "trajectories", columns: list[str] | None = None) -> pa.Table:
        """All rows of a table as Arrow, in the current schema (older parts are conformed). StoreError naming
        a part that cannot be read (a store without a listing skips it with a warning, as it always did)."""
        def load(path: StorePath) -> pa.Table | None:
            try:
                return conform(self._read_parquet(path), table)
            except FileNotFoundError:
                raise  # compacted away: _each_part lists the parts again
            except Exception as exc:
                if self.listed:
                    raise StoreError(f"{path}: cannot be read ({type(exc).__name__}: {exc}); the part is damaged, "
                                     f"see `omrl store check {self.path}`") from None
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

        # mypy resolves `datasets` to the repository's datasets/ folder (task data), not Hugging Face's package
        return datasets.Dataset(self.read(table))  # type: ignore[attr-defined]

    def count(self, table: str = "trajectories") -> int:
        return sum(self._each_part(table, lambda p: self._footer(p).num_rows))

    def ids(self, table: str = "trajectories") -> set[str]:
        """The ids present in a table (cheap: reads one column)."""
        out: set[str] = set()
        for ids in self._each_part(table, lambda p: self._read_parquet(p, columns=["id"]).column("id")):
            out.update(ids.to_pylist())
        return out

    def _side_matches(self, side: StorePath, part_name: str, rows: int, size: int) -> bool:
        """Whether `side` is the readable side file of this part (layout.side_matches, through the storage)."""
        if self.storage.local:
            return side_matches(local_path(side), part_name, rows)
        try:
            with self.storage.arrow_source(side, size=size) as f:
                return side_matches(f, part_name, rows)
        except FileNotFoundError:
            return False

    def side_files(self, kind: str = "tool_calls") -> tuple[list[StorePath], list[StorePath]]:
        """(side files, parts without one) of the live trajectories parts: readers use the side files and
        unnest only the parts lacking one (v1 parts, a side file lost or damaged: `store check` names those)."""
        def listing_now() -> tuple[list[StorePath], list[StorePath]]:
            sides: list[StorePath] = []
            lacking: list[StorePath] = []
            records = {r.name: r for r in (listing(self.manifest) or {}).get("trajectories", [])}
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
                want = records[part.name].sides.get(kind) if part.name in records else None
                if want is not None and want.bytes != st.st_size:
                    warnings.warn(f"ignoring damaged side file {side}: {st.st_size} bytes, {MANIFEST} lists "
                                  f"{want.bytes}", stacklevel=3)
                    lacking.append(part)
                    continue
                key = (str(side), st.st_size, st.st_mtime_ns, part.name, rows)
                if key not in self._sides:
                    self._sides[key] = self._side_matches(side, part.name, rows, st.st_size)
                (sides if self._sides[key] else lacking).append(side if self._sides[key] else part)
            return sides, lacking

        return retry_vanished(listing_now)
