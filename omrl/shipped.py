"""Where the data shipped with omrl lies: task sets (tasks/*.jsonl) and code-repair projects (code_tasks/).

One copy: the files live in the top-level datasets/ folder, and omrl/data is a link to it that setuptools
follows, so a wheel carries them as package data (pyproject.toml). The same path, omrl/data, serves a
checkout and an installed package. Name a shipped task set without a path as `shipped:NAME`
(e.g. `shipped:math_arith`); `omrl tasks generate` writes fresh ones.

This module imports nothing from omrl, so environments and task loading may both use it.
"""

from __future__ import annotations

from pathlib import Path

PREFIX = "shipped:"


def shipped_datasets_dir() -> Path:
    """The shipped data folder (tasks/ and code_tasks/), in a checkout or an installed package."""
    here = Path(__file__).resolve().parent
    data = here / "data"
    if data.is_dir():
        return data
    return here.parent / "datasets"  # a checkout made without symbolic links (omrl/data is then a file)


def shipped_task_sets() -> list[str]:
    """Names of the shipped task sets, usable as `shipped:NAME`."""
    return sorted(p.stem for p in (shipped_datasets_dir() / "tasks").glob("*.jsonl"))


def resolve_tasks(source: str | Path) -> str | Path:
    """`shipped:NAME` -> the path of that shipped task set; any other source unchanged.

    Raises FileNotFoundError naming the shipped sets when NAME is not one of them."""
    text = str(source)
    if not text.startswith(PREFIX):
        return source
    name = text[len(PREFIX):].removesuffix(".jsonl")
    path = shipped_datasets_dir() / "tasks" / f"{name}.jsonl"
    if not name or "/" in name or not path.is_file():
        raise FileNotFoundError(f"{text}: no such shipped task set; shipped: "
                                + ", ".join(PREFIX + n for n in shipped_task_sets()))
    return path
