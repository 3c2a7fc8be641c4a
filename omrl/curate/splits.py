"""Splits by task: every trajectory of a task lands in the same split, chosen by hashing the task id.

The assignment depends only on (seed, task_id), so it is stable when the store grows and identical
on every rebuild. Fractions are of tasks, not of trajectories.
"""

from __future__ import annotations

import hashlib

from omrl.errors import UsageError


def parse_split(spec: str | None) -> dict[str, float]:
    """`"val=0.05"` or `"val=0.05,test=0.1"` -> {"val": 0.05, "test": 0.1}; the rest is "train"."""
    if not spec:
        return {}
    out: dict[str, float] = {}
    for part in spec.split(","):
        name, sep, value = part.strip().partition("=")
        try:
            frac = float(value)
        except ValueError:
            frac = -1.0
        if not sep or not name or not 0 < frac < 1 or name == "train":
            raise UsageError(f"bad split {part!r}: write NAME=FRACTION with 0 < FRACTION < 1, e.g. val=0.05")
        out[name] = frac
    if sum(out.values()) >= 1:
        raise UsageError(f"split fractions {spec!r} leave nothing for train")
    return out


def task_unit(task_id: str, seed: int) -> float:
    """A uniform number in [0, 1) fixed by (seed, task_id)."""
    digest = hashlib.sha256(f"{seed}:{task_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def assign_split(task_id: str, fractions: dict[str, float], seed: int = 0) -> str:
    """The split of a task: named splits take consecutive slices of [0, 1) in sorted name order, train the rest."""
    u = task_unit(task_id, seed)
    edge = 0.0
    for name in sorted(fractions):
        edge += fractions[name]
        if u < edge:
            return name
    return "train"
