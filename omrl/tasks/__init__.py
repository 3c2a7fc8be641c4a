"""User task datasets: read JSONL/JSON/CSV/Parquet/saved `datasets`/Hub data, map columns, validate, write tasks Parquet.

A tasks file has one row per task with the columns of TASK_SCHEMA:
id, instruction, answer (gold, text; lists/objects as JSON), env, split, payload (JSON text holding every
other source column). Environments receive rows as `omrl.envs.base.Task`.

The row schema and checks are in omrl.tasks.rows (an environment's required payload fields in
omrl.tasks.payload_needs), the benchmark converters (GSM8K, DBBench, AgentBench OS, SWE-bench) in
omrl.tasks.benchmarks, the shipped task sets (`shipped:NAME`) in omrl.shipped; omrl.tasks.shipped_files
regenerates the shipped grid files.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from omrl.envs.base import Task, TaskRow
from omrl.shipped import resolve_tasks, shipped_datasets_dir, shipped_task_sets
from omrl.store import readers
from omrl.store.readers import json_kind
from omrl.tasks.benchmarks import CONVERTERS, detect_benchmark, extract_gsm8k_answer
from omrl.tasks.payload_needs import check_payload
from omrl.tasks.rows import (
    TASK_COLUMNS,
    TASK_SCHEMA,
    TaskError,
    TaskMapping,
    env_split,
    load_task_mapping,
    short_repr,
    slug,
    task_record,
    tasks_table,
    validate_row,
)

__all__ = [
    "FORMATS", "TASK_COLUMNS", "TASK_SCHEMA", "TaskMapping", "Task", "TaskError", "convert_rows", "detect_benchmark",
    "extract_gsm8k_answer", "generate_tasks", "import_tasks", "load_task_mapping", "load_tasks", "read_rows", "shipped_datasets_dir",
    "shipped_task_sets", "summarize", "tasks_table", "write_tasks",
]

FORMATS = ("auto", "plain", "gsm8k", "dbbench", "agentbench_os", "swebench")
SUFFIXES = (".jsonl", ".ndjson", ".json", ".csv", ".tsv", ".parquet")

# Column names tried, in order, when the mapping does not name one.
_GUESS = {
    "id": ["id", "task_id", "instance_id", "query_id", "qid", "uid", "idx"],
    "instruction": ["instruction", "question", "prompt", "problem", "query", "description", "problem_statement",
                    "task", "input"],
    "answer": ["answer", "label", "gold", "target", "solution", "ground_truth", "output"],
}


# ----------------------------------------------------------------------------------------------- reading


def read_rows(src: str | Path) -> tuple[list[dict[str, Any]], str]:
    """Rows of a source as dicts plus a short name for it. Files by extension (read by omrl.store.readers: errors
    name the file and line, item or row group); a folder saved by `datasets.save_to_disk`; otherwise a Hub
    dataset name (needs the network); `shipped:NAME` names a task set shipped with omrl."""
    src = resolve_tasks(src)
    path = Path(src)
    if path.is_dir():
        return _read_saved_dataset(path), path.name
    if path.is_file():
        if path.suffix.lower() == ".json":
            return _read_json(path), path.stem
        rows = []
        for record in readers.iter_records(path, allowed=SUFFIXES, error=TaskError):
            if not isinstance(record.value, dict):
                raise TaskError(f"{record.where} is not a JSON object (got {json_kind(record.value)})")
            rows.append(record.value)
        return rows, path.stem
    if re.fullmatch(r"[\w.-]+(/[\w.-]+)?(:[\w.-]+)?", str(src)) and not str(src).startswith((".", "/")):
        return _read_hub(str(src)), str(src).replace("/", "_").split(":")[0]
    raise FileNotFoundError(f"{src}: no such file or folder")


def _read_json(path: Path) -> list[dict[str, Any]]:
    data = readers.read_json(path, error=TaskError)
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) == 1 and all(isinstance(r, dict) for r in lists[0]):
            data = lists[0]  # {"data": [...]} and similar wrappers
        elif data and all(isinstance(v, list) for v in data.values()) and len({len(v) for v in data.values()}) == 1:
            keys = list(data)
            return [dict(zip(keys, values, strict=True)) for values in zip(*data.values(), strict=True)]  # column-oriented
    if not isinstance(data, list):
        raise TaskError(f"{path.name}: expected a list of objects, got {json_kind(data)}")
    for number, row in enumerate(data):
        if not isinstance(row, dict):
            raise TaskError(f"{path.name} item {number} (row {number + 1}) is not a JSON object (got {json_kind(row)})")
    return data


def _dataset_records(dataset: Any) -> list[dict[str, Any]]:
    import datasets

    if isinstance(dataset, (datasets.DatasetDict, dict)):
        rows = []
        for split_name in dataset:
            for row in dataset[split_name].to_list():
                row.setdefault("split", split_name)
                rows.append(row)
        return rows
    return dataset.to_list()


def _read_saved_dataset(path: Path) -> list[dict[str, Any]]:
    import datasets

    try:
        return _dataset_records(datasets.load_from_disk(str(path)))
    except FileNotFoundError:
        raise TaskError(f"{path}: a folder must be saved by datasets' save_to_disk") from None


def _read_hub(name: str) -> list[dict[str, Any]]:
    import datasets

    repo, _, config = name.partition(":")
    try:
        return _dataset_records(datasets.load_dataset(repo, config or None))
    except Exception as exc:  # the Hub client raises many types; report them as one clear error
        raise TaskError(f"could not load Hub dataset {repo!r} (offline, private or misspelled?): {exc}") from None


# ----------------------------------------------------------------------------------------------- converting


def convert_rows(records: list[dict[str, Any]], mapping: TaskMapping, name: str = "task") -> list[TaskRow]:
    """Source records -> task rows (TASK_COLUMNS, payload as JSON text), validated."""
    fmt = detect_benchmark(records) if mapping.format == "auto" else mapping.format
    if fmt not in FORMATS:
        raise TaskError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    converter = CONVERTERS.get(fmt, _plain_row)
    prefix = mapping.id_prefix or (fmt if fmt != "plain" else slug(name))
    columns = _resolve_columns(records, mapping, fmt)
    out, seen, needs = [], {}, {}
    for index, row in enumerate(records):
        try:
            task = converter(row, index, columns, mapping, prefix)
        except TaskError:
            raise
        except (TypeError, AttributeError, KeyError, ValueError, RecursionError) as exc:  # a column of the wrong type
            raise TaskError(f"row {index + 1}: cannot read it as a {fmt} row ({type(exc).__name__}: "
                            f"{short_repr(str(exc), 120)})") from None
        validate_row(task, index, seen)
        check_payload(task, index, needs)  # a field the environment needs is refused missing here, not at play
        out.append(task)
    return out


def _resolve_columns(records: list[dict[str, Any]], mapping: TaskMapping, fmt: str) -> dict[str, str | None]:
    available = list(dict.fromkeys(key for record in records[:100] for key in record))
    columns: dict[str, str | None] = {}
    for role in ("id", "instruction", "answer"):
        named = getattr(mapping, role)
        if named is not None:
            # A dotted path reaches into a nested field (`eval.reference_answers`) when no column has that name.
            if named not in available and not (
                    "." in named and any(dotted(record, named) is not MISSING for record in records[:100])):
                raise TaskError(f"column {named!r} (given for {role}) is not in the data; columns are {available}"
                                + ("" if "." in named else "; a dotted path (a.b) reaches into nested fields"))
            columns[role] = named
        elif fmt == "plain":
            columns[role] = next((c for c in _GUESS[role] if c in available and c != columns.get("instruction")),
                                 None)
    if fmt == "plain" and columns.get("instruction") is None:
        raise TaskError(f"no instruction column found (tried {_GUESS['instruction']}); name one with "
                        f"--instruction. Columns are {available}")
    return columns


def _plain_row(row, index, columns, mapping, prefix):
    used = {c for c in columns.values() if c and c in row} | {"env", "split"}
    row_id = column_value(row, columns["id"]) if columns.get("id") else f"{prefix}-{index}"
    answer = column_value(row, columns["answer"]) if columns.get("answer") else None
    payload = {k: v for k, v in row.items() if k not in used and k != "payload"}
    if "payload" in row and "payload" not in used:  # a task-row file's payload is the payload, not a field of it
        payload.update(_payload_object(row["payload"], index, row_id))
    if isinstance(answer, str) and "####" in answer:
        payload["solution"] = answer  # GSM8K-style: keep the worked solution, answer the number
        answer = extract_gsm8k_answer(answer)
    env, split = env_split(row, mapping, None)
    return task_record(row_id, column_value(row, columns["instruction"]), answer, env, split, payload)


def _payload_object(value: Any, index: int, row_id: Any) -> dict[str, Any]:
    """A `payload` column's value as the object it must be (JSON text of an object, or an object)."""
    where = f"row {index + 1}" + (f" (id {short_repr(str(row_id))})" if row_id is not None else "")
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise TaskError(f"{where}: payload is not valid JSON ({exc.msg}: column {exc.colno}); it must be a JSON "
                            "object (the environment's task data)") from None
        except (RecursionError, ValueError):
            raise TaskError(f"{where}: payload is not readable JSON (nested too deeply or a huge number)") from None
    if not isinstance(value, dict):
        raise TaskError(f"{where}: payload must be a JSON object (the environment's task data), got {json_kind(value)}")
    return value


MISSING = object()


def dotted(record: dict[str, Any], path: str) -> Any:
    """The value at a dotted path into a source record's nested objects (lists by index), or MISSING."""
    value: Any = record
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return MISSING
    return value


def column_value(record: dict[str, Any], column: str) -> Any:
    """A source record's column by name, else by dotted path; None when absent (the row checks then name what
    is missing)."""
    if column in record:
        return record[column]
    value = dotted(record, column) if "." in column else MISSING
    return None if value is MISSING else value


# ----------------------------------------------------------------------------------------------- public API


def write_tasks(table_or_rows: pa.Table | list[dict[str, Any]] | list[Task], out: str | Path) -> Path:
    """Write a tasks Parquet file atomically (temporary file, then rename)."""
    if isinstance(table_or_rows, list):
        rows = [t.to_row() if isinstance(t, Task) else t for t in table_or_rows]
        table_or_rows = tasks_table(rows)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".jsonl":
        text = "".join(json.dumps({**r, "payload": json.loads(r["payload"])}, ensure_ascii=False) + "\n"
                       for r in table_or_rows.to_pylist())
        _atomic_write(out, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    else:
        _atomic_write(out, lambda tmp: pq.write_table(table_or_rows, tmp, compression="zstd"))
    return out


def _atomic_write(out: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def import_tasks(src: str | Path, out: str | Path | None = None, mapping: TaskMapping | None = None,
                 **flags: Any) -> pa.Table:
    """Read `src`, map and validate its rows, write `out` (Parquet, or JSONL by extension) when given.

    flags: id, instruction, answer, env, split, format, id_prefix (override `mapping`).
    """
    # A copy: the caller's mapping is not changed by the flags.
    mapping = dataclasses.replace(mapping or TaskMapping(), **{k: v for k, v in flags.items() if v is not None})
    src = resolve_tasks(src)
    rows, name = read_rows(src)
    label = Path(src).name if Path(src).exists() else str(src)
    if not rows:
        raise TaskError(f"{label}: no rows")
    try:
        table = tasks_table(convert_rows(rows, mapping, name=name))
    except TaskError as exc:  # conversion errors name the row; say which file it is in
        raise TaskError(f"{label}: {exc}") from None
    if out is not None:
        write_tasks(table, out)
    return table


def load_tasks(path: str | Path, split: str | None = None, env: str | None = None) -> list[Task]:
    """Tasks from a tasks file (Parquet or JSONL in task-row format, e.g. datasets/tasks/*.jsonl); other
    sources are imported on the fly; `shipped:NAME` is a task set shipped with omrl (`shipped:math_arith`).
    Optionally keep one split / env."""
    path = Path(resolve_tasks(path))
    if path.suffix.lower() == ".parquet" and path.is_file() and \
            set(TASK_COLUMNS) <= set(readers.parquet_schema(path, error=TaskError).names):
        rows = [record.value for record in readers.iter_parquet(path, error=TaskError)]
    else:
        rows, _ = read_rows(path)
    label = path.name if path.exists() else str(path)
    if not rows:
        raise TaskError(f"{label}: no rows")
    try:
        if not {"id", "instruction"} <= set(rows[0]):
            rows = convert_rows(rows, TaskMapping(), name=path.stem)
        return [t for t in _tasks_of(rows) if (split is None or t.split == split) and (env is None or t.env == env)]
    except TaskError as exc:  # row errors name the row; say which file it is in
        raise TaskError(f"{label}: {exc}") from None


def _tasks_of(records: Sequence[Mapping[str, Any]]) -> list[Task]:
    """Task objects from records in task-row form, each checked like an imported row."""
    seen: dict[str, int] = {}
    tasks = []
    for index, row in enumerate(records):
        check = {"id": row.get("id"), "instruction": row.get("instruction"), "env": row.get("env"),
                 "split": row.get("split"), "answer": row.get("answer")}
        validate_row(check, index, seen)
        where = f"row {index + 1} (id {short_repr(check['id'])})"
        payload = row.get("payload")
        try:
            payload = json.loads(payload) if isinstance(payload, str) else payload
        except json.JSONDecodeError as exc:
            raise TaskError(f"{where}: payload is not valid JSON ({exc.msg})") from None
        except (RecursionError, ValueError):
            raise TaskError(f"{where}: payload is not readable JSON (nested too deeply or a huge number)") from None
        if payload is not None and not isinstance(payload, dict):
            raise TaskError(f"{where}: payload must be a JSON object, got {json_kind(payload)}")
        tasks.append(Task.from_row({**row, **check, "payload": payload or {}}))
    return tasks


def summarize(tasks: list[Task]) -> dict[str, Any]:
    """Counts per (env, split) and whether answers are present: what `omrl tasks show` prints."""
    counts: dict[tuple[str, str], int] = {}
    for task in tasks:
        key = (task.env or "-", task.split or "-")
        counts[key] = counts.get(key, 0) + 1
    return {"count": len(tasks), "by_env_split": counts,
            "with_answer": sum(1 for t in tasks if t.answer not in (None, ""))}


def generate_tasks(kind: str, n: int = 50, seed: int = 0, split: str | None = None, **options: Any) -> list[Task]:
    """Tasks made by environment `kind`'s own generator (`omrl.envs.generate_tasks`; `omrl envs` lists which
    environments have one); `options` go to that generator; split None: the environment's first split."""
    from omrl.envs import EnvSpecError
    from omrl.envs import generate_tasks as env_generate

    try:
        return env_generate(kind, n=n, seed=seed, split=split, **options)
    except EnvSpecError as exc:
        raise TaskError(str(exc)) from None
