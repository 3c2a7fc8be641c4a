"""Guess the format of a trajectory file from its extension and the keys of its first record."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omrl import readers
from omrl.formats.common import BadRecord, FormatError, first_record, kind_of

OPENMANUS_KEYS = {"reward_model", "item_id", "data_source", "extra_info"}


def detect_record(record: Any) -> str | None:
    """The format of one native record, or None when its keys match none."""
    if not isinstance(record, dict):
        return None
    keys = set(record)
    if str(record.get("schema_version", "")).startswith("ATIF") and "steps" in keys:
        return "atif"
    if "history" in keys and ({"trajectory", "info", "replay_config"} & keys):
        return "swe_agent"
    if isinstance(record.get("answer_generation"), dict):
        return "toolbench"
    if "conversations" in keys:
        return "openmanus" if len(OPENMANUS_KEYS & keys) >= 2 else "sharegpt"
    if "messages" in keys:
        return "openai"
    return None


def detect_format(path: str | Path) -> str:
    """The format of a file: .traj is SWE-agent; otherwise decided by the first record's keys."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    if path.suffix.lower() == ".traj":
        return "swe_agent"
    if path.suffix.lower() == ".parquet":
        # The schema is enough, no need to read rows; a file that is not Parquet is a FormatError naming it.
        names = set(readers.parquet_schema(path, error=FormatError).names)
        found = detect_record(dict.fromkeys(names))
    else:
        record = first_record(path)
        if isinstance(record, BadRecord):  # the first line does not parse: say so, not "unknown keys"
            raise FormatError(f"{path.name} {record.error}", record.reason)
        found = detect_record(record)
        if found is None and record is None:
            raise FormatError(f"{path.name}: the file holds no records", "empty file")
        if not isinstance(record, dict):
            raise FormatError(f"{path.name}: the first record is {kind_of(record)}, not an object", "not an object")
        names = set(record)
    if found is None:
        shown = sorted(map(str, names))
        keys = shown if len(shown) <= 20 else [*shown[:20], f"... {len(shown) - 20} more"]
        raise FormatError(f"{path.name}: cannot tell the format from keys {keys}; "
                          "pass --format (sharegpt, openai, swe_agent, openmanus, toolbench, atif); "
                          "a task dataset goes through `omrl tasks import`", "unknown format")
    return found
