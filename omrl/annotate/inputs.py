"""The arguments a metric may declare, computed from one trajectory row.

Available names: trajectory (the row dict), messages, task (parsed JSON, payload an object), answer (the gold answer),
final_answer, reward, success, status, num_turns, turns, tools (parsed JSON), tool_calls (flat list),
instruction, metadata (parsed JSON), prompt_tokens, completion_tokens.
"""

from __future__ import annotations

import json
from typing import Any

from omrl.schema import parse_task
from omrl.schema.payloads import metadata_of
from omrl.schema.rows import TrajectoryRow

# Tool names that submit the final answer; the first argument value (or "answer") is the answer.
ANSWER_TOOLS = ("answer", "submit", "final_answer", "submit_answer", "finish")


def parse_json(text: str | None, default: Any) -> Any:
    """Parse a JSON payload column; empty or invalid text gives `default`."""
    if not text:
        return default
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return default


def gold_answer(task: dict[str, Any]) -> Any:
    """The task's gold answer: task["answer"], else payload["answer"], else "answers"/"gold"; None if absent."""
    if not isinstance(task, dict):
        return None
    for source in (task, task.get("payload") if isinstance(task.get("payload"), dict) else {}):
        for key in ("answer", "answers", "gold", "target"):
            if source.get(key) is not None:
                return source[key]
    return None


def _renamed_answer_tools(metadata: dict[str, Any]) -> set[str]:
    """Answer tool names after an augment `tool_rename` (recorded in metadata) so extraction still works."""
    mapping = metadata.get("tool_rename") if isinstance(metadata, dict) else None
    names = set(ANSWER_TOOLS)
    if isinstance(mapping, dict):
        names |= {new for old, new in mapping.items() if old in ANSWER_TOOLS}
    return names


def final_answer(messages: list[dict[str, Any]], metadata: dict[str, Any] | None = None) -> str | None:
    """The last answer-tool call's value, else the last non-empty assistant text; None when neither exists."""
    answer_tools = _renamed_answer_tools(metadata or {})
    for msg in reversed(messages):
        if msg.get("role") != "assistant":
            continue
        for call in reversed(msg.get("tool_calls") or []):
            if call.get("name") in answer_tools:
                args = parse_json(call.get("arguments"), None)
                if isinstance(args, dict) and args:
                    value = args.get("answer", next(iter(args.values())))
                    return value if isinstance(value, str) else json.dumps(value)
                return call.get("arguments")
    for msg in reversed(messages):
        if msg.get("role") == "assistant" and (msg.get("content") or "").strip():
            return msg["content"].strip()
    return None


def metric_inputs(row: TrajectoryRow) -> dict[str, Any]:
    """Every argument a metric may ask for, computed from one trajectory row (as read from a store)."""
    messages = row.get("messages") or []
    task = parse_task(row.get("task"))  # payload decoded, also on rows whose payload was encoded twice
    metadata = metadata_of(row)
    return {
        "trajectory": row,
        "messages": messages,
        "task": task,
        "answer": gold_answer(task),
        "final_answer": final_answer(messages, metadata),
        "reward": row.get("reward"),
        "success": row.get("success"),
        "status": row.get("status"),
        "num_turns": row.get("num_turns"),
        "turns": row.get("turns") or [],
        "tools": parse_json(row.get("tools"), []),
        "tool_calls": [c for m in messages if m.get("role") == "assistant" for c in (m.get("tool_calls") or [])],
        "instruction": row.get("instruction") or "",
        "metadata": metadata,
        "prompt_tokens": row.get("prompt_tokens"),
        "completion_tokens": row.get("completion_tokens"),
    }
