"""A study's task sets: loaded as the study file names them, fingerprinted on its environment and screened for
held-out tasks the agent has seen (omrl.study.overlap)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omrl.config import from_dict
from omrl.envs import env_class
from omrl.envs.base import Task
from omrl.envs.options import options_class
from omrl.study.fingerprint import fingerprint_tasks
from omrl.study.overlap import Screened, screen
from omrl.study.spec import SPLITS, StudySpec, task_source
from omrl.tasks import TaskError, load_tasks


def load_task_set(text: str, base: Path | None = None) -> list[Task]:
    """The tasks a study names by `text` (a tasks file relative to `base` or `shipped:NAME`, with an optional
    `[start:stop]` row slice); none selected is a TaskError."""
    source, rows = task_source(text, base)
    tasks = load_tasks(source)[rows]
    if not tasks:
        raise TaskError(f"{text}: the slice selects no tasks")
    return tasks


def env_options(spec: StudySpec) -> dict[str, Any]:
    """The study's env_options, checked and converted by the environment's options_class where it has one (a
    RecipeError names the option); a class without one gets them as written."""
    cls = options_class(env_class(spec.env))
    if cls is None or not spec.env_options:
        return dict(spec.env_options)
    options = from_dict(cls, dict(spec.env_options), where=f"study env_options (environment {spec.env!r})")
    return {key: getattr(options, key) for key in spec.env_options}


def screened_task_sets(spec: StudySpec, base: Path | None = None) -> tuple[Screened, dict[str, dict[str, str]]]:
    """The study's train, dev and test tasks after the overlap screen (refused, or dropped with drop_overlaps),
    and every task's fingerprint by split (split -> task id -> fingerprint)."""
    options = env_options(spec)
    tasks = {split: load_task_set(getattr(spec.tasks, split), base) for split in SPLITS}
    fingerprints = {split: fingerprint_tasks(spec.env, tasks[split], options) for split in SPLITS}
    return screen(tasks, fingerprints, drop=spec.drop_overlaps), fingerprints
