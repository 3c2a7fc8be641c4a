"""A small base for tool environments: dispatch an Action to a `tool_<name>` method, never raise on bad input."""

from __future__ import annotations

import json
import re
from typing import Any

from omrl.envs.base import Action, StepResult


class InvalidAction(Exception):
    """Raised inside a tool method when the agent's move is invalid; becomes an observation, not an error."""


class ToolEnv:
    """Subclasses set `name`, `tools` (OpenAI schemas) and write one `tool_<name>(**arguments)` per tool.

    A tool method returns a StepResult; raising InvalidAction turns into an observation with
    info["invalid_action"] = True. Plain-text actions go to `text_action(text)` (default: parse
    `name[argument]` or a JSON tool call).
    """

    name = "tool-env"
    tools: list[dict[str, Any]] = []

    def __init__(self) -> None:
        self.invalid_actions = 0
        self.done = False

    def step(self, action: Action) -> StepResult:
        if self.done:
            return self._invalid("The episode is over; no more actions are accepted.")
        try:
            if action.tool is None:
                action = self.text_action(action.text)
            return self._call(action)
        except InvalidAction as exc:
            return self._invalid(str(exc))

    def text_action(self, text: str) -> Action:
        """Turn plain text into a tool call; the default understands `name[arg]` and JSON tool calls."""
        action = parse_text_action(text, self.tools)
        if action is None:
            raise InvalidAction(f"Could not read an action from the text. Call one of the tools: {self.tool_names()}.")
        return action

    def tool_names(self) -> str:
        return ", ".join(t["function"]["name"] for t in self.tools)

    def _call(self, action: Action) -> StepResult:
        schema = next((t["function"] for t in self.tools if t["function"]["name"] == action.tool), None)
        if schema is None:
            raise InvalidAction(f"Unknown tool {action.tool!r}. Available tools: {self.tool_names()}.")
        arguments = action.arguments if isinstance(action.arguments, dict) else None
        if arguments is None:
            raise InvalidAction(f"Arguments of {action.tool} must be a JSON object.")
        properties = schema["parameters"]["properties"]
        unknown = sorted(set(arguments) - set(properties))
        if unknown:
            raise InvalidAction(f"{action.tool} got unknown argument(s) {unknown}; it takes {sorted(properties)}.")
        missing = [name for name in schema["parameters"].get("required", []) if name not in arguments]
        if missing:
            raise InvalidAction(f"{action.tool} is missing required argument(s) {missing}.")
        return getattr(self, f"tool_{action.tool}")(**arguments)

    def _invalid(self, message: str) -> StepResult:
        self.invalid_actions += 1
        return StepResult(observation=f"Invalid action: {message}", reward=0.0, done=False,
                          info={"invalid_action": True, "invalid_actions": self.invalid_actions})

    def close(self) -> None:
        self.done = True


_BRACKET = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\[(.*)\]", re.DOTALL)


def parse_text_action(text: str, tools: list[dict[str, Any]]) -> Action | None:
    """Read `name[argument]` (ReAct/WebShop style; the last one wins) or a JSON {"name", "arguments"} object.

    A bracketed argument fills the tool's first parameter. Returns None when nothing is recognised.
    """
    text = (text or "").strip()
    by_name = {t["function"]["name"]: t["function"] for t in tools}
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None
        if isinstance(data, dict) and data.get("name") in by_name:
            arguments = data.get("arguments") or {}
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except json.JSONDecodeError:
                    return None
            return Action(tool=data["name"], arguments=arguments)
    matches = [m for m in re.finditer(r"([A-Za-z_][A-Za-z0-9_]*)\[", text) if m.group(1) in by_name]
    for match in reversed(matches):
        found = _BRACKET.match(text, match.start())
        if not found:
            continue
        name, argument = found.group(1), found.group(2)
        params = list(by_name[name]["parameters"]["properties"])
        if not params:
            return Action(tool=name, arguments={})
        return Action(tool=name, arguments={params[0]: argument.strip()})
    return None


def action_to_text(action: Action) -> str:
    """The inverse of parse_text_action for one-argument tools: `name[argument]`."""
    if action.tool is None:
        return action.text
    values = list(action.arguments.values())
    if len(values) <= 1:
        return f"{action.tool}[{values[0] if values else ''}]"
    return json.dumps({"name": action.tool, "arguments": action.arguments}, ensure_ascii=False)


def play_episode(env: Any, task: Any, max_steps: int = 50, rng: Any = None) -> tuple[float, StepResult, int]:
    """Play one episode with the env's scripted expert (or its random_action when rng is given), without a
    model: (total reward, last step, steps). For tests and quick checks; collection uses the agent loop."""
    env.reset(task)
    total, result = 0.0, None
    for steps in range(1, max_steps + 1):
        action = env.random_action(rng) if rng is not None else env.expert_action()
        result = env.step(action)
        total += result.reward
        if result.done:
            return total, result, steps
    return total, result, max_steps
