"""`shouting`: how much of the assistant's text is upper case."""

from __future__ import annotations

import json
from typing import Any


def shouting(messages: list[dict[str, Any]]) -> float | None:
    """Upper-case letters / letters in the assistant's text and tool-call argument values; None without letters."""
    parts = []
    for m in messages:
        if m.get("role") == "assistant":
            parts.append(m.get("content") or "")
            for call in m.get("tool_calls") or []:
                arguments = json.loads((call.get("function") or call).get("arguments") or "{}")
                parts += [str(value) for value in arguments.values()]
    letters = [c for c in "".join(parts) if c.isalpha()]
    return sum(c.isupper() for c in letters) / len(letters) if letters else None
