"""Import trajectory files into a store: detect, convert, validate, skip what the store already holds.

A bad record stops the import of its file with an error naming the file and record index (nothing of
that file is written), or, with `skip_errors`, is counted under its reason and reported; never silently
dropped. Ids depend only on (format, file name, record index, native id), so importing a file twice
adds nothing the second time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omrl.formats import format_module
from omrl.formats.common import FormatError, RecordContext, read_records
from omrl.formats.detect import detect_format
from omrl.schema import SchemaError, group_id, normalize_trajectory
from omrl.store import Store


@dataclass
class FileReport:
    """What happened to one file: counts, and why records were skipped."""

    path: str
    format: str
    records: int = 0
    imported: int = 0
    already_present: int = 0
    skipped: Counter = field(default_factory=Counter)  # reason -> count
    examples: list[str] = field(default_factory=list)  # the first few skip messages, in full

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())


def iter_trajectories(path: str | Path, fmt: str = "auto", skip_errors: bool = False,
                      report: FileReport | None = None,
                      on_record: Callable[[], None] | None = None) -> Iterator[dict[str, Any]]:
    """Yield validated schema-1 rows from one file. Bad records raise FormatError, or are counted in `report`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    fmt = detect_format(path) if fmt == "auto" else fmt
    module = format_module(fmt)
    report = report if report is not None else FileReport(str(path), fmt)
    report.format = fmt
    samples: Counter = Counter()  # task_id -> rows seen: several attempts at one task form a GRPO group
    for index, record in read_records(path):
        report.records += 1
        if on_record:
            on_record()
        ctx = RecordContext(fmt, path, index)
        try:
            row = module.convert(record, ctx)
            row["sample"] = samples[row["task_id"]]
            row["group_id"] = group_id(row["run_id"], 0, row["task_id"])
            row = normalize_trajectory(row)
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
        samples[row["task_id"]] += 1
        yield row


def load_trajectories(path: str | Path, fmt: str = "auto", skip_errors: bool = False) -> list[dict[str, Any]]:
    """All rows of one file as validated trajectory dicts."""
    return list(iter_trajectories(path, fmt, skip_errors))


def import_files(paths: Iterable[str | Path], store: Store, fmt: str = "auto", skip_errors: bool = False,
                 on_record: Callable[[], None] | None = None,
                 on_file: Callable[[Path], None] | None = None) -> list[FileReport]:
    """Import files into a store, one after the other; rows whose id the store holds are not written again."""
    existing = store.ids()
    reports = []
    for path in map(Path, paths):
        if on_file:
            on_file(path)
        report = FileReport(str(path), fmt)
        rows = []
        for row in iter_trajectories(path, fmt, skip_errors, report, on_record):
            if row["id"] in existing:
                report.already_present += 1
                continue
            existing.add(row["id"])
            rows.append(row)
        # The whole file is converted before anything is written, then written as one atomic part:
        # a bad record (or a crash) leaves the store unchanged.
        # skip_existing: a concurrent import of the same data may have committed these ids since we looked.
        appended = store.append(rows, skip_existing=True)
        report.imported = appended.written
        report.already_present += appended.skipped
        reports.append(report)
    return reports
