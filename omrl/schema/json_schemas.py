"""The JSON Schema (draft 2020-12) of each table, generated from its Arrow schema."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from omrl.schema.plans import _kind
from omrl.schema.tables import ROW_SCHEMA_VERSION, SCHEMAS


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
