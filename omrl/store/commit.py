"""Committing to a store: the write lock, new parts, the manifest that lists them, the card, cleanup.

Every commit is whole and goes through one store-wide write lock: a part (its side files first) is
written new and whole, then the manifest that lists it is written (that write is the commit), then the
dataset card. What a killed writer left is removed by the next writer.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from omrl.errors import UsageError
from omrl.schema import SCHEMA_VERSION, SCHEMAS, utcnow
from omrl.store import layout
from omrl.store.card import card_configs, card_parts, dataset_card, replace_card_configs
from omrl.store.durable import is_stale
from omrl.store.layout import (
    SIDE_DIR,
    SIDE_KINDS,
    SIDE_SCHEMAS,
    part_of_side,
    side_path,
    side_tables,
    stamped,
    write_parquet,
)
from omrl.store.manifest import (
    MANIFEST,
    TABLES,
    FileRecord,
    HashingFile,
    PartRecord,
    file_record,
    listing,
    manifest_bytes,
    with_listing,
)
from omrl.store.parts import LISTED_KEY, StoreReader, _Scan
from omrl.store.splice import Footer, splice, spliceable
from omrl.store.storage import StorePath, local_path

# Writers put their pid in temporary names (`.part-<time>-<pid>-<rand>.parquet.tmp`, `.NAME.staging-<pid>-<rand>`).
_TMP_PID = re.compile(r"^\.part-\d{8}T\d{12}-(\d+)-[0-9a-f]+\.parquet\.tmp$")
_SIDE_TMP_PID = re.compile(r"^\.part-\d{8}T\d{12}-(\d+)-[0-9a-f]+\.\w+\.parquet\.tmp$")


class PartIndex:
    """An index kept beside a store's trajectories parts. omrl.store.search attaches its text index to
    PART_INDEXES when it is imported (omrl.store imports it), so the store tells it about parts without
    importing it. Each method is called outside the write lock, after the commit it follows."""

    def compacted(self, store: StoreWriter, part: StorePath) -> None:
        """A compaction committed `part`."""

    def complete(self, store: StoreWriter) -> None:
        """`omrl store compact` found nothing to merge: index the live parts that lack an index."""

    def removed(self, store: StoreWriter, part: StorePath) -> None:
        """`part` was deleted (compacted away, or dropped by a repair)."""


PART_INDEXES: list[PartIndex] = []


def _part_name() -> str:
    """A new part's name: time first so parts sort in write order; pid and random suffix keep concurrent
    writers apart."""
    return f"part-{utcnow().strftime('%Y%m%dT%H%M%S%f')}-{os.getpid()}-{uuid.uuid4().hex[:8]}.parquet"


class StoreWriter(StoreReader):
    """The committing half of a Store (omrl.store.store); callers of its underscored methods hold the
    write lock."""

    @contextlib.contextmanager
    def _lock(self, name: str, wait: bool = True) -> Iterator[bool]:
        """An exclusive advisory lock shared by all processes using this store; yields whether it is held
        (always True when `wait`): flock on local disk, a lease object on S3 (omrl.store.s3)."""
        with self.storage.lock(self.path, name, wait) as held:
            yield held

    def update_manifest(self, **changes: Any) -> dict[str, Any]:
        """Merge keys into omrl.json atomically; `lineage` entries are appended, not replaced.

        Under the write lock, like every commit: the manifest holds the parts listing, so a change made
        beside a commit would write back the listing it read and drop the committed part.
        """
        if "parts" in changes:
            raise UsageError("the parts listing is written by the store's commits only")
        with self._lock("write"):
            manifest = self.manifest
            for key, value in changes.items():
                if key == "lineage":
                    manifest.setdefault("lineage", []).append(value)
                else:
                    manifest[key] = value
            self.storage.write_bytes(self.path / MANIFEST, manifest_bytes(manifest))
            return manifest

    def _write_part(self, data: pa.Table, table: str, metadata: dict[bytes, bytes] | None = None, *,
                    store_id: str | None = None) -> PartRecord:
        """Write a part whole through the storage (local: temporary, fsync, rename; S3: one PUT), its side
        files first, and return its listing record; callers hold the write lock and commit it with the
        manifest whose `store_id` they pass (None: the one omrl.json has)."""
        store_id = store_id or self.manifest.get("store_id") or ""
        name = _part_name()
        final = self.table_dir(table) / name
        data = data.replace_schema_metadata({**(data.schema.metadata or {}), **(metadata or {}),
                                             LISTED_KEY: store_id.encode()})
        sides = {}
        if table == "trajectories":
            # Side files go in first: a crash before the part's rename leaves only an orphan (removed by
            # the next writer), never a part without its side data that a reader would then unnest.
            for kind, side in side_tables(data, name).items():
                sides[kind] = self._write_file(side_path(final, kind), side, 1 << 20)
        # Row groups sized by bytes (layout.ROW_GROUP_BYTES), for appends and compactions alike.
        return PartRecord(name, data.num_rows, self._write_file(final, data), sides)

    def _splice_sources(self, parts: list[StorePath], table: str) -> tuple[list[Footer], dict[str, pa.Table]] | None:
        """The parts' footers and side tables when a compaction can splice them (omrl.store.splice: same
        current schema, row groups averaging a quarter of layout.ROW_GROUP_BYTES encoded or more, every side
        file there and matching); None when their rows must be decoded and written again."""
        footers = [Footer(self.storage.read_bytes(part), str(part)) for part in parts]
        if not spliceable(footers, SCHEMAS[table], layout.ROW_GROUP_BYTES // 4):
            return None
        sides: dict[str, pa.Table] = {}
        if table == "trajectories":
            for kind in SIDE_KINDS:
                pieces = []
                for part in parts:
                    side = side_path(part, kind)
                    try:
                        size = self.storage.stat(side).st_size
                    except FileNotFoundError:
                        return None
                    if not self._side_matches(side, part.name, self._footer(part).num_rows, size):
                        return None
                    try:
                        piece = self._read_parquet(side)
                    except Exception:  # damaged (`store check` says so): built again from the rows
                        return None
                    if not piece.schema.equals(SIDE_SCHEMAS[kind], check_metadata=False):
                        return None  # an older side file: built again from the rows
                    pieces.append(piece)
                sides[kind] = pa.concat_tables(pieces)
        return footers, sides

    def _write_spliced(self, sources: tuple[list[Footer], dict[str, pa.Table]], table: str,
                       metadata: dict[bytes, bytes], *, store_id: str) -> PartRecord:
        """`_write_part` for a splice: the parts' row groups copied as they are (`_splice_sources`), under a
        footer with the schema and metadata `_write_part` would have written; their side tables concatenated."""
        footers, sides = sources
        name = _part_name()
        final = self.table_dir(table) / name
        rows = sum(footer.value(3) for footer in footers)  # FileMetaData.num_rows
        schema = SCHEMAS[table]
        schema = schema.with_metadata({**(schema.metadata or {}), **metadata, LISTED_KEY: store_id.encode()})
        records = {kind: self._write_file(side_path(final, kind), stamped(side, name, rows), 1 << 20)
                   for kind, side in sides.items()}
        written: list[FileRecord] = []

        def write(sink) -> None:
            hashing = HashingFile(sink)
            splice(footers, schema, hashing.write)
            written.append(hashing.record())

        self.storage.write_new(final, write)
        return PartRecord(name, rows, written[-1], records)

    def _write_file(self, path: StorePath, data: pa.Table, row_group_rows: int | None = None) -> FileRecord:
        """Write one Parquet file new and whole (store_layout.write_parquet); its size and hash as written."""
        written: list[FileRecord] = []

        def write(sink) -> None:
            hashing = HashingFile(sink)
            write_parquet(data, hashing, row_group_rows)
            written.append(hashing.record())

        self.storage.write_new(path, write)
        return written[-1]

    def _commit(self, manifest: dict[str, Any], parts: dict[str, list[PartRecord]], wrote_part: bool = False) -> None:
        """Write the manifest listing `parts` (tables left out keep their listing): the commit; then the card.
        Callers hold the write lock and pass the manifest they read under it."""
        updated = with_listing(manifest, parts)
        if wrote_part and updated.get("schema_version", 1) < SCHEMA_VERSION:  # a v1 store now holds v2 parts
            updated["schema_version"] = SCHEMA_VERSION
        self.storage.write_bytes(self.path / MANIFEST, manifest_bytes(updated))
        self._rewrite_card(self._live_names(updated))

    def _upgraded(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """The manifest with a parts listing: as it is, or for a store written before the listing existed,
        one made from its folders (the readable parts a reader sees, hashed now); written by the next commit."""
        if listing(manifest) is not None:
            return manifest
        parts = {}
        for table in TABLES:
            parts[table] = [self._record_of(path) for path in self._scan(table, manifest).live]
        return with_listing(manifest, parts)

    def _record_of(self, part: StorePath) -> PartRecord:
        """The listing record of a part already in the folder (and of its side files that match it)."""
        record = file_record(self.storage.read_bytes(part))
        rows = self._footer(part).num_rows
        sides = {}
        if part.parent.name == "trajectories":
            for kind in SIDE_KINDS:
                side = side_path(part, kind)
                try:
                    st = self.storage.stat(side)
                except FileNotFoundError:
                    continue
                if self._side_matches(side, part.name, rows, st.st_size):
                    sides[kind] = file_record(self.storage.read_bytes(side))
        return PartRecord(part.name, rows, record, sides)

    def sync_card(self) -> None:
        """Rewrite the card if a writer was killed between committing its part and rewriting the card. Commands
        that write to an existing store call it first: a rerun with nothing new to write still heals the card."""
        names = self._live_names(self.manifest)
        try:
            listed = card_parts(self._read_card() or "")
        except ValueError:
            listed = {}
        if any(listed.get(t) != (names[t] or None) for t in TABLES):
            with self._lock("write"):
                self._rewrite_card(self._live_names(self.manifest))

    def _live_names(self, manifest: dict[str, Any]) -> dict[str, list[str]]:
        """Each table's part names as the manifest lists them (a store without a listing: its live parts)."""
        listed = listing(manifest)
        if listed is not None:
            return {table: [r.name for r in records] for table, records in listed.items()}
        return {table: [p.name for p in self._scan(table, manifest).live] for table in TABLES}

    def _rewrite_card(self, names: dict[str, list[str]] | None = None) -> None:
        """List each table's parts (`names`, else the manifest's listing) in README.md; callers hold the write lock.

        Exact names, not a glob: a glob would also match the parts a killed writer left behind, and
        `load_dataset` would then return their rows twice.
        """
        card = self._read_card()
        if card is None:
            card = dataset_card(self.path.name)
        names = self._live_names(self.manifest) if names is None else names
        updated = replace_card_configs(card, card_configs(names))
        if updated != card:
            self.storage.write_bytes(self.path / "README.md", updated.encode())

    def _read_card(self) -> str | None:
        """The dataset card's text (None when there is none; undecodable bytes replaced)."""
        try:
            return self.storage.read_bytes(self.path / "README.md").decode("utf-8", errors="replace")
        except FileNotFoundError:
            return None

    def _finish_cleanup(self, table: str, scan: _Scan, temporary: bool = True) -> int:
        """Remove what killed writers left (`scan.leftovers`: parts never committed, parts a compaction
        replaced, with their side files) and, with `temporary`, stale temporary files. Callers hold the
        write lock and pass a scan made under it (with `unlisted`); returns the number of files removed."""
        removed = 0
        if scan.leftovers:
            # A compaction killed after its commit may not have rewritten the card yet: list the live parts
            # first, so the card never names a part that is gone (load_dataset would fail).
            self._rewrite_card()
        for path in scan.leftovers:
            self._remove_part(path)
            removed += 1
        if temporary and self.storage.local:  # S3 writes have no temporaries (omrl.store.s3)
            for tmp in local_path(self.table_dir(table)).glob(".part-*.tmp"):
                if is_stale(tmp, _TMP_PID):
                    tmp.unlink(missing_ok=True)
                    removed += 1
        listed = {r.name for r in scan.records or []}
        return removed + self._remove_orphan_side_files(table, temporary, listed)

    def _remove_orphan_side_files(self, table: str, temporary: bool, listed: set[str]) -> int:
        """Side files whose part is neither there nor listed (a writer killed between them; callers hold the
        write lock, so no writer is between its side files and its part now) and, with `temporary`, stale
        side temporaries. A missing listed part keeps its side file: the loss is for the user to decide."""
        folder = self.table_dir(table) / SIDE_DIR
        names = self.storage.list_names(folder)
        if not names:
            return 0
        parts = set(self.storage.list_names(self.table_dir(table))) | listed
        removed = 0
        for name in names:
            side = folder / name
            if name.startswith("."):
                orphan = temporary and self.storage.local and is_stale(local_path(side), _SIDE_TMP_PID)
            else:
                orphan = part_of_side(side) not in parts
            if orphan:
                self.storage.delete(side)
                removed += 1
        return removed

    def _remove_part(self, part: StorePath) -> None:
        """Delete a part and then what belongs to it (a crash in between leaves orphans, removed later)."""
        self.storage.delete(part)
        for kind in SIDE_KINDS:
            self.storage.delete(side_path(part, kind))
        if part.parent.name == "trajectories":
            for index in PART_INDEXES:
                index.removed(self, part)

    def _ids_locked(self, table: str, parts: list[StorePath]) -> set[str]:
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
