"""Rendering one trajectory for people: roles, tool calls, observations and rewards."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from omrl.schema.payloads import decoded
from omrl.schema.rows import TrajectoryRow

ROLE_STYLES = {"system": "dim", "user": "cyan", "assistant": "green", "tool": "yellow"}


def _pretty_arguments(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), ensure_ascii=False)
    except (json.JSONDecodeError, TypeError):
        return arguments  # keep what the model wrote, even when it is not JSON


def render_trajectory(row: TrajectoryRow, max_chars: int = 2000) -> Group:
    """A rich renderable of one trajectory row (as read from the store)."""
    header = Table.grid(padding=(0, 2))
    header.add_column(style="bold")
    header.add_column()
    for key in ("id", "task_id", "env", "model", "run_id", "round", "sample", "status", "reward", "success",
                "num_turns", "duration_s", "source", "parent_id"):
        value = row.get(key)
        if value is not None and value != "":
            header.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    if row.get("error"):
        header.add_row("error", Text(str(row["error"]), style="red"))
    parts: list[Any] = [Panel(header, title="trajectory", border_style="blue")]
    turn_rewards = {t["index"]: t for t in row.get("turns") or []}
    assistant_index = 0
    for position, message in enumerate(row.get("messages") or []):
        role = message["role"]
        body = Text()
        if message.get("reasoning"):
            body.append(_clip(message["reasoning"], max_chars) + "\n", style="italic dim")
        if message.get("content"):
            body.append(_clip(message["content"], max_chars))
        for call in message.get("tool_calls") or []:
            if body:
                body.append("\n")
            body.append(f"→ {call['name']}({_pretty_arguments(call['arguments'])})", style="bold magenta")
        title = role if role != "tool" else f"tool {message.get('name') or ''}".strip()
        if message.get("trainable") is False:
            title += " (not trained)"
        subtitle = None
        if role == "assistant":
            turn = turn_rewards.get(assistant_index)
            if turn is not None and turn.get("reward") is not None:
                subtitle = f"turn {assistant_index}  reward {turn['reward']:g}" + ("  done" if turn.get("done") else "")
                subtitle += "".join(f"  {note}" for note in turn_notes(turn.get("info")))
            assistant_index += 1
        parts.append(Panel(body, title=f"[{position}] {title}", subtitle=subtitle,
                           border_style=ROLE_STYLES.get(role, "white"), title_align="left"))
    return Group(*parts)


def turn_notes(info: Any) -> list[str]:
    """The short notes an environment left on a turn's steps (info["note"]: e.g. a checker's verdict)."""
    try:
        info = decoded(info, None)
    except json.JSONDecodeError:
        return []
    if not isinstance(info, dict):
        return []
    steps = info.get("steps") if isinstance(info.get("steps"), list) else [info]
    return [str(s["note"]) for s in steps if isinstance(s, dict) and s.get("note")]


def _clip(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f"\n… ({len(text) - max_chars} more characters)"
