"""The JSON-text columns read as values: a trajectory's task, tools and metadata, an annotation's metadata, a
turn's info. Stored rows hold these as JSON text (omrl.schema.tables: "omrl.kind" json); a row built in code
before it is normalised may hold the decoded value, which is taken as it is."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from omrl.schema.task_column import _payload_decoded, parse_task


def decoded(value: Any, default: Any) -> Any:
    """A JSON-text column's value: text parsed (invalid JSON raises json.JSONDecodeError), null or "" the
    default, an already decoded value as it is."""
    if value is None or value == "":
        return default
    return json.loads(value) if isinstance(value, str) else value


def _object(value: Any) -> dict[str, Any]:
    """The JSON object a column holds; {} for null, invalid JSON or any other JSON value."""
    try:
        found = decoded(value, {})
    except (ValueError, RecursionError):
        return {}
    return found if isinstance(found, dict) else {}


def metadata_of(row: Mapping[str, Any]) -> dict[str, Any]:
    """A trajectory's or annotation's metadata as an object ({} when null, invalid or not an object)."""
    return _object(row.get("metadata"))


def info_of(turn: Mapping[str, Any]) -> dict[str, Any]:
    """A turn's info as an object ({} when null, invalid or not an object)."""
    return _object(turn.get("info"))


def tools_of(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A trajectory's tools: the OpenAI function schemas offered ([] when null; invalid JSON raises)."""
    return decoded(row.get("tools"), [])


def task_of(row: Mapping[str, Any]) -> dict[str, Any]:
    """A trajectory's task as an object, payload decoded (omrl.schema.parse_task; {} when null or invalid)."""
    task = row.get("task")
    if isinstance(task, dict):
        return _payload_decoded(task)
    return parse_task(task)
