"""Import trajectory files into a store: detect, convert, validate, skip what the store already holds.

A bad record stops the import of its file with an error naming the file and record index, or, with
`skip_errors`, is counted under its reason and reported; never silently dropped. Text a format leaves
out on purpose (SWE-agent demonstrations, OpenHands' result headers) is reported per row in
metadata.import.dropped and per file in `FileReport.dropped`. A file whose every
record was skipped counts as failed.

All or nothing: every file is converted and validated before anything is written, and then all rows go
in one atomic append; when any file fails nothing is written (with `partial`, the files that converted
are written and the failed ones listed). A store that does not exist yet is created only when there is
something to write, so a failed import leaves no empty store folder behind.

Ids depend only on the record's content (and its occurrence among identical records of the file), never
on the file's name: re-importing the same data adds nothing under any name, different data never
collides. Run ids come from the file's path relative to the import root (`import:weather/val`).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omrl.formats import format_module
from omrl.formats.detect import detect_format
from omrl.formats.records import FormatError, RecordContext, read_records, record_digest
from omrl.formats.rows import PREVIOUS_ID
from omrl.progress import QUIET, Reporter
from omrl.schema import SchemaError, group_id, normalize_trajectory
from omrl.store import MANIFEST, Store
from omrl.store.location import storage_for


@dataclass
class FileReport:
    """What happened to one file: counts, why records were skipped, and whether it failed or was written."""

    path: str
    format: str
    records: int = 0
    imported: int = 0
    already_present: int = 0
    skipped: Counter = field(default_factory=Counter)  # reason -> count
    examples: list[str] = field(default_factory=list)  # the first few skip messages, in full
    error: str | None = None  # why the file failed (nothing of it is written)
    status: str = "pending"  # written, nothing new, failed, not written
    reason: str | None = None  # the failure's short category
    previous_ids: dict[str, str] = field(default_factory=dict)  # row id -> its id before content ids
    dropped: Counter = field(default_factory=Counter)  # reason -> characters of text left out on purpose

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())


class ImportFailed(FormatError):
    """Some files failed; `reports` says what happened to each (and whether anything was written)."""

    def __init__(self, message: str, reports: list[FileReport], reason: str = "import failed"):
        super().__init__(message, reason)
        self.reports = reports


def import_root(paths: Iterable[str | Path]) -> Path:
    """The folder run ids are relative to: the working directory when it holds every file, else their common folder."""
    folders = [Path(p).resolve().parent for p in paths]
    if not folders:
        return Path.cwd()
    cwd = Path.cwd().resolve()
    if all(f.is_relative_to(cwd) for f in folders):
        return cwd
    return Path(os.path.commonpath([str(f) for f in folders]))


def _relative(path: Path, root: Path | None) -> str:
    if root is None:
        return path.name
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.name


def iter_trajectories(path: str | Path, fmt: str = "auto", skip_errors: bool = False,
                      report: FileReport | None = None, reporter: Reporter = QUIET,
                      root: str | Path | None = None, mapping: Any = None,
                      keep_demos: bool = False) -> Iterator[dict[str, Any]]:
    """Yield validated schema-1 rows from one file. Bad records raise FormatError, or are counted in `report`.

    root: the import root run ids are relative to (default: the file's folder).
    mapping: an `omrl.formats.mapping.RecordMapping` (then fmt is ignored): records mapped key by key.
    keep_demos: keep demonstration messages (SWE-agent is_demo) as trainable=false instead of skipping them.
    reporter: advanced by one for each record read (omrl.progress).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    reader = read_records
    if mapping is not None:
        fmt, convert = mapping.name, mapping.convert
    else:
        fmt = detect_format(path) if fmt == "auto" else fmt
        module = format_module(fmt)
        convert, reader = module.convert, getattr(module, "read_records", read_records)
    rel = _relative(path, Path(root) if root is not None else path.parent)
    report = report if report is not None else FileReport(str(path), fmt)
    report.format = fmt
    samples: Counter = Counter()  # task_id -> rows seen: several attempts at one task form a GRPO group
    seen: Counter = Counter()  # record digest -> occurrences: identical records in one file stay distinct rows
    for index, record in reader(path):
        report.records += 1
        reporter.advance(1)
        ctx = RecordContext(fmt, path, index, rel=rel, keep_demos=keep_demos)
        try:
            digest = record_digest(record)
            occurrence = seen[digest]
            seen[digest] += 1
            ctx = RecordContext(fmt, path, index, digest if not occurrence else f"{digest}:{occurrence}", rel,
                                keep_demos)
            converted = convert(record, ctx)  # a row, or a list of rows (ATIF: the trajectory, then its subagents)
            rows = []
            for row in converted if isinstance(converted, list) else [converted]:
                previous = row.pop(PREVIOUS_ID, None)
                drops = row["metadata"].get("import", {}).get("dropped", []) if isinstance(row.get("metadata"), dict) else []
                row["sample"] = samples[row["task_id"]] + sum(r["task_id"] == row["task_id"] for r, _, _ in rows)
                row["group_id"] = group_id(row["run_id"], 0, row["task_id"])
                rows.append((normalize_trajectory(row), previous, drops))
        except (SchemaError, ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            reason = getattr(exc, "reason", "invalid record" if isinstance(exc, SchemaError) else type(exc).__name__)
            detail = "nested too deeply to convert" if isinstance(exc, RecursionError) else str(exc)
            text = detail if detail.startswith(ctx.where) else f"{ctx.where}: {detail}"
            if not skip_errors:
                raise FormatError(f"{text} (use --skip-errors to skip bad records)", reason) from None
            report.skipped[reason] += 1
            if len(report.examples) < 5:
                report.examples.append(text)
            continue
        for drop in (d for _, _, ds in rows for d in ds):
            report.dropped[drop["reason"]] += drop["chars"]
        for row, previous, _ in rows:
            samples[row["task_id"]] += 1
            if previous:
                report.previous_ids[row["id"]] = previous
            yield row


def load_trajectories(path: str | Path, fmt: str = "auto", skip_errors: bool = False,
                      mapping: Any = None) -> list[dict[str, Any]]:
    """All rows of one file as validated trajectory dicts."""
    return list(iter_trajectories(path, fmt, skip_errors, mapping=mapping))


def import_files(paths: Iterable[str | Path], store: Store | str | Path, fmt: str = "auto",
                 skip_errors: bool = False, reporter: Reporter = QUIET, partial: bool = False,
                 root: str | Path | None = None, mapping: Any = None, keep_demos: bool = False) -> list[FileReport]:
    """Convert every file, then write all their new rows in one atomic append (see the module docstring).

    reporter (omrl.progress): one piece of work per file ("reading NAME (i/n)"), a unit per record read.
    store: a Store, or the path of one (created only when there is something to write).
    Raises ImportFailed (with every file's report) when a file fails: nothing written, or, with `partial`,
    the good files written (their reports say so).
    """
    paths = [Path(p) for p in paths]
    root = Path(root) if root is not None else import_root(paths)
    if not isinstance(store, Store):
        store_root, storage = storage_for(store)  # a local folder or an s3:// prefix
        if storage.exists(store_root / MANIFEST):
            store = Store(store)
            store.sync_card()  # a card left stale by a killed import is healed even when nothing is new
    existing = store.ids() if isinstance(store, Store) else set()
    reports: list[FileReport] = []
    batches: list[list[dict[str, Any]]] = []
    for number, path in enumerate(paths, 1):
        report = FileReport(str(path), mapping.name if mapping is not None else fmt)
        reports.append(report)
        rows: list[dict[str, Any]] = []
        batch_ids: set[str] = set()
        reporter.start(f"reading {path.name} ({number}/{len(paths)})")
        try:
            for row in iter_trajectories(path, fmt, skip_errors, report, reporter, root, mapping, keep_demos):
                if row["id"] in existing or row["id"] in batch_ids or report.previous_ids.get(row["id"]) in existing:
                    report.already_present += 1
                    continue
                batch_ids.add(row["id"])
                rows.append(row)
            if report.records and report.skipped_total == report.records:
                raise FormatError(f"{path.name}: every record ({report.records}) was skipped as bad; nothing of it "
                                  f"imported (first: {report.examples[0] if report.examples else '?'})",
                                  "every record skipped")
        except (FormatError, SchemaError, OSError) as exc:
            report.error, report.status = str(exc), "failed"
            report.format = "?" if report.format == "auto" else report.format
            report.reason = getattr(exc, "reason", "invalid record")
            batches.append([])
            continue
        finally:
            reporter.finish()
        existing |= batch_ids
        batches.append(rows)
    failed = [r for r in reports if r.status == "failed"]
    if failed and not partial:
        for r in reports:
            if r.status != "failed":
                r.status = "not written"
        raise ImportFailed(_failure_message(failed, len(reports), written=False), reports,
                           failed[0].reason or "import failed")
    good = [(r, rows) for r, rows in zip(reports, batches, strict=True) if r.status != "failed"]
    new_rows = [row for _, rows in good for row in rows]
    if new_rows:
        if not isinstance(store, Store):
            store = Store.create(store)
        # One atomic part for every file: a crash leaves all of them or none. skip_existing: a concurrent
        # import of the same data may have committed some of these ids since we looked.
        appended = store.append(new_rows, skip_existing=True)
        raced = appended.skipped
        for r, rows in good:
            taken = min(raced, len(rows))  # ids a racing writer committed first count as already present
            raced -= taken
            r.imported, r.already_present = len(rows) - taken, r.already_present + taken
    for r, _ in good:
        r.status = "written" if r.imported else "nothing new"
    if failed:
        raise ImportFailed(_failure_message(failed, len(reports), written=True), reports,
                           failed[0].reason or "import failed")
    return reports


def _failure_message(failed: list[FileReport], total: int, written: bool) -> str:
    errors = "; ".join(r.error or "" for r in failed[:3]) + (f"; ... {len(failed) - 3} more" if len(failed) > 3 else "")
    if total == 1:
        return errors
    if written:
        return f"{len(failed)} of {total} files failed and were not written (the others were, --partial): {errors}"
    return (f"{len(failed)} of {total} files failed, so nothing was written (all or nothing; --partial writes "
            f"the good files): {errors}")
