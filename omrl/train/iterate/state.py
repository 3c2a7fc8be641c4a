"""A resumable run's state file (state.json of omrl train iterate, a comparison's benchmark_state.json): the
finished stages in order, each with its checkpoint and results, and the recipe they were made with, so that a
run started again with another recipe is refused instead of mixing two setups in one result."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from omrl.errors import UsageError

# Settings a resumed run may change: they change no recorded result (how fast or how loud a run is, where it
# writes) or only add stages (more rounds, a baseline). Any other change refuses to resume (check_recipe).
RESUMABLE_SETTINGS = {"threads", "report", "rounds", "output_dir", "store", "baseline"}
RESUMABLE_LEAVES = {"concurrency", "quiet", "logging_steps"}


def recipe_changes(before: Any, now: Any, prefix: str = "") -> list[str]:
    """'key: old -> new' for every setting (dotted key) whose value differs between two recipes as plain data
    ('(not set)' where one lacks it, as in an env_options mapping), except RESUMABLE_SETTINGS (top level) and
    RESUMABLE_LEAVES (at any depth)."""
    if not (isinstance(before, dict) and isinstance(now, dict)):
        return [] if before == now else [f"{prefix.rstrip('.')}: {before} -> {now}"]
    changes = []
    for key in sorted(set(before) | set(now)):
        if not ((not prefix and key in RESUMABLE_SETTINGS) or key in RESUMABLE_LEAVES):
            changes += recipe_changes(before.get(key, "(not set)"), now.get(key, "(not set)"), f"{prefix}{key}.")
    return changes


def _with_defaults(recorded: Any, kind: type) -> Any:
    """A recorded recipe with the settings it lacks at `kind`'s defaults (a setting added to omrl after the
    record was written); as recorded when it no longer loads as `kind` (a setting since removed: a change)."""
    from omrl.config import RecipeError, from_dict, to_dict

    try:
        return json.loads(json.dumps(to_dict(from_dict(kind, recorded, where="state")), default=str))
    except (RecipeError, TypeError, ValueError):  # it does not load as `kind` now: compare it as recorded
        return recorded


class IterateState:
    """state.json: finished stages in order, each with its checkpoint and results, and the recipe they were made
    with (check_recipe); written atomically."""

    def __init__(self, path: Path):
        self.path = path
        self.data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"stages": []}

    def done(self, stage: str) -> dict[str, Any] | None:
        return next((s for s in self.data["stages"] if s["stage"] == stage), None)

    def finish(self, stage: str, **record: Any) -> None:
        self.data["stages"].append({"stage": stage, **record})
        self._write()

    def check_recipe(self, config: Any, key: str = "recipe") -> None:
        """Record recipe `config` (a settings dataclass) under `key` as the one this state's stages are made with;
        refuse (UsageError) to resume stages made with another, naming what changed: skipping them would mix two
        setups in one result. A state recorded before recipes were kept is taken as made with this one; a setting
        omrl added since the state was recorded counts as unchanged while it keeps its default."""
        from omrl.config import to_dict

        recipe = json.loads(json.dumps(to_dict(config), default=str))  # as the state file holds it
        before = self.data.get(key)
        changes = recipe_changes(_with_defaults(before, type(config)), recipe) if before is not None else []
        if changes:
            shown = "; ".join(changes[:8]) + (f"; and {len(changes) - 8} more" if len(changes) > 8 else "")
            raise UsageError(f"{self.path} records stages made with another recipe ({shown}): use a new output "
                             "folder, or put those settings back to resume")
        if before != recipe:  # the first record, or changes that need no new stages
            self.data[key] = recipe
            self._write()

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.path)

    @property
    def checkpoint(self) -> str | None:
        for stage in reversed(self.data["stages"]):
            if stage.get("checkpoint"):
                return stage["checkpoint"]
        return None
