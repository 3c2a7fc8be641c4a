"""Row ids and times: deterministic ids of collected trajectories and groups, random ids, the UTC clock."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone


def trajectory_id(run_id: str, round: int, task_id: str, sample: int, attempt: int = 0) -> str:
    """Deterministic id of a collected trajectory: a resumed run cannot write the same episode twice.

    `attempt` counts replays of a failed episode (collect --retry-failed): attempt 0, every first play, keeps
    the id it always had; attempt n > 0 has its own id, so the failed rows before it stay as history."""
    key = json.dumps([run_id, int(round), str(task_id), int(sample), *([int(attempt)] if attempt else [])])
    return hashlib.sha256(key.encode()).hexdigest()[:24]


def group_id(run_id: str, round: int, task_id: str) -> str:
    """The GRPO group key: all samples of one task by one run in one round."""
    key = json.dumps([run_id, int(round), str(task_id)])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def new_id() -> str:
    """A random id for rows that have no natural key."""
    import uuid

    return uuid.uuid4().hex[:24]


def utcnow() -> datetime:
    return datetime.now(timezone.utc)
