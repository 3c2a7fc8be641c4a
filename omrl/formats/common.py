"""Shared pieces of the importers: reading records, errors naming file and record, row building, tool linking.

Every importer turns one native record into a schema-1 trajectory dict (before `normalize_trajectory`);
the helpers here keep ids, run ids, instructions and tool-call links the same across formats.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omrl.schema import SchemaError
from omrl.store import readers
from omrl.store.readers import json_kind


class FormatError(SchemaError):
    """A record that cannot be imported; `reason` is a short category for the skip summary."""

    def __init__(self, message: str, reason: str = "invalid record"):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class RecordContext:
    """Where a record came from: its format, file and position in the file.

    digest: the record's content hash (with its occurrence among identical records of the file), the
    basis of the row id; rel: the file's path relative to the import root, the basis of the run id.
    """

    fmt: str
    path: Path
    index: int
    digest: str = ""
    rel: str = ""
    keep_demos: bool = False  # keep demonstration messages (SWE-agent is_demo) as trainable=false

    @property
    def where(self) -> str:
        return f"{self.path.name} record {self.index}"

    @property
    def run_name(self) -> str:
        """The file's path relative to the import root, without its suffix: `weather/val`."""
        rel = self.rel or self.path.name
        return rel[: -len(Path(rel).suffix)] if Path(rel).suffix else rel


def record_digest(record: Any) -> str:
    """A content hash of one native record: the same data gives the same hash under any file name."""
    data = json.dumps(record, ensure_ascii=False, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(data.encode("utf-8", "surrogatepass")).hexdigest()[:32]


# A record that could not even be parsed (a broken JSONL line); converting it raises FormatError naming it.
BadRecord = readers.BadLine


# ---------------------------------------------------------------- reading files

SUFFIXES = (".json", ".jsonl", ".ndjson", ".traj", ".parquet")


def read_json_file(path: Path) -> Any:
    """The JSON document of a file; errors (FormatError) name the file and the item or line."""
    return readers.read_json(path, error=FormatError)


def read_records(path: Path) -> Iterator[tuple[int, Any]]:
    """Yield (index, record) from .jsonl, .json (a list, or one object), .traj (one object) or .parquet.

    A broken JSONL line comes as a BadRecord (so --skip-errors can count it); a file that cannot be read
    at all raises FormatError naming the file and the line, item or row group.
    """
    for record in readers.iter_records(path, allowed=SUFFIXES, error=FormatError, bad_lines="yield",
                                       single_json=True):
        yield record.index, record.value


def first_record(path: Path) -> Any:
    """The first record of a file (for format detection), or None when the file has none."""
    for _, record in read_records(path):
        return record
    return None


# ---------------------------------------------------------------- values


def text(value: Any, where: str = "content") -> str | None:
    """Message content as text: strings as is, OpenAI content parts joined, objects as JSON.

    A number or boolean (ShareGPT `"value": 5`) or a list of other parts (`[1, 2]`) is refused: turning it
    into text ("5", "12") would store something the source never wrote."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):  # [{"type": "text", "text": ...}, ...]
        parts = []
        for k, part in enumerate(value):
            if isinstance(part, dict):
                parts.append(part.get("text") if isinstance(part.get("text"), str) else json.dumps(part))
            elif isinstance(part, str):
                parts.append(part)
            else:
                raise FormatError(f"{where}[{k}]: a content part must be text or an object like "
                                  f'{{"type": "text", "text": ...}}, got {json_kind(part)}', "bad content")
        return "".join(parts)
    if not isinstance(value, dict):
        raise FormatError(f"{where} must be text, got {json_kind(value)}; quote it in the file if it is meant as "
                          "text", "bad content")
    return json.dumps(value, ensure_ascii=False)


def arguments_text(value: Any) -> str:
    """Tool-call arguments as JSON text (sources give a JSON string or an object)."""
    if value is None:
        return "{}"
    if isinstance(value, str):
        return value  # kept exactly as the model wrote it, even when it is not valid JSON
    return json.dumps(value, ensure_ascii=False)


def parse_json_text(value: Any, where: str, reason: str = "bad json") -> Any:
    """Parse a JSON string field (or return a non-string as is); errors name the field."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise FormatError(f"{where}: not valid JSON ({exc.msg})", reason) from None


def short_hash(*parts: Any, n: int = 16) -> str:
    return hashlib.sha256(json.dumps(parts, ensure_ascii=False, default=str).encode()).hexdigest()[:n]


def as_tool_schemas(tools: Any, where: str) -> list[dict[str, Any]]:
    """Tool definitions as OpenAI function-tool schemas; bare function schemas get wrapped."""
    tools = parse_json_text(tools, f"{where} tools", "bad tools") if tools is not None else []
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise FormatError(f"{where}: tools must be a list, got {type(tools).__name__}", "bad tools")
    out = []
    for tool in tools:
        if not isinstance(tool, dict):
            raise FormatError(f"{where}: each tool must be an object", "bad tools")
        if isinstance(tool.get("function"), dict):
            out.append({"type": tool.get("type", "function"), "function": tool["function"]})
        else:
            out.append({"type": "function", "function": tool})
    return out


# ---------------------------------------------------------------- messages


def message(role: str, content: Any = None, *, reasoning: str | None = None,
            tool_calls: list[dict[str, Any]] | None = None, tool_call_id: str | None = None,
            name: str | None = None, trainable: bool | None = None, where: str = "content") -> dict[str, Any]:
    """A message dict in the schema's OpenAI form (`where` names the content in errors)."""
    return {"role": role, "content": text(content, where), "reasoning": reasoning, "tool_calls": tool_calls or [],
            "tool_call_id": tool_call_id, "name": name, "trainable": trainable}


# Private keys a converter may set on a message dict; make_row takes them off (normalize_trajectory
# refuses unknown fields): where in the record the message came from, the native keys no field took
# (kept in metadata.message_fields), text removed on purpose (reported in metadata.import.dropped), and
# the text before tool calls were parsed out of it (kept in its turn's info, as collected rows keep it).
AT, FIELDS, DROPPED, RAW_TEXT = "_at", "_fields", "_dropped", "_raw_text"
# Keys a message's text is often under when not under the mapped one; names that look like metadata.
TEXT_NAMES = ("text", "value", "output", "message", "response", "result", "observation", "body", "utterance",
              "answer", "completion", "stdout")
META_NAME = re.compile(r"(^|_)(id|ids|uuid|time|timestamp|date|created|updated|model|status|type|agent|name|"
                       r"role|index|idx)$|_(at|id|time)$", re.I)


def _has_text(value: Any) -> bool:
    if isinstance(value, str):
        return bool(value.strip())
    if isinstance(value, list):
        return any(_has_text(v.get("text") if isinstance(v, dict) else v) for v in value)
    return False


def native_text(raw: dict[str, Any], keys: tuple[str, ...], known: set[str], at: str,
                empty: bool = True) -> tuple[Any, dict[str, Any]]:
    """(a native message's text, its keys no field took) for a message read with `keys` as its text keys.

    `known`: the keys the converter maps otherwise (role, tool_calls, ...). When the text keys hold no
    text and the message would be `empty` (no calls, no reasoning), its text is looked for under other
    keys, never left behind: the one other key holding text (not named like metadata: id, timestamp, ...)
    is taken; several are a FormatError naming them. Keys nothing took are returned, to be kept in the
    metadata.
    """
    content = next((raw[k] for k in keys if raw.get(k) is not None), None)
    rest = {k: v for k, v in raw.items() if k not in known and k not in keys and v not in (None, "", [], {})}
    if empty and not _has_text(content):
        pick = [k for k, v in rest.items() if _has_text(v) and not META_NAME.search(str(k))]
        if len(pick) == 1:
            content = rest.pop(pick[0])
        elif len(pick) > 1:
            raise FormatError(f"{at}: the message's text is not under {' or '.join(repr(k) for k in keys)}, and "
                              f"several keys hold text ({', '.join(repr(k) for k in sorted(map(str, pick)))}); say "
                              "which with --content-key KEY (or `content:` in a --map file)", "text under unknown key")
    return content, rest


def tool_call(name: Any, arguments: Any, call_id: Any = None, where: str = "tool call") -> dict[str, Any]:
    if not isinstance(name, str) or not name:
        raise FormatError(f"{where}: a tool call needs a function name", "tool call without name")
    return {"id": call_id if isinstance(call_id, str) and call_id else None, "name": name,
            "arguments": arguments_text(arguments)}


def openai_tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """OpenAI `tool_calls` ([{id, type, function: {name, arguments}}]) or flat {id, name, arguments}."""
    if not calls:
        return []
    if not isinstance(calls, list):
        raise FormatError(f"{where}: tool_calls must be a list", "bad tool calls")
    out = []
    for k, call in enumerate(calls):
        if not isinstance(call, dict):
            raise FormatError(f"{where}: tool_calls[{k}] must be an object", "bad tool calls")
        fn = call.get("function") if isinstance(call.get("function"), dict) else call
        out.append(tool_call(fn.get("name"), fn.get("arguments"), call.get("id"), f"{where} tool_calls[{k}]"))
    return out


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


def link_tool_calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Give every tool call an id and every tool result the id of the call it answers.

    Missing call ids become `call_<message>_<k>` (stable across re-imports). A result that names only a
    function is linked to the oldest unanswered call of that name; a result naming nothing, to the oldest
    unanswered call. Results that match no call keep what they had.
    """
    pending: list[dict[str, Any]] = []  # calls not answered yet, oldest first
    for position, msg in enumerate(messages):
        for k, call in enumerate(msg["tool_calls"]):
            if not call.get("id"):
                call["id"] = f"call_{position}_{k}"
            pending.append(call)
        if msg["role"] != "tool":
            continue
        match = None
        if msg.get("tool_call_id"):
            match = next((c for c in pending if c["id"] == msg["tool_call_id"]), None)
        elif msg.get("name"):
            match = next((c for c in pending if c["name"] == msg["name"]), None)
        elif pending:
            match = pending[0]
        if match is not None:
            pending.remove(match)
            msg["tool_call_id"] = match["id"]
            msg["name"] = msg.get("name") or match["name"]
    return messages


# ---------------------------------------------------------------- rows


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
             turns: list[dict[str, Any]] | None = None, prompt_tokens: int | None = None,
             completion_tokens: int | None = None, created_at: Any = None,
             instruction: str | None = None) -> dict[str, Any]:
    """A schema-1 trajectory dict for an imported record.

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


def _take_private_keys(messages: list[dict[str, Any]], turns: list[dict[str, Any]], meta: dict[str, Any]) -> None:
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


def short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


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


def leftovers(record: dict[str, Any], used: set[str]) -> dict[str, Any]:
    """The fields of a native record an importer did not map: they go to metadata, never lost."""
    return {k: v for k, v in record.items() if k not in used}


def object_field(value: Any, where: str, name: str) -> dict[str, Any]:
    """An optional nested object of a record ({} when absent); any other type is a FormatError naming it."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise FormatError(f"{where}: '{name}' must be an object, got {json_kind(value)}", "bad field")
    return value


def list_field(value: Any, where: str, name: str) -> list[Any]:
    """An optional list field of a record ([] when absent); any other type is a FormatError naming it."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise FormatError(f"{where}: '{name}' must be a list, got {json_kind(value)}", "bad field")
    return value


def require_dict(record: Any, ctx: RecordContext) -> dict[str, Any]:
    if isinstance(record, BadRecord):
        raise FormatError(f"{ctx.where}: {record.error}", record.reason)
    if not isinstance(record, dict):
        raise FormatError(f"{ctx.where}: expected an object, got {type(record).__name__}", "not an object")
    return record
