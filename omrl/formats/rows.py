"""make_row: a schema-1 trajectory dict for an imported record, with an id from its content and the task
text from its fields or its first user message that is not a preamble.
"""

from __future__ import annotations

import json
import re
from typing import Any

from omrl.formats.messages import AT, DROPPED, FIELDS, RAW_TEXT, link_tool_calls
from omrl.formats.records import FormatError, RecordContext
from omrl.formats.values import as_tool_schemas, short_hash, short_repr, text
from omrl.formats.xml_calls import xml_function_calls
from omrl.schema.rows import UncheckedRow
from omrl.store.readers import json_kind

MISSING = object()
PREVIOUS_ID = "_previous_id"  # a key of make_row's dict that the importer takes out before validation
# Where records keep the task's own text (tau-bench's info.task.instruction, SWE-bench's problem_statement).
INSTRUCTION_PATHS = ("instruction", "task.instruction", "info.task.instruction", "info.instruction",
                     "problem_statement", "task.problem_statement", "query", "question", "task")


def get_path(record: Any, path: str) -> Any:
    """The value at a dotted path (`info.task.instruction`; numbers index lists); MISSING when absent.

    A key that itself contains dots is found first as is."""
    if isinstance(record, dict) and path in record:
        return record[path]
    value = record
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.lstrip("-").isdigit() and -len(value) <= int(part) < len(value):
            value = value[int(part)]
        else:
            return MISSING
    return value


def task_text(record: dict[str, Any]) -> str | None:
    """The task text a record states outside its conversation, or None."""
    for path in INSTRUCTION_PATHS:
        value = get_path(record, path)
        if isinstance(value, str) and value.strip():
            return value
    return None


ACK_LIMIT = 40  # an assistant reply this short, starting like ACK, right after a user message acknowledges a preamble
ACK = re.compile(r"^(ok|okay|sure|understood|got it|i understand|i see|yes|ready|alright|noted)\b")
PREAMBLE_MARKS = ("you have access to the following tools", "available tools:", "# tools", "<tools>",
                  "here are the tools", "you can use the following tools")


def is_preamble(messages: list[dict[str, Any]], position: int) -> bool:
    """A user message that sets the scene rather than giving the task: a tool list, or one the agent only
    acknowledged ("OK") before the real task came (ETO, OpenManus-RL, AgentTuning data)."""
    msg = messages[position]
    content = (msg["content"] or "").strip()
    if any(mark in content.lower() for mark in PREAMBLE_MARKS):
        return True
    after = messages[position + 1] if position + 1 < len(messages) else None
    later_user = any(m["role"] == "user" for m in messages[position + 1:])
    reply = (after["content"] or "").strip().lower() if after is not None else ""
    return (after is not None and after["role"] == "assistant" and not after["tool_calls"] and later_user
            and len(reply) <= ACK_LIMIT and ACK.match(reply) is not None)


def first_user_text(messages: list[dict[str, Any]]) -> str:
    """The instruction of a conversation: the first user message that is not a preamble (else the first)."""
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    for i in users:
        if not is_preamble(messages, i):
            return messages[i]["content"] or ""
    return (messages[users[0]]["content"] or "") if users else ""


def make_row(ctx: RecordContext, *, native_id: Any, messages: list[dict[str, Any]], tools: Any = None,
             task: dict[str, Any] | None = None, reward: Any = None, success: Any = None, status: str = "ok",
             error: str | None = None, model: str | None = None, metadata: dict[str, Any] | None = None,
             turns: list[UncheckedRow] | None = None, prompt_tokens: int | None = None,
             completion_tokens: int | None = None, created_at: Any = None,
             instruction: str | None = None) -> UncheckedRow:
    """A schema-1 trajectory dict for an imported record, not yet normalised (the importer adds sample and
    group_id, takes out PREVIOUS_ID, then normalises it).

    The id depends only on the record's content (ctx.digest: same data, same id, under any file name or
    format); a source's own id (instance_id, item_id, ...) is the task id, not the row id, since several
    attempts at one task share it. The run id is the file's path relative to the import root.
    instruction: the task text where the format has one; else the first user message that is not a preamble.
    """
    native = _native_id(native_id, ctx)
    task_id = native or f"{ctx.run_name}:{ctx.index}"
    messages = link_tool_calls(xml_function_calls(messages, ctx.where))
    if turns is None:  # one entry per assistant turn, as collected rows have; imported data has no per-turn reward
        positions = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        turns = [{"index": k, "done": k == len(positions) - 1} for k in range(len(positions))]
    meta = {"import": {"format": ctx.fmt, "file": ctx.rel or ctx.path.name, "index": ctx.index}}
    meta.update(metadata or {})
    _take_private_keys(messages, turns, meta)
    digest = ctx.digest or short_hash(ctx.fmt, ctx.path.name, ctx.index, native)  # no digest: called directly
    if instruction is None or not str(instruction).strip():
        instruction = first_user_text(messages)
    return {
        "id": short_hash("import", digest, n=24),
        # The id this record had before ids came from content (format, file name, index, native id): the
        # importer counts a record a store holds under that id as already there, so upgrading adds nothing twice.
        PREVIOUS_ID: short_hash("import", ctx.fmt, ctx.path.name, ctx.index, native, n=24),
        "run_id": f"import:{ctx.run_name}",
        "round": 0,
        "task_id": task_id,
        "env": f"import:{ctx.fmt}",
        "model": model or "",
        "instruction": text(instruction),
        "task": {"id": native, **(task or {})},
        "tools": as_tool_schemas(tools, ctx.where) if tools is not None else [],
        "messages": messages,
        "turns": turns,
        "reward": _number(reward, f"{ctx.where}: reward"),
        "success": _flag(success, f"{ctx.where}: success"),
        "status": status,
        "error": error,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "source": f"imported:{ctx.fmt}",
        "metadata": meta,
        "created_at": created_at,
    }


def _take_private_keys(messages: list[dict[str, Any]], turns: list[UncheckedRow], meta: dict[str, Any]) -> None:
    """Move what converters left on messages under private keys to where the row keeps it (see AT)."""
    fields, dropped = {}, []
    for drop in meta.pop(DROPPED, None) or []:  # what an importer left out whole (SWE-agent demonstrations)
        dropped.append({"at": drop["at"], "reason": drop["reason"], "chars": len(re.sub(r"\s", "", drop["text"]))})
    assistant = 0
    for position, msg in enumerate(messages):
        at = msg.pop(AT, None) or f"messages[{position}]"
        fields.update(msg.get(FIELDS) or {})  # {where in the record: the native keys no field took}
        for drop in msg.pop(DROPPED, None) or []:
            dropped.append({"at": at, "reason": drop["reason"], "chars": len(re.sub(r"\s", "", drop["text"]))})
        msg.pop(FIELDS, None)
        raw = msg.pop(RAW_TEXT, None)
        if msg["role"] == "assistant":
            if raw is not None and assistant < len(turns):
                turn = turns[assistant]
                info = turn.get("info") or {}
                info = json.loads(info) if isinstance(info, str) else dict(info)
                info.setdefault("raw_text", raw)
                turn["info"] = info
            assistant += 1
    if fields:
        meta["message_fields"] = {**meta.get("message_fields", {}), **fields}
    if dropped:
        meta["import"]["dropped"] = meta["import"].get("dropped", []) + dropped


def _native_id(value: Any, ctx: RecordContext) -> str | None:
    """A source's own id as text: strings, and integers as their digits; never the repr of an object."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise FormatError(f"{ctx.where}: the record's id must be a string or an integer, got {json_kind(value)}", "bad id")


def _number(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    raise FormatError(f"{where} must be a number, got {short_repr(value)}", "bad reward")


def _flag(value: Any, where: str) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise FormatError(f"{where} must be true or false, got {short_repr(value)}", "bad success flag")
