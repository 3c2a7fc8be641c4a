"""BFCL tasks: entries of one multi-turn category, drawn by seed from the chosen scenarios."""

from __future__ import annotations

import random
from typing import Any

from omrl.envs.base import Task
from omrl.envs.bfcl import data
from omrl.errors import UsageError


def scenarios_of(spec: Any) -> set[int] | None:
    """A scenario selection: None (all), "0-159", "3,5,10-20" or a list of indices."""
    if spec is None or spec == "":
        return None
    if isinstance(spec, int):
        return {spec}
    parts = spec if isinstance(spec, list) else str(spec).split(",")
    chosen: set[int] = set()
    try:
        for part in parts:
            text = str(part).strip()
            if "-" in text:
                lo, hi = (int(x) for x in text.split("-", 1))
                chosen.update(range(lo, hi + 1))
            else:
                chosen.add(int(text))
    except ValueError:
        raise UsageError(f"scenarios must be indices or ranges like 0-159 or 1,4,10-20, got {spec!r}") from None
    return chosen


def bfcl_tasks(n: int, seed: int = 0, split: str = "multi_turn_base", scenarios: Any = None) -> list[Task]:
    """`n` entries of category `split`, drawn by `seed` (the same arguments, the same tasks), from the
    scenario indices `scenarios` selects (default: all 200)."""
    chosen = scenarios_of(scenarios)
    items = [e for e in data.entries(split).values()
             if chosen is None or int(e["id"].rsplit("_", 1)[1]) in chosen]
    if n > len(items):
        raise UsageError(f"bfcl {split} has {len(items)} entries in the scenarios chosen, asked for {n}")
    random.Random(f"bfcl-{seed}-{split}").shuffle(items)
    version = data.version()
    tasks = []
    for item in items[:n]:
        first = next((turn for turn in item["question"] if turn), [])
        tasks.append(Task(
            id=f"bfcl-{item['id']}", instruction=data.turn_text(first), env="bfcl", split=split,
            payload={"entry_id": item["id"], "category": split, "scenario": int(item["id"].rsplit("_", 1)[1]),
                     "involved_classes": list(item["involved_classes"]), "turns": len(item["question"]),
                     "bfcl_eval_version": version}))
    return tasks
