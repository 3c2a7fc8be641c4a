"""Task fingerprints: two tasks with the same fingerprint are the same task to the agent, whatever their ids.

A fingerprint is 16 hex digits of sha256 over three parts, as canonical JSON:
- `start`: what the agent can observe at the start: the task's instruction and what `reset(task)` returns (the
  first observation, the tools offered, the system prompt);
- `payload`: the task's payload without the keys in DROPPED_PAYLOAD_KEYS (below), which label or name a task
  rather than describe it;
- `structure`: the environment's own word on the game's structure, where it can tell: the optional hook
  `fingerprint(task) -> str | None`, a method an environment class may have, called right after `reset(task)`
  on the same instance (so it may read the game just built: for TextWorld-like games the map, the room names
  and where the objects lie). None, or no hook: the start and the payload stand for the task.

The task's id, split and gold answer are left out: the id and split are labels, and the answer is not seen by
the agent (it follows from what is in the payload). Environments are made by omrl.envs.make_env with the
study's options, the way `omrl collect` makes them; a `reusable` environment plays every task in turn.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from omrl.envs import make_env
from omrl.envs.base import Task

# Payload keys that do not describe the task, each dropped (top level only) from the default fingerprint:
DROPPED_PAYLOAD_KEYS = {
    "id": "a label: the same task under another id is the same task",
    "task_id": "a label, as id",
    "split": "the held-out label itself: kept, a test task would differ from its train copy by construction",
    "fold": "the held-out label as TextWorldExpress writes it (its split), dropped for the same reason",
    "seed": "a generator seed names a game rather than describing it: two seeds can make the same game (the "
            "audit's 200 TWX test games were 98), and what the seed made shows in the start observation and "
            "the environment's structure hook",
    "source": "provenance (`generated`, an importer's name): where a task came from, not what it is",
}


def fingerprint_parts(env: Any, task: Task) -> dict[str, Any]:
    """The three parts a fingerprint hashes (see the module's docstring), the environment reset to `task`."""
    first = env.reset(task)
    start = {"instruction": task.instruction, "observation": getattr(first, "observation", first),
             "tools": getattr(first, "tools", None), "system_prompt": getattr(first, "system_prompt", None)}
    payload = {key: value for key, value in (task.payload or {}).items() if key not in DROPPED_PAYLOAD_KEYS}
    hook = getattr(env, "fingerprint", None)
    structure = hook(task) if callable(hook) else None
    if structure is not None and not isinstance(structure, str):
        raise TypeError(f"{type(env).__name__}.fingerprint must return text or None, not {type(structure).__name__}")
    return {"start": start, "payload": payload, "structure": structure}


def digest(parts: dict[str, Any]) -> str:
    """16 hex digits of sha256 over `parts` as canonical JSON (keys sorted; values JSON cannot hold as repr)."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=repr)
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:16]


def task_fingerprint(env: Any, task: Task) -> str:
    """`task`'s fingerprint, played on `env` (which it resets)."""
    return digest(fingerprint_parts(env, task))


def fingerprint_tasks(env_spec: str, tasks: Iterable[Task], env_options: dict[str, Any] | None = None
                      ) -> dict[str, str]:
    """task id -> fingerprint for `tasks`, on environments `make_env(env_spec, **env_options)`: one instance for
    all when the class is `reusable`, else a fresh one per task (its own state never leaks into the next)."""
    options = dict(env_options or {})
    out: dict[str, str] = {}
    env = None
    try:
        for task in tasks:
            if env is None:
                env = make_env(env_spec, **options)
            out[task.id] = task_fingerprint(env, task)
            if getattr(env, "reusable", False) is not True:
                env.close()
                env = None
    finally:
        if env is not None:
            env.close()
    return out
