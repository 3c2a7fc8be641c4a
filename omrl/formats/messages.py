"""Messages in the schema's OpenAI form: built from native ones, their text found under any key, their
tool calls read and linked to their results.
"""

from __future__ import annotations

import re
from typing import Any

from omrl.formats.records import FormatError
from omrl.formats.values import arguments_text, text


def message(role: str, content: Any = None, *, reasoning: str | None = None,
            tool_calls: list[dict[str, Any]] | None = None, tool_call_id: str | None = None,
            name: str | None = None, trainable: bool | None = None, where: str = "content") -> dict[str, Any]:
    """A message dict in the schema's OpenAI form (`where` names the content in errors)."""
    return {"role": role, "content": text(content, where), "reasoning": reasoning, "tool_calls": tool_calls or [],
            "tool_call_id": tool_call_id, "name": name, "trainable": trainable}


# Private keys a converter may set on a message dict; make_row takes them off (normalize_trajectory
# refuses unknown fields): where in the record the message came from, the native keys no field took
# (kept in metadata.message_fields), text removed on purpose (reported in metadata.import.dropped), and
# the text before tool calls were parsed out of it (kept in its turn's info, as collected rows keep it).
AT, FIELDS, DROPPED, RAW_TEXT = "_at", "_fields", "_dropped", "_raw_text"
# Keys a message's text is often under when not under the mapped one; names that look like metadata.
TEXT_NAMES = ("text", "value", "output", "message", "response", "result", "observation", "body", "utterance",
              "answer", "completion", "stdout")
META_NAME = re.compile(r"(^|_)(id|ids|uuid|time|timestamp|date|created|updated|model|status|type|agent|name|"
                       r"role|index|idx)$|_(at|id|time)$", re.I)


def _has_text(value: Any) -> bool:
    if isinstance(value, str):
        return bool(value.strip())
    if isinstance(value, list):
        return any(_has_text(v.get("text") if isinstance(v, dict) else v) for v in value)
    return False


def native_text(raw: dict[str, Any], keys: tuple[str, ...], known: set[str], at: str,
                empty: bool = True) -> tuple[Any, dict[str, Any]]:
    """(a native message's text, its keys no field took) for a message read with `keys` as its text keys.

    `known`: the keys the converter maps otherwise (role, tool_calls, ...). When the text keys hold no
    text and the message would be `empty` (no calls, no reasoning), its text is looked for under other
    keys, never left behind: the one other key holding text (not named like metadata: id, timestamp, ...)
    is taken; several are a FormatError naming them. Keys nothing took are returned, to be kept in the
    metadata.
    """
    content = next((raw[k] for k in keys if raw.get(k) is not None), None)
    rest = {k: v for k, v in raw.items() if k not in known and k not in keys and v not in (None, "", [], {})}
    if empty and not _has_text(content):
        pick = [k for k, v in rest.items() if _has_text(v) and not META_NAME.search(str(k))]
        if len(pick) == 1:
            content = rest.pop(pick[0])
        elif len(pick) > 1:
            raise FormatError(f"{at}: the message's text is not under {' or '.join(repr(k) for k in keys)}, and "
                              f"several keys hold text ({', '.join(repr(k) for k in sorted(map(str, pick)))}); say "
                              "which with --content-key KEY (or `content:` in a --map file)", "text under unknown key")
    return content, rest


def tool_call(name: Any, arguments: Any, call_id: Any = None, where: str = "tool call") -> dict[str, Any]:
    if not isinstance(name, str) or not name:
        raise FormatError(f"{where}: a tool call needs a function name", "tool call without name")
    return {"id": call_id if isinstance(call_id, str) and call_id else None, "name": name,
            "arguments": arguments_text(arguments)}


def openai_tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """OpenAI `tool_calls` ([{id, type, function: {name, arguments}}]) or flat {id, name, arguments}."""
    if not calls:
        return []
    if not isinstance(calls, list):
        raise FormatError(f"{where}: tool_calls must be a list", "bad tool calls")
    out = []
    for k, call in enumerate(calls):
        if not isinstance(call, dict):
            raise FormatError(f"{where}: tool_calls[{k}] must be an object", "bad tool calls")
        fn = call.get("function") if isinstance(call.get("function"), dict) else call
        out.append(tool_call(fn.get("name"), fn.get("arguments"), call.get("id"), f"{where} tool_calls[{k}]"))
    return out


def link_tool_calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Give every tool call an id and every tool result the id of the call it answers.

    Missing call ids become `call_<message>_<k>` (stable across re-imports). A result that names only a
    function is linked to the oldest unanswered call of that name; a result naming nothing, to the oldest
    unanswered call. Results that match no call keep what they had.
    """
    pending: list[dict[str, Any]] = []  # calls not answered yet, oldest first
    for position, msg in enumerate(messages):
        for k, call in enumerate(msg["tool_calls"]):
            if not call.get("id"):
                call["id"] = f"call_{position}_{k}"
            pending.append(call)
        if msg["role"] != "tool":
            continue
        match = None
        if msg.get("tool_call_id"):
            match = next((c for c in pending if c["id"] == msg["tool_call_id"]), None)
        elif msg.get("name"):
            match = next((c for c in pending if c["name"] == msg["name"]), None)
        elif pending:
            match = pending[0]
        if match is not None:
            pending.remove(match)
            msg["tool_call_id"] = match["id"]
            msg["name"] = msg.get("name") or match["name"]
    return messages
