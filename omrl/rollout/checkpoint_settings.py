"""A checkpoint's rollout settings: the environment and the knobs its trainer played (or read) episodes with,
saved beside the weights as omrl_rollout.json, so `omrl eval/collect --policy hf:CKPT` plays it as it was
trained unless a flag says otherwise (omrl.cli.collect reads it).

    save_rollout_settings(out, recipe.rollout, trainer="grpo")     # every trainer, beside the weights
    read_rollout_settings("runs/grpo")                             # {"env": "grid", "max_turns": 14, ...} or None

Saved: env and CARRIED (env_options, max_turns, max_new_tokens, temperature), each only when known (a trainer
that only reads rows, SFT, knows what its rows show: settings_shown_by); the file lists the others under `missing`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omrl.errors import UsageError
from omrl.rollout.settings import RolloutSettings
from omrl.schema.payloads import metadata_of

SETTINGS_FILE = "omrl_rollout.json"
CARRIED = ("env_options", "max_turns", "max_new_tokens", "temperature")  # what eval and collect take from it
# Never carried to another machine's run: running agent code outside the sandbox is asked for each time.
_NOT_CARRIED_OPTIONS = ("unsafe_no_sandbox",)


def save_rollout_settings(checkpoint: str | Path, settings: RolloutSettings | Mapping[str, Any], *,
                          trainer: str) -> Path:
    """Write omrl_rollout.json into `checkpoint`: `settings` (RolloutSettings, or a mapping of the known ones)
    less the unknown (None) ones, which it names under `missing`; returns the file's path."""
    values = settings if isinstance(settings, Mapping) else {
        name: getattr(settings, name) for name in ("env", *CARRIED)}
    known: dict[str, Any] = {name: values.get(name) for name in ("env", *CARRIED) if values.get(name) is not None}
    if "env_options" in known:
        known["env_options"] = {k: v for k, v in dict(known["env_options"]).items() if k not in _NOT_CARRIED_OPTIONS}
    record = {"trainer": trainer, **known, "missing": [name for name in ("env", *CARRIED) if name not in known]}
    path = Path(checkpoint) / SETTINGS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, default=str) + "\n", encoding="utf-8")
    return path


def read_rollout_settings(checkpoint: str | Path) -> dict[str, Any] | None:
    """The known settings saved in `checkpoint` (env and those of CARRIED it holds); None when it has no
    omrl_rollout.json (a checkpoint not trained by omrl)."""
    path = Path(checkpoint) / SETTINGS_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not readable as JSON ({exc}); delete it to play the checkpoint with the "
                         "flags' settings only") from None
    if not isinstance(record, dict):
        raise UsageError(f"{path}: expected a JSON object of rollout settings")
    return {name: record[name] for name in ("env", *CARRIED) if record.get(name) is not None}


def settings_shown_by(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The rollout settings trajectory rows show (SFT's, which plays no episode): env and max_turns where every
    row agrees (metadata.max_turns: the budget they were played with); the rest is unknown."""
    envs = {row.get("env") or None for row in rows}  # "": a row that names no environment
    turns = {metadata_of(row).get("max_turns") for row in rows}
    return {"env": envs.pop() if len(envs) == 1 else None,
            "max_turns": turns.pop() if len(turns) == 1 else None}
