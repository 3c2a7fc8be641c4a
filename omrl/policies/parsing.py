"""Tool calls written as text, for models and servers that do not return native `tool_calls`.

Two formats are recognised:

    <tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>   (Qwen, Hermes)
    Action: search[red shoes]                                                         (ReAct)
    Action: calculator
    Action Input: {"expression": "2+3"}

`parse_tool_calls(text, tools)` returns the text left once the calls are taken out and the calls as
{id, name, arguments (JSON text)}. Arguments that are not valid JSON are passed on verbatim, so the
agent loop can tell the model its call was malformed instead of silently dropping it.
"""

from __future__ import annotations

import json
import re
from typing import Any

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_NAME = re.compile(r'"name"\s*:\s*"([^"]+)"')
# ReAct: "Action: name[args]" on one line, or "Action: name" followed by "Action Input: ...".
_REACT_BRACKET = re.compile(r"^\s*Action\s*:\s*([A-Za-z_][\w.\-]*)\s*\[(.*)\]\s*$", re.MULTILINE)
_REACT_NAME = re.compile(r"^\s*Action\s*:\s*([A-Za-z_][\w.\-]*)\s*$", re.MULTILINE)
_REACT_INPUT = re.compile(r"^\s*Action\s+Input\s*:\s*(.*?)(?=^\s*(?:Observation|Thought|Action)\s*:|\Z)",
                          re.MULTILINE | re.DOTALL)


def split_reasoning(text: str | None) -> tuple[str | None, str | None]:
    """Split `<think>...</think>` blocks off a reply: (content, reasoning)."""
    if not text or "<think>" not in text:
        return text, None
    reasoning = "\n".join(part.strip() for part in _THINK.findall(text)) or None
    content = _THINK.sub("", text).strip()
    return content or None, reasoning


def _first_parameter(tools: list[dict[str, Any]] | None, name: str) -> str | None:
    """The parameter a bare ReAct argument fills: the tool's first required (else first) parameter."""
    for tool in tools or []:
        fn = tool.get("function", tool)
        if fn.get("name") == name:
            params = fn.get("parameters") or {}
            required = params.get("required") or []
            props = list((params.get("properties") or {}).keys())
            if required:
                return required[0]
            return props[0] if props else None
    return None


def _arguments_text(raw: str, tools: list[dict[str, Any]] | None, name: str) -> str:
    """ReAct arguments as JSON text: a JSON object as is, plain text into the tool's first parameter."""
    raw = raw.strip()
    if not raw:
        return "{}"
    if raw.startswith("{"):
        return raw  # JSON (or malformed JSON, which the agent loop reports back to the model)
    param = _first_parameter(tools, name) or "input"
    return json.dumps({param: raw}, ensure_ascii=False)


def _call(index: int, name: str, arguments: str) -> dict[str, Any]:
    return {"id": f"call_{index}", "name": name, "arguments": arguments}


def parse_tool_calls(text: str | None, tools: list[dict[str, Any]] | None = None
                     ) -> tuple[str | None, list[dict[str, Any]]]:
    """Tool calls written in `text` (Hermes/Qwen tags first, else ReAct): (remaining text, calls)."""
    if not text:
        return text, []
    calls: list[dict[str, Any]] = []
    if "<tool_call>" in text:
        for block in _TOOL_CALL.findall(text):
            try:
                body = json.loads(block)
            except json.JSONDecodeError:
                body = None
            if isinstance(body, dict) and isinstance(body.get("name"), str):
                args = body.get("arguments", body.get("parameters", {}))
                args_text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
                calls.append(_call(len(calls), body["name"], args_text))
                continue
            # Broken JSON: keep the call if its name is readable, with the raw text as its arguments,
            # so the model is told what was wrong with it.
            name = _NAME.search(block)
            if name:
                calls.append(_call(len(calls), name.group(1), block))
        if calls:
            rest = _TOOL_CALL.sub("", text).strip()
            return rest or None, calls
    match = _REACT_BRACKET.search(text)
    if match:
        name, raw = match.group(1), match.group(2)
        rest = text[: match.start()].strip()
        return rest or None, [_call(0, name, _arguments_text(raw, tools, name))]
    match = _REACT_NAME.search(text)
    if match:
        name = match.group(1)
        after = text[match.end():]
        given = _REACT_INPUT.search(after)
        raw = given.group(1) if given else ""
        rest = text[: match.start()].strip()
        return rest or None, [_call(0, name, _arguments_text(raw, tools, name))]
    return text, []
