"""OpenHands' text form of tool calls (<function=NAME> blocks in assistant text) turned into tool calls,
and their "EXECUTION RESULT" messages into tool results.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from omrl.formats.messages import AT, DROPPED, RAW_TEXT, tool_call
from omrl.formats.records import FormatError

# OpenHands' text form of tool calls (models without native function calling): in assistant text,
#   <function=str_replace_editor>\n<parameter=command>view</parameter>\n<parameter=path>/a.py</parameter>\n</function>
# with the result in the next user message, "EXECUTION RESULT of [str_replace_editor]:\n...".
# A name stops at "<" (no tool name holds one): each opener's name scan then ends at the next tag at the
# latest, so text full of unclosed openers is scanned once, not once per opener.
XML_FUNCTION = re.compile(r"<function=([^<>\s]+)>")
XML_PARAMETER = re.compile(r"<parameter=([^<>\s]+)>")
XML_RESULT = re.compile(r"^\s*EXECUTION RESULT of \[([^\]]+)\]:\s*\n?", re.S)
# The most text of one assistant message searched for calls: far above any model's reply (about a million
# tokens); a record past it is refused, naming it, rather than parsed.
XML_TEXT_LIMIT = 4 * 2**20


def xml_blocks(text: str, opener: re.Pattern[str], closer: str) -> Iterator[tuple[str, str, int, int]]:
    """(name, body, start, end) of each `<tag=NAME>body</tag>` in `text`, in one pass over it.

    The same blocks as the non-greedy `<tag=NAME>(.*?)</tag>`: a body ends at the first closer after its
    opener, and an opener with no closer after it is plain text."""
    last = text.rfind(closer)  # an opener must end before the last closer: no rescans for hopeless ones
    position = 0
    while (found := opener.search(text, position, max(last, 0))) is not None:
        end = text.find(closer, found.end())
        yield found.group(1), text[found.end():end], found.start(), end + len(closer)
        position = end + len(closer)


def _param_value(raw: str) -> str:
    """A parameter's text without the one newline OpenHands puts after the opening and before the closing tag."""
    raw = raw[1:] if raw.startswith("\n") else raw
    return raw[:-1] if raw.endswith("\n") else raw


def _xml_calls(content: str, where: str) -> tuple[list[dict[str, Any]], str]:
    """(the calls of an assistant text, the text outside them); time and memory linear in the text."""
    if len(content) > XML_TEXT_LIMIT:
        raise FormatError(f"{where}: an assistant message of {len(content):,} characters holds <function=...> "
                          f"markup; tool calls are parsed from at most {XML_TEXT_LIMIT:,}", "message too long")
    calls, outside, position = [], [], 0
    for name, body, start, end in xml_blocks(content, XML_FUNCTION, "</function>"):
        arguments = {key: _param_value(value) for key, value, _, _ in xml_blocks(body, XML_PARAMETER, "</parameter>")}
        calls.append(tool_call(name, arguments))
        outside.append(content[position:start])
        position = end
    outside.append(content[position:])
    return calls, "".join(outside)


def xml_function_calls(messages: list[dict[str, Any]], where: str = "") -> list[dict[str, Any]]:
    """Turn OpenHands XML function calls in assistant text into tool calls, and their results into tool messages.

    The assistant keeps the text outside the <function=...> blocks; each block becomes a call whose arguments
    are its parameters (as JSON). A user message right after that starts "EXECUTION RESULT of [name]:" is the
    result: it becomes a tool message (without that header) answering the call. Linear in the text; a message
    past XML_TEXT_LIMIT is a FormatError naming `where` (the record) and the message.
    """
    expecting = False
    for position, msg in enumerate(messages):
        content = msg["content"]
        if msg["role"] == "assistant" and not msg["tool_calls"] and content and "<function=" in content:
            calls, rest = _xml_calls(content, f"{where} {msg.get(AT) or f'messages[{position}]'}".lstrip())
            if calls:
                msg["tool_calls"] = calls
                msg["content"] = rest.strip() or None
                msg[RAW_TEXT] = content  # what the model wrote, markup and all
                expecting = True
                continue
        header = XML_RESULT.match(content) if expecting and msg["role"] == "user" and content else None
        if header is not None:
            msg["role"], msg["name"], msg["content"] = "tool", header.group(1), content[header.end():]
            msg.setdefault(DROPPED, []).append({"reason": "OpenHands result header", "text": header.group(0)})
            continue
        expecting = False
    return messages
