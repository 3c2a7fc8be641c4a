"""OpenAI chat messages: {"messages": [...], "tools": [...]} per record (fine-tuning files, OpenHands/SWE-Gym).

Handles `tool_calls` with arguments as JSON text or an object, legacy `function_call` messages and the
`function` role, tool results linked by `tool_call_id` or only by `name`, content given as parts, and the
fine-tuning `weight` flag (0/1 -> trainable). Native ids, `resolved`/`success`, `reward` and
`test_result` are mapped when present.
"""

from __future__ import annotations

from typing import Any

from omrl.formats.mapping import RecordMapping
from omrl.formats.records import RecordContext

NAME = "openai"
ID_KEYS = ("instance_id", "id", "task_id", "item_id")
TOOL_KEYS = ("tools", "available_tools", "functions", "tool_definitions")
GOLD_KEYS = ("test_result", "answer", "ground_truth", "gold", "expected")


# The format is a mapping: messages under `messages`, the rest under the usual keys.
MAPPING = RecordMapping(messages="messages", id=ID_KEYS, tools=TOOL_KEYS, success=("resolved", "success", "win"),
                  reward=("reward",), model=("model",), task=GOLD_KEYS, name=NAME, style="openai")


def convert(record: Any, ctx: RecordContext) -> dict[str, Any]:
    """One OpenAI-messages record -> a trajectory dict."""
    return MAPPING.convert(record, ctx)
