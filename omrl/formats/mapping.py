"""A declarative mapping from any JSON/JSONL/Parquet trajectory record onto the schema, without Python.

    omrl import results.jsonl --map recipes/imports/tau_bench.yaml --store s
    omrl import results.jsonl --messages-key traj --reward-key reward --store s

A mapping names, by dotted path (`info.task.instruction`, `steps.0.text`), where each field of a record
is: `messages` (required: a list of OpenAI {role, content, tool_calls} or ShareGPT {from, value}
messages), `reward`, `success`, `id` (the task id), `instruction`, `tools`, `model`, and `task` (paths
copied into the task payload). A field left out falls back to the usual keys (reward, success/resolved,
instance_id/id/task_id, tools/available_tools/functions, model). Keys the mapping does not use go to the
row's metadata, never lost.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from omrl.formats.common import (
    MISSING,
    FormatError,
    RecordContext,
    get_path,
    kind_of,
    leftovers,
    make_row,
    require_dict,
    task_text,
)

FIELDS = ("messages", "reward", "success", "id", "instruction", "tools", "model")
ID_KEYS = ("instance_id", "id", "task_id", "item_id", "query_id")
TOOL_KEYS = ("tools", "available_tools", "functions", "tool_definitions")
@dataclass(frozen=True)
class Mapping:
    """Where each schema field is in a record (dotted paths); see the module docstring."""

    messages: str
    reward: str | None = None
    success: str | None = None
    id: str | None = None
    instruction: str | None = None
    tools: str | None = None
    model: str | None = None
    task: tuple[str, ...] = field(default_factory=tuple)
    name: str = "mapped"

    def convert(self, record: Any, ctx: RecordContext) -> dict[str, Any]:
        """One record -> a trajectory dict, by this mapping."""
        from omrl.formats.openai import convert_messages
        from omrl.formats.sharegpt import convert_conversation

        record = require_dict(record, ctx)
        raw = get_path(record, self.messages)
        if raw is MISSING:
            keys = sorted(map(str, record))[:20]
            raise FormatError(f"{ctx.where}: no messages at '{self.messages}' (the record has keys {keys})",
                              "missing messages")
        if not isinstance(raw, list) or not raw:
            raise FormatError(f"{ctx.where}: '{self.messages}' must be a non-empty list of messages, got "
                              f"{kind_of(raw) if raw else 'an empty one'}", "empty conversation")
        first = raw[0] if isinstance(raw[0], dict) else {}
        if "from" in first or ("value" in first and "content" not in first):
            messages = convert_conversation(raw, f"{ctx.where} {self.messages}")
        else:
            messages = convert_messages(raw, f"{ctx.where} {self.messages}", key=self.messages)
        # A top-level key a mapping takes is not repeated in metadata; the parent of a dotted path stays
        # there whole (it may hold more than the mapped value).
        used = {self.messages}

        def pick(path: str | None, defaults: tuple[str, ...]) -> Any:
            for candidate in ((path,) if path else defaults):
                value = get_path(record, candidate)
                if value is not MISSING:
                    used.add(candidate)
                    return value
            if path:
                raise FormatError(f"{ctx.where}: the mapping's '{path}' is not in the record "
                                  f"(keys {sorted(map(str, record))[:20]})", "missing field")
            return None

        reward = pick(self.reward, ("reward",))
        success = pick(self.success, ("success", "resolved", "win"))
        native = pick(self.id, ID_KEYS)
        tools = pick(self.tools, TOOL_KEYS)
        model = pick(self.model, ("model",))
        instruction = pick(self.instruction, ()) if self.instruction else task_text(record)
        if instruction is not None and not isinstance(instruction, str):
            raise FormatError(f"{ctx.where}: the instruction at '{self.instruction}' must be text, got "
                              f"{kind_of(instruction)}", "bad instruction")
        task: dict[str, Any] = {}
        for path in self.task:
            value = get_path(record, path)
            if value is not MISSING:
                task[path] = value
                used.add(path)
        return make_row(ctx, native_id=native, messages=messages, tools=tools, task=task, reward=reward,
                        success=success, model=model if isinstance(model, str) else None,
                        instruction=instruction, metadata=leftovers(record, used))


def mapping_from(options: dict[str, Any], where: str = "mapping") -> Mapping:
    """A Mapping from a dict (a YAML file's contents, or the CLI's --*-key flags); errors name the key."""
    known = {f.name for f in fields(Mapping)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise FormatError(f"{where}: unknown keys {unknown}; a mapping has {', '.join(sorted(known))}", "bad mapping")
    if not options.get("messages"):
        raise FormatError(f"{where}: 'messages' (the path of the message list) is required", "bad mapping")
    values: dict[str, Any] = {}
    for key, value in options.items():
        if value is None:
            continue
        if key == "task":
            value = [value] if isinstance(value, str) else value
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                raise FormatError(f"{where}: 'task' must be a list of paths", "bad mapping")
            value = tuple(value)
        elif not isinstance(value, str) or not value:
            raise FormatError(f"{where}: '{key}' must be a dotted path (text), got {kind_of(value)}", "bad mapping")
        values[key] = value
    return Mapping(**values)


def load_mapping(path: str | Path | None = None, **overrides: Any) -> Mapping:
    """A Mapping from a YAML file, with flags (`messages=...`, `reward=...`) overriding its keys."""
    import yaml

    options: dict[str, Any] = {}
    where = "mapping"
    if path is not None:
        path = Path(path)
        where = path.name
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f" line {mark.line + 1}" if mark is not None else ""
            raise FormatError(f"{path.name}{line}: not valid YAML", "bad mapping") from None
        except UnicodeDecodeError:
            raise FormatError(f"{path.name}: not valid UTF-8", "bad mapping") from None
        if not isinstance(loaded, dict):
            raise FormatError(f"{path.name}: a mapping file holds keys (messages: ..., reward: ...), got "
                              f"{kind_of(loaded)}", "bad mapping")
        options.update(loaded)
    options.update({k: v for k, v in overrides.items() if v is not None})
    return mapping_from(options, where)
