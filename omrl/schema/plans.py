"""Field plans: a converter per field of an Arrow struct or schema, chosen by its type and "omrl.kind"."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, fields
from typing import Any

import pyarrow as pa

from omrl.schema.convert import (
    SchemaError,
    _finite,
    _json_text,
    _key,
    _numbers,
    _opt_bool,
    _opt_float,
    _opt_int,
    _opt_str,
    _text,
    _timestamp,
)

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


def _converted(value: Mapping[str, Any], plan: list[tuple[str, Converter, tuple[type, ...]]]) -> dict[str, Any]:
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


# The normaliser of each struct type a list column holds, registered by omrl.schema.normalise.
_STRUCTS: dict[pa.DataType, Callable[[Any, str, int], Any]] = {}
