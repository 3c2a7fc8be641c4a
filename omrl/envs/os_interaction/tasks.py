"""OS tasks: AgentBench OS-interaction records as tasks, less those this sandbox cannot run (each refusal says why)."""

from __future__ import annotations

import json
import logging
import random
import re
from pathlib import Path
from typing import Any

from omrl.envs.base import InvalidTask, Task

log = logging.getLogger(__name__)


_CHECKERS = ("integer-match.py", "string-match.py", "size-match.py")
_REFUSE_WORDS = {r"\bsu\b": "`su` to another user (the sandbox has one user)",
                 r"\b(apt|apt-get|pip|npm|curl|wget)\s+(install|get|http)": "the network"}


def task_from_record(record: dict[str, Any], index: int, split: str, prefix: str) -> Task:
    """One AgentBench OS record as a Task; its payload keeps what replaying and checking need."""
    create = record.get("create") if isinstance(record.get("create"), dict) else {}
    init = create.get("init")
    evaluation = dict(record.get("evaluation") or {})
    example = evaluation.get("example", record.get("example"))
    payload = {"source_index": index, "description": record.get("description", ""),
               "init": _script(init), "init_file": init.get("file") if isinstance(init, dict) else None,
               "start": _script(record.get("start")), "match": evaluation.get("match"),
               "check": evaluation.get("check"), "example": _script(example),
               "example_file": example.get("file") if isinstance(example, dict) else None,
               "labels": record.get("labels") or []}
    return Task(id=f"{prefix}-{index}", instruction=payload["description"], env="os", split=split,
                answer=payload["match"], payload=payload)


def _script(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("code"), str):
        return value["code"]
    return None


def refusal(payload: dict[str, Any]) -> str | None:
    """What a task needs that this sandbox cannot give, or None when it runs here."""
    for key in ("init_file", "example_file"):
        if payload.get(key):
            return f"AgentBench's script {payload[key]}, which the task file does not include"
    check = payload.get("check")
    if isinstance(check, dict):
        return f"AgentBench's check script {check.get('file')}, which the task file does not include"
    if payload.get("match") is None:
        if not isinstance(check, list) or not check:
            return "an evaluation (match or check) the task does not give"
        for item in check:
            if item is not None and Path(str(item.get("file"))).name not in _CHECKERS:
                return f"AgentBench's checker {item.get('file')}, which omrl does not implement"
        if None in check and not payload.get("example"):
            return "an example script to compute the expected answer"
    scripts = " ".join(payload.get(k) or "" for k in ("init", "start", "example"))
    for pattern, need in _REFUSE_WORDS.items():
        if re.search(pattern, scripts):
            return need
    return None


def agentbench_tasks(source: str | None, n: int | None = None, seed: int = 0, split: str = "dev") -> list[Task]:
    """The runnable tasks of an AgentBench OS-interaction file (source=PATH, e.g. its dev.json); those
    the sandbox cannot give what they need are left out and logged with the reason."""
    if not source:
        raise InvalidTask("os tasks come from an AgentBench OS-interaction file: --option source=PATH "
                          "(e.g. agentbench_os_dev.json)")
    records = json.loads(Path(source).read_text(encoding="utf-8"))
    tasks, refused = [], []
    for index, record in enumerate(records):
        task = task_from_record(record, index, split, Path(source).stem)
        reason = refusal(task.payload)
        if reason:
            refused.append(f"{task.id}: {reason}")
        else:
            tasks.append(task)
    for line in refused:
        log.warning("os task refused: %s", line)
    if n is not None and n < len(tasks):
        tasks = random.Random(seed).sample(tasks, n)
    return tasks
