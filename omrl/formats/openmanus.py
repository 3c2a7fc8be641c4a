"""OpenManus-RL parquet rows: conversations list<{from, loss, value}>, prompt, reward_model, extra_info.

The conversation is ShareGPT-shaped; `reward_model` (ground truth, style), `data_source`, `ability`,
`prompt` and `extra_info` are the task payload. The files carry no reward, so reward stays null.
"""

from __future__ import annotations

from typing import Any

from omrl.formats.chat import convert_conversation
from omrl.formats.records import RecordContext
from omrl.formats.rows import make_row
from omrl.formats.values import leftovers, require_dict

NAME = "openmanus"
TASK_KEYS = ("reward_model", "data_source", "ability", "prompt", "extra_info")


def convert(record: Any, ctx: RecordContext) -> dict[str, Any]:
    """One OpenManus-RL row -> a trajectory dict."""
    record = require_dict(record, ctx)
    messages = convert_conversation(record.get("conversations"), ctx.where)
    task = {k: record[k] for k in TASK_KEYS if k in record}
    native = record.get("item_id") or record.get("id")
    return make_row(ctx, native_id=native, messages=messages, task=task, reward=record.get("reward"),
                    success=record.get("success"),
                    metadata=leftovers(record, {"conversations", "item_id", "id", "reward", "success", *TASK_KEYS}))
