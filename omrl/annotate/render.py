"""Trajectories rendered as text for a judge, truncated in a stated way when too long.

Truncation rule (tested): when the full rendering exceeds `max_chars`, keep the task header
(instruction), the leading system/user messages, a marker "[... N messages elided ...]", the final
`keep_last` messages, and the outcome line. If that is still too long, each kept message body is cut
to an equal share, keeping its head and tail around "[... N chars elided ...]". The task header and
the outcome are never cut. The judge never sees the gold answer or the environment reward.
"""

from __future__ import annotations

from typing import Any

from omrl.annotate.inputs import final_answer
from omrl.schema.payloads import metadata_of
from omrl.schema.rows import TrajectoryRow

ELIDED_MESSAGES = "[... {n} messages elided ...]"
ELIDED_CHARS = "[... {n} chars elided ...]"


def _message_text(msg: dict[str, Any]) -> str:
    role = msg.get("role", "?")
    head = f"{role.upper()}" + (f" ({msg['name']})" if role == "tool" and msg.get("name") else "")
    parts = [msg["content"]] if msg.get("content") else []
    for call in msg.get("tool_calls") or []:
        parts.append(f"-> call {call.get('name')}({call.get('arguments') or ''})")
    return f"{head}: " + "\n".join(parts)


def clip(text: str, limit: int) -> str:
    """Keep the head and tail of a text within `limit` characters, marking what was cut."""
    if len(text) <= limit:
        return text
    marker_room = 32
    keep = max(0, limit - marker_room)
    head, tail = keep - keep // 2, keep // 2
    cut = len(text) - head - tail
    return text[:head] + ELIDED_CHARS.format(n=cut) + (text[-tail:] if tail else "")


def outcome_line(row: TrajectoryRow) -> str:
    answer = final_answer(row.get("messages") or [], metadata_of(row))
    return f"OUTCOME: status={row.get('status') or 'ok'}; final answer: {answer if answer is not None else '(none)'}"


def render_trajectory(row: TrajectoryRow, max_chars: int = 12000, keep_last: int = 6) -> str:
    """The trajectory as judge-readable text, within about `max_chars` (see the module docstring)."""
    header = f"TASK: {row.get('instruction') or '(no instruction)'}"
    outcome = outcome_line(row)
    texts = [_message_text(m) for m in row.get("messages") or []]
    full = "\n\n".join([header, *texts, outcome])
    if len(full) <= max_chars:
        return full
    # The leading system/user messages state the task; keep them with the final turns.
    lead = 0
    for m in row.get("messages") or []:
        if m.get("role") in ("system", "user") and lead < len(texts):
            lead += 1
        else:
            break
    tail_start = max(lead, len(texts) - keep_last)
    kept = texts[:lead] + ([ELIDED_MESSAGES.format(n=tail_start - lead)] if tail_start > lead else []) \
        + texts[tail_start:]
    text = "\n\n".join([header, *kept, outcome])
    if len(text) <= max_chars:
        return text
    fixed = len(header) + len(outcome) + 2 * (len(kept) + 1)
    share = max(64, (max_chars - fixed) // max(1, len(kept)))
    kept = [k if k.startswith("[... ") else clip(k, share) for k in kept]
    return "\n\n".join([header, *kept, outcome])
