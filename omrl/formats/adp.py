"""Agent Data Protocol (ADP) standardized trajectories: {id, content: [typed actions and observations], details}.

Items by `class_`: text_observation {content, source: user|agent|environment, name}, web_observation
{html, axtree, url}, image_observation; message_action {content, description}, api_action {function,
kwargs, description}, code_action {language, content, description}. Actions are assistant messages (the
description is the reasoning); an api_action is a call of its function, a code_action a call of
`execute_<language>` with {"code": ...}; an environment observation after a call is the call's tool
result, any other observation a user message. `details` goes to metadata.

ADP *raw* files are each source dataset's own format (OpenAI messages for SWE-Gym, ShareGPT for ETO):
they import through those formats.
"""

from __future__ import annotations

import json
from typing import Any

from omrl.formats.messages import AT, FIELDS, message, tool_call
from omrl.formats.records import FormatError, RecordContext
from omrl.formats.rows import make_row
from omrl.formats.values import leftovers, require_dict

NAME = "adp"
ACTIONS = ("message_action", "api_action", "code_action")
OBSERVATIONS = ("text_observation", "web_observation", "image_observation")


# The keys of each kind of item a message takes; the rest are kept in the row's metadata.
USED = {"message_action": {"content", "description"}, "api_action": {"function", "kwargs", "id", "description"},
        "code_action": {"language", "content", "description"}, "text_observation": {"content", "source", "name"},
        "web_observation": {"source"}, "image_observation": set()}


def _observation_text(item: dict[str, Any]) -> tuple[Any, set[str]]:
    """(an observation's text, the keys it took)."""
    if item["class_"] == "text_observation":
        return item.get("content"), set()
    if item["class_"] == "web_observation":
        key = next((k for k in ("axtree", "html", "url") if item.get(k)), None)
        return (item[key], {key}) if key else (None, set())
    return json.dumps({k: v for k, v in item.items() if k != "class_"}, ensure_ascii=False, default=str), set(item)


def convert(record: Any, ctx: RecordContext) -> dict[str, Any]:
    """One ADP standardized trajectory -> a trajectory dict."""
    record = require_dict(record, ctx)
    items = record.get("content")
    if not isinstance(items, list) or not items:
        raise FormatError(f"{ctx.where}: 'content' must be a non-empty list of actions and observations",
                          "empty conversation")
    messages: list[dict[str, Any]] = []
    pending = 0  # calls not answered yet
    for k, item in enumerate(items):
        at = f"{ctx.where} content[{k}]"
        kind = item.get("class_") if isinstance(item, dict) else None
        if kind not in ACTIONS + OBSERVATIONS:
            raise FormatError(f"{at}: expected an item with class_ one of {', '.join(ACTIONS + OBSERVATIONS)}, "
                              f"got {kind!r}", "unknown item")
        description = item.get("description") if isinstance(item.get("description"), str) else None
        reasoning = description or None
        used = {"class_", *USED[kind]}
        if kind == "message_action":
            messages.append(message("assistant", item.get("content"), reasoning=reasoning))
        elif kind == "api_action":
            kwargs = item.get("kwargs") if item.get("kwargs") is not None else {}
            messages.append(message("assistant", None, reasoning=reasoning,
                                    tool_calls=[tool_call(item.get("function"), kwargs, item.get("id"), at)]))
            pending += 1
        elif kind == "code_action":
            language = item.get("language") if isinstance(item.get("language"), str) else "code"
            messages.append(message("assistant", None, reasoning=reasoning,
                                    tool_calls=[tool_call(f"execute_{language}", {"code": item.get("content")}, None, at)]))
            pending += 1
        else:
            source = item.get("source", "environment")
            observed, took = _observation_text(item)
            used |= took
            if source == "agent":
                messages.append(message("assistant", observed))
            elif source == "environment" and pending:
                messages.append(message("tool", observed))
                pending -= 1
            else:
                messages.append(message("user", observed, name=item.get("name")))
        messages[-1][AT] = f"content[{k}]"
        rest = {key: value for key, value in item.items() if key not in used and value not in (None, "", [], {})}
        if rest:
            messages[-1][FIELDS] = {f"content[{k}]": rest}
    details = record.get("details") if isinstance(record.get("details"), dict) else {}
    return make_row(ctx, native_id=record.get("id"), messages=messages, reward=details.get("reward"),
                    success=details.get("success"),
                    metadata={"details": record.get("details"), **leftovers(record, {"id", "content", "details"})})
