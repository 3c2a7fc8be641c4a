"""A declarative mapping from any JSON/JSONL/Parquet trajectory record onto the schema, without Python.

    omrl import results.jsonl --map recipes/imports/tau_bench.yaml --store s
    omrl import results.jsonl --messages-key traj --reward-key reward --store s

A mapping names, by dotted path (`info.task.instruction`, `steps.0.text`) or a list of candidate paths,
where each field of a record is: `messages` (required: a list of OpenAI {role, content, tool_calls} or
ShareGPT {from, value} messages), `reward`, `success`, `id` (the task id), `instruction`, `tools`,
`model`, `system` (a system prompt kept apart), `task` (paths copied into the task payload) and
`content` (the key, or candidate keys, of each message's text, e.g. `[content, output]`); `style`
(openai, sharegpt, auto) and `name` (env `import:<name>`). A field left out falls back to the usual keys
(reward, success/resolved, instance_id/id/task_id, tools/available_tools/functions, model). Keys the
mapping does not use go to the row's metadata, never lost; so do a message's keys (under
metadata.message_fields), and a message whose text is under a key no mapping names gets it from there,
or the import fails naming the key. The built-in openai and sharegpt formats are
mappings of the same kind.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from omrl.errors import UsageError
from omrl.formats.chat import convert_conversation, convert_messages
from omrl.formats.messages import message
from omrl.formats.records import FormatError, RecordContext
from omrl.formats.rows import MISSING, get_path, make_row, task_text
from omrl.formats.values import leftovers, require_dict
from omrl.store.readers import json_kind

FIELDS = ("messages", "reward", "success", "id", "instruction", "tools", "model", "system")
ID_KEYS = ("instance_id", "id", "task_id", "item_id", "query_id")
TOOL_KEYS = ("tools", "available_tools", "functions", "tool_definitions")
SUCCESS_KEYS = ("success", "resolved", "win")
Style = Literal["auto", "openai", "sharegpt"]  # a mapping's `style`, checked when it is loaded
Paths = str | tuple[str, ...] | None


def message_list_hint(record: dict[str, Any]) -> str:
    """Where a record's messages seem to be, as the flag that would take them."""
    lists = [k for k, v in record.items() if isinstance(v, list) and v and isinstance(v[0], dict)
             and ("role" in v[0] or "from" in v[0])]
    if lists:
        return f"; the messages look to be under '{lists[0]}': pass --messages-key {lists[0]}"
    return "; pass --messages-key KEY (or --map map.yaml) to say where they are"


@dataclass(frozen=True)
class RecordMapping:
    """Where each schema field is in a record; see the module docstring.

    A field is a dotted path (required: a record without it is an error naming it), a tuple of candidate
    paths (the first present is taken; none present is fine), or None (the usual keys). The built-in
    openai and sharegpt formats are RecordMappings too (omrl.formats.openai.MAPPING, omrl.formats.sharegpt.MAPPING).
    Loaded from YAML by `load_mapping` (omrl.config.from_dict: errors name the file and the key).
    """

    messages: str | tuple[str, ...] = field(metadata={"help": "path (or candidate paths) of the message list"})
    reward: Paths = None
    success: Paths = None
    id: Paths = None
    instruction: Paths = None
    tools: Paths = None
    model: Paths = None
    system: Paths = None  # a system prompt kept beside the messages (LLaMA-Factory): put first
    # the keys of a message's text (the first present); () = the style's usual
    content: tuple[str, ...] = field(default=(), metadata={"comma": False})
    task: tuple[str, ...] = field(default=(), metadata={"comma": False})  # paths copied into the task payload
    name: str = "mapped"
    style: Style = "auto"  # the messages' shape: openai {role, content}, sharegpt {from, value}, auto: by the first

    def __post_init__(self) -> None:
        if not self.name:
            raise UsageError("name must be text")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("name", "style") or value is None:
                continue
            paths = (value,) if isinstance(value, str) else value
            if f.name == "messages" and not paths or not all(isinstance(v, str) and v for v in paths):
                raise UsageError(f"{f.name} must be a dotted path or a list of them, not {value!r}")

    def convert(self, record: Any, ctx: RecordContext) -> dict[str, Any]:
        """One record -> a trajectory dict, by this mapping."""
        record = require_dict(record, ctx)
        # A top-level key a mapping takes is not repeated in metadata; the parent of a dotted path stays
        # there whole (it may hold more than the mapped value).
        used: set[str] = set()

        def pick(paths: Paths, defaults: tuple[str, ...], check: Any = None) -> tuple[str | None, Any]:
            required = isinstance(paths, str)
            for candidate in ((paths,) if required else paths if paths is not None else defaults):
                value = get_path(record, candidate)
                if value is MISSING or (not required and value in (None, "")):  # candidates: the first with a value
                    continue
                if check is None or check(value):
                    used.add(candidate)
                    return candidate, value
            if isinstance(paths, str):
                raise FormatError(f"{ctx.where}: the mapping's '{paths}' is not in the record "
                                  f"(keys {sorted(map(str, record))[:20]})", "missing field")
            return None, None

        candidates = (self.messages,) if isinstance(self.messages, str) else self.messages
        key, raw = next(((c, get_path(record, c)) for c in candidates if get_path(record, c) is not MISSING),
                        (None, MISSING))
        if raw is MISSING:
            shown = " or ".join(f"'{c}'" for c in candidates)
            raise FormatError(f"{ctx.where}: no {shown} key (the record has keys {sorted(map(str, record))[:20]})"
                              f"{message_list_hint(record)}", "missing messages")
        if not isinstance(raw, list) or not raw:
            raise FormatError(f"{ctx.where}: '{key}' must be a non-empty list", "empty conversation")
        used.add(key)
        first = raw[0] if isinstance(raw[0], dict) else {}
        sharegpt = self.style == "sharegpt" or (
            self.style == "auto" and ("from" in first or ("value" in first and "content" not in first)))
        text_keys = self.content or (("value", "content") if sharegpt else ("content", "text"))
        messages = (convert_conversation(raw, ctx.where, key, text_keys) if sharegpt
                    else convert_messages(raw, ctx.where, key, text_keys))
        _, system = pick(self.system, (), lambda v: isinstance(v, str) and bool(v))
        if system:
            messages.insert(0, message("system", system))
        _, reward = pick(self.reward, ("reward",))
        _, success = pick(self.success, SUCCESS_KEYS)
        _, native = pick(self.id, ID_KEYS)
        _, tools = pick(self.tools, TOOL_KEYS)
        _, model = pick(self.model, ("model",), lambda v: isinstance(v, str))
        where, instruction = pick(self.instruction, ())
        if self.instruction is None:
            instruction = task_text(record)
        if instruction is not None and not isinstance(instruction, str):
            raise FormatError(f"{ctx.where}: the instruction at '{where}' must be text, got "
                              f"{json_kind(instruction)}", "bad instruction")
        task: dict[str, Any] = {}
        for path in self.task:
            value = get_path(record, path)
            if value is not MISSING:
                task[path] = value
                used.add(path)
        return make_row(ctx, native_id=native, messages=messages, tools=tools, task=task, reward=reward,
                        success=success, model=model, instruction=instruction, metadata=leftovers(record, used))


def load_mapping(path: str | Path | None = None, **overrides: Any) -> RecordMapping:
    """A RecordMapping from a YAML file (or `shipped:imports/NAME`), with flags (`messages=...`,
    `reward=...`) overriding its keys, by omrl.config.from_dict (errors name the file and the key)."""
    from omrl.config import from_dict, read_yaml

    options = read_yaml(path) if path is not None else {}
    options.update({k: v for k, v in overrides.items() if v is not None})
    if path is None and not options.get("messages"):  # only other flags (--reward-key ...): the usual message keys
        options["messages"] = ["messages", "conversations"]
    return from_dict(RecordMapping, options, where=str(path) if path is not None else "mapping")
