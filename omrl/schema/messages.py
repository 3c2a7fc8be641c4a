"""The one converter between stored messages and the messages a model sees.

Input: messages in the store's shape (omrl.schema: flat tool calls {id, name, arguments as JSON text},
`reasoning`, `trainable`) or in the agent loop's live shape (tool calls nested under `function`); both
are read the same way. Two targets, because the two consumers need different things:

- `to_openai(messages)`: the chat-completions API. Tool calls nested under `function` with `arguments`
  as JSON TEXT (what the API requires); keys the API does not know (reasoning, trainable) dropped.
  `export=True` keeps reasoning as `reasoning_content` and the trainable flag as OpenAI fine-tuning's
  `weight` (assistant turns only): the `openai` export format.
- `to_chat_template(messages)`: `tokenizer.apply_chat_template`. Tool-call `arguments` as an OBJECT:
  templates write them with `| tojson` (Qwen, Hermes, Llama 3.1), which renders an object as the JSON
  the model emits but a string as a quoted string (`"arguments": "{\\"x\\": 1}"`). Arguments that are
  not valid JSON stay text: the model wrote them, and training must see what it wrote. Reasoning
  becomes `reasoning_content` (the key Qwen3 / DeepSeek templates read); missing content becomes "".

Every path that renders a conversation for a model goes through here: the OpenAI policy, the HF policy's
prompts, the training bridge (SFT examples, TRL datasets, loss masks) and the exports, so a conversation
is tokenised the same way at inference and in training.
"""

from __future__ import annotations

import json
from typing import Any


def tool_call_parts(call: dict[str, Any]) -> tuple[str | None, str, Any]:
    """(id, name, arguments as given) of a flat or `function`-nested tool call."""
    function = call.get("function")
    fn = function if isinstance(function, dict) else call
    return call.get("id"), fn.get("name") or "", fn.get("arguments")


def arguments_text(arguments: Any) -> str:
    """Tool-call arguments as JSON text (text is kept verbatim, even when it is not valid JSON)."""
    if arguments is None or arguments == "":
        return "{}"
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, ensure_ascii=False)


def arguments_value(arguments: Any) -> Any:
    """Tool-call arguments as a JSON value; text that is not valid JSON is returned as is."""
    if not isinstance(arguments, str):
        return {} if arguments is None else arguments
    try:
        return json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return arguments


def to_openai(messages: list[dict[str, Any]], *, export: bool = False) -> list[dict[str, Any]]:
    """Messages as the chat-completions API takes them (or, with `export`, as OpenAI fine-tuning files hold them)."""
    out = []
    for m in messages:
        role = m["role"]
        msg: dict[str, Any] = {"role": role}
        calls = [{"id": cid, "type": "function", "function": {"name": name, "arguments": arguments_text(args)}}
                 for cid, name, args in map(tool_call_parts, m.get("tool_calls") or [])]
        content = m.get("content")
        if export:
            msg["content"] = content
        elif content is not None or role == "assistant":
            msg["content"] = content if content is not None or calls else ""
        if calls:
            msg["tool_calls"] = calls
        if role == "tool":
            if m.get("tool_call_id") is not None or export:
                msg["tool_call_id"] = m.get("tool_call_id")
            if m.get("name"):
                msg["name"] = m["name"]
        if export:
            if m.get("reasoning") is not None:
                msg["reasoning_content"] = m["reasoning"]
            if m.get("trainable") is not None and role == "assistant":  # OpenAI weighs assistant turns only
                msg["weight"] = int(m["trainable"])
            if m.get("name") and role != "tool":  # a participant's name (the API's `name`), kept in files
                msg["name"] = m["name"]
        out.append(msg)
    return out


def to_chat_template(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as `apply_chat_template` takes them (tool-call arguments as objects, reasoning_content)."""
    out = []
    for m in messages:
        msg: dict[str, Any] = {"role": m["role"], "content": m.get("content") or ""}
        calls = []
        for cid, name, args in map(tool_call_parts, m.get("tool_calls") or []):
            calls.append({"type": "function", "function": {"name": name, "arguments": arguments_value(args)},
                          **({"id": cid} if cid else {})})
        msg["tool_calls"] = calls
        for key in ("tool_call_id", "name"):
            if m.get(key):
                msg[key] = m[key]
        if m.get("reasoning"):
            msg["reasoning_content"] = m["reasoning"]
        out.append(msg)
    return out
