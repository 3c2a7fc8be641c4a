"""Task rows: the task-file schema, the column mapping, and the checks every task row passes.

Shared by plain and benchmark conversion (omrl.tasks, omrl.tasks.benchmarks) and by loading task files.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from omrl.errors import OmrlError
from omrl.store.readers import json_kind

TASK_SCHEMA = pa.schema([
    pa.field("id", pa.string(), nullable=False),
    pa.field("instruction", pa.string(), nullable=False),
    pa.field("answer", pa.string()),
    pa.field("env", pa.string()),
    pa.field("split", pa.string()),
    pa.field("payload", pa.string()),
])
TASK_COLUMNS = [f.name for f in TASK_SCHEMA]


class TaskError(OmrlError, ValueError):
    """A task dataset that cannot be imported; the message names the row and the field."""


@dataclass
class TaskMapping:
    """Which source columns hold id/instruction/answer; env and split are constants (or taken from columns
    named env/split when not given). From YAML: `load_task_mapping`."""

    id: str | None = field(default=None, metadata={"help": "the id column"})
    instruction: str | None = field(default=None, metadata={"help": "the instruction column"})
    answer: str | None = field(default=None, metadata={"help": "the answer column"})
    env: str | None = field(default=None, metadata={"help": "the environment of every task"})
    split: str | None = field(default=None, metadata={"help": "the split of every task"})
    format: str = field(default="auto", metadata={"help": "plain, a benchmark name, or auto"})
    id_prefix: str | None = field(default=None, metadata={"help": "put before every id"})
    source: str | None = field(default=None, metadata={
        "help": "SWE-bench rows: a folder holding one checkout per instance_id"})

    def __post_init__(self) -> None:
        check_env_name(self.env)


def load_task_mapping(path: str | Path, **overrides: Any) -> TaskMapping:
    """A YAML mapping file (keys: TaskMapping's fields), flags overriding it, by omrl.config.from_dict
    (errors name the file and the key)."""
    from omrl.config import from_dict, read_yaml

    data = {**read_yaml(path), **{k: v for k, v in overrides.items() if v is not None}}
    return from_dict(TaskMapping, data, where=str(path))


def check_env_name(env: str | None) -> None:
    """Refuse an environment that is neither built in nor a package.module:Class path (a typo otherwise
    surfaces only when the tasks are collected)."""
    from omrl.envs import known_names

    if env is not None and ":" not in env and env not in known_names():
        raise TaskError(f"unknown environment {env!r}; known: {', '.join(known_names())}, "
                        "or give package.module:ClassName")


def task_record(row_id: Any, instruction: Any, answer: Any, env: Any, split: Any,
                payload: dict[str, Any]) -> dict[str, Any]:
    """A task row not yet checked: id, instruction, env and split stay as given until `validate_row` checks
    their types."""
    try:
        payload_text = json.dumps(payload, ensure_ascii=False, default=str)
    except (RecursionError, ValueError):
        payload_text = None  # refused by validate_row, which knows the row
    # A non-finite number is kept as is for validate_row to refuse: "nan" is not an answer.
    answer = answer if _non_finite(answer) else answer_text(answer)
    return {"id": row_id, "instruction": instruction, "answer": answer, "env": env, "split": split,
            "payload": payload_text}


def _non_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def answer_text(answer: Any) -> str | None:
    if answer is None:
        return None
    if isinstance(answer, (list, dict)):
        try:
            return json.dumps(answer, ensure_ascii=False, default=str)
        except (RecursionError, ValueError):
            return None
    return str(answer)


def env_split(record: Mapping[str, Any], mapping: TaskMapping, default_env: str | None) -> tuple[Any, Any]:
    """A source record's env and split: the mapping's, else its own columns, else the defaults."""
    env = mapping.env or record.get("env") or default_env
    split = mapping.split or record.get("split") or "train"
    return env, split


def _key_text(value: Any, where: str, field_name: str) -> str | None:
    """An id, env or split: text, or an integer taken as its digits; floats, booleans and objects refused."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise TaskError(f"{where}: {field_name} must be a string, got {json_kind(value)}")


def validate_row(task: dict[str, Any], index: int, seen: dict[str, int]) -> None:
    """Check a task row in place: types first (converting integer ids to text), then empty and duplicate ids."""
    task["id"] = _key_text(task["id"], f"row {index + 1}", "id")
    where = f"row {index + 1}" + (f" (id {short_repr(task['id'])})" if task["id"] else "")
    for name in ("env", "split"):
        task[name] = _key_text(task.get(name), where, name)
    instruction = task["instruction"]
    if instruction is not None and not isinstance(instruction, str):
        raise TaskError(f"{where}: instruction must be text, got {json_kind(instruction)}")
    task["instruction"] = instruction or ""
    if _non_finite(task.get("answer")):
        raise TaskError(f"{where}: the answer is {task['answer']!r}, not a value (an empty cell of a float column?); "
                        "give the answer as text, or leave it out for a task without one")
    if task.get("payload", "") is None:
        raise TaskError(f"{where}: the row's other columns are nested too deeply to store as JSON")
    if not task["id"]:
        raise TaskError(f"{where}: empty id")
    if not task["instruction"].strip():
        raise TaskError(f"{where}: empty instruction")
    if task["id"] in seen:
        raise TaskError(f"{where}: duplicate id {task['id']!r} (first seen at row {seen[task['id']] + 1})")
    seen[task["id"]] = index


def short_repr(value: str, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 4] + "...'"


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "task"


def tasks_table(task_rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Task rows (payload as an object or JSON text) -> an Arrow table with TASK_SCHEMA."""
    clean = []
    for row in task_rows:
        payload = row.get("payload")
        if not isinstance(payload, str):
            payload = json.dumps(payload or {}, ensure_ascii=False, default=str)
        clean.append({"id": str(row["id"]), "instruction": row["instruction"], "answer": answer_text(row.get("answer")),
                      "env": row.get("env"), "split": row.get("split"), "payload": payload})
    return pa.Table.from_pylist(clean, schema=TASK_SCHEMA)
