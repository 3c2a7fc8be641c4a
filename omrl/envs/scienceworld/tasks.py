"""ScienceWorld tasks: (task type, variation) pairs of the simulator's own train/dev/test variations, from a
per-version table the simulator makes on first use."""

from __future__ import annotations

import json
import os
import random
from functools import cache
from pathlib import Path
from typing import Any

from omrl.envs import textgame
from omrl.envs.base import Task
from omrl.envs.engine_memory import jvm_caps
from omrl.envs.scienceworld.engine import JVM_HEAP_MB, start_engine
from omrl.errors import UsageError


@cache
def variation_table() -> dict[str, dict[str, Any]]:
    """{task name: {"id", "train", "dev", "test"}} for the installed scienceworld, from the per-version cache
    (made by the simulator on first use)."""
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    path = home / "omrl" / "scienceworld" / str(textgame.installed_version("scienceworld")) / "variations.json"
    if path.exists():
        return json.loads(path.read_text())
    engine = start_engine(*jvm_caps("scienceworld", JVM_HEAP_MB, None), call_timeout=600.0)
    try:
        table = engine.call("variations")
    finally:
        engine.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(table))
    os.replace(partial, path)  # whole or absent: concurrent first uses write the same table
    return table


def sciworld_tasks(n: int, seed: int = 0, split: str = "train", tasks: Any = None, simplifications: str = "") -> list[Task]:
    """`n` (task type, variation) pairs of `split`: task types in a seeded order, round robin, each with
    a variation of the split not drawn before; the same arguments give the same tasks."""
    table = variation_table()
    names = sorted(table)
    if tasks:
        wanted = [t.strip() for t in (tasks if isinstance(tasks, list) else str(tasks).split(",")) if t.strip()]
        by_id = {v["id"]: k for k, v in table.items()}
        unknown = [t for t in wanted if t not in table and t not in by_id]
        if unknown:
            raise UsageError(f"unknown ScienceWorld task(s) {unknown}; known: {', '.join(names)}")
        names = sorted({by_id.get(t, t) for t in wanted})
    rng = random.Random(f"scienceworld-{seed}-{split}")
    pools = {name: rng.sample(table[name][split], len(table[name][split])) for name in names}
    order = rng.sample(names, len(names))
    available = sum(len(p) for p in pools.values())
    if n > available:
        raise UsageError(f"scienceworld {split} has {available} variations of the chosen tasks, asked for {n}")
    out: list[Task] = []
    version = textgame.installed_version("scienceworld")
    while len(out) < n:
        for name in order:
            if pools[name] and len(out) < n:
                variation = pools[name].pop()
                task_id = table[name]["id"]
                out.append(Task(
                    id=f"scienceworld-{name}-{variation}" + (f"-{simplifications}" if simplifications else ""),
                    instruction=f"ScienceWorld task {task_id} ({name}), variation {variation}", env="scienceworld",
                    split=split, payload={"task_name": name, "task_id": task_id, "variation": variation,
                                          "simplifications": simplifications, "scienceworld_version": version}))
    return out
