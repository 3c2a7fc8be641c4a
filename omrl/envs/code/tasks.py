"""Code tasks: the shipped repair projects (datasets/tasks/code.jsonl), each with its files embedded."""

from __future__ import annotations

import random

from omrl.envs.base import Task
from omrl.envs.code.projects import project_files
from omrl.shipped import shipped_datasets_dir


def shipped_tasks(n: int | None = None, seed: int = 0, split: str = "train") -> list[Task]:
    """The shipped repair projects with their files embedded (self-contained); n caps how many, seed
    shuffles which."""
    from omrl.store import readers  # when tasks are made: playing an episode reads no record file

    tasks = [Task.from_row(record.value)
             for record in readers.iter_records(shipped_datasets_dir() / "tasks" / "code.jsonl")]
    if n is not None and n < len(tasks):
        tasks = random.Random(seed).sample(tasks, n)
    for task in tasks:
        task.payload["files"] = project_files(task)
        task.split = split
    return tasks
