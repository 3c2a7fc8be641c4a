"""`omrl store check` and `--repair`: find every file of a store that is lost, damaged or out of place.

What check looks at, against the listing in omrl.json (omrl.store.manifest):

- omrl.json itself (valid JSON, a known schema version: `Store()` refuses it otherwise) and the dataset
  card (present, valid YAML front matter, listing exactly the parts omrl.json lists);
- each listed part: there, of the listed size and SHA-256 (a part written before the listing existed,
  which has no hash, is decoded whole instead, page checksums verified), with an id column;
- each listed trajectories part's side files: there, of the listed size and hash, made for that part;
- part files the listing does not name: a killed writer's leftovers are no problem (the next writer or
  repair removes them); anything else (an older omrl's part, a file copied in) is, as its rows are seen by
  no reader;
- ids held twice.

Repair removes leftovers and stale temporaries, adds readable stray parts to the listing, moves unreadable
ones to the table's hidden `.quarantine/` folder, rebuilds missing or damaged side files from their part,
writes the listing of a store from before it existed, and rewrites the card. A listed part that is missing
or damaged stays listed, so the store keeps saying so, unless `accept_loss` is given: then it is dropped
(a damaged file moved to `.quarantine/`) and the report names it with its row count.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow.parquet as pq

from omrl.schema import conform
from omrl.store.card import card_parts
from omrl.store.layout import SIDE_KINDS, side_matches, side_path, side_tables
from omrl.store.manifest import MANIFEST, TABLES, PartProblem, PartRecord, StoreError, listing
from omrl.store.storage import StorePath, local_path

if TYPE_CHECKING:  # types only: any store, through the committing half of Store (the reading half to find damage)
    from omrl.store.commit import StoreWriter as Store
    from omrl.store.parts import StoreReader

QUARANTINE_DIR = ".quarantine"  # hidden: never listed, never uploaded (hub.PUSH_IGNORE)
_CHUNK = 8 << 20


def check_store(store: Store) -> list[PartProblem]:
    """Every problem check finds (module docstring); [] for a sound store."""
    try:
        store.manifest  # noqa: B018 - read again: it may have changed since the store was opened
    except StoreError as exc:
        return [PartProblem(store.path / MANIFEST, str(exc))]
    problems = _card_problems(store)
    for table in TABLES:
        scan = store._current_scan(table, unlisted=True)
        folder = store.table_dir(table)
        found = [PartProblem(folder / r.name, f"missing: {MANIFEST} lists it with {r.rows} rows, the file is gone; "
                             "restore it, or `--repair --accept-loss` drops it (and its rows)") for r in scan.missing]
        found += [PartProblem(p.path, f"damaged: {p.error}; restore it, or `--repair --accept-loss` drops it")
                  for p in (scan.damaged if scan.listed else [])]
        found += [PartProblem(p.path, f"unreadable, skipped by readers: {p.error}")
                  for p in (scan.damaged if not scan.listed else [])]
        records = {r.name: r for r in scan.records or []}
        for path in scan.live:
            why = verify_part(store, path, records.get(path.name))
            if why is not None:
                found.append(PartProblem(path, f"damaged: {why}; restore it, or `--repair --accept-loss` drops it"))
        for path in scan.strays:
            why = _unusable(store, path)
            found.append(PartProblem(path, f"not listed in {MANIFEST}, so no reader sees its rows (written by an "
                                     "older omrl, or copied in); `--repair` adds it" if why is None else
                                     f"not part of the store and unreadable ({why}); `--repair` moves it to "
                                     f"{QUARANTINE_DIR}/"))
        if table == "trajectories":
            found += [PartProblem(side, why) for side, why in _side_problems(store, scan.live, records)]
        problems += found
        if not found:  # ids of damaged parts cannot be read: those are reported instead
            problems += store._duplicate_problems(table)
    return problems


def damaged_files(store: StoreReader) -> list[PartProblem]:
    """The live parts and side files whose bytes are not what was written (or, unhashed, do not decode):
    what a failed read of the store ran into (omrl.store.query names them)."""
    out = []
    manifest = store.manifest
    for table in TABLES:
        records = {r.name: r for r in (listing(manifest) or {}).get(table, [])}
        scan = store._scan(table, manifest)
        out += [PartProblem(store.table_dir(table) / r.name, "missing") for r in scan.missing] + scan.damaged
        for path in scan.live:
            why = verify_part(store, path, records.get(path.name))
            if why is not None:
                out.append(PartProblem(path, why))
        if table == "trajectories":
            out += [PartProblem(side, why) for side, why in _side_problems(store, scan.live, records)
                    if "missing" not in why]
    return out


def verify_part(store: StoreReader, path: StorePath, record: PartRecord | None) -> str | None:
    """Why the part at `path` is not the one listed (None when it is): its hash, or for a part without a
    record (a store from before the listing), whether every page decodes and it has an id column."""
    try:
        if record is not None:
            digest, size = _sha256(store, path)
            if (size, digest) != (record.file.bytes, record.file.sha256):
                return (f"its bytes differ from those written (SHA-256 {digest[:12]}..., {MANIFEST} lists "
                        f"{record.file.sha256[:12]}...)")
            return None
        return _unusable(store, path)
    except FileNotFoundError:
        return None  # compacted away since the listing: its rows are in the merged part


def _unusable(store: StoreReader, path: StorePath) -> str | None:
    """Why a part file cannot serve as a part (None when every page decodes and it has an id column)."""
    try:
        parquet = pq.ParquetFile(store.storage.arrow_source(path, whole=True), page_checksum_verification=True)
        if "id" not in parquet.schema_arrow.names:
            return "it has no id column"
        for group in range(parquet.num_row_groups):  # one row group at a time: bounded memory
            parquet.read_row_group(group)
    except FileNotFoundError:
        raise
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _sha256(store: StoreReader, path: StorePath) -> tuple[str, int]:
    """(hex SHA-256, size) of a file, read in chunks on local disk."""
    if not store.storage.local:
        data = store.storage.read_bytes(path)
        return hashlib.sha256(data).hexdigest(), len(data)
    digest, size = hashlib.sha256(), 0
    with open(local_path(path), "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _side_problems(store: StoreReader, live: list[StorePath], records: dict[str, PartRecord]
                   ) -> list[tuple[StorePath, str]]:
    """(side file, why) for each live trajectories part whose side file is missing, damaged or another's."""
    out = []
    for part in live:
        record = records.get(part.name)
        for kind in SIDE_KINDS:
            side = side_path(part, kind)
            want = record.sides.get(kind) if record is not None else None
            try:
                digest, size = _sha256(store, side)
            except FileNotFoundError:
                if want is not None:
                    out.append((side, "missing side file: queries unnest its part instead (same answers, "
                                      "slower); `--repair` rebuilds it"))
                continue
            if want is not None and (size, digest) != (want.bytes, want.sha256):
                why = "its bytes differ from those written"
            elif not _side_fits(store, side, part):
                why = "it is unreadable or made for another part"
            else:
                continue
            out.append((side, f"damaged side file ({why}): queries unnest its part instead; `--repair` rebuilds it"))
    return out


def _side_fits(store: StoreReader, side: StorePath, part: StorePath) -> bool:
    rows = store._footer(part).num_rows
    if store.storage.local:
        return side_matches(local_path(side), part.name, rows)
    return side_matches(store.storage.arrow_source(side), part.name, rows)


def _card_problems(store: Store) -> list[PartProblem]:
    card_path = store.path / "README.md"
    card = store._read_card()
    if card is None:
        return [PartProblem(card_path, "missing: `datasets.load_dataset` cannot open the store; `--repair` writes it")]
    try:
        listed = card_parts(card)
    except ValueError as exc:
        return [PartProblem(card_path, f"broken: {exc}; `--repair` rewrites its configs")]
    names = store._live_names(store.manifest)
    wrong = [t for t in TABLES if listed.get(t) != (names[t] or None)]
    if wrong:
        return [PartProblem(card_path, f"its configs list other {' and '.join(wrong)} parts than {MANIFEST} (a writer "
                            "killed between the two, or a hand edit), so `load_dataset` reads other rows than omrl; "
                            "`--repair` rewrites them")]
    return []


# ------------------------------------------------------------------------------------------- repair


@dataclass
class RepairReport:
    """What `repair_store` did, file by file."""

    removed: int = 0  # leftovers of killed writers, stale temporaries, orphan side files
    upgraded: bool = False  # wrote the listing of a store from before it existed
    adopted: list[str] = field(default_factory=list)  # stray parts added to the listing
    quarantined: list[str] = field(default_factory=list)  # unreadable strays moved aside
    sides_rebuilt: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # lost parts left listed (no accept_loss)
    dropped: list[str] = field(default_factory=list)  # lost parts dropped (accept_loss), with their rows

    def lines(self) -> list[str]:
        """What to tell the user, one line each."""
        out = [f"repaired: {self.removed} leftover file(s) removed, dataset card rewritten"]
        if self.upgraded:
            out.append(f"{MANIFEST} now lists every part (the store was written before omrl listed its parts)")
        out += [f"added to the listing: {name}" for name in self.adopted]
        out += [f"moved aside (unreadable, not a part): {name}" for name in self.quarantined]
        out += [f"side file rebuilt: {name}" for name in self.sides_rebuilt]
        out += [f"kept listed, still lost: {name} (restore it, or `--repair --accept-loss` drops it)"
                for name in self.kept]
        out += [f"dropped (--accept-loss): {name}" for name in self.dropped]
        return out


def repair_store(store: Store, accept_loss: bool = False) -> RepairReport:
    """Repair what can be repaired (module docstring); lost parts are dropped only with `accept_loss`."""
    report = RepairReport()
    # The compaction locks first (the order compact() takes them in), so no merge is under way.
    with store._lock("compact-trajectories"), store._lock("compact-annotations"), store._lock("write"):
        manifest = store.manifest
        report.upgraded = listing(manifest) is None
        manifest = store._upgraded(manifest)
        parts = {}
        dropped: list[StorePath] = []
        for table in TABLES:
            scan = store._scan(table, manifest, unlisted=True)
            report.removed += store._finish_cleanup(table, scan)
            folder = store.table_dir(table)
            assert scan.records is not None  # the manifest is upgraded: it has a listing
            records = list(scan.records)
            lost = {r.name: f"{r.rows} rows, missing" for r in scan.missing}
            lost |= {p.path.name: f"{_rows(records, p.path.name)} rows, damaged: {p.error}" for p in scan.damaged}
            for path in scan.live:
                why = verify_part(store, path, _record(records, path.name))
                if why is not None:
                    lost[path.name] = f"{_rows(records, path.name)} rows, damaged: {why}"
            for name, why in lost.items():
                shown = f"{folder / name} ({why})"
                if not accept_loss:
                    report.kept.append(shown)
                    continue
                records = [r for r in records if r.name != name]
                if "damaged" in why:
                    _set_aside(store, folder / name)
                dropped.append(folder / name)
                report.dropped.append(shown)
            for path in scan.strays:
                if _unusable(store, path) is None:
                    records.append(store._record_of(path))
                    report.adopted.append(str(path))
                else:
                    _set_aside(store, path)
                    report.quarantined.append(str(path))
            if table == "trajectories":
                records = [_with_sides(store, folder, r, report) if r.name not in lost else r for r in records]
            parts[table] = records
        store._commit(manifest, parts)
        for path in dropped:  # once no longer listed: its side files and search index
            store._remove_part(path)
    return report


def _record(records: list[PartRecord], name: str) -> PartRecord | None:
    return next((r for r in records if r.name == name), None)


def _rows(records: list[PartRecord], name: str) -> int | str:
    record = _record(records, name)
    return record.rows if record is not None else "?"


def _with_sides(store: Store, folder: StorePath, record: PartRecord, report: RepairReport) -> PartRecord:
    """The record of a sound trajectories part, its side files rebuilt from it where missing or damaged."""
    part = folder / record.name
    if not [side for side, _ in _side_problems(store, [part], {record.name: record})] and set(record.sides) == set(
            SIDE_KINDS):
        return record
    data = conform(store._read_parquet(part), "trajectories")  # v1 parts get side files too
    sides = dict(record.sides)
    for kind, table in side_tables(data, record.name).items():
        side = side_path(part, kind)
        store.storage.delete(side)  # write_new never overwrites (S3 PUTs only if absent)
        sides[kind] = store._write_file(side, table, 1 << 20)
        report.sides_rebuilt.append(str(side))
    return PartRecord(record.name, record.rows, record.file, sides)


def _set_aside(store: Store, path: StorePath) -> None:
    """Move a file out of the parts (into its table's hidden quarantine folder), keeping its bytes."""
    target = path.parent / QUARANTINE_DIR / path.name
    data = store.storage.read_bytes(path)
    store.storage.delete(target)
    store.storage.write_new(target, lambda f: f.write(data))
    store.storage.delete(path)

