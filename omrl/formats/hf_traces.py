"""Hugging Face Hub agent traces: the Session Trace Simple Format (STS) that the Hub's trace viewer renders.

One JSONL file per session (here: per trajectory). The first line is the session header
{"type": "session", "harness", "id", "name"} (other keys are allowed and ignored by the Hub: omrl adds
task_id, env, model, reward, success, status); every following line is one message in an envelope
{"type": "message", "message": {role, content, reasoningContent, toolCalls, toolCallId, model}}:
role is system/user/assistant/tool, content text (may be empty), toolCalls [{id, function: {name,
arguments}}] with arguments a JSON string, toolCallId the call a tool message answers. Export only: the
format keeps no token ids, rewards per turn or training flags.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from omrl.schema.messages import arguments_value, tool_call_parts
from omrl.schema.rows import TrajectoryRow

NAME = "traces"
HARNESS = "omrl"  # the header's harness id: the Hub picks the renderer, icon and label from it
ROLES = ("system", "user", "assistant", "tool")
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def session_path(row_id: str) -> str:
    """Where a trajectory's session file goes inside the export: sessions/<2 hex>/<id>.jsonl.

    Spread over 256 folders (the Hub advises against folders of more than ~10,000 files); an id that is
    not a plain file name is replaced by its hash, so no id can name a path outside the folder."""
    digest = hashlib.sha256(row_id.encode("utf-8", "surrogatepass")).hexdigest()
    name = row_id if SAFE_NAME.fullmatch(row_id) and not row_id.endswith(".") else digest[:32]
    return f"sessions/{digest[:2]}/{name}.jsonl"


def session_lines(row: TrajectoryRow) -> list[dict[str, Any]]:
    """The header and message lines of one trajectory's session file."""
    title = (row.get("instruction") or "").strip().splitlines()
    header = {"type": "session", "harness": HARNESS, "id": row["id"]}
    if title:
        header["name"] = title[0][:120]
    for key in ("task_id", "env", "model", "reward", "success", "status", "error"):
        if row.get(key) not in (None, ""):
            header[key] = row[key]
    lines = [header]
    for m in row["messages"]:
        out: dict[str, Any] = {"role": m["role"], "content": m["content"] or ""}
        if m.get("reasoning"):
            out["reasoningContent"] = m["reasoning"]
        calls = [{"id": cid or "", "function": {"name": name, "arguments": _arguments(args)}}
                 for cid, name, args in map(tool_call_parts, m.get("tool_calls") or [])]
        if calls:
            out["toolCalls"] = calls
        if m["role"] == "tool" and m.get("tool_call_id"):
            out["toolCallId"] = m["tool_call_id"]
        if m["role"] == "assistant" and row.get("model"):
            out["model"] = row["model"]
        lines.append({"type": "message", "message": out})
    return lines


def _arguments(args: Any) -> str:
    """Arguments as the JSON string the format asks for; text that is not JSON becomes a JSON string of it."""
    value = arguments_value(args)
    if isinstance(args, str) and args.strip() and value is not args:
        return args  # valid JSON text: kept exactly as the model wrote it
    return json.dumps(value, ensure_ascii=False)


CARD = """---
tags:
- agent-traces
- omrl
---

# Agent traces exported by omrl

One session per trajectory in the Hub's Session Trace Simple Format (`sessions/*/*.jsonl`: a session
header line, then one line per message), for the Hub's trace viewer. The trajectories themselves, with
token ids, rewards and annotations, are in the omrl store this was exported from (`omrl export STORE
--out DIR` writes it as a dataset).

{description}
"""
