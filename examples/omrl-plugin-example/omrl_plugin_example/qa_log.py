"""`qa-log`: JSON lines {"question", "answer", "correct"} from some QA bot, one trajectory per line; imported
(convert, detect) and exported (export_records) the same way."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from omrl.formats.messages import message
from omrl.formats.records import FormatError, RecordContext
from omrl.formats.rows import make_row
from omrl.formats.values import require_dict

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


def export_records(rows: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Each trajectory row as a qa-log record: the first user message, the last assistant text, its success."""
    for row in rows:
        texts = {m["role"]: m["content"] for m in reversed(row["messages"]) if m["content"]}
        yield {"question": texts.get("user", ""), "answer": texts.get("assistant", ""), "correct": row["success"]}
