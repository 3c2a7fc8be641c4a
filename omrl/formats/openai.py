"""OpenAI chat messages: {"messages": [...], "tools": [...]} per record (fine-tuning files, OpenHands/SWE-Gym).

Handles `tool_calls` with arguments as JSON text or an object, legacy `function_call` messages and the
`function` role, tool results linked by `tool_call_id` or only by `name`, content given as parts, and the
fine-tuning `weight` flag (0/1 -> trainable). Native ids, `resolved`/`success`, `reward` and
`test_result` are mapped when present.
"""

from __future__ import annotations

from typing import Any

from omrl.formats.common import (
    FormatError,
    RecordContext,
    leftovers,
    make_row,
    message,
    openai_tool_calls,
    require_dict,
    task_text,
    tool_call,
)

NAME = "openai"
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "ai": "assistant",
         "tool": "tool", "function": "tool"}
ID_KEYS = ("instance_id", "id", "task_id", "item_id")
TOOL_KEYS = ("tools", "available_tools", "functions", "tool_definitions")
GOLD_KEYS = ("test_result", "answer", "ground_truth", "gold", "expected")


def convert_messages(raw: Any, where: str, key: str = "messages") -> list[dict[str, Any]]:
    """OpenAI messages -> schema messages (tool results linked later by `make_row`)."""
    if not isinstance(raw, list) or not raw:
        raise FormatError(f"{where}: '{key}' must be a non-empty list", "empty conversation")
    out = []
    for k, msg in enumerate(raw):
        at = f"{where} messages[{k}]"
        if not isinstance(msg, dict):
            raise FormatError(f"{at}: expected an object with a role", "bad message")
        role = ROLES.get(msg.get("role")) if isinstance(msg.get("role"), str) else None
        if role is None:
            raise FormatError(f"{at}: unknown role {msg.get('role')!r}", "unknown role")
        calls = openai_tool_calls(msg.get("tool_calls"), at)
        legacy = msg.get("function_call")
        if isinstance(legacy, dict):  # pre-tools API: one call per message, no id
            calls.append(tool_call(legacy.get("name"), legacy.get("arguments"), None, f"{at} function_call"))
        weight = msg.get("weight")
        trainable = msg.get("trainable", None if weight is None else bool(weight))
        reasoning = msg.get("reasoning_content", msg.get("reasoning"))
        out.append(message(role, msg.get("content", msg.get("text")), reasoning=reasoning if isinstance(reasoning, str) else None,
                           tool_calls=calls, tool_call_id=msg.get("tool_call_id"), name=msg.get("name"),
                           trainable=trainable))
    return out


def convert(record: Any, ctx: RecordContext) -> dict[str, Any]:
    """One OpenAI-messages record -> a trajectory dict."""
    record = require_dict(record, ctx)
    if "messages" not in record:
        lists = [k for k, v in record.items() if isinstance(v, list) and v and isinstance(v[0], dict)
                 and ("role" in v[0] or "from" in v[0])]
        hint = (f"; the messages look to be under '{lists[0]}': pass --messages-key {lists[0]}" if lists
                else "; pass --messages-key KEY (or --map map.yaml) to say where they are")
        raise FormatError(f"{ctx.where}: no 'messages' key (the record has keys {sorted(map(str, record))[:20]})"
                          f"{hint}", "missing messages")
    messages = convert_messages(record.get("messages"), ctx.where)
    tool_key = next((k for k in TOOL_KEYS if record.get(k) is not None), None)  # functions: legacy schemas
    tools = record[tool_key] if tool_key else None
    native = next((record[k] for k in ID_KEYS if record.get(k) not in (None, "")), None)
    gold = {k: record[k] for k in GOLD_KEYS if k in record}
    success = next((record[k] for k in ("resolved", "success", "win") if k in record), None)
    used = {"messages", *TOOL_KEYS, "reward", "resolved", "success", "win", "model", *ID_KEYS, *gold}
    return make_row(ctx, native_id=native, messages=messages, tools=tools, task=gold, reward=record.get("reward"),
                    success=success, model=record.get("model") if isinstance(record.get("model"), str) else None,
                    instruction=task_text(record), metadata=leftovers(record, used))
