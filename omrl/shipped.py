"""Where the data shipped with omrl lies: task sets (tasks/*.jsonl), code-repair projects (code_tasks/)
and recipes (the top-level recipes/ folder).

One copy: the files live in the top-level datasets/ and recipes/ folders, and omrl/data and
omrl/shipped_recipes are links to them that setuptools follows, so a wheel carries them as package data
(pyproject.toml). The same paths serve a checkout and an installed package. Name a shipped task set or
recipe without a path as `shipped:NAME` (`shipped:math_arith` as tasks, `shipped:quickstart` or
`shipped:judges/grid_goal` as a recipe); `omrl tasks generate` writes fresh task sets, `omrl recipes copy`
a recipe to edit.

Also where omrl keeps what it fetches or builds once per machine (sdists, models, vLLM's venv): `cache_dir()`.

This module imports nothing from omrl, so environments and task loading may both use it.
"""

from __future__ import annotations

import os
from pathlib import Path

PREFIX = "shipped:"


def cache_dir() -> Path:
    """omrl's cache folder: OMRL_CACHE_DIR, default ~/.cache/omrl."""
    return Path(os.environ.get("OMRL_CACHE_DIR") or Path.home() / ".cache" / "omrl")


def shipped_datasets_dir() -> Path:
    """The shipped data folder (tasks/ and code_tasks/), in a checkout or an installed package."""
    here = Path(__file__).resolve().parent
    data = here / "data"
    if data.is_dir():
        return data
    return here.parent / "datasets"  # a checkout made without symbolic links (omrl/data is then a file)


def shipped_recipes_dir() -> Path:
    """The shipped recipes folder, in a checkout or an installed package."""
    here = Path(__file__).resolve().parent
    recipes = here / "shipped_recipes"
    if recipes.is_dir():
        return recipes
    return here.parent / "recipes"  # a checkout made without symbolic links


def shipped_task_sets() -> list[str]:
    """Names of the shipped task sets, usable as `shipped:NAME`."""
    return _names(shipped_datasets_dir() / "tasks", ".jsonl")


def shipped_recipes() -> list[str]:
    """Names of the shipped recipes, usable as `shipped:NAME` (`judges/grid_goal` for one in a subfolder)."""
    return _names(shipped_recipes_dir(), ".yaml")


def resolve_tasks(source: str | Path) -> str | Path:
    """`shipped:NAME` -> the path of that shipped task set; any other source unchanged.

    Raises FileNotFoundError naming the shipped sets when NAME is not one of them, and "did you mean
    shipped:NAME?" for a missing .jsonl path that ends like a shipped set (datasets/tasks/NAME.jsonl)."""
    return _resolve(source, "task set", shipped_datasets_dir() / "tasks", ".jsonl")


def resolve_recipe(source: str | Path) -> str | Path:
    """`shipped:NAME` -> the path of that shipped recipe; any other source unchanged.

    Raises FileNotFoundError naming the shipped recipes when NAME is not one of them, and "did you mean
    shipped:NAME?" for a missing .yaml path that ends like a shipped recipe (recipes/NAME.yaml)."""
    return _resolve(source, "recipe", shipped_recipes_dir(), ".yaml")


def _shipped_name_of_missing(path: Path, folder: Path, suffix: str) -> str | None:
    """The shipped name a missing `path` with this suffix ends with (datasets/tasks/math_arith.jsonl ->
    math_arith, recipes/judges/grid_goal.yaml -> judges/grid_goal), else None. Other sources (a Hub
    dataset, a file that exists) are never matched."""
    if path.suffix != suffix or path.exists():
        return None
    names = set(_names(folder, suffix))
    parts = path.with_suffix("").parts
    return next(("/".join(parts[i:]) for i in range(len(parts)) if "/".join(parts[i:]) in names), None)


def _names(folder: Path, suffix: str) -> list[str]:
    return sorted(p.relative_to(folder).with_suffix("").as_posix() for p in folder.rglob(f"*{suffix}"))


def _resolve(source: str | Path, kind: str, folder: Path, suffix: str) -> str | Path:
    text = str(source)
    if not text.startswith(PREFIX):
        name = _shipped_name_of_missing(Path(text), folder, suffix)
        if name is not None:  # a checkout's path from an installed wheel (or another folder)
            raise FileNotFoundError(f"{text}: no such file; did you mean {PREFIX}{name}?")
        return source
    name = text[len(PREFIX):].removesuffix(suffix)
    names = _names(folder, suffix)
    if name not in names:  # a listed name only: no `..` or absolute path reaches outside the folder
        raise FileNotFoundError(f"{text}: no such shipped {kind}; shipped: " + ", ".join(PREFIX + n for n in names))
    return folder / f"{name}{suffix}"
