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

from omrl.schema.messages import tool_call_parts

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


# ---------------------------------------------------------------------------- tools described as text

# metadata["prompt_format"] of an episode whose tools went to the model as text (text_tool_messages), so the
# conversation it saw can be rebuilt from the stored one (omrl.policies.tokens_check.seen_messages).
TEXT_TOOLS_FORMAT = "text_tools"

_TOOLS_INTRO = ("You can use the tools listed below between <tools> and </tools>, one JSON schema a line. To use "
                "one, write a <tool_call> block holding a JSON object with the tool's name and its arguments, "
                "for example:\n<tool_call>\n{\"name\": \"NAME\", \"arguments\": {\"ARGUMENT\": \"VALUE\"}}\n"
                "</tool_call>\nEach tool's result comes back to you between <tool_response> and </tool_response>.")


def tools_instruction(tools: list[dict[str, Any]]) -> str:
    """The system prompt's paragraph that describes `tools` for a model served without tool support; the
    replies it asks for are what `parse_tool_calls` reads."""
    schemas = "\n".join(json.dumps(tool.get("function", tool), ensure_ascii=False) for tool in tools)
    return f"{_TOOLS_INTRO}\n<tools>\n{schemas}\n</tools>"


def text_tool_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as a model without tool support reads it: the tools described in the system message
    (one is added first when there is none), earlier calls written as <tool_call> blocks in the assistant's
    text, and tool results as user messages inside <tool_response> tags. The messages given are not changed."""
    out: list[dict[str, Any]] = []
    described = False
    for message in messages:
        role = message["role"]
        if role == "system" and not described:
            text = message.get("content") or ""
            out.append({**message, "content": f"{text}\n\n{tools_instruction(tools)}".strip()})
            described = True
        elif role == "assistant" and message.get("tool_calls"):
            blocks = "\n".join(_call_block(call) for call in message["tool_calls"])
            out.append({**message, "content": f"{message.get('content') or ''}\n{blocks}".strip(), "tool_calls": []})
        elif role == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{message.get('content') or ''}\n</tool_response>"})
        else:
            out.append(message)
    if not described:
        out.insert(0, {"role": "system", "content": tools_instruction(tools)})
    return out


def _call_block(call: dict[str, Any]) -> str:
    """One tool call, stored (flat) or live (under `function`, as the agent loop sends it), as the <tool_call>
    block a model writes; both shapes give the same block, so a stored episode rebuilds the prompt it was sent."""
    _, name, arguments = tool_call_parts(call)
    arguments = arguments or "{}"
    if isinstance(arguments, str):
        arguments = _json_or_text(arguments)
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + \
        "\n</tool_call>"


def _json_or_text(text: str) -> Any:
    """The JSON value of `text`, or the text itself when it is not JSON (malformed arguments, shown as written)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text
