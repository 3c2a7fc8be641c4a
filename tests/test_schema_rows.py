"""The row TypedDicts (omrl.schema.rows) match the Arrow schemas (omrl.schema.tables) field by field: the same
names in the same order, `X | None` exactly where Arrow allows null, and a Python type for each Arrow type; a
column added to one and not the other fails here."""

from __future__ import annotations

import types
import typing
from datetime import datetime

import pyarrow as pa
import pytest

from omrl.schema import rows, tables

PAIRS = [
    (rows.TrajectoryRow, tables.TRAJECTORY_SCHEMA),
    (rows.AnnotationRow, tables.ANNOTATION_SCHEMA),
    (rows.MessageRow, tables.MESSAGE_TYPE),
    (rows.ToolCallRow, tables.TOOL_CALL_TYPE),
    (rows.TurnRow, tables.TURN_TYPE),
]
STRUCTS = {struct: typed for typed, struct in PAIRS if isinstance(struct, pa.StructType)}


def _optional(hint: object) -> tuple[object, bool]:
    """(the type inside, whether None is allowed) of a hint such as `str | None`."""
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        inner = [a for a in args if a is not type(None)]
        assert len(inner) == 1, f"{hint}: one type or None only"
        return inner[0], len(inner) < len(args)
    return hint, False


def _type_differs(hint: object, dtype: pa.DataType, where: str) -> list[str]:
    """What is wrong with `hint` as the Python type of Arrow `dtype` (nothing: [])."""
    if pa.types.is_struct(dtype):
        typed = STRUCTS.get(dtype)
        return [] if hint is typed else [f"{where}: {hint} is not the row type of {dtype}"]
    if pa.types.is_list(dtype):
        if typing.get_origin(hint) is not list:
            return [f"{where}: {hint} is not a list"]
        (item,) = typing.get_args(hint)  # a list never holds a null: the normaliser refuses one
        return _type_differs(item, dtype.value_type, f"{where}[]")
    python = (str if pa.types.is_string(dtype) else bool if pa.types.is_boolean(dtype)
              else int if pa.types.is_integer(dtype) else float if pa.types.is_floating(dtype)
              else datetime if pa.types.is_timestamp(dtype) else None)
    assert python is not None, f"{where}: no Python type for {dtype}"
    return [] if hint is python else [f"{where}: {hint} for Arrow {dtype} (want {python.__name__})"]


def differences(typed: type, arrow_fields: pa.Schema | pa.StructType) -> list[str]:
    """Every way the TypedDict `typed` and the Arrow fields disagree."""
    hints = typing.get_type_hints(typed)
    names = [f.name for f in arrow_fields]
    if list(hints) != names:
        return [f"{typed.__name__} keys {list(hints)} != Arrow names {names}"]
    out = []
    if typed.__required_keys__ != set(names):
        out.append(f"{typed.__name__}: every column is a key of every row (total)")
    for f in arrow_fields:
        inner, optional = _optional(hints[f.name])
        if optional != f.nullable:
            out.append(f"{typed.__name__}.{f.name}: None {'allowed' if optional else 'refused'}, "
                       f"Arrow nullable={f.nullable}")
        out += _type_differs(inner, f.type, f"{typed.__name__}.{f.name}")
    return out


@pytest.mark.parametrize("typed, arrow_fields", PAIRS, ids=[typed.__name__ for typed, _ in PAIRS])
def test_row_type_matches_the_arrow_schema(typed, arrow_fields):
    assert differences(typed, arrow_fields) == []


def test_every_struct_of_the_schemas_has_a_row_type():
    def structs(dtype: pa.DataType):
        if pa.types.is_struct(dtype):
            yield dtype
            for f in dtype:
                yield from structs(f.type)
        elif pa.types.is_list(dtype):
            yield from structs(dtype.value_type)

    found = {s for schema in tables.SCHEMAS.values() for f in schema for s in structs(f.type)}
    assert found == set(STRUCTS)


def _changed(schema: pa.Schema, index: int, field: pa.Field) -> pa.Schema:
    return schema.set(index, field)


@pytest.mark.parametrize("change", ["added", "dropped", "renamed", "retyped", "nullability", "item type"])
def test_a_schema_change_without_the_row_type_fails(change):
    schema = tables.TRAJECTORY_SCHEMA
    index = schema.get_field_index("reward")
    changed = {
        "added": lambda: schema.append(pa.field("new_column", pa.string())),
        "dropped": lambda: schema.remove(index),
        "renamed": lambda: _changed(schema, index, pa.field("score", pa.float64())),
        "retyped": lambda: _changed(schema, index, pa.field("reward", pa.string())),
        "nullability": lambda: _changed(schema, index, pa.field("reward", pa.float64(), nullable=False)),
        "item type": lambda: _changed(schema, schema.get_field_index("messages"),
                                      pa.field("messages", pa.list_(tables.TURN_TYPE))),
    }[change]()
    assert differences(rows.TrajectoryRow, changed)


def test_a_row_type_change_without_the_schema_fails():
    class Extra(rows.ToolCallRow):
        new_key: str | None

    assert differences(Extra, tables.TOOL_CALL_TYPE)
