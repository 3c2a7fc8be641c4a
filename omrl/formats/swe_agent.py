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
    list_field,
    make_row,
    message,
    object_field,
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
        ids = list_field(msg.get("tool_call_ids"), at, "tool_call_ids")
        messages.append(message(msg["role"], msg.get("content"), tool_calls=openai_tool_calls(msg.get("tool_calls"), at),
                                tool_call_id=ids[0] if ids and isinstance(ids[0], str) else None))
    config = record.get("replay_config") or {}
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except (json.JSONDecodeError, RecursionError):
            config = {"raw": config}
    config = object_field(config, ctx.where, "replay_config")
    problem = object_field(config.get("problem_statement"), ctx.where, "replay_config.problem_statement")
    agent = object_field(config.get("agent"), ctx.where, "replay_config.agent")
    model = (agent.get("model") or {}).get("name") if isinstance(agent.get("model"), dict) else None
    info = object_field(record.get("info"), ctx.where, "info")
    status, error = outcome(info.get("exit_status"))
    stats = object_field(info.get("model_stats"), ctx.where, "info.model_stats")
    env_config = object_field(config.get("env"), ctx.where, "replay_config.env")
    deployment = object_field(env_config.get("deployment"), ctx.where, "replay_config.env.deployment")
    task = {"instance_id": problem.get("id"), "problem_statement": problem.get("text"),
            "repo": env_config.get("repo"), "image": deployment.get("image")}
    resolved = info.get("resolved", record.get("resolved"))
    metadata = {"info": info, "environment": record.get("environment"),
                "trajectory_steps": len(list_field(record.get("trajectory"), ctx.where, "trajectory")),
                "replay_config": config, "roles_detail": [m.get("message_type") for m in history]}
    return make_row(ctx, native_id=problem.get("id") or ctx.path.stem.removesuffix(".traj"), messages=messages,
                    task=task, reward=record.get("reward"), success=resolved, status=status, error=error,
                    model=model, metadata=metadata,
                    prompt_tokens=stats.get("tokens_sent") or None, completion_tokens=stats.get("tokens_received") or None)
