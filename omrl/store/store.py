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
through `self.storage` (omrl.store.storage, which explains the commit protocol there: whole-object PUTs,
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from omrl.durable import fsync_path, is_stale
from omrl.errors import OmrlError, UsageError
from omrl.schema import SCHEMA_VERSION, SCHEMAS, conform, to_table, utcnow
from omrl.store.layout import (
    SIDE_DIR,
    SIDE_KINDS,
    CompactPolicy,
    part_of_side,
    side_matches,
    side_path,
    side_tables,
    write_parquet,
)
from omrl.store.manifest import (
    CARD_FRONT_MATTER,
    MANIFEST,
    TABLES,
    FileRecord,
    HashingFile,
    PartProblem,
    PartRecord,
    StoreError,
    card_front_matter,
    card_parts,
    file_record,
    listing,
    manifest_bytes,
    new_manifest,
    parse_manifest,
    with_listing,
)
from omrl.store.storage import LOCAL, S3Path, Stat, Storage, storage_for

# Parquet key listing the parts a compacted part replaces: readers of a store without a listing (and older
# omrl versions) skip those if a crash left them behind.
REPLACES_KEY = b"omrl.replaces"
# Parquet key of every part written for a listing, holding the store's id (omrl.json's store_id): such a
# part belongs to the store only once omrl.json lists it, so an unlisted one with this store's id is what a
# killed writer left (removed), not an older omrl's part or a file copied in from elsewhere (adopted).
LISTED_KEY = b"omrl.listed_in"
if TYPE_CHECKING:  # a type only: omrl.store.check imports this module
    from omrl.store.check import RepairReport

T = TypeVar("T")
# Listings of parts a reader redoes when a concurrent compaction removed a part it was about to read.
RELIST_ATTEMPTS = 5
# Writers put their pid in temporary names (`.part-<time>-<pid>-<rand>.parquet.tmp`, `.NAME.staging-<pid>-<rand>`).
_TMP_PID = re.compile(r"^\.part-\d{8}T\d{12}-(\d+)-[0-9a-f]+\.parquet\.tmp$")
_SIDE_TMP_PID = re.compile(r"^\.part-\d{8}T\d{12}-(\d+)-[0-9a-f]+\.\w+\.parquet\.tmp$")
_STAGING_PID = re.compile(r"\.(?:staging|creating|replaced)-(\d+)-[0-9a-f]+$")


class CorruptPartWarning(UserWarning):
    """A part file that could not be read and was skipped."""


class AutoCompactWarning(UserWarning):
    """An automatic compaction that failed after its append was committed (the append stands)."""


class SearchIndexWarning(UserWarning):
    """A part whose text-search index could not be built (the part stands; searches scan it)."""


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
    live: list[Path] = field(default_factory=list)  # listed (or, without a listing, found) and usable, in order
    missing: list[PartRecord] = field(default_factory=list)  # listed, not there
    damaged: list[PartProblem] = field(default_factory=list)  # there, but of the wrong size or unreadable
    leftovers: list[Path] = field(default_factory=list)  # unlisted, omrl's own: a killed commit, replaced parts
    strays: list[Path] = field(default_factory=list)  # unlisted, not omrl's: an older omrl's part, a file copied in

    @property
    def listed(self) -> bool:
        return self.records is not None


_CARD_TAGS = "tags:\n- omrl\n- agent-trajectories\n- reinforcement-learning"


def dataset_card(name: str, description: str = "") -> str:
    """The README.md that makes a store loadable with `datasets.load_dataset(path)` (no parts yet)."""
    return f"""---
{_card_configs({table: [] for table in TABLES})}
{_CARD_TAGS}
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
    """The card with its YAML `configs:` block replaced (the rest of the front matter and the text kept);
    front matter that is not valid YAML is replaced whole, the text below it kept."""
    match = CARD_FRONT_MATTER.match(card)
    if match is None:  # no front matter (a hand-edited card): give it one
        return f"---\n{configs}\n---\n\n{card}"
    front = match.group(1)
    try:
        card_front_matter(card)
    except ValueError:  # a broken front matter: a fresh one, as a new store's card has
        front = _CARD_TAGS
    kept = re.sub(r"^configs:\n(?:[ -].*\n?)*", "", front + "\n", flags=re.M).strip("\n")
    return f"---\n{configs}" + (f"\n{kept}" if kept else "") + "\n---\n" + card[match.end():]


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
        self.path, self.storage = storage_for(path)  # local disk, or S3 for s3://bucket/prefix (omrl.store.storage)
        try:
            self.manifest  # noqa: B018 - read once here, so a broken or too new manifest is refused at once
        except FileNotFoundError:
            raise StoreError(f"{self.path} is not an omrl store (no {MANIFEST}); create one with `omrl store init`"
                             ) from None
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
        manifest = manifest_bytes(new_manifest(utcnow().isoformat(), [lineage] if lineage else []))
        storage.write_bytes(root / "README.md", dataset_card(name, description).encode())
        # Written new: in a fresh local staging folder, and on S3 only if absent (racing creators: one wins)
        storage.write_new(root / MANIFEST, lambda f: f.write(manifest))

    @property
    def manifest(self) -> dict[str, Any]:
        """omrl.json, read now and checked (StoreError naming what is wrong; FileNotFoundError when absent)."""
        return parse_manifest(self.storage.read_bytes(self.path / MANIFEST), str(self.path / MANIFEST))

    @contextlib.contextmanager
    def _lock(self, name: str, wait: bool = True) -> Iterator[bool]:
        """An exclusive advisory lock shared by all processes using this store; yields whether it is held
        (always True when `wait`): flock on local disk, a lease object on S3 (omrl.store.storage)."""
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
            if data.num_rows == 0:
                return Appended(None, 0, skipped)
            record = self._write_part(data, table, metadata, store_id=manifest["store_id"])
            self._commit(manifest, {table: [*scan.records, record]}, wrote_part=True)
            part = self.table_dir(table) / record.name
        # No search index here: building it cost more than the append itself. Compaction (automatic or
        # `omrl store compact`) and `omrl store check --repair` build it; searches scan unindexed parts.
        self._auto_compact(table, policy)
        return Appended(part, data.num_rows, skipped)

    def _index(self, part: Path, data: pa.Table | None = None) -> None:
        """Build a compacted trajectories part's search index (omrl.store.search) outside the write lock. The part
        is committed already: a failure is a warning, and searches scan the part instead."""
        if not self.storage.local:  # tantivy needs a local folder: S3 stores are not indexed (_refuse_remote_search)
            return
        from omrl.store.search import build_index

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
        from omrl.store.search import missing_indexes

        for part in missing_indexes(self):
            self._index(part)

    def search(self, query: str, limit: int | None = None, *, snippets: bool = True) -> pa.Table:
        """Messages matching a text query (words and "phrases"; rules in omrl.store.search), exactly what a
        full scan finds: trajectory_id, position, role and (with `snippets`) snippet, ordered; at most
        `limit` rows. Without snippets no message text is read from an indexed part."""
        from omrl.store.search import search

        return search(self, query, limit, snippets=snippets)

    def cache_dir(self, name: str) -> Path:
        """A local folder for the store's caches (judge replies): inside a local store; for an S3 store,
        under ~/.cache/omrl/s3/BUCKET/PREFIX (a cache is per machine, never shared through the bucket)."""
        if self.storage.local:
            return self.path / "cache" / name
        return Path.home() / ".cache" / "omrl" / "s3" / self.path.key / name

    def _write_part(self, data: pa.Table, table: str, metadata: dict[bytes, bytes] | None = None, *,
                    store_id: str | None = None) -> PartRecord:
        """Write a part whole through the storage (local: temporary, fsync, rename; S3: one PUT), its side
        files first, and return its listing record; callers hold the write lock and commit it with the
        manifest whose `store_id` they pass (None: the one omrl.json has)."""
        store_id = store_id or self.manifest.get("store_id") or ""
        directory = self.table_dir(table)
        # Time first so parts sort in write order; pid and random suffix keep concurrent writers apart.
        name = f"part-{utcnow().strftime('%Y%m%dT%H%M%S%f')}-{os.getpid()}-{uuid.uuid4().hex[:8]}.parquet"
        final = directory / name
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

    def _write_file(self, path: Path, data: pa.Table, row_group_rows: int | None = None) -> FileRecord:
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

    def _record_of(self, part: Path) -> PartRecord:
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

    def _sync_card(self) -> None:
        """Rewrite the card if a writer was killed between committing its part and rewriting the card."""
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
        updated = _replace_card_configs(card, _card_configs(names))
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
        if temporary and self.storage.local:  # S3 writes have no temporaries (omrl.store.storage)
            for tmp in self.table_dir(table).glob(".part-*.tmp"):
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
            from omrl.store.search import remove_index

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
        """Every part file in the table's folder, listed or not."""
        directory = self.table_dir(table)
        names = [n for n in self.storage.list_names(directory) if n.startswith("part-") and n.endswith(".parquet")]
        return [directory / name for name in names]

    def _stat(self, path: Path) -> Stat:
        """A part's size and mtime (local disk: asked again, FileNotFoundError when gone; S3: from the
        newest listing, Storage.part_stat)."""
        return self.storage.part_stat(path)

    def _read_parquet(self, path: Path, columns: list[str] | None = None) -> pa.Table:
        """A part (or side file) read through the store's storage, its page checksums verified;
        FileNotFoundError when it is gone."""
        return pq.read_table(self.storage.arrow_source(path, whole=True), columns=columns,
                             page_checksum_verification=True)

    def _footer(self, path: Path, st: Stat | None = None) -> _Footer:
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
            readable, replaced = [], set()
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

        return self._retry_on_vanished(attempt)

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

    def check(self) -> list[PartProblem]:
        """Every problem of the store's files (omrl.store.check): lost, damaged or unlisted parts and side
        files, a broken card, ids held twice."""
        from omrl.store.check import check_store

        return check_store(self)

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

    def repair(self, accept_loss: bool = False) -> RepairReport:
        """Fix what can be fixed (omrl.store.check.repair_store) and return what was done; a lost part is
        dropped from the listing only with `accept_loss`."""
        from omrl.store.check import repair_store

        return repair_store(self, accept_loss)

    def read(self, table: str = "trajectories", columns: list[str] | None = None) -> pa.Table:
        """All rows of a table as Arrow, in the current schema (older parts are conformed). StoreError naming
        a part that cannot be read (a store without a listing skips it with a warning, as it always did)."""
        def load(path: Path) -> pa.Table | None:
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
                wait: bool = True, index: bool = True) -> Path | None:
        """Merge all readable parts into one, keeping the first copy of any repeated id; crash-safe.

        The merged part names the parts it replaces and is renamed in before they are removed, so a
        crash in between hides them from readers, and the next writer (or compaction) removes them.
        With `policy` (automatic compaction) only its small parts are merged, once there are enough of
        them; without `wait`, a compaction another process is running already makes this one return None.
        The merged part gets its search index; without `policy`, parts left as they are get theirs too.
        With `index` false no index is built (searches scan the part until omrl.store.search.build_missing).
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
                    self._index_missing()  # nothing to merge: `omrl store compact` still makes search fast
                return None
            # Merge outside the write lock: appends go on meanwhile, as new parts this one does not replace.
            data = pa.concat_tables([conform(self._read_parquet(p), table) for p in parts])
            if duplicated:
                data = _first_of_each_id(data)
            names = {p.name for p in parts}
            with self._lock("write"):
                manifest = self._upgraded(self.manifest)
                records = listing(manifest)[table]
                if not names <= {r.name for r in records}:  # the compaction lock keeps repair out: a bug
                    raise StoreError(f"{self.table_dir(table)}: parts changed during the compaction; nothing "
                                     "compacted, run it again")
                at = next(i for i, r in enumerate(records) if r.name in names)
                merged = self._write_part(data, table, {REPLACES_KEY: json.dumps(sorted(names)).encode()},
                                          store_id=manifest["store_id"])
                kept = [r for r in records if r.name not in names]
                kept.insert(at, merged)  # where the first merged part was: rows keep their order
                self._commit(manifest, {table: kept}, wrote_part=True)
                for p in parts:
                    self._remove_part(p)
            new = self.table_dir(table) / merged.name
            if table == "trajectories" and index:
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
        """Text search reads parts and indexes from local disk (omrl.store.search): refused on an S3 store."""
        if not self.storage.local:
            raise UsageError(f"{self.path}: text search is not supported on S3 stores yet (no index is built "
                             "there); use SQL, e.g. `WHERE content ILIKE '%word%'` on the messages view")

    def _side_matches(self, side: Path, part_name: str, rows: int, size: int) -> bool:
        """Whether `side` is the readable side file of this part (layout.side_matches, through the storage)."""
        if self.storage.local:
            return side_matches(side, part_name, rows)
        try:
            with self.storage.arrow_source(side, size=size) as f:
                return side_matches(f, part_name, rows)
        except FileNotFoundError:
            return False

    def side_files(self, kind: str = "tool_calls") -> tuple[list[Path], list[Path]]:
        """(side files, parts without one) of the live trajectories parts: readers use the side files and
        unnest only the parts lacking one (v1 parts, a side file lost or damaged: `store check` names those)."""
        def listing_now() -> tuple[list[Path], list[Path]]:
            sides, lacking = [], []
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

        return self._retry_on_vanished(listing_now)

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
