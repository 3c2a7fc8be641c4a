"""ToolBench DFSDT answers: {win, answer_generation{query, function, train_messages, final_answer, finish_type}}.

`train_messages` holds growing snapshots of one conversation; the longest is the full trajectory.
Assistant `function_call`s become tool calls, `function` messages become tool results (linked by name),
`answer_generation.function` becomes the tools. `win` is success; ToolBench gives no numeric reward.
"""

from __future__ import annotations

from typing import Any

from omrl.formats.chat import convert_messages
from omrl.formats.records import FormatError, RecordContext
from omrl.formats.rows import make_row
from omrl.formats.values import require_dict, short_hash

NAME = "toolbench"


def convert(record: Any, ctx: RecordContext) -> dict[str, Any]:
    """One ToolBench answer -> a trajectory dict."""
    record = require_dict(record, ctx)
    gen = record.get("answer_generation")
    if not isinstance(gen, dict):
        raise FormatError(f"{ctx.where}: missing 'answer_generation'", "missing field")
    snapshots = gen.get("train_messages") or []
    if not isinstance(snapshots, list) or not any(isinstance(s, list) and s for s in snapshots):
        raise FormatError(f"{ctx.where}: answer_generation.train_messages holds no conversation", "empty conversation")
    longest = max((s for s in snapshots if isinstance(s, list)), key=len)
    messages = convert_messages(longest, f"{ctx.where} train_messages[{snapshots.index(longest)}]")
    query = gen.get("query")
    task = {"query": query, "final_answer": gen.get("final_answer"), "finish_type": gen.get("finish_type")}
    metadata = {k: gen.get(k) for k in ("valid_data", "query_count", "total_tokens", "chain") if k in gen}
    metadata["snapshots"] = len(snapshots)
    metadata.update({k: v for k, v in record.items() if k not in ("answer_generation", "win")})
    native = record.get("query_id") or (f"toolbench:{short_hash(query, n=12)}" if query else None)
    return make_row(ctx, native_id=native, messages=messages, tools=gen.get("function") or [], task=task,
                    success=record.get("win"), metadata=metadata)
