"""OpenAI chat messages: {"messages": [...], "tools": [...]} per record (fine-tuning files, OpenHands/SWE-Gym).

Handles `tool_calls` with arguments as JSON text or an object, legacy `function_call` messages and the
`function` role, tool results linked by `tool_call_id` or only by `name`, content given as parts, and the
fine-tuning `weight` flag (0/1 -> trainable). Native ids, `resolved`/`success`, `reward` and
`test_result` are mapped when present.
"""

from __future__ import annotations

from typing import Any

from omrl.formats.common import FormatError, RecordContext, message, openai_tool_calls, tool_call
from omrl.formats.mapping import Mapping

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
        at = f"{where} {key}[{k}]"
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


# The format is a mapping: messages under `messages`, the rest under the usual keys.
MAPPING = Mapping(messages="messages", id=ID_KEYS, tools=TOOL_KEYS, success=("resolved", "success", "win"),
                  reward=("reward",), model=("model",), task=GOLD_KEYS, name=NAME, style="openai")


def convert(record: Any, ctx: RecordContext) -> dict[str, Any]:
    """One OpenAI-messages record -> a trajectory dict."""
    return MAPPING.convert(record, ctx)
