"""Native records: reading them from files, where each came from (RecordContext), and the FormatError
that names the file and record a conversion failed on.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omrl.schema import SchemaError
from omrl.store import readers


class FormatError(SchemaError):
    """A record that cannot be imported; `reason` is a short category for the skip summary."""

    def __init__(self, message: str, reason: str = "invalid record"):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class RecordContext:
    """Where a record came from: its format, file and position in the file.

    digest: the record's content hash (with its occurrence among identical records of the file), the
    basis of the row id; rel: the file's path relative to the import root, the basis of the run id.
    """

    fmt: str
    path: Path
    index: int
    digest: str = ""
    rel: str = ""
    keep_demos: bool = False  # keep demonstration messages (SWE-agent is_demo) as trainable=false

    @property
    def where(self) -> str:
        return f"{self.path.name} record {self.index}"

    @property
    def run_name(self) -> str:
        """The file's path relative to the import root, without its suffix: `weather/val`."""
        rel = self.rel or self.path.name
        return rel[: -len(Path(rel).suffix)] if Path(rel).suffix else rel


def record_digest(record: Any) -> str:
    """A content hash of one native record: the same data gives the same hash under any file name."""
    data = json.dumps(record, ensure_ascii=False, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(data.encode("utf-8", "surrogatepass")).hexdigest()[:32]


# A record that could not even be parsed (a broken JSONL line); converting it raises FormatError naming it.
BadRecord = readers.BadLine


SUFFIXES = (".json", ".jsonl", ".ndjson", ".traj", ".parquet")


def read_json_file(path: Path) -> Any:
    """The JSON document of a file; errors (FormatError) name the file and the item or line."""
    return readers.read_json(path, error=FormatError)


def read_records(path: Path) -> Iterator[tuple[int, Any]]:
    """Yield (index, record) from .jsonl, .json (a list, or one object), .traj (one object) or .parquet.

    A broken JSONL line comes as a BadRecord (so --skip-errors can count it); a file that cannot be read
    at all raises FormatError naming the file and the line, item or row group.
    """
    for record in readers.iter_records(path, allowed=SUFFIXES, error=FormatError, bad_lines="yield",
                                       single_json=True):
        yield record.index, record.value


def first_record(path: Path) -> Any:
    """The first record of a file (for format detection), or None when the file has none."""
    for _, record in read_records(path):
        return record
    return None
