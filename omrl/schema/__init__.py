"""The trajectory and annotation formats: the one source of truth for every column omrl stores.

One trajectory row is one attempt by one policy at one task. Free-form payloads are JSON strings
(never Arrow maps, which Hugging Face `datasets` cannot load); "none" is an empty list, never null.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, field, fields
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa

from omrl.errors import OmrlError

# The store's version. 2: repeated text dictionary-encoded, flat side data per part (omrl.store.layout); stores of
# version 1 are read as they are. Rows did not change: their JSON Schema keeps ROW_SCHEMA_VERSION.
SCHEMA_VERSION = 2
ROW_SCHEMA_VERSION = 1

STATUSES = ("ok", "truncated", "env_error", "policy_error", "timeout")
# An episode that ran to its end (done, or out of turns): its `success` is an outcome.
FINISHED_STATUSES = ("ok", "truncated")
# Something failed (environment, policy, time limit): never scored, never trained on, never a failure.
FAILED_STATUSES = ("env_error", "policy_error", "timeout")
ROLES = ("system", "user", "assistant", "tool")
ANNOTATION_KINDS = ("score", "label", "rank", "pairwise")
ANNOTATION_STATUSES = ("ok", "error")

# What a string or float column holds beyond its Arrow type, kept on the field ("omrl.kind") so the
# normalisers are derived from the schema: json (JSON text; objects and lists are serialised), raw (text
# kept as written, objects serialised), key (id-like: text, or an integer as its digits), text (text only),
# finite (a finite number or null).
JSON_TEXT = {"omrl.kind": "json"}
RAW_JSON = {"omrl.kind": "raw"}
KEY = {"omrl.kind": "key"}
TEXT = {"omrl.kind": "text"}
FINITE = {"omrl.kind": "finite"}

TOOL_CALL_TYPE = pa.struct(
    [
        pa.field("id", pa.string()),
        pa.field("name", pa.string()),
        pa.field("arguments", pa.string(), metadata=RAW_JSON),  # JSON text, exactly as the model wrote it
    ]
)

MESSAGE_TYPE = pa.struct(
    [
        pa.field("role", pa.string()),
        pa.field("content", pa.string()),
        pa.field("reasoning", pa.string()),
        pa.field("tool_calls", pa.list_(TOOL_CALL_TYPE)),
        pa.field("tool_call_id", pa.string()),
        pa.field("name", pa.string()),
        pa.field("trainable", pa.bool_()),  # null: decided by role (assistant turns train)
    ]
)

TURN_TYPE = pa.struct(
    [
        pa.field("index", pa.int32()),
        pa.field("reward", pa.float64(), metadata=FINITE),
        pa.field("done", pa.bool_()),
        pa.field("latency_s", pa.float64()),
        pa.field("prompt_tokens", pa.int32()),
        pa.field("completion_tokens", pa.int32()),
        pa.field("info", pa.string(), metadata=JSON_TEXT),
        pa.field("completion_ids", pa.list_(pa.int32())),
        pa.field("logprobs", pa.list_(pa.float32())),
    ]
)

TIMESTAMP = pa.timestamp("us", tz="UTC")

TRAJECTORY_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("run_id", pa.string()),
        pa.field("round", pa.int32()),
        pa.field("task_id", pa.string(), metadata=KEY),
        pa.field("group_id", pa.string()),
        pa.field("sample", pa.int32()),
        pa.field("env", pa.string()),
        pa.field("model", pa.string()),
        pa.field("instruction", pa.string(), metadata=TEXT),
        pa.field("task", pa.string(), metadata=JSON_TEXT),  # gold answers included; never shown to the policy
        pa.field("tools", pa.string(), metadata=JSON_TEXT),  # a list of OpenAI function schemas
        pa.field("messages", pa.list_(MESSAGE_TYPE)),
        pa.field("turns", pa.list_(TURN_TYPE)),
        pa.field("reward", pa.float64(), metadata=FINITE),
        pa.field("success", pa.bool_()),
        pa.field("status", pa.string()),
        pa.field("error", pa.string()),
        pa.field("num_turns", pa.int32()),
        pa.field("prompt_tokens", pa.int64()),
        pa.field("completion_tokens", pa.int64()),
        pa.field("duration_s", pa.float64()),
        pa.field("source", pa.string()),
        pa.field("parent_id", pa.string()),
        pa.field("metadata", pa.string(), metadata=JSON_TEXT),
        pa.field("created_at", TIMESTAMP),
    ],
    metadata={"omrl.schema_version": str(SCHEMA_VERSION), "omrl.table": "trajectories"},
)

ANNOTATION_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("trajectory_id", pa.string(), nullable=False),
        pa.field("annotator", pa.string(), nullable=False),
        pa.field("kind", pa.string()),
        pa.field("score", pa.float64(), metadata=FINITE),
        pa.field("label", pa.string()),
        pa.field("rationale", pa.string()),
        pa.field("status", pa.string()),  # ok, or error: a failed judge or metric is never a score of 0
        pa.field("error", pa.string()),
        pa.field("judge_model", pa.string()),
        pa.field("rubric", pa.string()),
        pa.field("prompt_hash", pa.string()),
        pa.field("prompt_tokens", pa.int64()),
        pa.field("completion_tokens", pa.int64()),
        pa.field("cost_usd", pa.float64()),
        pa.field("run_id", pa.string()),
        pa.field("metadata", pa.string(), metadata=JSON_TEXT),
        pa.field("created_at", TIMESTAMP),
    ],
    metadata={"omrl.schema_version": str(SCHEMA_VERSION), "omrl.table": "annotations"},
)

SCHEMAS = {"trajectories": TRAJECTORY_SCHEMA, "annotations": ANNOTATION_SCHEMA}


class SchemaError(OmrlError, ValueError):
    """A record that does not fit the schema; the message names the record and the field."""


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

    def to_row(self) -> dict[str, Any]:
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

    def to_row(self) -> dict[str, Any]:
        """The Arrow row of this annotation, normalised and validated."""
        return normalize_annotation(asdict(self))


# ---------------------------------------------------------------- outcomes and the success rate
#
# Success rate = solved / episodes with a known outcome. An episode has a known outcome when its status is
# not failed (FAILED_STATUSES) and `success` is not null. Failed episodes (`failed`) and finished episodes
# whose success is unknown (`unknown_success`) are counted beside the rate, never as failures or successes,
# so episodes = known + failed + unknown_success. No known outcome: the rate is None (SQL NULL), not 0.
# `success_counts` (Python) and `SUCCESS_SQL` (DuckDB aggregates) are the only two spellings of this rule;
# stats, report, the `groups` view and eval all use them.


def is_failed(status: str | None) -> bool:
    """Whether an episode failed (env_error, policy_error, timeout); a missing status is ok."""
    return (status or "ok") in FAILED_STATUSES


@dataclass(frozen=True)
class SuccessCounts:
    """The success rate of some episodes, with what it leaves out counted beside it."""

    episodes: int = 0
    solved: int = 0
    known: int = 0  # episodes with a known outcome: not failed, success not null
    failed: int = 0  # status in FAILED_STATUSES
    unknown_success: int = 0  # not failed, success null

    @property
    def rate(self) -> float | None:
        return self.solved / self.known if self.known else None

    def as_dict(self) -> dict[str, Any]:
        """The columns shown wherever a success rate is: the rate, then what it leaves out."""
        return {"success_rate": self.rate, "failed": self.failed, "unknown_success": self.unknown_success}


def success_counts(rows: Any) -> SuccessCounts:
    """Count rows (mappings with `status` and `success`) by outcome; see the definition above."""
    episodes = solved = known = failed = 0
    for row in rows:
        episodes += 1
        if is_failed(row.get("status")):
            failed += 1
        elif row.get("success") is not None:
            known += 1
            solved += bool(row["success"])
    return SuccessCounts(episodes, solved, known, failed, episodes - known - failed)


_FAILED_SQL = "coalesce(status, 'ok') IN (" + ", ".join(f"'{s}'" for s in FAILED_STATUSES) + ")"
_KNOWN_SQL = f"(NOT ({_FAILED_SQL}) AND success IS NOT NULL)"
# Aggregate columns over a table with `status` and `success` (trajectories): the same rule in SQL, the
# same columns as SuccessCounts.as_dict (success_rate, failed, unknown_success).
SUCCESS_RATE_SQL = f"avg(CASE WHEN {_KNOWN_SQL} THEN CASE WHEN success THEN 1.0 ELSE 0.0 END END)"
SUCCESS_SQL = (f"{SUCCESS_RATE_SQL} AS success_rate, "
               f"count(*) FILTER (WHERE {_FAILED_SQL}) AS failed, "
               f"count(*) FILTER (WHERE NOT ({_FAILED_SQL}) AND success IS NULL) AS unknown_success")


def success_sql(digits: int | None = None) -> str:
    """SUCCESS_SQL, the rate rounded to `digits` when given (for display tables)."""
    if digits is None:
        return SUCCESS_SQL
    return SUCCESS_SQL.replace(f"{SUCCESS_RATE_SQL} AS", f"round({SUCCESS_RATE_SQL}, {int(digits)}) AS", 1)


# ---------------------------------------------------------------- ids


def trajectory_id(run_id: str, round: int, task_id: str, sample: int) -> str:
    """Deterministic id of a collected trajectory: a resumed run cannot write the same episode twice."""
    key = json.dumps([run_id, int(round), str(task_id), int(sample)])
    return hashlib.sha256(key.encode()).hexdigest()[:24]


def group_id(run_id: str, round: int, task_id: str) -> str:
    """The GRPO group key: all samples of one task by one run in one round."""
    key = json.dumps([run_id, int(round), str(task_id)])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def new_id() -> str:
    """A random id for rows that have no natural key."""
    import uuid

    return uuid.uuid4().hex[:24]


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


# ---------------------------------------------------------------- validation and normalisation


def _json_text(value: Any, where: str, default: str) -> str:
    """Free-form payloads are stored as JSON text; dicts and lists are serialised, text must parse."""
    if value is None:
        return default
    if type(value) is str and (value == "{}" or value == "[]"):  # most payloads are empty: no parse needed
        return value
    if isinstance(value, str):
        try:
            json.loads(value)
        except json.JSONDecodeError as exc:
            raise SchemaError(f"field '{where}' must be JSON text: {exc}") from None
        except RecursionError:
            raise SchemaError(f"field '{where}' is JSON nested too deeply to read") from None
        except ValueError as exc:  # e.g. an integer beyond Python's digit limit
            raise SchemaError(f"field '{where}' must be JSON text: {exc}") from None
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError) as exc:
        raise SchemaError(f"field '{where}' cannot be serialised to JSON: {exc}") from None
    except RecursionError:
        raise SchemaError(f"field '{where}' is nested too deeply to serialise") from None


# ---------------------------------------------------------------- the task column
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


def _short(value: Any, limit: int = 80) -> str:
    """A value for an error message, cut short: a record may hold megabytes."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _names(names: set[str], limit: int = 10) -> str:
    shown = [str(n)[:40] for n in sorted(map(str, names))[:limit]]
    return ", ".join(shown) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _text(value: Any, where: str) -> str | None:
    """A field that must be text (instruction): no number or object is turned into its repr."""
    if value is None or isinstance(value, str):
        return value
    raise SchemaError(f"field '{where}' must be a string, got {type(value).__name__}")


def _key(value: Any, where: str) -> str | None:
    """An id-like field: text, or an integer taken as its digits; never a float, bool or object."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise SchemaError(f"field '{where}' must be a string, got {type(value).__name__} {_short(value)}")


def _finite(value: Any, where: str) -> float | None:
    """A reward or score: a finite number or null (JSON's Infinity and NaN are refused, never stored)."""
    if type(value) is float and math.isfinite(value):  # the common case, without the checks below
        return value
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SchemaError(f"field '{where}' must be a number, got {_short(value)}")
    name = where.rsplit(".", 1)[-1]
    try:
        number = float(value)
    except OverflowError:
        raise SchemaError(f"field '{where}': {name} must be a finite number, got an integer too large for a float"
                          ) from None
    if not math.isfinite(number):
        raise SchemaError(f"field '{where}': {name} must be a finite number, got {number!r}")
    return number


def _opt_str(value: Any, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float, bool)):
        return str(value)
    raise SchemaError(f"field '{where}' must be a string, got {type(value).__name__}")


_INT_LIMITS = {32: 2**31, 64: 2**63}


def _opt_int(value: Any, where: str, bits: int = 32) -> int | None:
    if type(value) is int and -_INT_LIMITS[bits] <= value < _INT_LIMITS[bits]:  # the common case, checked once
        return value
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
        isinstance(value, float) and not value.is_integer()
    ):
        raise SchemaError(f"field '{where}' must be an integer, got {_short(value)}")
    value = int(value)
    if not -_INT_LIMITS[bits] <= value < _INT_LIMITS[bits]:
        raise SchemaError(f"field '{where}' must fit in {bits} bits, got {_short(value)}")
    return value


def _opt_float(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SchemaError(f"field '{where}' must be a number, got {_short(value)}")
    try:
        value = float(value)
    except OverflowError:
        raise SchemaError(f"field '{where}' must be a number that fits a float, got a huge integer") from None
    if math.isnan(value):
        return None
    return value


def _opt_bool(value: Any, where: str) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise SchemaError(f"field '{where}' must be true or false, got {_short(value)}")


def _timestamp(value: Any, where: str) -> datetime:
    if value is None:
        return utcnow()
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise SchemaError(f"field '{where}' must be an ISO-8601 time, got {_short(value)}") from None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)
    raise SchemaError(f"field '{where}' must be a timestamp, got {_short(value)}")


def _numbers(values: Any, where: str, kind: type) -> list[Any]:
    """A list of token ids (int) or logprobs (float); a bad one is named instead of failing deep in Python."""
    if not values:
        return []
    if isinstance(values, (str, bytes, dict)):  # a string would otherwise become one number per character
        raise SchemaError(f"field '{where}' must be a list of numbers, got {type(values).__name__}")
    try:
        numbers = [kind(v) for v in values]
    except (TypeError, ValueError, OverflowError):
        index, bad = next((i, v) for i, v in enumerate(values) if not _converts(kind, v))
        raise SchemaError(f"field '{where}[{index}]' must be a number, got {_short(bad)}") from None
    if kind is int:  # token ids are int32 in the schema
        for index, number in enumerate(numbers):
            if not -_INT_LIMITS[32] <= number < _INT_LIMITS[32]:
                raise SchemaError(f"field '{where}[{index}]' must fit in 32 bits, got {_short(number)}")
    return numbers


def _converts(kind: type, value: Any) -> bool:
    try:
        kind(value)
    except (TypeError, ValueError, OverflowError):
        return False
    return True


# ---------------------------------------------------------------- normalisers, derived from the Arrow schema
#
# Each table's columns are listed once, in its Arrow schema. A normaliser is built from it: a converter per
# field chosen by the Arrow type and the field's "omrl.kind" (json, raw, key, text, finite), defaults taken
# from the record dataclass (Trajectory, Message, ...). Only real rules are written by hand below (a role
# must be known, a tool call needs a name, group_id and num_turns are derived).

Converter = Callable[[Any, str], Any]


def _kind(f: pa.Field) -> str | None:
    value = (f.metadata or {}).get(b"omrl.kind")
    return value.decode() if value else None


def _defaults(record: type) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(record):
        out[f.name] = f.default if f.default is not MISSING else None  # list fields (default_factory): []
    return out


def _or_default(convert: Converter, default: Any) -> Converter:
    if default is None:
        return convert
    return lambda value, where: convert(value, where) or default


def _list_of(item: Callable[[Any, str, int], Any]) -> Converter:
    def convert(value: Any, where: str) -> list[Any]:
        if not value:
            return []
        if not isinstance(value, list):
            raise SchemaError(f"field '{where}' must be a list")
        return [item(v, where, i) for i, v in enumerate(value)]  # the item builds "where[i]" only for an error

    return convert


def _converter(f: pa.Field, default: Any) -> Converter:
    """The converter of one Arrow field: by type and "omrl.kind"; `default` replaces null (and "" or 0)."""
    dtype, kind = f.type, _kind(f)
    if pa.types.is_string(dtype):
        if kind == "json":  # JSON text: checked to parse; objects and lists serialised
            return lambda value, where: _json_text(value, where, default)
        if kind == "raw":  # text kept exactly as written (a model's tool-call arguments); objects serialised
            return lambda value, where: value if isinstance(value, str) else _json_text(value, where, default)
        check = {"key": _key, "text": _text}.get(kind or "", _opt_str)
        if default is None:  # text is the common case: taken as is without a call
            return lambda value, where: value if value.__class__ is str else check(value, where)
        return lambda value, where: (value if value.__class__ is str else check(value, where)) or default
    if pa.types.is_integer(dtype):
        bits = dtype.bit_width
        return _or_default(lambda value, where: _opt_int(value, where, bits), default)
    if pa.types.is_floating(dtype):
        return _finite if kind == "finite" else _opt_float
    if pa.types.is_boolean(dtype):
        return _opt_bool
    if pa.types.is_timestamp(dtype):
        return _timestamp
    if pa.types.is_list(dtype):
        item = dtype.value_type
        if pa.types.is_struct(item):
            return _list_of(_STRUCTS[item])
        number = int if pa.types.is_integer(item) else float
        return lambda value, where: _numbers(value, where, number)
    raise TypeError(f"no converter for {f.name}: {dtype}")  # pragma: no cover - the schemas use only these


def _kept(f: pa.Field, default: Any) -> tuple[type, ...]:
    """The classes of values the field's converter returns unchanged: those are stored without a call
    (most message fields are text or null, and a call per field was most of the normalising time)."""
    dtype, kind = f.type, _kind(f)
    if pa.types.is_string(dtype):
        if kind == "raw":
            return (str,)
        if kind in (None, "key", "text") and default is None:
            return (str, type(None))
        return ()
    if pa.types.is_floating(dtype) or (pa.types.is_integer(dtype) and default is None):
        return (type(None),)  # numbers are range- and finiteness-checked
    if pa.types.is_boolean(dtype):
        return (bool, type(None))
    return ()


def _field_converters(fields_of: Any, record: type, overrides: dict[str, Converter] | None = None
                      ) -> list[tuple[str, Converter]]:
    defaults, overrides = _defaults(record), overrides or {}
    return [(f.name, overrides.get(f.name) or _converter(f, defaults.get(f.name))) for f in fields_of]


def _field_plan(fields_of: Any, record: type, overrides: dict[str, Converter] | None = None
                ) -> list[tuple[str, Converter, tuple[type, ...]]]:
    """(name, converter, classes kept as they are) of each field; an overridden field is always converted."""
    defaults, overrides = _defaults(record), overrides or {}
    return [(name, convert, () if name in overrides else _kept(f, defaults.get(name)))
            for f, (name, convert) in zip(fields_of, _field_converters(fields_of, record, overrides), strict=True)]


def _converted(value: dict[str, Any], plan: list[tuple[str, Converter, tuple[type, ...]]]) -> dict[str, Any]:
    """`value`'s fields through the plan; the converter runs only where the value's class is not kept."""
    get, out = value.get, {}
    for name, convert, kept in plan:
        item = get(name)
        out[name] = item if type(item) in kept else convert(item, name)  # type(): a class cannot lie about it
    return out


_STRUCT_PLANS: dict[pa.DataType, list[tuple[str, Converter, tuple[type, ...]]]] = {}


def _struct(dtype: pa.StructType, record: type, what: str, overrides: dict[str, Converter] | None = None,
            prepare: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
            finish: Callable[[dict[str, Any], int], None] | None = None) -> Callable[[Any, str, int], Any]:
    """The normaliser of one struct type (a list item at `where`[`position`]): refuses a non-object,
    converts every field."""
    plan = _field_plan(dtype, record, overrides)
    _STRUCT_PLANS[dtype] = plan  # omrl.schema.arrow converts the same fields column by column

    def normalize(value: Any, where: str, position: int = 0) -> dict[str, Any]:
        if value.__class__ is not dict and not isinstance(value, dict):
            raise SchemaError(f"field '{where}[{position}]' must be {what}")
        if prepare is not None:
            value = prepare(value)
        try:  # field names only: the full path is built when a message needs it (most rows need none)
            out = _converted(value, plan)
        except SchemaError:
            for name, convert, _ in plan:  # again, so the message names the full path
                convert(value.get(name), f"{where}[{position}].{name}")
            raise
        if finish is not None:
            finish(out, position)
        return out

    return normalize


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


_STRUCTS: dict[pa.DataType, Callable[[Any, str, int], Any]] = {}
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


class NormalizedRow(dict):
    """A row as a normaliser returned it. Normalising it again (Store.append does) returns it as is, unless a
    key was set or deleted since; a change inside a nested value is not seen, so normalise a copy instead."""

    __slots__ = ("table", "changed")

    def __init__(self, values: dict[str, Any], table: str) -> None:
        super().__init__(values)
        self.table, self.changed = table, False

    def __setitem__(self, key, value):
        self.changed = True
        super().__setitem__(key, value)

    def __delitem__(self, key):
        self.changed = True
        super().__delitem__(key)

    def __ior__(self, other):
        self.changed = True
        return super().__ior__(other)

    def update(self, *args, **kwargs):
        self.changed = True
        super().update(*args, **kwargs)

    def setdefault(self, key, default=None):
        self.changed = True
        return super().setdefault(key, default)

    def pop(self, *args):
        self.changed = True
        return super().pop(*args)

    def popitem(self):
        self.changed = True
        return super().popitem()

    def clear(self):
        self.changed = True
        super().clear()


def is_normalized(row: Any, table: str = "trajectories") -> bool:
    """Whether `row` is a normaliser's output for `table`, unchanged since: it need not be checked again."""
    return type(row) is NormalizedRow and row.table == table and not row.changed


def _convert(row: dict[str, Any], plan: list[tuple[str, Converter, tuple[type, ...]]], label: str) -> dict[str, Any]:
    try:
        return _converted(row, plan)
    except SchemaError as exc:
        raise SchemaError(f"{label}: {exc}") from None


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def replace_lone_surrogates(value: Any) -> tuple[Any, int]:
    """(value, how many were replaced): every lone surrogate in its strings (dict keys too) made U+FFFD.

    Such a string is not Unicode text: Arrow cannot store it and httpx cannot send it. A model server's
    reply or an environment's observation may hold one; text from a file is refused instead (omrl.store.readers)."""
    if isinstance(value, str):
        if not _LONE_SURROGATE.search(value):
            return value, 0
        fixed = value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")  # joins pairs, fixes halves
        return fixed, len(_LONE_SURROGATE.findall(value))
    if isinstance(value, dict):
        out, total = {}, 0
        for key, item in value.items():
            key, n = replace_lone_surrogates(key)
            out[key], m = replace_lone_surrogates(item)
            total += n + m
        return (out if total else value), total
    if isinstance(value, (list, tuple)):
        items = [replace_lone_surrogates(item) for item in value]
        total = sum(n for _, n in items)
        return (type(value)(item for item, _ in items) if total else value), total
    return value, 0


def normalize_trajectory(row: dict[str, Any]) -> dict[str, Any]:
    """Check one trajectory record and return it in the exact shape of TRAJECTORY_SCHEMA.

    Raises SchemaError naming the trajectory id and the field at fault. A row this function returned
    (unchanged) is returned as is.
    """
    if is_normalized(row, "trajectories"):
        return row
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
    return NormalizedRow(out, "trajectories")


def normalize_annotation(row: dict[str, Any]) -> dict[str, Any]:
    """Check one annotation record and return it in the exact shape of ANNOTATION_SCHEMA."""
    if is_normalized(row, "annotations"):
        return row
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
    return NormalizedRow(_redacted(_convert(row, _ANNOTATION_FIELDS, label)), "annotations")


def _redacted(out: dict[str, Any]) -> dict[str, Any]:
    """A row's error and metadata without the secrets omrl knows of (an endpoint may echo a key back)."""
    from omrl.schema.redact import redact

    for name in ("error", "metadata"):
        if out.get(name):
            out[name] = redact(out[name])
    return out


NORMALIZERS = {"trajectories": normalize_trajectory, "annotations": normalize_annotation}



def conform(table: pa.Table, name: str = "trajectories") -> pa.Table:
    """Cast a table read from an older or foreign file to the current schema; missing columns become null."""
    schema = SCHEMAS[name]
    columns = []
    for f in schema:
        if f.name in table.column_names:
            col = table.column(f.name)
            columns.append(col if col.type == f.type else col.cast(f.type))
        else:
            columns.append(pa.nulls(table.num_rows, f.type))
    return pa.Table.from_arrays(columns, schema=schema)


# ---------------------------------------------------------------- JSON Schema


def _json_type(dtype: pa.DataType, nullable: bool, kind: str | None = None) -> dict[str, Any]:
    if pa.types.is_struct(dtype):
        out: dict[str, Any] = {
            "type": "object",
            "properties": {f.name: _json_type(f.type, f.nullable, _kind(f)) for f in dtype},
            "additionalProperties": False,
        }
    elif pa.types.is_list(dtype):
        out = {"type": "array", "items": _json_type(dtype.value_type, dtype.value_field.nullable)}
    elif pa.types.is_string(dtype):
        out = {"type": "string", "contentMediaType": "application/json"} if kind == "json" else {"type": "string"}
    elif pa.types.is_boolean(dtype):
        out = {"type": "boolean"}
    elif pa.types.is_integer(dtype):
        out = {"type": "integer", "x-arrow-type": str(dtype)}
    elif pa.types.is_floating(dtype):
        out = {"type": "number", "x-arrow-type": str(dtype)}
    elif pa.types.is_timestamp(dtype):
        out = {"type": "string", "format": "date-time", "x-arrow-type": str(dtype)}
    else:  # pragma: no cover - the schemas above use only the types handled here
        raise TypeError(f"no JSON Schema mapping for {dtype}")
    if nullable:
        out["type"] = [out["type"], "null"]
    return out


def json_schema(name: str = "trajectories") -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of one table, generated from its Arrow schema."""
    schema = SCHEMAS[name]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://omrl.dev/schemas/{name}.v{ROW_SCHEMA_VERSION}.json",
        "title": f"omrl {name} row, schema version {ROW_SCHEMA_VERSION}",
        "type": "object",
        "properties": {f.name: _json_type(f.type, f.nullable, _kind(f)) for f in schema},
        "required": [f.name for f in schema if not f.nullable],
        "additionalProperties": False,
    }


SCHEMA_FILES = {"trajectories": "trajectory.schema.json", "annotations": "annotation.schema.json"}
