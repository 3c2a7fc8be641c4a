"""`omrl study check` as an API: a study's task sets fingerprinted and screened, its figures of held-out
novelty and its settings hash, before anything runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omrl.shipped import resolve_recipe
from omrl.study.spec import StudySpec, settings_hash
from omrl.study.tasksets import screened_task_sets


def study_folder_of(source: str | Path) -> Path:
    """The folder a study file's relative task paths are read from: the file's own (`shipped:NAME` resolved)."""
    return Path(resolve_recipe(source)).resolve().parent


def check_study(spec: StudySpec, base: Path | None = None) -> dict[str, Any]:
    """{study, settings_hash, drop_overlaps, and the overlap report of the sets as used (omrl.study.overlap)}
    for `spec`, its relative task paths read from `base`; OverlapError (carrying the report) on a held-out task
    seen before, unless the study drops overlaps."""
    screened, _ = screened_task_sets(spec, base)
    return {**report_head(spec), **screened.report}


def report_head(spec: StudySpec) -> dict[str, Any]:
    """What every study report line starts with: the study's name, settings hash and overlap policy."""
    return {"study": spec.name, "settings_hash": settings_hash(spec), "drop_overlaps": spec.drop_overlaps}
