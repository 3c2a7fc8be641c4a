"""MiniWoB tasks: the `miniwob` package's task pages by name, and tasks drawn from them (train/test by seed)."""

from __future__ import annotations

import importlib.util
import re
from functools import cache
from pathlib import Path

from omrl.envs.base import Task
from omrl.envs.miniwob.expert import SOLVERS
from omrl.envs.miniwob.page import read_page, start_episode
from omrl.errors import UsageError

SPLITS = ("train", "test")
MINIWOB_VERSION = "1.1.0"


@cache
def html_dir() -> Path | None:
    """The `miniwob` package's task pages, found without importing it (its import registers gymnasium envs)."""
    spec = importlib.util.find_spec("miniwob")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "html" / "miniwob"
    return path if path.is_dir() else None


@cache
def task_names() -> tuple[str, ...]:
    """The MiniWoB tasks the package registers (its gymnasium environments), flight tasks left out."""
    from miniwob.envs import miniwob_envs  # imports gymnasium: only when tasks are generated

    names = {getattr(cls, "subdomain", None) for cls in vars(miniwob_envs).values() if isinstance(cls, type)}
    return tuple(sorted(n for n in names if n and not n.startswith("flight.")))


def task_url(name: str) -> str:
    """The file:// URL of one task page; an unknown name is a UsageError."""
    root = html_dir()
    page = (root / f"{name}.html") if root is not None and re.fullmatch(r"[a-z0-9-]+", name or "") else None
    if page is None or not page.is_file():
        raise UsageError(f"unknown MiniWoB task {name!r} (see `omrl tasks generate miniwob --option tasks=...`)")
    return page.as_uri()


def selected_tasks(tasks: str | list[str] | None) -> list[str]:
    """Task names from a comma-separated list, a list, "all" (or none) or "scripted" (the expert's)."""
    if tasks in (None, "", "all"):
        return list(task_names())
    if tasks == "scripted":  # the tasks the scripted expert solves
        return sorted(SOLVERS)
    names = [t.strip() for t in tasks.split(",")] if isinstance(tasks, str) else [str(t) for t in tasks]
    unknown = [n for n in names if n not in task_names()]
    if unknown:
        raise UsageError(f"unknown MiniWoB task(s) {', '.join(unknown)}; known: {', '.join(task_names())}")
    return names


def generate(n: int, seed: int = 0, split: str = "train", tasks: str | list[str] | None = None) -> list[Task]:
    """n tasks, round-robin over `tasks` (comma-separated names, "all" or "scripted"; default all), each
    with its own seed; the utterances are read from the pages in one browser."""
    names = selected_tasks(tasks)
    plan = [(names[i % len(names)], f"{split}:{seed}:{i // len(names)}") for i in range(n)]
    if not plan:
        return []
    from omrl.envs.miniwob.browser import Browser

    browser = Browser()
    try:
        utterances = {}
        for name in names:
            seeds = [s for task_name, s in plan if task_name == name]
            if seeds:
                browser.driver.get(task_url(name))
                for task_seed in seeds:
                    start_episode(browser.driver, task_seed, split, None)
                    utterances[name, task_seed] = read_page(browser.driver).utterance
    finally:
        browser.close()
    return [Task(id=f"miniwob/{name}/{task_seed}", instruction=utterances[name, task_seed], env="miniwob",
                 split=split, payload={"task": name, "seed": task_seed, "data_mode": split,
                                       "miniwob": MINIWOB_VERSION})
            for name, task_seed in plan]
