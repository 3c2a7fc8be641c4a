"""User task datasets: read JSONL/JSON/CSV/Parquet/saved `datasets`/Hub data, map columns, validate, write tasks Parquet.

A tasks file has one row per task with the columns of TASK_SCHEMA:
id, instruction, answer (gold, text; lists/objects as JSON), env, split, payload (JSON text holding every
other source column). Environments receive rows as `omrl.envs.base.Task`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from omrl import readers
from omrl.envs.base import Task

TASK_SCHEMA = pa.schema([
    pa.field("id", pa.string(), nullable=False),
    pa.field("instruction", pa.string(), nullable=False),
    pa.field("answer", pa.string()),
    pa.field("env", pa.string()),
    pa.field("split", pa.string()),
    pa.field("payload", pa.string()),
])
TASK_COLUMNS = [f.name for f in TASK_SCHEMA]
FORMATS = ("auto", "plain", "gsm8k", "dbbench", "swebench")
SUFFIXES = (".jsonl", ".ndjson", ".json", ".csv", ".tsv", ".parquet")

# Column names tried, in order, when the mapping does not name one.
_GUESS = {
    "id": ["id", "task_id", "instance_id", "uid", "idx"],
    "instruction": ["instruction", "question", "prompt", "problem", "query", "description", "problem_statement",
                    "task", "input"],
    "answer": ["answer", "label", "gold", "target", "solution", "ground_truth", "output"],
}
_GSM8K_FINAL = re.compile(r"####\s*(.+?)\s*$", re.DOTALL)


class TaskError(ValueError):
    """A task dataset that cannot be imported; the message names the row and the field."""


@dataclass
class Mapping:
    """Which source columns hold id/instruction/answer; env and split are constants (or taken from columns
    named env/split when not given)."""

    id: str | None = None
    instruction: str | None = None
    answer: str | None = None
    env: str | None = None
    split: str | None = None
    format: str = "auto"
    id_prefix: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides: Any) -> Mapping:
        """A YAML mapping file (keys: id, instruction, answer, env, split, format, id_prefix); flags override it."""
        import yaml

        data = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(data, dict):
            raise TaskError(f"{path}: a mapping file must be a YAML mapping of key: value")
        known = {"id", "instruction", "answer", "env", "split", "format", "id_prefix"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise TaskError(f"{path}: unknown key(s) {unknown}; allowed: {sorted(known)}")
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**data)


# ----------------------------------------------------------------------------------------------- reading


def read_rows(src: str | Path) -> tuple[list[dict[str, Any]], str]:
    """Rows of a source as dicts plus a short name for it. Files by extension (read by omrl.readers: errors
    name the file and line, item or row group); a folder saved by `datasets.save_to_disk`; otherwise a Hub
    dataset name (needs the network)."""
    path = Path(src)
    if path.is_dir():
        return _read_saved_dataset(path), path.name
    if path.is_file():
        if path.suffix.lower() == ".json":
            return _read_json(path), path.stem
        rows = []
        for record in readers.iter_records(path, allowed=SUFFIXES, error=TaskError):
            if not isinstance(record.value, dict):
                raise TaskError(f"{record.where} is not a JSON object (got {_kind(record.value)})")
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
        raise TaskError(f"{path.name}: expected a list of objects, got {_kind(data)}")
    for number, row in enumerate(data):
        if not isinstance(row, dict):
            raise TaskError(f"{path.name} item {number} (row {number + 1}) is not a JSON object (got {_kind(row)})")
    return data


def _dataset_rows(dataset: Any) -> list[dict[str, Any]]:
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
        return _dataset_rows(datasets.load_from_disk(str(path)))
    except FileNotFoundError:
        raise TaskError(f"{path}: a folder must be saved by datasets' save_to_disk") from None


def _read_hub(name: str) -> list[dict[str, Any]]:
    import datasets

    repo, _, config = name.partition(":")
    try:
        return _dataset_rows(datasets.load_dataset(repo, config or None))
    except Exception as exc:  # the Hub client raises many types; report them as one clear error
        raise TaskError(f"could not load Hub dataset {repo!r} (offline, private or misspelled?): {exc}") from None


# ----------------------------------------------------------------------------------------------- converting


def detect_format(rows: list[dict[str, Any]]) -> str:
    """gsm8k, dbbench, swebench or plain, from the first row's columns."""
    if not rows:
        return "plain"
    first = rows[0]
    if {"description", "label", "table"} <= set(first):
        return "dbbench"
    if {"instance_id", "problem_statement", "repo"} <= set(first):
        return "swebench"
    if {"question", "answer"} <= set(first) and "####" in str(first.get("answer")):
        return "gsm8k"
    return "plain"


def extract_gsm8k_answer(solution: str) -> str | None:
    """The number after '####' in a GSM8K solution, thousands separators removed ('#### 1,000' -> '1000')."""
    match = _GSM8K_FINAL.search(str(solution or ""))
    if not match:
        return None
    return match.group(1).replace(",", "").replace("$", "").strip()


def convert_rows(rows: list[dict[str, Any]], mapping: Mapping, name: str = "task") -> list[dict[str, Any]]:
    """Source rows -> task rows (dicts with TASK_COLUMNS, payload as JSON text), validated."""
    fmt = detect_format(rows) if mapping.format == "auto" else mapping.format
    if fmt not in FORMATS:
        raise TaskError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    converter = {"gsm8k": _gsm8k_row, "dbbench": _dbbench_row, "swebench": _swebench_row}.get(fmt, _plain_row)
    prefix = mapping.id_prefix or (fmt if fmt != "plain" else _slug(name))
    columns = _resolve_columns(rows, mapping, fmt)
    out, seen = [], {}
    for index, row in enumerate(rows):
        try:
            task = converter(row, index, columns, mapping, prefix)
        except TaskError:
            raise
        except (TypeError, AttributeError, KeyError, ValueError, RecursionError) as exc:  # a column of the wrong type
            raise TaskError(f"row {index + 1}: cannot read it as a {fmt} row ({type(exc).__name__}: "
                            f"{_short(str(exc), 120)})") from None
        _validate(task, index, seen)
        out.append(task)
    return out


def _resolve_columns(rows: list[dict[str, Any]], mapping: Mapping, fmt: str) -> dict[str, str | None]:
    available = list(dict.fromkeys(key for row in rows[:100] for key in row))
    columns: dict[str, str | None] = {}
    for role in ("id", "instruction", "answer"):
        named = getattr(mapping, role)
        if named is not None:
            if named not in available:
                raise TaskError(f"column {named!r} (given for {role}) is not in the data; columns are {available}")
            columns[role] = named
        elif fmt == "plain":
            columns[role] = next((c for c in _GUESS[role] if c in available and c != columns.get("instruction")),
                                 None)
    if fmt == "plain" and columns.get("instruction") is None:
        raise TaskError(f"no instruction column found (tried {_GUESS['instruction']}); name one with "
                        f"--instruction. Columns are {available}")
    return columns


def _task(row_id: Any, instruction: Any, answer: Any, env: Any, split: Any,
          payload: dict[str, Any]) -> dict[str, Any]:
    """A task row; id, instruction, env and split stay as given until `_validate` checks their types."""
    try:
        payload_text = json.dumps(payload, ensure_ascii=False, default=str)
    except (RecursionError, ValueError):
        payload_text = None  # refused by _validate, which knows the row
    return {"id": row_id, "instruction": instruction, "answer": _answer_text(answer), "env": env, "split": split,
            "payload": payload_text}


def _answer_text(answer: Any) -> str | None:
    if answer is None:
        return None
    if isinstance(answer, (list, dict)):
        try:
            return json.dumps(answer, ensure_ascii=False, default=str)
        except (RecursionError, ValueError):
            return None
    return str(answer)


def _env_split(row: dict[str, Any], mapping: Mapping, default_env: str | None) -> tuple[Any, Any]:
    env = mapping.env or row.get("env") or default_env
    split = mapping.split or row.get("split") or "train"
    return env, split


def _plain_row(row, index, columns, mapping, prefix):
    used = {c for c in columns.values() if c} | {"env", "split"}
    row_id = row.get(columns["id"]) if columns.get("id") else f"{prefix}-{index}"
    answer = row.get(columns["answer"]) if columns.get("answer") else None
    payload = {k: v for k, v in row.items() if k not in used}
    if isinstance(answer, str) and "####" in answer:
        payload["solution"] = answer  # GSM8K-style: keep the worked solution, answer the number
        answer = extract_gsm8k_answer(answer)
    env, split = _env_split(row, mapping, None)
    return _task(row_id, row.get(columns["instruction"]), answer, env, split, payload)


def _gsm8k_row(row, index, columns, mapping, prefix):
    instruction_col = columns.get("instruction") or "question"
    answer_col = columns.get("answer") or "answer"
    if answer_col not in row:
        raise TaskError(f"row {index + 1}: missing column {answer_col!r}")
    solution = row.get(answer_col)
    if not isinstance(solution, str):
        raise TaskError(f"row {index + 1}: answer must be text ending in '#### <number>', got {_kind(solution)}")
    answer = extract_gsm8k_answer(solution)
    if answer is None:
        raise TaskError(f"row {index + 1}: answer has no '#### <number>' final line: {str(solution)[:80]!r}")
    payload = {k: v for k, v in row.items() if k not in (instruction_col, answer_col, columns.get("id"))}
    payload["solution"] = solution
    row_id = row.get(columns["id"]) if columns.get("id") else f"{prefix}-{index}"
    env, split = _env_split(row, mapping, "math")
    return _task(row_id, row.get(instruction_col), answer, env, split, payload)


def _dbbench_row(row, index, columns, mapping, prefix):
    for key in ("description", "label", "table"):
        if key not in row:
            raise TaskError(f"row {index + 1}: missing column {key!r} (DBBench rows need description, label, table)")
    table = row["table"]
    info = table.get("table_info") if isinstance(table, dict) else None
    if not isinstance(info, dict) or "columns" not in info or "rows" not in info or "table_name" not in table:
        raise TaskError(f"row {index + 1}: 'table' must hold table_name and table_info{{columns, rows}}")
    label = row["label"] if isinstance(row["label"], list) else [row["label"]]
    kinds = row.get("type") or []
    kinds = [str(t).upper() for t in (kinds if isinstance(kinds, list) else [kinds])]
    payload = {k: v for k, v in row.items() if k not in ("description", "label")}
    payload["label"] = label
    payload["kind"] = "mutation" if {"INSERT", "UPDATE", "DELETE"} & set(kinds) else "query"
    instruction = row["description"]
    if row.get("add_description") and isinstance(instruction, str):
        instruction = f"{instruction}\n{row['add_description']}"
    row_id = row.get(columns["id"]) if columns.get("id") else f"{prefix}-{index}"
    env, split = _env_split(row, mapping, "sql")
    return _task(row_id, instruction, label, env, split, payload)


def _swebench_row(row, index, columns, mapping, prefix):
    for key in ("instance_id", "problem_statement", "repo", "base_commit"):
        if key not in row:
            raise TaskError(f"row {index + 1}: missing column {key!r} (SWE-bench rows need instance_id, repo, "
                            "base_commit, problem_statement)")
    payload = {k: v for k, v in row.items() if k not in ("problem_statement",)}
    for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        if isinstance(payload.get(key), str):  # SWE-bench stores these lists as JSON text
            try:
                payload[key] = json.loads(payload[key])
            except json.JSONDecodeError:
                raise TaskError(f"row {index + 1}: {key} is not a JSON list") from None
    env, split = _env_split(row, mapping, "swebench")
    return _task(row["instance_id"], row["problem_statement"], row.get("patch"), env, split, payload)


def _kind(value: Any) -> str:
    """A value's JSON type for messages (never its repr: no dict or list becomes an id or instruction)."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, float):
        return f"a number ({value!r})"
    if isinstance(value, int):
        return "an integer"
    return "null" if value is None else type(value).__name__


def _key_text(value: Any, where: str, field_name: str) -> str | None:
    """An id, env or split: text, or an integer taken as its digits; floats, booleans and objects refused."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise TaskError(f"{where}: {field_name} must be a string, got {_kind(value)}")


def _validate(task: dict[str, Any], index: int, seen: dict[str, int]) -> None:
    """Check a task row in place: types first (converting integer ids to text), then empty and duplicate ids."""
    task["id"] = _key_text(task["id"], f"row {index + 1}", "id")
    where = f"row {index + 1}" + (f" (id {_short(task['id'])})" if task["id"] else "")
    for name in ("env", "split"):
        task[name] = _key_text(task.get(name), where, name)
    instruction = task["instruction"]
    if instruction is not None and not isinstance(instruction, str):
        raise TaskError(f"{where}: instruction must be text, got {_kind(instruction)}")
    task["instruction"] = instruction or ""
    if task.get("payload", "") is None:
        raise TaskError(f"{where}: the row's other columns are nested too deeply to store as JSON")
    if not task["id"]:
        raise TaskError(f"{where}: empty id")
    if not task["instruction"].strip():
        raise TaskError(f"{where}: empty instruction")
    if task["id"] in seen:
        raise TaskError(f"{where}: duplicate id {task['id']!r} (first seen at row {seen[task['id']] + 1})")
    seen[task["id"]] = index


def _short(value: str, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 4] + "...'"


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "task"


# ----------------------------------------------------------------------------------------------- public API


def tasks_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Task rows (dicts, payload as dict or JSON text) -> an Arrow table with TASK_SCHEMA."""
    clean = []
    for row in rows:
        payload = row.get("payload")
        if not isinstance(payload, str):
            payload = json.dumps(payload or {}, ensure_ascii=False, default=str)
        clean.append({"id": str(row["id"]), "instruction": row["instruction"], "answer": _answer_text(row.get("answer")),
                      "env": row.get("env"), "split": row.get("split"), "payload": payload})
    return pa.Table.from_pylist(clean, schema=TASK_SCHEMA)


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


def import_tasks(src: str | Path, out: str | Path | None = None, mapping: Mapping | None = None,
                 **flags: Any) -> pa.Table:
    """Read `src`, map and validate its rows, write `out` (Parquet, or JSONL by extension) when given.

    flags: id, instruction, answer, env, split, format, id_prefix (override `mapping`).
    """
    # A copy: the caller's mapping is not changed by the flags.
    mapping = dataclasses.replace(mapping or Mapping(), **{k: v for k, v in flags.items() if v is not None})
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
    sources are imported on the fly. Optionally keep one split / env."""
    path = Path(path)
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
            rows = convert_rows(rows, Mapping(), name=path.stem)
        return [t for t in _tasks_of(rows) if (split is None or t.split == split) and (env is None or t.env == env)]
    except TaskError as exc:  # row errors name the row; say which file it is in
        raise TaskError(f"{label}: {exc}") from None


def _tasks_of(rows: list[dict[str, Any]]) -> list[Task]:
    """Task objects from rows in task-row form, each checked like an imported row."""
    seen: dict[str, int] = {}
    tasks = []
    for index, row in enumerate(rows):
        check = {"id": row.get("id"), "instruction": row.get("instruction"), "env": row.get("env"),
                 "split": row.get("split")}
        _validate(check, index, seen)
        where = f"row {index + 1} (id {_short(check['id'])})"
        payload = row.get("payload")
        try:
            payload = json.loads(payload) if isinstance(payload, str) else payload
        except json.JSONDecodeError as exc:
            raise TaskError(f"{where}: payload is not valid JSON ({exc.msg})") from None
        except (RecursionError, ValueError):
            raise TaskError(f"{where}: payload is not readable JSON (nested too deeply or a huge number)") from None
        if payload is not None and not isinstance(payload, dict):
            raise TaskError(f"{where}: payload must be a JSON object, got {_kind(payload)}")
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


def shipped_datasets_dir() -> Path:
    """The project's datasets/ folder (task files and code-repair projects shipped with omrl)."""
    return Path(__file__).resolve().parents[1] / "datasets"


def generate_tasks(kind: str, n: int = 50, seed: int = 0, split: str = "train") -> list[Task]:
    """Synthetic tasks: "math" (arithmetic), "shop" (shopping goals) or "code" (the shipped repair projects,
    files embedded so the result is self-contained)."""
    if kind == "math":
        from omrl.envs.math import generate_tasks as generate_math

        return generate_math(n, seed=seed, split=split)
    if kind == "shop":
        from omrl.envs.shop import generate_tasks as generate_shop

        return generate_shop(n, seed=seed, split=split)
    if kind == "code":
        from omrl.envs.code import project_files

        tasks = load_tasks(shipped_datasets_dir() / "tasks" / "code.jsonl")
        for task in tasks:
            task.payload["files"] = project_files(task)
            task.split = split
        return tasks
    raise TaskError(f"cannot generate {kind!r} tasks; choose math, shop or code")
