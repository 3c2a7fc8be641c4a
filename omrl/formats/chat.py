"""Message lists of the two chat shapes that formats and mappings share: OpenAI {role, content, tool_calls}
and ShareGPT {from, value}. One module, so the formats and `mapping` import it and not each other."""

from __future__ import annotations

from typing import Any

from omrl.formats.messages import AT, FIELDS, message, native_text, openai_tool_calls, tool_call
from omrl.formats.records import FormatError
from omrl.formats.values import parse_json_text

# OpenAI roles -> schema roles
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "ai": "assistant",
         "tool": "tool", "function": "tool"}

# ShareGPT speakers -> schema roles
ROLE_MAP = {
    "human": "user", "user": "user",
    "gpt": "assistant", "ai": "assistant", "assistant": "assistant", "bot": "assistant", "model": "assistant",
    "chatgpt": "assistant",
    "system": "system",
    "tool": "tool", "observation": "tool", "function": "tool", "function_response": "tool",
}
CALL_ROLES = ("function_call", "tool_call")


OPENAI_KEYS = {"role", "tool_calls", "function_call", "tool_call_id", "name", "weight", "trainable",
               "reasoning_content", "reasoning"}
SHAREGPT_KEYS = {"from", "role", "loss", "mask", "weight", "name", "reasoning"}


def convert_messages(raw: Any, where: str, key: str = "messages",
                     content_keys: tuple[str, ...] = ("content", "text")) -> list[dict[str, Any]]:
    """OpenAI messages -> schema messages (tool results linked later by `make_row`).

    content_keys: where a message's text is (the first present); text under other keys is found or
    refused by `native_text`, and a message's other keys are kept in the row's metadata."""
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
        reasoning = reasoning if isinstance(reasoning, str) else None
        content, rest = native_text(msg, content_keys, OPENAI_KEYS, at, empty=not calls and not reasoning)
        out.append(message(role, content, reasoning=reasoning, tool_calls=calls, tool_call_id=msg.get("tool_call_id"),
                           name=msg.get("name"), trainable=trainable, where=f"{at} content"))
        out[-1][AT] = f"{key}[{k}]"
        if rest:
            out[-1][FIELDS] = {f"{key}[{k}]": rest}
    return out


def trainable_flag(entry: dict[str, Any]) -> bool | None:
    """A conversation entry's (a ShareGPT turn's) training flag from `loss`, `mask` or `weight`; None when the
    source says nothing."""
    if entry.get("loss") is not None:
        return bool(entry["loss"])
    if entry.get("mask") is not None:
        return not bool(entry["mask"])
    if entry.get("weight") is not None:
        return bool(entry["weight"])
    return None


def convert_conversation(turns: Any, where: str, key: str = "conversations",
                         content_keys: tuple[str, ...] = ("value", "content")) -> list[dict[str, Any]]:
    """ShareGPT turns -> schema messages (tool results linked later by `make_row`); text keys as in
    `convert_messages`."""
    if not isinstance(turns, list) or not turns:
        raise FormatError(f"{where}: '{key}' must be a non-empty list", "empty conversation")
    messages: list[dict[str, Any]] = []
    for k, turn in enumerate(turns):
        at = f"{where} {key}[{k}]"
        if not isinstance(turn, dict):
            raise FormatError(f"{at}: expected an object with from/value", "bad turn")
        speaker = turn.get("from", turn.get("role"))
        reasoning = turn.get("reasoning")
        reasoning = reasoning if isinstance(reasoning, str) else None
        value, rest = native_text(turn, content_keys, SHAREGPT_KEYS, at, empty=not reasoning)
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
                messages[-1][AT] = f"{key}[{k}]"
            if rest:  # a call turn's other keys: kept under its own place in the record
                messages[-1].setdefault(FIELDS, {})[f"{key}[{k}]"] = rest
            continue
        role = ROLE_MAP.get(str(speaker).lower() if speaker is not None else None)
        if role is None:
            raise FormatError(f"{at}: unknown speaker {speaker!r}; expected one of {', '.join(ROLE_MAP)}",
                              "unknown role")
        messages.append(message(role, value, name=turn.get("name"), trainable=flag, reasoning=reasoning,
                                where=f"{at} value"))
        messages[-1][AT] = f"{key}[{k}]"
        if rest:
            messages[-1][FIELDS] = {f"{key}[{k}]": rest}
    return messages
