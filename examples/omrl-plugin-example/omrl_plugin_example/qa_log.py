"""`qa-log`: JSON lines {"question", "answer", "correct"} from some QA bot, one trajectory per line."""

from __future__ import annotations

from typing import Any

from omrl.formats.common import FormatError, RecordContext, make_row, message, require_dict

NAME = "qa-log"
KEYS = {"question", "answer", "correct"}


def detect(record: Any) -> bool:
    """A qa-log record has exactly these keys."""
    return isinstance(record, dict) and set(record) == KEYS


def convert(record: Any, ctx: RecordContext) -> dict[str, Any]:
    """One question and its answer -> a one-turn trajectory; `correct` is its success."""
    record = require_dict(record, ctx)
    if not isinstance(record.get("question"), str) or not isinstance(record.get("answer"), str):
        raise FormatError(f"{ctx.where}: question and answer must be strings", "missing field")
    messages = [message("user", record["question"]), message("assistant", record["answer"])]
    return make_row(ctx, native_id=None, messages=messages, success=record.get("correct"),
                    reward=1.0 if record.get("correct") else 0.0)
