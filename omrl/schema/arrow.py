"""Records to an Arrow table by omrl.schema's normalisers (to_table), trajectories a column at a time where it can.

The row-by-row normaliser (omrl.schema.normalise.normalize_trajectory) calls a converter per field of every message,
turn and tool call: on a big batch that cost as much as writing the rows as JSONL. Here pyarrow reads the rows
as they are, inferring each field's type in C++, and each field then gets the normaliser's own converter,
applied column by column:

- a field whose values are all of a class the converter keeps as it is (omrl.schema.plans._kept: text in most
  message fields) is taken as read;
- any other field's converter runs once per distinct value (a system prompt, a status, "{}" info: a few
  calls per batch), so its checks, defaults and conversions are the normaliser's exactly;
- what the normaliser derives (a missing turn index, num_turns, group_id) and the redaction of error and
  metadata are done as it does them.

Whatever this path cannot prove the normaliser would treat the same makes it give up (None): an inferred type
other than the one the field's converter would see (an integer where text belongs, bytes, a mix pyarrow
reconciles on its own), a null message, a tool call in OpenAI's nested form, a value a converter refuses,
rows some of which a normaliser returned already. The row-by-row normaliser then runs, so every error a user
sees, and every conversion of odd input, is its own. What pyarrow takes for what it is that Python does not:
numpy scalars and tuples are read as the numbers and lists they hold.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from omrl.schema.convert import SchemaError
from omrl.schema.ids import group_id
from omrl.schema.normalise import _TRAJECTORY_FIELDS, _TRAJECTORY_NAMES, NORMALIZERS
from omrl.schema.plans import _STRUCT_PLANS, Converter
from omrl.schema.rows import UncheckedRow
from omrl.schema.tables import SCHEMAS, STATUSES, TOOL_CALL_TYPE, TRAJECTORY_SCHEMA, TURN_TYPE

# Inferred types whose values reach a converter as the Python values the row held, by target type.
_READS_AS = {
    "string": (pa.string(), pa.null()),
    "integer": (pa.int64(), pa.float64(), pa.null()),  # a float column's 3.0 is what _opt_int turns into 3
    "floating": (pa.float64(), pa.int64(), pa.null()),
    "boolean": (pa.bool_(), pa.null()),
}
# Float fields of rows and turns: pyarrow reads True after a float as 1.0, which the normaliser refuses.
_FLOAT_FIELDS = tuple(f.name for f in TRAJECTORY_SCHEMA if pa.types.is_floating(f.type))
_TURN_FLOAT_FIELDS = tuple(f.name for f in TURN_TYPE if pa.types.is_floating(f.type))
_ERRORS = (pa.ArrowException, SchemaError, TypeError, ValueError, OverflowError, UnicodeError, RecursionError,
           AttributeError, KeyError, IndexError)


def to_table(rows: Sequence[UncheckedRow], table: str = "trajectories") -> pa.Table:
    """Validate records and build an Arrow table with the explicit schema (never inferred types).

    Rows a normaliser already returned (and nobody changed since) are not checked again: rows are
    normalised once on their way into the store.
    """
    if table == "trajectories":
        fast = trajectories_table(rows)  # column by column, the same rules; None where rows need the normaliser
        if fast is not None:
            return fast
    normalize = NORMALIZERS[table]
    with _collector_paused():
        normalized = [normalize(r) for r in rows]
    return pa.Table.from_pylist(normalized, schema=SCHEMAS[table])


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cycle collector off for a block that builds many small acyclic containers.

    Normalising a batch makes a few dicts per message; each young-generation collection walks them all
    again, about 40% of the time on a 4,000-row batch (benchmarks/store_bench.py). Nothing built here
    holds a cycle, so nothing is left for the collector; it is switched back on as it was.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class _GiveUp(Exception):
    """This batch takes the row-by-row normaliser."""


def trajectories_table(rows: Sequence[Any]) -> pa.Table | None:
    """The table `to_table(rows)` returns, built column by column; None where the normaliser must decide."""
    if not rows:
        return None
    try:
        if any(type(row) is not dict for row in rows) or _bool_in_floats(rows):
            return None  # NormalizedRow batches take to_table's own path; a bool among floats is refused there
        inferred = pa.array(rows)
        if not isinstance(inferred, pa.StructArray) or inferred.null_count:
            return None
        return _trajectories(inferred)
    except (_GiveUp, *_ERRORS):
        return None


def _bool_in_floats(rows: Sequence[UncheckedRow]) -> bool:
    """Whether a float field of a row or turn holds a bool (pyarrow would read it as 1.0 after a float)."""
    for row in rows:
        if any(type(row.get(name)) is bool for name in _FLOAT_FIELDS):
            return True
        turns = row.get("turns")
        if type(turns) is list and any(type(turn) is dict and any(type(turn.get(name)) is bool
                                                                  for name in _TURN_FLOAT_FIELDS)
                                       for turn in turns):
            return True
    return False


def _child(array: pa.StructArray, name: str) -> pa.Array:
    index = array.type.get_field_index(name)
    return array.field(index) if index >= 0 else pa.nulls(len(array))


def _trajectories(rows: pa.StructArray) -> pa.Table:
    names = {f.name for f in rows.type}
    if names - _TRAJECTORY_NAMES:
        raise _GiveUp  # unknown fields: the normaliser names them
    # The row checks normalize_trajectory makes before converting.
    for name in ("id", "task_id"):
        column = _child(rows, name)
        if column.type != pa.string() or column.null_count or pc.any(pc.equal(column, "")).as_py():
            raise _GiveUp
    status = _child(rows, "status")
    if status.type not in _READS_AS["string"]:
        raise _GiveUp
    filled = pc.fill_null(pc.if_else(pc.equal(status, ""), pa.scalar(None, pa.string()), status), "ok")
    if not pc.all(pc.is_in(filled, pa.array(STATUSES))).as_py():
        raise _GiveUp
    columns = {}
    for f, (name, convert, kept) in zip(TRAJECTORY_SCHEMA, _TRAJECTORY_FIELDS, strict=True):
        columns[name] = _column(_child(rows, name), f, convert, kept)
    from omrl.schema.redact import redact  # as _redacted: the secrets known now

    for name in ("error", "metadata"):
        columns[name] = _per_value(columns[name], lambda value, where: redact(value) if value else value, name,
                                   pa.string())
    columns["num_turns"] = _num_turns(columns["num_turns"], columns["messages"])
    columns["group_id"] = _group_ids(columns)
    return pa.Table.from_arrays([columns[f.name] for f in TRAJECTORY_SCHEMA], schema=TRAJECTORY_SCHEMA)


def _column(values: pa.Array, f: pa.Field, convert: Converter, kept: tuple[type, ...]) -> pa.Array:
    """One field of every row (or item) through its converter, as the normaliser would convert it."""
    target = f.type
    if pa.types.is_list(target):
        if pa.types.is_struct(target.value_type):
            return _struct_list(values, target)
        return _number_list(values, target)
    if pa.types.is_timestamp(target):
        if not (values.type in (pa.string(), pa.null()) or pa.types.is_timestamp(values.type)):
            raise _GiveUp
        return _per_value(values, convert, f.name, target)
    family = next((k for k, test in (("string", pa.types.is_string), ("integer", pa.types.is_integer),
                                     ("floating", pa.types.is_floating), ("boolean", pa.types.is_boolean))
                   if test(target)), None)
    if family is None or values.type not in _READS_AS[family]:
        raise _GiveUp
    if family == "string" and str in kept:  # text kept as it is; nulls too where the converter keeps them
        values = values.cast(target)
        if values.null_count and type(None) not in kept:
            return pc.fill_null(values, convert(None, f.name)) if convert(None, f.name) is not None else values
        return values
    if family == "boolean" and bool in kept and type(None) in kept:
        return values.cast(target)
    return _per_value(values, convert, f.name, target)


def _per_value(values: pa.Array, convert: Callable[[Any, str], Any], name: str, target: pa.DataType) -> pa.Array:
    """`convert` applied once per distinct value (and once to null), spread back over the rows."""
    if values.type == pa.null():
        return pa.array([convert(None, name)], target).take(pa.array(np.zeros(len(values), dtype=np.int32)))
    encoded = pc.dictionary_encode(values)
    converted = pa.array([convert(value, name) for value in encoded.dictionary.to_pylist()], target)
    out = converted.take(encoded.indices)
    if encoded.indices.null_count:
        missing = convert(None, name)
        if missing is not None:
            out = pc.fill_null(out, pa.scalar(missing, target))
    return out


def _list_parts(values: pa.Array, target: pa.ListType) -> tuple[np.ndarray, pa.Array | None]:
    """(offsets of each row's items, null and empty lists both empty; the items), None items for no list type."""
    if values.type == pa.null():
        return np.zeros(len(values) + 1, dtype=np.int32), None
    if not pa.types.is_list(values.type):
        raise _GiveUp  # a non-list the normaliser refuses (or a large list: not from rows this size)
    lengths = pc.fill_null(pc.list_value_length(values), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    if offsets[-1] >= 2**31:
        raise _GiveUp
    return offsets.astype(np.int32), values.flatten()


def _struct_list(values: pa.Array, target: pa.ListType) -> pa.Array:
    """A list<struct> field (messages, turns, tool calls): None and [] are [], each item converted."""
    offsets, items = _list_parts(values, target)
    item_type = target.value_type
    if items is None or items.type == pa.null():
        if items is not None and len(items):
            raise _GiveUp  # null items: the normaliser refuses them
        items = pa.array([], item_type)
    else:
        if not pa.types.is_struct(items.type) or items.null_count:
            raise _GiveUp
        items = _struct_items(items, item_type, offsets)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), items, type=target)


def _struct_items(items: pa.StructArray, item_type: pa.StructType, offsets: np.ndarray) -> pa.StructArray:
    present = {f.name for f in items.type}
    if item_type == TOOL_CALL_TYPE and "function" in present:
        raise _GiveUp  # OpenAI's nested form: the normaliser's `prepare` unpacks it
    flat = dict(zip((f.name for f in items.type), items.flatten(), strict=True))  # unknown keys: ignored, as there
    children = []
    for f, (name, convert, kept) in zip(item_type, _STRUCT_PLANS[item_type], strict=True):
        child = flat.get(name, pa.nulls(len(items)))
        children.append(_column(child, f, convert, kept))
    if item_type == TURN_TYPE:  # _turn_index: a turn without an index gets its position
        at = item_type.get_field_index("index")
        index = children[at]
        if index.null_count:
            lengths = np.diff(offsets)
            position = np.arange(len(items), dtype=np.int64) - np.repeat(offsets[:-1].astype(np.int64), lengths)
            children[at] = pc.if_else(pc.is_null(index), pa.array(position, pa.int32()), index)
    return pa.StructArray.from_arrays(children, fields=list(item_type))


def _number_list(values: pa.Array, target: pa.ListType) -> pa.Array:
    """Token ids or logprobs: None and [] are [], numbers cast (an int out of int32 range gives up)."""
    offsets, items = _list_parts(values, target)
    allowed = _READS_AS["integer"][:1] if pa.types.is_integer(target.value_type) else _READS_AS["floating"][:2]
    if items is None or items.type == pa.null():
        if items is not None and len(items):
            raise _GiveUp
        items = pa.array([], target.value_type)
    elif items.type not in allowed or items.null_count:
        raise _GiveUp
    else:
        items = items.cast(target.value_type)  # safe cast: ids out of int32 range raise
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), items, type=target)


def _num_turns(given: pa.Array, messages: pa.ListArray) -> pa.Array:
    """num_turns where the row gave none: its assistant messages, counted."""
    if not given.null_count:
        return given
    roles = pc.struct_field(messages.flatten(), "role")
    lengths = pc.list_value_length(messages).to_numpy(zero_copy_only=False).astype(np.int64)
    parents = np.repeat(np.arange(len(messages)), lengths)
    assistant = pc.equal(roles, "assistant").to_numpy(zero_copy_only=False)
    counts = np.bincount(parents, weights=assistant, minlength=len(messages)).astype(np.int32)
    return pc.if_else(pc.is_null(given), pa.array(counts, pa.int32()), given)


def _group_ids(columns: dict[str, pa.Array]) -> pa.Array:
    """group_id where the row gave none: schema.group_id of its run, round and task."""
    given = columns["group_id"]
    if not given.null_count:
        return given
    missing = np.flatnonzero(given.is_null().to_numpy(zero_copy_only=False))
    picked = [columns[name].take(pa.array(missing)).to_pylist() for name in ("run_id", "round", "task_id")]
    values = given.to_pylist()
    for i, run_id, round_, task_id in zip(missing.tolist(), *picked, strict=True):
        values[i] = group_id(run_id, round_, task_id)
    return pa.array(values, pa.string())
