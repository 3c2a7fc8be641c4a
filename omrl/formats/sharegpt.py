"""ShareGPT: {"conversations": [{"from": "human"|"gpt"|..., "value": ...}], ...} (FastChat, LLaMA-Factory, ETO).

Roles: human/user -> user, gpt/ai/assistant/bot/model -> assistant, system, tool/observation/function ->
tool, function_call -> an assistant tool call (value: JSON {"name", "arguments"} or a list of them).
Per-turn flags: `loss` (true = trained), `mask` (true = masked out, not trained), `weight` (0/1).
"""

from __future__ import annotations

from typing import Any

from omrl.formats.mapping import RecordMapping
from omrl.formats.records import RecordContext

NAME = "sharegpt"

ID_KEYS = ("id", "item_id", "task_id", "instance_id", "idx")
TOOL_KEYS = ("tools", "available_tools", "functions", "tool_definitions")


# The format is a mapping: turns under `conversations` (or `messages`), the rest under the usual keys.
MAPPING = RecordMapping(messages=("conversations", "messages"), system=("system",), id=ID_KEYS, tools=TOOL_KEYS,
                  reward=("reward",), success=("success", "resolved", "win"), model=("model",),
                  task=("answer", "ground_truth", "gold", "label"), name=NAME, style="sharegpt")


def convert(record: Any, ctx: RecordContext) -> dict[str, Any]:
    """One ShareGPT record -> a trajectory dict."""
    return MAPPING.convert(record, ctx)
