"""What the text-game environments share (TextWorld, TextWorldExpress): the `act` tool, reading a command
from an action, and the observation with the commands the engine accepts.

Prompts follow the agent papers' text-game format (ETO, AgentGym): the game's own text, then the
admissible commands when the engine lists them; the agent answers with one command, through the `act`
tool or as plain text (the last "Action: ..." line when the reply has one, else its first line).
"""

from __future__ import annotations

import random
import re
from typing import Any

from omrl.envs.base import Action, StepResult, tool_schema

ACT_TOOL = tool_schema("act", "Type one command into the text game, e.g. 'open fridge' or 'go north'.",
                       {"command": {"type": "string", "description": "the command, as you would type it"}})
TOOL_PROMPT = ("You are playing a text-based game. Each turn, call the `act` tool with exactly one command. "
               "Use the admissible commands listed after each observation when they are given.")
TEXT_PROMPT = ("You are playing a text-based game. Each turn, reply with exactly one command and nothing else "
               "(or end your reply with a line 'Action: <command>'). Use the admissible commands listed after "
               "each observation when they are given.")
MAX_COMMAND_CHARS = 180  # the Z-machine reads at most ~200 characters of input; longer is cut, never split
_ACTION_LINE = re.compile(r"^\s*action\s*:\s*(.*)$", re.IGNORECASE | re.MULTILINE)


def installed_version(distribution: str) -> str | None:
    """The installed version of a package (recorded in task payloads: a replay needs the same engine)."""
    try:
        from importlib.metadata import version

        return version(distribution)
    except Exception:
        return None


def system_prompt(action_format: str) -> str:
    return TOOL_PROMPT if action_format == "tool" else TEXT_PROMPT


def tools_for(action_format: str) -> list[dict[str, Any]]:
    return [ACT_TOOL] if action_format == "tool" else []


def check_action_format(action_format: str) -> str:
    from omrl.errors import UsageError

    if action_format not in ("tool", "text"):
        raise UsageError(f"action_format must be 'tool' or 'text', got {action_format!r}")
    return action_format


def read_command(action: Action) -> tuple[str | None, str | None]:
    """(command, None), or (None, why the action holds no command). One line, single spaces, bounded length:
    a command can never smuggle a second command into the engine's input."""
    if action.tool is not None:
        if action.tool != "act":
            return None, f"unknown tool {action.tool!r}: the only tool is act(command)"
        value = action.arguments.get("command") if isinstance(action.arguments, dict) else None
        if not isinstance(value, str):
            return None, "act needs a `command` string argument"
        text = value
    else:
        found = _ACTION_LINE.findall(action.text or "")
        text = found[-1] if found else next((line for line in (action.text or "").splitlines() if line.strip()), "")
    command = " ".join(text.split())[:MAX_COMMAND_CHARS].strip().strip("`'\"").strip()
    if not command:
        return None, "the command is empty"
    return command, None


def with_commands(text: str, commands: list[str] | None) -> str:
    """The observation shown to the agent: the game's text, then its admissible commands (when listed)."""
    text = text.strip()
    if commands:
        return f"{text}\n\nAdmissible commands: {', '.join(commands)}"
    return text


def as_action(command: str, action_format: str) -> Action:
    """A command as the action an agent of this format would send."""
    if action_format == "tool":
        return Action(tool="act", arguments={"command": command})
    return Action(text=command)


def random_command(commands: list[str], rng: random.Random) -> str:
    """A uniformly random admissible command (the random baseline of the text-game papers)."""
    return rng.choice(commands) if commands else "look"


class CommandGame:
    """The steps every engine-backed text game takes the same way; subclasses own the engine and the game.

    A subclass sets `action_format` and `engine` (an omrl.envs.engine.EngineWorker), and in `reset`
    `commands` (admissible now; [] when the engine lists none), `sent = []` and `done = False`. It
    implements `play(command) -> StepResult` (send one command, read the scorer) and `expert_path()`
    (the expert's commands from the start of the game).
    """

    action_format = "tool"
    fallback = "look"  # the expert's command once its path is played out
    engine: Any = None

    def __init__(self) -> None:
        self.commands: list[str] = []
        self.sent: list[str] = []  # commands sent to the game this episode
        self.done = True

    def play(self, command: str) -> StepResult:
        raise NotImplementedError

    def expert_path(self) -> list[str]:
        raise NotImplementedError

    def step(self, action: Action) -> StepResult:
        if self.done:
            return StepResult("The game is over.", 0.0, True, {"invalid_action": True, "success": False})
        command, problem = read_command(action)
        if command is None:  # not a command at all: the game is not asked
            return StepResult(f"Invalid action: {problem}.", 0.0, False, {"invalid_action": True, "reason": problem})
        admissible = not self.commands or command in self.commands
        self.sent.append(command)
        result = self.play(command)
        result.info["command"] = command
        if not admissible:  # the game answered it (that answer is the observation), but it was not admissible
            result.info["invalid_action"] = True
        return result

    def expert_action(self) -> Action:
        """The next command of the expert's path (the expert plays it from the start)."""
        path, played = self.expert_path(), len(self.sent)
        return as_action(path[played] if played < len(path) else self.fallback, self.action_format)

    def random_action(self, rng: random.Random) -> Action:
        return as_action(random_command(self.commands, rng), self.action_format)

    def close(self) -> None:
        self.done = True
        if self.engine is not None:
            self.engine.close()
