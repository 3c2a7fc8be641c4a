"""Converters for benchmark task formats: GSM8K (math), AgentBench DBBench (sql), AgentBench OS interaction
(os) and SWE-bench (swebench).

Each turns one source row into a task row for the environment that plays it; `detect_benchmark` picks one
from the first row's columns. Plain rows (any other columns) are converted in omrl.tasks.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from omrl.store.readers import json_kind
from omrl.tasks.rows import TaskError, env_split, task_record

_GSM8K_FINAL = re.compile(r"####\s*(.+?)\s*$", re.DOTALL)


def detect_benchmark(records: list[dict[str, Any]]) -> str:
    """gsm8k, dbbench, agentbench_os, swebench or plain, from the first source record's columns."""
    if not records:
        return "plain"
    first = records[0]
    if {"description", "label", "table"} <= set(first):
        return "dbbench"
    if {"description", "evaluation"} <= set(first) and isinstance(first["evaluation"], dict):
        return "agentbench_os"
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


def _gsm8k_row(row, index, columns, mapping, prefix):
    instruction_col = columns.get("instruction") or "question"
    answer_col = columns.get("answer") or "answer"
    if answer_col not in row:
        raise TaskError(f"row {index + 1}: missing column {answer_col!r}")
    solution = row.get(answer_col)
    if not isinstance(solution, str):
        raise TaskError(f"row {index + 1}: answer must be text ending in '#### <number>', got {json_kind(solution)}")
    answer = extract_gsm8k_answer(solution)
    if answer is None:
        raise TaskError(f"row {index + 1}: answer has no '#### <number>' final line: {str(solution)[:80]!r}")
    payload = {k: v for k, v in row.items() if k not in (instruction_col, answer_col, columns.get("id"))}
    payload["solution"] = solution
    row_id = row.get(columns["id"]) if columns.get("id") else f"{prefix}-{index}"
    env, split = env_split(row, mapping, "math")
    return task_record(row_id, row.get(instruction_col), answer, env, split, payload)


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
    env, split = env_split(row, mapping, "sql")
    return task_record(row_id, instruction, label, env, split, payload)


def _agentbench_os_row(row, index, columns, mapping, prefix):
    from omrl.envs.os_interaction.tasks import task_from_record  # the one reader of AgentBench OS records

    if not isinstance(row.get("evaluation"), dict):
        raise TaskError(f"row {index + 1}: missing column 'evaluation' (AgentBench OS rows need description and "
                        "evaluation{match or check})")
    row_id = row.get(columns["id"]) if columns.get("id") else f"{prefix}-{index}"
    env, split = env_split(row, mapping, "os")
    task = task_from_record(row, index, str(split), prefix)
    return task_record(row_id, task.instruction, task.answer, env, split, task.payload)


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
    env, split = env_split(row, mapping, "swe" if mapping.source else "swebench")
    if mapping.source:  # the instance's checkout at base_commit: the swe env runs it in the sandbox
        checkout = Path(mapping.source) / str(row["instance_id"])
        if not checkout.is_dir():
            raise TaskError(f"row {index + 1}: SWE-bench instance {row['instance_id']}: no checkout {checkout} "
                            f"(--source DIR holds one per instance, at its base_commit)")
        payload["source"] = str(checkout.resolve())
    return task_record(row["instance_id"], row["problem_statement"], row.get("patch"), env, split, payload)


CONVERTERS = {"gsm8k": _gsm8k_row, "dbbench": _dbbench_row, "agentbench_os": _agentbench_os_row,
              "swebench": _swebench_row}
