"""The record dataclasses and the row normalisers: a record checked and returned in its table's exact shape.

A record's defaults are the normaliser's (omrl.schema.plans reads them from the dataclass), and `to_row()`
normalises a record built in code, so the two stay in one module.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, cast

from omrl.schema.convert import SchemaError, _json_text, _names, _opt_str, _short
from omrl.schema.ids import group_id, new_id
from omrl.schema.plans import _STRUCTS, Converter, _converted, _field_plan, _struct
from omrl.schema.rows import AnnotationRow, TrajectoryRow, UncheckedRow
from omrl.schema.tables import (
    ANNOTATION_KINDS,
    ANNOTATION_SCHEMA,
    ANNOTATION_STATUSES,
    MESSAGE_TYPE,
    ROLES,
    STATUSES,
    TOOL_CALL_TYPE,
    TRAJECTORY_SCHEMA,
    TURN_TYPE,
)
from omrl.schema.task_column import _task_text

# ---------------------------------------------------------------- record types
#
# Each record's fields and defaults: the normalisers below take their defaults from these (`_defaults`);
# omrl itself passes rows as dicts, and `to_row()` turns a record built in code into one.


@dataclass
class ToolCall:
    name: str
    arguments: str = "{}"
    id: str | None = None


@dataclass
class Message:
    role: str
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    trainable: bool | None = None


@dataclass
class Turn:
    index: int
    reward: float | None = None
    done: bool = False
    latency_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    info: str = "{}"
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


@dataclass
class Trajectory:
    id: str
    task_id: str
    messages: list[Message] = field(default_factory=list)
    run_id: str = ""
    round: int = 0
    group_id: str | None = None
    sample: int = 0
    env: str = ""
    model: str = ""
    instruction: str = ""
    task: str = "{}"
    tools: str = "[]"
    turns: list[Turn] = field(default_factory=list)
    reward: float | None = None
    success: bool | None = None
    status: str = "ok"
    error: str | None = None
    num_turns: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    duration_s: float | None = None
    source: str = "collected"
    parent_id: str | None = None
    metadata: str = "{}"
    created_at: datetime | None = None

    def to_row(self) -> TrajectoryRow:
        """The Arrow row of this trajectory, normalised and validated."""
        return normalize_trajectory(asdict(self))


@dataclass
class Annotation:
    trajectory_id: str
    annotator: str
    kind: str = "score"
    score: float | None = None
    label: str | None = None
    rationale: str | None = None
    status: str = "ok"
    error: str | None = None
    judge_model: str | None = None
    rubric: str | None = None
    prompt_hash: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None
    run_id: str | None = None
    metadata: str = "{}"
    created_at: datetime | None = None
    id: str | None = None

    def to_row(self) -> AnnotationRow:
        """The Arrow row of this annotation, normalised and validated."""
        return normalize_annotation(asdict(self))


def _role(value: Any, where: str) -> str:
    if value not in ROLES:
        raise SchemaError(f"field '{where}' must be one of {', '.join(ROLES)}, got {_short(value)}")
    return value


def _tool_name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise SchemaError(f"field '{where}' must be a non-empty string")
    return value


def _openai_call(call: dict[str, Any]) -> dict[str, Any]:
    """OpenAI nests name and arguments under "function"; the id stays on the call."""
    fn = call.get("function")
    if not isinstance(fn, dict):
        return call
    return {"id": call.get("id"), "name": fn.get("name"), "arguments": fn.get("arguments", "{}")}


def _turn_index(out: dict[str, Any], position: int) -> None:
    if out["index"] is None:
        out["index"] = position


_STRUCTS[TOOL_CALL_TYPE] = _struct(TOOL_CALL_TYPE, ToolCall, "an object with name and arguments",
                                   {"name": _tool_name}, prepare=_openai_call)
_STRUCTS[MESSAGE_TYPE] = _struct(MESSAGE_TYPE, Message, "an object with a role", {"role": _role})
_STRUCTS[TURN_TYPE] = _struct(TURN_TYPE, Turn, "an object", {"done": lambda value, where: bool(value)},
                              finish=_turn_index)


def _tools(value: Any, where: str) -> str:
    tools = _json_text(value, where, "[]")
    if not isinstance(json.loads(tools), list):
        raise SchemaError("field 'tools' must be a JSON list of function schemas")
    return tools


_TRAJECTORY_FIELDS = _field_plan(TRAJECTORY_SCHEMA, Trajectory,
                                 {"task": lambda value, where: _task_text(value), "tools": _tools})
_ANNOTATION_FIELDS = _field_plan(ANNOTATION_SCHEMA, Annotation,
                                 {"id": lambda value, where: _opt_str(value, where) or new_id()})
_TRAJECTORY_NAMES = frozenset(TRAJECTORY_SCHEMA.names)
_ANNOTATION_NAMES = frozenset(ANNOTATION_SCHEMA.names)


class NormalizedRow(dict[str, Any]):
    """A row as a normaliser returned it. Normalising it again (Store.append does) returns it as is, unless a
    key was set or deleted since; a change inside a nested value is not seen, so normalise a copy instead."""

    __slots__ = ("table", "changed")

    def __init__(self, values: dict[str, Any], table: str) -> None:
        super().__init__(values)
        self.table, self.changed = table, False

    def __setitem__(self, key: str, value: Any) -> None:
        self.changed = True
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self.changed = True
        super().__delitem__(key)

    # typeshed types dict.__or__ generic in the other mapping's key type; |= keeps a row a row.
    def __ior__(self, other: Any) -> NormalizedRow:  # type: ignore[misc,override]
        self.changed = True
        return super().__ior__(other)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self.changed = True
        super().update(*args, **kwargs)

    def setdefault(self, key: str, default: Any = None) -> Any:
        self.changed = True
        return super().setdefault(key, default)

    def pop(self, *args: Any) -> Any:
        self.changed = True
        return super().pop(*args)

    def popitem(self) -> tuple[str, Any]:
        self.changed = True
        return super().popitem()

    def clear(self) -> None:
        self.changed = True
        super().clear()


def is_normalized(row: Any, table: str = "trajectories") -> bool:
    """Whether `row` is a normaliser's output for `table`, unchanged since: it need not be checked again."""
    return type(row) is NormalizedRow and row.table == table and not row.changed


def _convert(row: UncheckedRow, plan: list[tuple[str, Converter, tuple[type, ...]]], label: str) -> dict[str, Any]:
    try:
        return _converted(row, plan)
    except SchemaError as exc:
        raise SchemaError(f"{label}: {exc}") from None


def normalize_trajectory(row: UncheckedRow) -> TrajectoryRow:
    """Check one trajectory record and return it in the exact shape of TRAJECTORY_SCHEMA.

    Raises SchemaError naming the trajectory id and the field at fault. A row this function returned
    (unchanged) is returned as is.
    """
    if is_normalized(row, "trajectories"):
        return cast(TrajectoryRow, row)  # a normaliser's own row, unchanged since
    if not isinstance(row, dict):
        raise SchemaError(f"a trajectory must be an object, got {type(row).__name__}")
    tid = row.get("id")
    label = f"trajectory {_short(tid)}" if isinstance(tid, str) and tid else "trajectory (no id)"
    unknown = set(row) - _TRAJECTORY_NAMES
    if unknown:
        raise SchemaError(f"{label}: unknown field(s) {_names(unknown)}")
    if not isinstance(tid, str) or not tid:
        got = "" if tid is None or isinstance(tid, str) else f", got {type(tid).__name__}"
        raise SchemaError(f"{label}: field 'id' must be a non-empty string{got}")
    task_id = row.get("task_id")
    if task_id is None or (isinstance(task_id, str) and not task_id):
        raise SchemaError(f"{label}: field 'task_id' is required")
    status = row.get("status") or "ok"
    if status not in STATUSES:
        raise SchemaError(f"{label}: field 'status' must be one of {', '.join(STATUSES)}, got {_short(status)}")
    out = _redacted(_convert(row, _TRAJECTORY_FIELDS, label))
    if out["num_turns"] is None:
        out["num_turns"] = sum(1 for m in out["messages"] if m["role"] == "assistant")
    if out["group_id"] is None:
        out["group_id"] = group_id(out["run_id"], out["round"], out["task_id"])
    return cast(TrajectoryRow, NormalizedRow(out, "trajectories"))


def normalize_annotation(row: UncheckedRow) -> AnnotationRow:
    """Check one annotation record and return it in the exact shape of ANNOTATION_SCHEMA."""
    if is_normalized(row, "annotations"):
        return cast(AnnotationRow, row)  # a normaliser's own row, unchanged since
    if not isinstance(row, dict):
        raise SchemaError(f"an annotation must be an object, got {type(row).__name__}")
    tid = row.get("trajectory_id")
    label = f"annotation of trajectory {_short(tid)}"
    unknown = set(row) - _ANNOTATION_NAMES
    if unknown:
        raise SchemaError(f"{label}: unknown field(s) {_names(unknown)}")
    if not isinstance(tid, str) or not tid:
        raise SchemaError(f"{label}: field 'trajectory_id' must be a non-empty string")
    annotator = row.get("annotator")
    if not isinstance(annotator, str) or not annotator:
        raise SchemaError(f"{label}: field 'annotator' must be a non-empty string")
    kind = row.get("kind") or "score"
    if kind not in ANNOTATION_KINDS:
        raise SchemaError(f"{label}: field 'kind' must be one of {', '.join(ANNOTATION_KINDS)}")
    status = row.get("status") or "ok"
    if status not in ANNOTATION_STATUSES:
        raise SchemaError(f"{label}: field 'status' must be ok or error, got {_short(status)}")
    if status == "error" and not row.get("error"):
        raise SchemaError(f"{label}: an error annotation needs field 'error' saying what went wrong")
    return cast(AnnotationRow, NormalizedRow(_redacted(_convert(row, _ANNOTATION_FIELDS, label)), "annotations"))


def _redacted(out: dict[str, Any]) -> dict[str, Any]:
    """A row's error and metadata without the secrets omrl knows of (an endpoint may echo a key back)."""
    from omrl.schema.redact import redact

    for name in ("error", "metadata"):
        if out.get(name):
            out[name] = redact(out[name])
    return out


NORMALIZERS: dict[str, Callable[[UncheckedRow], TrajectoryRow | AnnotationRow]] = {
    "trajectories": normalize_trajectory, "annotations": normalize_annotation}
