"""The math expert's plan: the calculations of a task's reference solution, replayed before it answers."""

from __future__ import annotations

import re

from omrl.envs.base import Task
from omrl.envs.expression import ExpressionError, evaluate

# GSM8K solutions annotate each computation as <<expression=result>>.
_CALCULATION = re.compile(r"<<([^=<>]+)=([^<>]*)>>")


def expert_calculations(task: Task) -> list[str]:
    """The expressions the expert evaluates before answering: the payload's expression, else the solution's
    <<expression=result>> annotations that are plain arithmetic."""
    if task.payload.get("expression"):
        return [str(task.payload["expression"])]
    solution = str(task.payload.get("solution") or task.payload.get("answer") or "")
    plan = []
    for expression, _result in _CALCULATION.findall(solution):
        try:
            evaluate(expression)
        except ExpressionError:
            continue  # a few annotations are not plain arithmetic; the expert skips them
        plan.append(expression.strip())
    return plan
