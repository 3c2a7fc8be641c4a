"""Content keys for deduplication: the normalised text a trainer would see for a trajectory.

The content is the instruction plus every message (role, text, tool calls with canonical JSON
arguments), lower-cased with whitespace collapsed. Tool-call ids, timestamps, run ids and rewards are
left out: two episodes that say the same things are duplicates whoever ran them.
"""

from __future__ import annotations

import hashlib
import json

from omrl.schema.rows import TrajectoryRow


def _canonical(arguments: str | None) -> str:
    try:
        return json.dumps(json.loads(arguments or "{}"), sort_keys=True, ensure_ascii=False)
    except json.JSONDecodeError:
        return arguments or ""


def content_text(row: TrajectoryRow) -> str:
    """The normalised trainable content of a trajectory as one text."""
    parts = [f"task: {row.get('instruction') or ''}"]
    for msg in row.get("messages") or []:
        text = msg.get("content") or ""
        calls = " ".join(f"call {c.get('name')} {_canonical(c.get('arguments'))}" for c in msg.get("tool_calls") or [])
        parts.append(f"{msg.get('role')}: {text} {calls}")
    return " ".join(" ".join(parts).lower().split())


def content_hash(row: TrajectoryRow) -> str:
    """The exact-duplicate key of a trajectory."""
    return hashlib.sha256(content_text(row).encode()).hexdigest()
