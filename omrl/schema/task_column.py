"""The `task` column: its one stored shape, and reading it in Python and SQL (old double-encoded rows too)."""

from __future__ import annotations

import json
import re
from typing import Any

from omrl.schema.convert import SchemaError, _json_text, _short

#
# `task` is JSON text of one object whose `payload` is an object: {"id": ..., "answer": ..., "payload": {...}}.
# Stores written before this rule hold the payload as JSON text inside the JSON (encoded twice, from a
# tasks-file row). Rows are written in the one shape (the normaliser decodes such a payload); readers use
# `parse_task` in Python and TASK_PAYLOAD_SQL / `task_payload_sql` in SQL, which read both shapes.

# The payload object as JSON text, for both shapes: json_extract_string(<this>, '$.key') reads one key.
TASK_PAYLOAD_SQL = "json_extract_string(task, '$.payload')"
_SQL_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def task_payload_sql(key: str) -> str:
    """SQL for one payload value as text, e.g. task_payload_sql("expression"), right on old and new rows."""
    if not _SQL_KEY.fullmatch(key):
        raise SchemaError(f"payload key {_short(key)} must be a dotted name of letters, digits and _")
    return f"json_extract_string({TASK_PAYLOAD_SQL}, '$.{key}')"


def _payload_decoded(task: Any) -> Any:
    """The task object with a payload given as JSON text of an object replaced by that object."""
    if isinstance(task, dict) and isinstance(task.get("payload"), str):
        try:
            payload = json.loads(task["payload"])
        except (ValueError, RecursionError):
            return task
        if isinstance(payload, dict):
            return {**task, "payload": payload}
    return task


def parse_task(text: str | None) -> dict[str, Any]:
    """The `task` column of a stored row as an object, payload decoded (old double-encoded rows too)."""
    if not text:
        return {}
    try:
        task = json.loads(text)
    except (ValueError, RecursionError, TypeError):
        return {}
    return _payload_decoded(task) if isinstance(task, dict) else {}


def _task_text(value: Any) -> str:
    """The task column's JSON text, payload encoded once (a tasks-file row's payload text is decoded)."""
    if isinstance(value, dict):
        return _json_text(_payload_decoded(value), "task", "{}")
    text = _json_text(value, "task", "{}")
    if '"payload"' in text:
        task = json.loads(text)
        fixed = _payload_decoded(task)
        if fixed is not task:
            return json.dumps(fixed, ensure_ascii=False)
    return text
