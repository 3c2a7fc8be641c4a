"""The OS expert's plan: answer the gold match, or run the task's example script (a check task)."""

from __future__ import annotations

from typing import Any

from omrl.envs.base import Action


def expert_plan(payload: dict[str, Any]) -> list[Action]:
    """The expert's moves for a task's payload, in order."""
    if payload.get("match") is not None:
        return [Action(tool="answer", arguments={"answer": str(payload["match"])})]
    return [Action(tool="bash", arguments={"command": payload["example"]})]
