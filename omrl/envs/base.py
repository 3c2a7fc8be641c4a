"""The environment protocol every omrl environment follows.

One environment instance runs one episode at a time:

    env = SomeEnv(**options)
    first = env.reset(task)          # Reset: first observation text + the tools offered (OpenAI schemas)
    result = env.step(action)        # StepResult: observation, reward, done, info
    env.close()

An action is one tool call (name + parsed arguments) or, for text environments, plain text. The
agent loop steps once per tool call the model makes. An invalid action never raises: it returns an
observation saying what was wrong and sets info["invalid_action"] = True. An exception out of
reset/step means the environment itself failed (stored as status env_error); a task it refuses raises
InvalidTask from reset, with a message naming the task and the field.

A step may change the tools offered from the next model call on (StepResult.tools; the stored row keeps
the last set). Action.turn is the index of the assistant reply that made a call, so an environment can
tell the calls of one reply (parallel calls) from those of the next.

A step's info may carry a short human-readable "note" on its outcome (a checker's verdict); `omrl show`
prints it beside the turn.

Rewards: StepResult.reward is the reward earned by that step; the trajectory reward is the sum.
The episode's outcome is info["success"] on the final step (when absent: final reward >= 1).
`expert_action()` returns the next move of a scripted expert (which may read the gold answer), or a
list of tool-call Actions made at once in one reply; it exists to test the plumbing and to make
demonstrations.

Optional parts of the contract, looked up on the class (omrl.envs reads them; none needs registering):
- `generate_tasks(n, seed=0, split=..., **options) -> list[Task]` (a classmethod): the environment's own
  task generator, behind `omrl tasks generate NAME`; the same arguments give the same tasks, and
  different splits never share a game, layout or variation. `splits` names the splits it knows.
- `unavailable() -> str | None` (a classmethod): one line saying why the environment cannot run here
  (the pip extra or the system package it lacks), or None; `make_env` refuses with that line.
- `reusable = True`: `reset` restores a fresh state, so one instance may play many episodes in turn
  (slow engines: JVMs, browsers). The episode runner then pools instances and closes one that failed.
- `default_max_turns`: the turn budget an episode gets when the user sets none (a text game needs more
  moves than a one-shot tool task); omrl.rollout.turn_budget reads it.
- `resource_limits() -> str | None` (a classmethod): the resource limits in force on this host, shown by `omrl envs`.
- `required_payload`: the payload fields every task needs, each a name or a tuple of names one of which must be
  given (not null), and `payload_reader`: one line naming the command that reads the environment's source files
  whole; `omrl tasks import` refuses a row lacking one (omrl.tasks.payload_needs) instead of playing env_errors.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict, runtime_checkable

from omrl.errors import OmrlError


class InvalidTask(OmrlError, ValueError):
    """A task the environment cannot play (a payload it refuses); raised by reset, stored as env_error with
    this one-line message."""


@dataclass
class Action:
    """One agent move: a tool call (tool + arguments) or plain text (tool is None)."""

    tool: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    text: str = ""
    turn: int | None = None  # the assistant turn (reply) that made it, set by the agent loop: calls of one reply share it

    def describe(self) -> str:
        if self.tool is None:
            return self.text
        return f"{self.tool}({json.dumps(self.arguments, ensure_ascii=False)})"


@dataclass
class Reset:
    """What the agent sees first: the observation text and the tools it may call."""

    observation: str
    tools: list[dict[str, Any]] = field(default_factory=list)
    system_prompt: str | None = None


@dataclass
class StepResult:
    observation: str
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] | None = None  # when set: the tools offered from now on (an episode may add some)


class TaskRow(TypedDict):
    """One checked row of a tasks file (omrl.tasks.TASK_SCHEMA), payload as JSON text of an object."""

    id: str
    instruction: str
    answer: str | None
    env: str | None
    split: str | None
    payload: str | None


@dataclass
class Task:
    """One task as environments receive it (a row of a tasks file)."""

    id: str
    instruction: str
    answer: str | None = None
    env: str | None = None
    split: str | None = None
    payload: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_row(cls, record: Mapping[str, Any]) -> Task:
        """A task from a task row, or a record in its form (payload JSON text or an object, id any scalar)."""
        payload = record.get("payload") or {}
        if isinstance(payload, str):
            payload = json.loads(payload)
        return cls(id=str(record["id"]), instruction=record.get("instruction") or "", answer=record.get("answer"),
                   env=record.get("env"), split=record.get("split"), payload=payload)

    def to_row(self) -> TaskRow:
        return {"id": self.id, "instruction": self.instruction, "answer": self.answer, "env": self.env,
                "split": self.split, "payload": json.dumps(self.payload, ensure_ascii=False)}


@runtime_checkable
class Environment(Protocol):
    name: str

    def reset(self, task: Task) -> Reset: ...

    def step(self, action: Action) -> StepResult: ...

    def close(self) -> None: ...


def tool_schema(name: str, description: str, properties: dict[str, Any], required: list[str] | None = None
                ) -> dict[str, Any]:
    """An OpenAI function-tool schema."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties,
                           "required": list(properties) if required is None else required},
        },
    }
