"""ShareGPT: {"conversations": [{"from": "human"|"gpt"|..., "value": ...}], ...} (FastChat, LLaMA-Factory, ETO).

Roles: human/user -> user, gpt/ai/assistant/bot/model -> assistant, system, tool/observation/function ->
tool, function_call -> an assistant tool call (value: JSON {"name", "arguments"} or a list of them).
Per-turn flags: `loss` (true = trained), `mask` (true = masked out, not trained), `weight` (0/1).
"""

from __future__ import annotations

from typing import Any

from omrl.formats.common import FormatError, RecordContext, message, parse_json_text, tool_call
from omrl.formats.mapping import Mapping

NAME = "sharegpt"

ROLE_MAP = {
    "human": "user", "user": "user",
    "gpt": "assistant", "ai": "assistant", "assistant": "assistant", "bot": "assistant", "model": "assistant",
    "chatgpt": "assistant",
    "system": "system",
    "tool": "tool", "observation": "tool", "function": "tool", "function_response": "tool",
}
CALL_ROLES = ("function_call", "tool_call")
ID_KEYS = ("id", "item_id", "task_id", "instance_id", "idx")
TOOL_KEYS = ("tools", "available_tools", "functions", "tool_definitions")


def trainable_flag(turn: dict[str, Any]) -> bool | None:
    """The turn's training flag from `loss`, `mask` or `weight`; None when the source says nothing."""
    if turn.get("loss") is not None:
        return bool(turn["loss"])
    if turn.get("mask") is not None:
        return not bool(turn["mask"])
    if turn.get("weight") is not None:
        return bool(turn["weight"])
    return None


def convert_conversation(turns: Any, where: str, key: str = "conversations") -> list[dict[str, Any]]:
    """ShareGPT turns -> schema messages (tool results linked later by `make_row`)."""
    if not isinstance(turns, list) or not turns:
        raise FormatError(f"{where}: '{key}' must be a non-empty list", "empty conversation")
    messages: list[dict[str, Any]] = []
    for k, turn in enumerate(turns):
        at = f"{where} {key}[{k}]"
        if not isinstance(turn, dict):
            raise FormatError(f"{at}: expected an object with from/value", "bad turn")
        speaker = turn.get("from", turn.get("role"))
        value = turn.get("value", turn.get("content"))
        flag = trainable_flag(turn)
        if speaker in CALL_ROLES:
            calls = parse_json_text(value, f"{at} (function_call)", "bad function call")
            calls = calls if isinstance(calls, list) else [calls]
            parsed = []
            for j, call in enumerate(calls):
                if not isinstance(call, dict):
                    raise FormatError(f"{at}: function_call must hold {{name, arguments}}", "bad function call")
                parsed.append(tool_call(call.get("name"), call.get("arguments", call.get("parameters")),
                                        call.get("id"), f"{at} call {j}"))
            # A call right after an assistant text turn belongs to that same assistant message.
            prev = messages[-1] if messages else None
            if prev is not None and prev["role"] == "assistant" and not prev["tool_calls"]:
                prev["tool_calls"] = parsed
            else:
                messages.append(message("assistant", None, tool_calls=parsed, trainable=flag))
            continue
        role = ROLE_MAP.get(str(speaker).lower() if speaker is not None else None)
        if role is None:
            raise FormatError(f"{at}: unknown speaker {speaker!r}; expected one of {', '.join(ROLE_MAP)}",
                              "unknown role")
        reasoning = turn.get("reasoning")
        messages.append(message(role, value, name=turn.get("name"), trainable=flag,
                                reasoning=reasoning if isinstance(reasoning, str) else None))
    return messages


# The format is a mapping: turns under `conversations` (or `messages`), the rest under the usual keys.
MAPPING = Mapping(messages=("conversations", "messages"), system=("system",), id=ID_KEYS, tools=TOOL_KEYS,
                  reward=("reward",), success=("success", "resolved", "win"), model=("model",),
                  task=("answer", "ground_truth", "gold", "label"), name=NAME, style="sharegpt")


def convert(record: Any, ctx: RecordContext) -> dict[str, Any]:
    """One ShareGPT record -> a trajectory dict."""
    return MAPPING.convert(record, ctx)
