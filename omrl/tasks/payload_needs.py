"""The payload fields an environment says its tasks need, checked when rows are imported: a row lacking one is
refused there, in one line naming the field and the command that reads the environment's source files whole,
instead of every episode ending as an env_error at play.

An environment declares them on its class (omrl/envs/base.py, optional parts of the contract):
`required_payload` (each entry a field, or a tuple of fields one of which must be given) and `payload_reader`.
"""

from __future__ import annotations

import json
from typing import Any

from omrl.tasks.rows import TaskError, short_repr


def payload_needs(env: str | None, known: dict[str, tuple[tuple[Any, ...], str]]) -> tuple[tuple[Any, ...], str]:
    """Environment `env`'s (required_payload, payload_reader), looked up once per name in `known`; nothing
    when no environment is named or its class cannot be loaded here (collect then says why)."""
    if not env:
        return (), ""
    if env not in known:
        from omrl.envs import EnvSpecError, env_class

        try:
            cls = env_class(env)
        except EnvSpecError:
            cls = None
        known[env] = (tuple(getattr(cls, "required_payload", ()) or ()), str(getattr(cls, "payload_reader", "") or ""))
    return known[env]


def check_payload(task: dict[str, Any], index: int, known: dict[str, tuple[tuple[Any, ...], str]]) -> None:
    """Refuse a converted task row whose payload lacks a field its environment requires (null counts as absent)."""
    required, reader = payload_needs(task.get("env"), known)
    if not required:
        return
    payload = json.loads(task["payload"]) if isinstance(task.get("payload"), str) else (task.get("payload") or {})
    for need in required:
        fields = need if isinstance(need, tuple) else (need,)
        if not any(payload.get(name) is not None for name in fields):
            names = " or ".join(repr(name) for name in fields)
            where = f"row {index + 1}" + (f" (id {short_repr(task['id'])})" if task.get("id") else "")
            raise TaskError(f"{where}: environment {task['env']!r} needs the payload field {names}, which this row "
                            f"lacks" + (f"; {reader}" if reader else ""))
