"""Math tasks: generated arithmetic with whole-number answers, the same for the same seed."""

from __future__ import annotations

import random

from omrl.envs.base import Task
from omrl.envs.expression import evaluate, format_number


def generate_tasks(n: int, seed: int = 0, split: str = "train", max_operands: int = 4) -> list[Task]:
    """Generated arithmetic tasks: ids math-<seed>-<i>, the expression in payload, the value as answer."""
    rng = random.Random(seed)
    tasks = []
    templates = [
        "Compute {e}.",
        "What is {e}?",
        "Use the calculator to evaluate {e} and answer with the result.",
    ]
    while len(tasks) < n:
        expression = _random_expression(rng, rng.randint(2, max_operands))
        value = evaluate(expression)
        if isinstance(value, float) and not value.is_integer():
            continue  # keep answers whole numbers so exact matching is unambiguous
        i = len(tasks)
        tasks.append(Task(id=f"math-{seed}-{i}", instruction=rng.choice(templates).format(e=expression),
                          answer=format_number(value), env="math", split=split,
                          payload={"expression": expression, "source": "generated"}))
    return tasks


def _random_expression(rng: random.Random, operands: int) -> str:
    text = str(rng.randint(1, 99))
    for _ in range(operands - 1):
        op = rng.choice(["+", "-", "*", "+", "-"])
        term = str(rng.randint(1, 99)) if op != "*" else str(rng.randint(2, 12))
        text = f"({text}) {op} {term}" if op == "*" and rng.random() < 0.5 else f"{text} {op} {term}"
    return text
