"""ATIF (Agent Trajectory Interchange Format, Harbor RFC 0001, v1.x): {schema_version, session_id, agent, steps}.

Each step has a source (system/user/agent) and a message; agent steps may carry reasoning_content,
tool_calls [{tool_call_id, function_name, arguments}], an observation {results: [{source_call_id,
content}]} and metrics (token counts, completion_token_ids, logprobs). An agent step becomes an
assistant message followed by one tool message per observation result; its metrics become a turn.
"""

from __future__ import annotations

from typing import Any

from omrl.formats.common import (
    FormatError,
    RecordContext,
    list_field,
    make_row,
    message,
    object_field,
    require_dict,
    tool_call,
)

NAME = "atif"
SOURCES = {"system": "system", "user": "user", "agent": "assistant"}


def convert(record: Any, ctx: RecordContext) -> dict[str, Any]:
    """One ATIF trajectory -> a trajectory dict."""
    record = require_dict(record, ctx)
    steps = record.get("steps")
    if not isinstance(steps, list) or not steps:
        raise FormatError(f"{ctx.where}: 'steps' must be a non-empty list", "empty conversation")
    messages: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for k, step in enumerate(steps):
        at = f"{ctx.where} steps[{k}]"
        if not isinstance(step, dict) or step.get("source") not in SOURCES:
            raise FormatError(f"{at}: expected a step with source system/user/agent", "unknown role")
        role = SOURCES[step["source"]]
        calls = []
        for j, call in enumerate(list_field(step.get("tool_calls"), at, "tool_calls")):
            call = object_field(call, at, f"tool_calls[{j}]")
            calls.append(tool_call(call.get("function_name"), call.get("arguments"), call.get("tool_call_id"),
                                   f"{at} tool_calls[{j}]"))
        reasoning = step.get("reasoning_content")
        messages.append(message(role, step.get("message"), reasoning=reasoning if isinstance(reasoning, str) else None,
                                tool_calls=calls))
        if role == "assistant":
            metrics = object_field(step.get("metrics"), at, "metrics")
            turns.append({"index": len(turns), "prompt_tokens": metrics.get("prompt_tokens"),
                          "completion_tokens": metrics.get("completion_tokens"),
                          "completion_ids": metrics.get("completion_token_ids") or [],
                          "logprobs": metrics.get("logprobs") or [],
                          "info": {key: step[key] for key in ("step_id", "timestamp", "model_name", "extra") if key in step}})
        observation = object_field(step.get("observation"), at, "observation")
        for result in list_field(observation.get("results"), at, "observation.results"):
            if not isinstance(result, dict):
                raise FormatError(f"{at}: observation results must be objects", "bad observation")
            if result.get("content") is None and result.get("subagent_trajectory_ref"):
                continue  # a delegated sub-trajectory lives in its own file
            messages.append(message("tool", result.get("content"), tool_call_id=result.get("source_call_id")))
    if turns:
        turns[-1]["done"] = True
    agent = object_field(record.get("agent"), ctx.where, "agent")
    final = object_field(record.get("final_metrics"), ctx.where, "final_metrics")
    extra = record.get("extra") or {}
    native = extra.get("task_id") if isinstance(extra, dict) and extra.get("task_id") else record.get("session_id")
    metadata = {"schema_version": record.get("schema_version"), "session_id": record.get("session_id"),
                "agent": agent, "notes": record.get("notes"), "final_metrics": final, "extra": extra}
    return make_row(ctx, native_id=native, messages=messages, turns=turns,
                    tools=agent.get("tool_definitions") if isinstance(agent, dict) else None,
                    reward=extra.get("reward") if isinstance(extra, dict) else None,
                    success=extra.get("success") if isinstance(extra, dict) else None,
                    model=agent.get("model_name"), metadata=metadata,
                    prompt_tokens=final.get("total_prompt_tokens"), completion_tokens=final.get("total_completion_tokens"))
