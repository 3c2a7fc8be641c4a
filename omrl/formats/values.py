"""Field values of native records as the schema wants them: text, JSON, tool schemas, typed fields;
what cannot be converted is a FormatError naming the field.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from omrl.formats.records import BadRecord, FormatError, RecordContext
from omrl.store.readers import json_kind


def text(value: Any, where: str = "content") -> str | None:
    """Message content as text: strings as is, OpenAI content parts joined, objects as JSON.

    A number or boolean (ShareGPT `"value": 5`) or a list of other parts (`[1, 2]`) is refused: turning it
    into text ("5", "12") would store something the source never wrote."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):  # [{"type": "text", "text": ...}, ...]
        parts = []
        for k, part in enumerate(value):
            if isinstance(part, dict):
                parts.append(part.get("text") if isinstance(part.get("text"), str) else json.dumps(part))
            elif isinstance(part, str):
                parts.append(part)
            else:
                raise FormatError(f"{where}[{k}]: a content part must be text or an object like "
                                  f'{{"type": "text", "text": ...}}, got {json_kind(part)}', "bad content")
        return "".join(parts)
    if not isinstance(value, dict):
        raise FormatError(f"{where} must be text, got {json_kind(value)}; quote it in the file if it is meant as "
                          "text", "bad content")
    return json.dumps(value, ensure_ascii=False)


def arguments_text(value: Any) -> str:
    """Tool-call arguments as JSON text (sources give a JSON string or an object)."""
    if value is None:
        return "{}"
    if isinstance(value, str):
        return value  # kept exactly as the model wrote it, even when it is not valid JSON
    return json.dumps(value, ensure_ascii=False)


def parse_json_text(value: Any, where: str, reason: str = "bad json") -> Any:
    """Parse a JSON string field (or return a non-string as is); errors name the field."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise FormatError(f"{where}: not valid JSON ({exc.msg})", reason) from None


def short_hash(*parts: Any, n: int = 16) -> str:
    return hashlib.sha256(json.dumps(parts, ensure_ascii=False, default=str).encode()).hexdigest()[:n]


def as_tool_schemas(tools: Any, where: str) -> list[dict[str, Any]]:
    """Tool definitions as OpenAI function-tool schemas; bare function schemas get wrapped."""
    tools = parse_json_text(tools, f"{where} tools", "bad tools") if tools is not None else []
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise FormatError(f"{where}: tools must be a list, got {type(tools).__name__}", "bad tools")
    out = []
    for tool in tools:
        if not isinstance(tool, dict):
            raise FormatError(f"{where}: each tool must be an object", "bad tools")
        if isinstance(tool.get("function"), dict):
            out.append({"type": tool.get("type", "function"), "function": tool["function"]})
        else:
            out.append({"type": "function", "function": tool})
    return out


def short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def leftovers(record: dict[str, Any], used: set[str]) -> dict[str, Any]:
    """The fields of a native record an importer did not map: they go to metadata, never lost."""
    return {k: v for k, v in record.items() if k not in used}


def object_field(value: Any, where: str, name: str) -> dict[str, Any]:
    """An optional nested object of a record ({} when absent); any other type is a FormatError naming it."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise FormatError(f"{where}: '{name}' must be an object, got {json_kind(value)}", "bad field")
    return value


def list_field(value: Any, where: str, name: str) -> list[Any]:
    """An optional list field of a record ([] when absent); any other type is a FormatError naming it."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise FormatError(f"{where}: '{name}' must be a list, got {json_kind(value)}", "bad field")
    return value


def require_dict(record: Any, ctx: RecordContext) -> dict[str, Any]:
    if isinstance(record, BadRecord):
        raise FormatError(f"{ctx.where}: {record.error}", record.reason)
    if not isinstance(record, dict):
        raise FormatError(f"{ctx.where}: expected an object, got {type(record).__name__}", "not an object")
    return record
