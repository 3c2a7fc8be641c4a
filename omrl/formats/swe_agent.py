"""SWE-agent `.traj` files: {history, trajectory, info, replay_config, environment}, one trajectory per file.

Messages come from `history` (role, content, tool_calls, tool_call_ids); `trajectory` repeats the same
steps and is kept only as a count. The outcome comes from `info`: exit_status "submitted" is status ok,
cost/context/time limits are truncated, errors are policy errors. SWE-agent does not know whether the
patch resolves the issue, so success and reward stay null unless the file carries a resolved flag.
"""

from __future__ import annotations

import json
from typing import Any

from omrl.formats.common import (
    FormatError,
    RecordContext,
    make_row,
    message,
    openai_tool_calls,
    require_dict,
)

NAME = "swe_agent"
TRUNCATED = ("exit_cost", "exit_context", "exit_total_execution_time", "exit_command_timeout", "exit_max_steps")
ERRORS = ("exit_error", "exit_format", "exit_api", "exit_environment_error", "exit_forfeit")


def outcome(exit_status: Any) -> tuple[str, str | None]:
    """(status, error) from SWE-agent's exit_status; a limit hit, even if autosubmitted, is truncated."""
    if exit_status in (None, "", "submitted"):
        return "ok", None
    text = str(exit_status)
    if any(key in text for key in TRUNCATED):
        return "truncated", f"exit_status: {text}"
    if any(key in text for key in ERRORS):
        return "policy_error", f"exit_status: {text}"
    return "ok", None


def convert(record: Any, ctx: RecordContext) -> dict[str, Any]:
    """One SWE-agent trajectory file -> a trajectory dict."""
    record = require_dict(record, ctx)
    history = record.get("history")
    if not isinstance(history, list) or not history:
        raise FormatError(f"{ctx.where}: 'history' must be a non-empty list of messages", "empty conversation")
    messages = []
    for k, msg in enumerate(history):
        at = f"{ctx.where} history[{k}]"
        if not isinstance(msg, dict) or msg.get("role") not in ("system", "user", "assistant", "tool"):
            raise FormatError(f"{at}: expected a message with role system/user/assistant/tool", "unknown role")
        ids = msg.get("tool_call_ids") or []
        messages.append(message(msg["role"], msg.get("content"), tool_calls=openai_tool_calls(msg.get("tool_calls"), at),
                                tool_call_id=ids[0] if ids else None))
    config = record.get("replay_config") or {}
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except json.JSONDecodeError:
            config = {"raw": config}
    problem = config.get("problem_statement") or {}
    agent = config.get("agent") or {}
    model = (agent.get("model") or {}).get("name") if isinstance(agent.get("model"), dict) else None
    info = record.get("info") or {}
    status, error = outcome(info.get("exit_status"))
    stats = info.get("model_stats") or {}
    env_config = config.get("env") or {}
    task = {"instance_id": problem.get("id"), "problem_statement": problem.get("text"),
            "repo": env_config.get("repo"), "image": (env_config.get("deployment") or {}).get("image")}
    resolved = info.get("resolved", record.get("resolved"))
    metadata = {"info": info, "environment": record.get("environment"),
                "trajectory_steps": len(record.get("trajectory") or []), "replay_config": config,
                "roles_detail": [m.get("message_type") for m in history]}
    return make_row(ctx, native_id=problem.get("id") or ctx.path.stem.removesuffix(".traj"), messages=messages,
                    task=task, reward=record.get("reward"), success=resolved, status=status, error=error,
                    model=model, metadata=metadata,
                    prompt_tokens=stats.get("tokens_sent") or None, completion_tokens=stats.get("tokens_received") or None)
