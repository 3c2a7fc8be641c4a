"""The trainers' per-step logs (omrl_grpo.json, omrl_ppo.json) read as RunLog series."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omrl.errors import UsageError
from omrl.store.readers import json_kind

RUN_LOGS = {"omrl_grpo.json": "grpo", "omrl_ppo.json": "ppo"}
# Our series name -> the log keys that carry it (first found wins): TRL's GRPO log names and omrl PPO's.
STEP_KEYS: dict[str, tuple[str, ...]] = {
    "reward": ("reward",),
    "success": ("success",),  # PPO logs it; GRPO's comes from the stored rollouts (STEPS_SQL)
    "loss": ("loss", "policy_loss"),
    "entropy": ("entropy",),
    "value_loss": ("value_loss",),
    "explained_variance": ("explained_variance",),
    "clip_fraction": ("clip_fraction", "clip_ratio/region_mean"),
    "approx_kl": ("approx_kl",),
    "kl": ("kl", "kl_ref"),
}


@dataclass
class RunLog:
    """One trainer's per-step log: `steps` holds {"step", and each STEP_KEYS series it logged}."""

    kind: str  # grpo or ppo
    path: Path
    label: str  # the log's folder, relative to the --runs folder it was found under
    round: int | None
    steps: list[dict[str, Any]]


def _finite(value: Any) -> float | None:
    # PPO writes NaN for what a step could not measure (kl_ref without a reference): no value, not 0.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def read_run_log(path: str | Path, label: str | None = None) -> RunLog:
    """A run log written by train_grpo (omrl_grpo.json) or train_ppo (omrl_ppo.json), as RunLog."""
    path = Path(path)
    kind = RUN_LOGS.get(path.name)
    if kind is None:
        raise UsageError(f"{path}: not a run log (expected one of {', '.join(RUN_LOGS)})")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"{path}: unreadable run log ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("log"), list):
        raise UsageError(f"{path}: a run log is a JSON object with a 'log' list, got {json_kind(data)}")
    steps = []
    for entry in data["log"]:
        # TRL's closing summary entry (train_runtime, ...) has no step metrics: not a step
        if not isinstance(entry, dict) or _finite(entry.get("step")) is None:
            continue
        row: dict[str, Any] = {"step": int(entry["step"])}
        for name, keys in STEP_KEYS.items():
            value = next((_finite(entry[k]) for k in keys if k in entry), None)
            if value is not None:
                row[name] = value
        if len(row) > 1:
            steps.append(row)
    recipe = data.get("recipe") if isinstance(data.get("recipe"), dict) else {}
    number = recipe.get("round")
    return RunLog(kind, path, label or str(path.parent), number if isinstance(number, int) else None,
                  sorted(steps, key=lambda r: r["step"]))


def find_run_logs(folders: list[str | Path]) -> list[RunLog]:
    """Every omrl_grpo.json / omrl_ppo.json under these folders (a file may be given as is), in path order."""
    logs = []
    for folder in folders:
        folder = Path(folder)
        if folder.is_file():
            logs.append(read_run_log(folder, folder.parent.name))
            continue
        if not folder.is_dir():
            raise UsageError(f"--runs {folder}: no such folder")
        found = sorted(p for name in RUN_LOGS for p in folder.rglob(name))
        if not found:
            raise UsageError(f"--runs {folder}: no {' or '.join(RUN_LOGS)} under it (written by omrl train "
                             "grpo, ppo and iterate into their output folders)")
        for path in found:
            label = str(path.parent.relative_to(folder)) if path.parent != folder else folder.name
            logs.append(read_run_log(path, label))
    return logs
