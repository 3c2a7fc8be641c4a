"""`math`: word problems with a safe calculator tool and an answer tool; reward 1 for the right number."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from omrl.envs.base import Action, Reset, StepResult, Task, tool_schema
from omrl.envs.expression import ExpressionError, evaluate, format_number, numbers_match, parse_number
from omrl.envs.math.expert import expert_calculations
from omrl.envs.math.tasks import generate_tasks
from omrl.envs.toolenv import InvalidAction, ToolEnv
from omrl.errors import UsageError

SYSTEM_PROMPT = ("Solve the problem. Use the calculator tool for arithmetic, then call answer with the final "
                 "number only.")

TOOLS = [
    tool_schema("calculator", "Evaluate an arithmetic expression (numbers, + - * / // % ** and parentheses).",
                {"expression": {"type": "string", "description": "e.g. (16 - 3 - 4) * 2"}}),
    tool_schema("answer", "Give the final answer (a number). Ends the episode.",
                {"value": {"type": "string", "description": "the final number, e.g. 18"}}),
]

_FINAL = re.compile(r"(?:####|answer\s*(?:is|:)|\\boxed\{)\s*\$?\s*(-?[\d,]*\.?\d+)", re.IGNORECASE)


@dataclass
class MathOptions:
    """MathEnv's constructor options, as `--env-option KEY=VALUE` gives them (checked by the recipe loader)."""

    max_calculator_calls: int = 50


class MathEnv(ToolEnv):
    """Word problems with a calculator(expression) tool and answer(value); reward 1 on a numeric match."""

    name = "math"
    options_class = MathOptions
    tools = TOOLS

    @classmethod
    def generate_tasks(cls, n: int, seed: int = 0, split: str = "train", max_operands: int = 4) -> list[Task]:
        """Generated arithmetic tasks (tasks.py)."""
        return generate_tasks(n, seed=seed, split=split, max_operands=max_operands)

    def __init__(self, max_calculator_calls: int = 50) -> None:
        super().__init__()
        self.max_calculator_calls = max_calculator_calls
        self.task: Task | None = None

    def reset(self, task: Task) -> Reset:
        if task.answer is None or parse_number(task.answer) is None:
            raise UsageError(f"math task {task.id!r} has no numeric gold answer (answer={task.answer!r})")
        super().__init__()
        self.task = task
        self.calculator_calls = 0
        self._expert_plan = expert_calculations(task)
        return Reset(observation=task.instruction, tools=list(TOOLS), system_prompt=SYSTEM_PROMPT)

    def text_action(self, text: str) -> Action:
        # A model answering in prose ("#### 42", "The answer is 42") is taken as an answer.
        action = super().text_action(text) if "[" in text or text.lstrip().startswith("{") else None
        if action is None:
            match = _FINAL.search(text or "")
            if not match:
                raise InvalidAction("No tool call and no final answer found. Call calculator(expression) "
                                    "or answer(value).")
            action = Action(tool="answer", arguments={"value": match.group(1)})
        return action

    def tool_calculator(self, expression: str) -> StepResult:
        self.calculator_calls += 1
        if self.calculator_calls > self.max_calculator_calls:
            raise InvalidAction(f"calculator used more than {self.max_calculator_calls} times")
        try:
            value = evaluate(expression)
        except ExpressionError as exc:
            raise InvalidAction(f"calculator: {exc}") from None
        return StepResult(observation=format_number(value), info={"tool": "calculator"})

    def tool_answer(self, value: Any) -> StepResult:
        if parse_number(value) is None:
            raise InvalidAction(f"answer must be a number, got {value!r}")
        self.done = True
        correct = numbers_match(value, self.task.answer)
        return StepResult(observation="Correct." if correct else "Incorrect.", reward=1.0 if correct else 0.0,
                          done=True, info={"success": correct, "answer": str(value)})

    def expert_action(self) -> Action:
        """Replay the calculations of the reference solution, then answer the gold number."""
        if self._expert_plan:
            return Action(tool="calculator", arguments={"expression": self._expert_plan.pop(0)})
        return Action(tool="answer", arguments={"value": format_number(parse_number(self.task.answer))})

    def random_action(self, rng: random.Random) -> Action:
        if rng.random() < 0.5:
            a, b = rng.randint(0, 100), rng.randint(1, 100)
            return Action(tool="calculator", arguments={"expression": f"{a} {rng.choice('+-*/')} {b}"})
        return Action(tool="answer", arguments={"value": str(rng.randint(0, 100))})


