"""The store's manifest (omrl.json): what makes a folder a store, and the listing of its parts.

    {"format": "omrl-store", "schema_version": 2, "created_at": "...", "lineage": [...],
     "store_id": "...",                                          (random, made with the listing)
     "auto_compact": {...},                                      (optional)
     "parts": {"trajectories": [PART, ...], "annotations": [PART, ...]}}
    PART = {"name": "part-....parquet", "rows": 10, "bytes": 12345, "sha256": "...",
            "sides": {"tool_calls": {"bytes": 678, "sha256": "..."}}}       (sides: trajectories parts)

The listing is the store's commit record: a part belongs to the store once a manifest naming it is written
(one atomic replace on local disk, one PUT on S3), so the store knows each part's rows, size and hash, and
a part that is deleted, cut short or changed is found by name instead of silently leaving fewer rows. A
store written before the listing existed has no "parts" key: it is read as before (its folders listed)
and its first commit writes the listing (`Store._upgraded`).

Every value is checked on reading: the manifest is a file anyone can edit, and its part names become
paths the store reads and deletes, so a name is only ever a plain `part-*.parquet` file name.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from omrl.errors import OmrlError
from omrl.schema import SCHEMA_VERSION
from omrl.store.storage import StorePath

TABLES = ("trajectories", "annotations")
MANIFEST = "omrl.json"
FORMAT = "omrl-store"
PART_NAME = re.compile(r"part-[A-Za-z0-9_.-]+\.parquet")
_SHA256 = re.compile(r"[0-9a-f]{64}")
SIDE_KINDS = ("tool_calls",)  # the side files a trajectories part may have (omrl.store.layout builds them)


class StoreError(OmrlError, RuntimeError):
    """A store that does not exist or cannot be used; the message says which and why."""


@dataclass(frozen=True)
class FileRecord:
    """The size and SHA-256 of a file as it was written."""

    bytes: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "sha256": self.sha256}


@dataclass(frozen=True)
class PartRecord:
    """One listed part: its file name, row count, size and hash, and those of its side files."""

    name: str
    rows: int
    file: FileRecord
    sides: dict[str, FileRecord] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "rows": self.rows, **self.file.to_json()}
        if self.sides:
            out["sides"] = {kind: record.to_json() for kind, record in sorted(self.sides.items())}
        return out


class HashingFile:
    """A binary sink that passes writes on to `sink` and counts and hashes them (Parquet writers take it)."""

    def __init__(self, sink: BinaryIO):
        self.sink = sink
        self.size = 0
        self._hash = hashlib.sha256()

    def write(self, data) -> int:
        self._hash.update(data)
        self.size += len(memoryview(data).cast("B"))
        return self.sink.write(data)

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self.sink.flush()

    def close(self) -> None:  # the sink belongs to the storage, which closes it
        pass

    @property
    def closed(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def record(self) -> FileRecord:
        return FileRecord(self.size, self._hash.hexdigest())


def file_record(data: bytes) -> FileRecord:
    """The record of a file from its bytes."""
    return FileRecord(len(data), hashlib.sha256(data).hexdigest())


def new_manifest(created_at: str, lineage: list[dict[str, Any]]) -> dict[str, Any]:
    """A new store's manifest: no parts yet."""
    return {"format": FORMAT, "schema_version": SCHEMA_VERSION, "created_at": created_at, "lineage": lineage,
            "store_id": uuid.uuid4().hex, "parts": {table: [] for table in TABLES}}


def manifest_bytes(manifest: dict[str, Any]) -> bytes:
    return (json.dumps(manifest, indent=2, default=str) + "\n").encode()


def parse_manifest(raw: bytes, where: str) -> dict[str, Any]:
    """The manifest in `raw` (the file at `where`), checked; StoreError saying what is wrong otherwise."""
    def bad(why: str) -> StoreError:
        return StoreError(f"{where}: {why}; the store cannot be used until it is fixed (restore the file, or "
                          "rewrite the key by hand)")

    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad(f"not valid JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise bad(f"not a JSON object but {type(manifest).__name__}")
    if manifest.get("format", FORMAT) != FORMAT:
        raise bad(f"format is {manifest['format']!r}, not {FORMAT!r}")
    version = manifest.get("schema_version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise bad(f"schema_version must be a whole number from 1, not {version!r}")
    if version > SCHEMA_VERSION:
        raise StoreError(f"{where}: the store has schema version {version}, newer than this omrl reads (1 to "
                         f"{SCHEMA_VERSION}); upgrade omrl to use it")
    if not isinstance(manifest.get("lineage", []), list):
        raise bad("lineage must be a list")
    if "store_id" in manifest and not (isinstance(manifest["store_id"], str) and manifest["store_id"]):
        raise bad("store_id must be a non-empty string")
    if "parts" in manifest:
        if "store_id" not in manifest:
            raise bad("a store that lists its parts needs its store_id")
        try:
            _parse_listing(manifest["parts"])
        except (TypeError, ValueError, KeyError) as exc:
            raise bad(f"its parts listing is malformed ({exc})") from None
    return manifest


def listing(manifest: dict[str, Any]) -> dict[str, list[PartRecord]] | None:
    """Each table's listed parts, in order (None for a store written before the listing existed)."""
    if "parts" not in manifest:
        return None
    return _parse_listing(manifest["parts"])


def with_listing(manifest: dict[str, Any], parts: dict[str, list[PartRecord]]) -> dict[str, Any]:
    """The manifest with `parts` as its listing (tables not in `parts` keep theirs)."""
    current = listing(manifest) or {}
    merged = {table: parts.get(table, current.get(table, [])) for table in TABLES}
    return {**manifest, "store_id": manifest.get("store_id") or uuid.uuid4().hex,
            "parts": {table: [r.to_json() for r in records] for table, records in merged.items()}}


def _parse_listing(parts: Any) -> dict[str, list[PartRecord]]:
    if not isinstance(parts, dict):
        raise TypeError("'parts' must be an object of tables")
    unknown = set(parts) - set(TABLES)
    if unknown:
        raise ValueError(f"unknown table(s) {sorted(unknown)}")
    out: dict[str, list[PartRecord]] = {}
    for table in TABLES:
        records = parts.get(table, [])
        if not isinstance(records, list):
            raise TypeError(f"parts.{table} must be a list")
        out[table] = [_part_record(entry, f"parts.{table}[{i}]") for i, entry in enumerate(records)]
        names = [r.name for r in out[table]]
        if len(set(names)) != len(names):
            raise ValueError(f"parts.{table} lists a part twice")
    return out


def _part_record(entry: Any, where: str) -> PartRecord:
    if not isinstance(entry, dict):
        raise TypeError(f"{where} must be an object")
    name = entry.get("name")
    if not isinstance(name, str) or not PART_NAME.fullmatch(name):
        raise ValueError(f"{where}.name {name!r} is not a part file name (part-*.parquet)")
    sides = entry.get("sides", {})
    if not isinstance(sides, dict) or set(sides) - set(SIDE_KINDS):
        raise ValueError(f"{where}.sides must be an object of {', '.join(SIDE_KINDS)}")
    return PartRecord(name, _count(entry.get("rows"), f"{where}.rows"), _file_record(entry, where),
                      {kind: _file_record(value, f"{where}.sides.{kind}") for kind, value in sides.items()})


def _file_record(entry: Any, where: str) -> FileRecord:
    if not isinstance(entry, dict):
        raise TypeError(f"{where} must be an object")
    digest = entry.get("sha256")
    if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
        raise ValueError(f"{where}.sha256 is not a SHA-256 hex digest")
    return FileRecord(_count(entry.get("bytes"), f"{where}.bytes"), digest)


def _count(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{where} must be a whole number >= 0, not {value!r}")
    return value


@dataclass(frozen=True)
class PartProblem:
    """A file of the store that is lost, damaged or out of place, and what `omrl store check --repair` does."""

    path: StorePath
    error: str
