"""Trajectories as observation/action step lists: {task, steps: [{observation, action, thought, reward, done}]}.

Also accepted: the list under `trajectory`, and alternating items {type|kind: observation|action, content}
(or {observation: ...} and {action: ...} items). An observation is what the environment showed (a user
message), an action what the agent did (an assistant message, the thought as its reasoning); per-step
reward and done go to the assistant turn. The instruction is the task text (task, instruction, goal,
question) when the record has one, else the first observation; the trajectory reward is the record's
`reward` (per-step rewards are not summed into it).
"""

from __future__ import annotations

from typing import Any

from omrl.formats.messages import message
from omrl.formats.records import FormatError, RecordContext
from omrl.formats.rows import get_path, make_row, task_text
from omrl.formats.values import leftovers, require_dict

NAME = "steps"
LIST_KEYS = ("steps", "trajectory")
TEXT_KEYS = ("content", "text", "value")


def step_list(record: Any) -> str | None:
    """The key of a record's observation/action step list, or None."""
    if not isinstance(record, dict):
        return None
    for key in LIST_KEYS:
        value = record.get(key)
        if isinstance(value, list) and value and isinstance(value[0], dict) and "source" not in value[0]:
            first = value[0]
            if {"observation", "action"} & set(first) or str(first.get("type", first.get("kind"))) in ("observation", "action"):
                return key
    return None


def convert(record: Any, ctx: RecordContext) -> dict[str, Any]:
    """One observation/action trajectory -> a trajectory dict."""
    record = require_dict(record, ctx)
    key = step_list(record)
    if key is None:
        raise FormatError(f"{ctx.where}: expected a list of observation/action steps under 'steps' or 'trajectory'",
                          "empty conversation")
    task = task_text(record) or next((v for v in (get_path(record, "goal"),) if isinstance(v, str)), None)
    messages = [message("user", task)] if task else []
    turns: list[dict[str, Any]] = []
    for k, step in enumerate(record[key]):
        at = f"{ctx.where} {key}[{k}]"
        if not isinstance(step, dict):
            raise FormatError(f"{at}: a step must be an object with observation and/or action", "bad step")
        kind = step.get("type", step.get("kind"))
        body = next((step[t] for t in TEXT_KEYS if t in step), None)
        observation = step.get("observation", body if kind == "observation" else None)
        action = step.get("action", body if kind == "action" else None)
        if observation is None and action is None:
            raise FormatError(f"{at}: a step needs an observation or an action", "bad step")
        if observation is not None:
            messages.append(message("user", observation))
        if action is not None:
            thought = step.get("thought")
            messages.append(message("assistant", action, reasoning=thought if isinstance(thought, str) else None))
            info = {k2: v for k2, v in step.items() if k2 not in ("observation", "action", "thought", "reward", "done",
                                                                  "type", "kind", *TEXT_KEYS)}
            turns.append({"index": len(turns), "reward": step.get("reward"), "done": step.get("done"), "info": info})
    if turns and turns[-1]["done"] is None:
        turns[-1]["done"] = True
    native = next((record[k] for k in ("id", "task_id", "instance_id", "game_file") if record.get(k) not in (None, "")), None)
    return make_row(ctx, native_id=native, messages=messages, turns=turns, reward=record.get("reward"),
                    success=record.get("success", record.get("won")), instruction=task,
                    metadata=leftovers(record, {key, "id", "task_id", "instance_id", "reward", "success", "won"}))
