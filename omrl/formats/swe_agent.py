"""SWE-agent `.traj` files, current (v1: history with tool calls, replay_config) and legacy (no replay_config).

Current files: messages come from `history` (role, content, tool_calls, tool_call_ids); each step of
`trajectory` adds its state, thought, execution time and raw response to the turn of the same index.

Legacy files (SWE-agent before 1.0): `history` holds the system prompt, a demonstration (`is_demo: true`)
and the issue, then assistant turns in plain text; `trajectory` holds one {thought, action, observation,
response, state} per step. The conversation is rebuilt from the steps: each step is an assistant
message (content = thought) calling the agent's command tool (`command`, arguments {"command": action}),
then a tool message with the observation; state and response go to the step's turn.

Both: demonstration messages are skipped (counted in metadata; kept as trainable=false with
`keep_demos`, `omrl import --keep-demos`), never taken for the instruction; the
issue text becomes task.problem_statement and the instruction; instance id and repo are filled from the
replay config, the record, or the file name (`owner__repo-123`). The outcome comes from `info`:
exit_status "submitted" is status ok, cost/context/time limits are truncated, errors are policy errors.
SWE-agent does not know whether the patch resolves the issue, so success and reward stay null unless
the file carries a resolved flag.
"""

from __future__ import annotations

import json
import re
from typing import Any

from omrl.formats.messages import AT, DROPPED, FIELDS, message, native_text, openai_tool_calls, tool_call
from omrl.formats.records import FormatError, RecordContext
from omrl.formats.rows import make_row
from omrl.formats.values import list_field, object_field, require_dict, text

NAME = "swe_agent"
TRUNCATED = ("exit_cost", "exit_context", "exit_total_execution_time", "exit_command_timeout", "exit_max_steps")
ERRORS = ("exit_error", "exit_format", "exit_api", "exit_environment_error", "exit_forfeit")
ROLES = {"system": "system", "user": "user", "assistant": "assistant", "ai": "assistant", "tool": "tool"}
COMMAND = "command"  # the tool legacy SWE-agent actions are calls of
COMMAND_TOOL = {"type": "function", "function": {
    "name": COMMAND,
    "description": "Run one SWE-agent command: a shell command or one of the agent's own (open, edit, "
                   "search_file, submit, ...).",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
ISSUE = re.compile(r"ISSUE:\s*\n(.*?)(?:\n\s*INSTRUCTIONS:|\Z)", re.S)
INSTANCE = re.compile(r"^([A-Za-z0-9_.-]+?)__([A-Za-z0-9_.-]+)-\d+$")


def outcome(exit_status: Any) -> tuple[str, str | None]:
    """(status, error) from SWE-agent's exit_status; a limit hit, even if autosubmitted, is truncated."""
    if exit_status in (None, "", "submitted"):
        return "ok", None
    text_ = str(exit_status)
    if any(key in text_ for key in TRUNCATED):
        return "truncated", f"exit_status: {text_}"
    if any(key in text_ for key in ERRORS):
        return "policy_error", f"exit_status: {text_}"
    return "ok", None


def problem_statement(content: str | None) -> str | None:
    """The issue text of SWE-agent's issue message ("... ISSUE:\\n<text>\\n\\nINSTRUCTIONS: ..."), or the message."""
    if not content:
        return None
    found = ISSUE.search(content)
    return found.group(1).strip() if found else content


HISTORY_KEYS = {"role", "tool_calls", "tool_call_ids", "is_demo", "message_type"}


def _history(history: list[Any], where: str, keep_demos: bool,
             dropped: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[bool]]:
    """(messages, is-demonstration flag of each) of a history list; demonstrations only with keep_demos,
    then marked trainable=false (else reported in `dropped`). A message's other keys (action, thought,
    agent) are kept in the row's metadata."""
    messages, demo_flags = [], []
    for k, msg in enumerate(history):
        at = f"{where} history[{k}]"
        if not isinstance(msg, dict) or msg.get("role") not in ROLES:
            raise FormatError(f"{at}: expected a message with role system/user/assistant/tool", "unknown role")
        demo = bool(msg.get("is_demo"))
        demo_flags.append(demo)
        if demo and not keep_demos:
            dropped.append({"at": f"history[{k}]", "reason": "demonstration (--keep-demos keeps it)",
                            "text": json.dumps(msg, ensure_ascii=False, default=str)})
            continue
        ids = list_field(msg.get("tool_call_ids"), at, "tool_call_ids")
        calls = openai_tool_calls(msg.get("tool_calls"), at)
        content, rest = native_text(msg, ("content", "text"), HISTORY_KEYS, at, empty=not calls)
        messages.append(message(ROLES[msg["role"]], content, tool_calls=calls,
                                tool_call_id=ids[0] if ids and isinstance(ids[0], str) else None,
                                trainable=False if demo else None))
        messages[-1][AT] = f"history[{k}]"
        if rest:
            messages[-1][FIELDS] = {f"history[{k}]": rest}
    kept = demo_flags if keep_demos else [False] * len(messages)
    return messages, kept


def _state(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except (json.JSONDecodeError, RecursionError):
            return value
    return value


def _step_info(step: dict[str, Any]) -> dict[str, Any]:
    return {k: _state(step[k]) if k == "state" else step[k]
            for k in ("thought", "action", "response", "state", "execution_time") if step.get(k) is not None}


def convert(record: Any, ctx: RecordContext) -> dict[str, Any]:
    """One SWE-agent trajectory file -> a trajectory dict."""
    record = require_dict(record, ctx)
    history = record.get("history")
    if not isinstance(history, list) or not history:
        raise FormatError(f"{ctx.where}: 'history' must be a non-empty list of messages", "empty conversation")
    dropped: list[dict[str, Any]] = []
    messages, is_demo = _history(history, ctx.where, ctx.keep_demos, dropped)
    demos = sum(1 for m in history if isinstance(m, dict) and m.get("is_demo"))
    steps = list_field(record.get("trajectory"), ctx.where, "trajectory")
    for k, step in enumerate(steps):
        object_field(step, ctx.where, f"trajectory[{k}]")
    config = record.get("replay_config") or {}
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except (json.JSONDecodeError, RecursionError):
            config = {"raw": config}
    config = object_field(config, ctx.where, "replay_config")
    matched = False
    legacy = (not any(m["tool_calls"] for m in messages) and bool(steps)
              and all(isinstance(s.get("action"), str) for s in steps))
    tools = None
    if legacy:  # rebuild the conversation from the steps: actions as calls of the command tool
        head = []
        for m, demo in zip(messages, is_demo, strict=True):
            if m["role"] == "assistant" and not demo:
                break
            head.append(m)
        for m in messages[len(head):]:  # the steps below hold the same turns, action by action
            dropped.append({"at": m[AT], "reason": "legacy history rebuilt from the trajectory steps",
                            "text": m["content"] or ""})
        messages = head
        is_demo = is_demo[: len(head)]
        turns = [{"index": k, "done": False, "info": {"demonstration": True}}  # kept demonstrations' turns
                 for k in range(sum(1 for m in head if m["role"] == "assistant"))]
        for j, step in enumerate(steps):
            k = len(turns)
            thought = step.get("thought")
            call = tool_call(COMMAND, {"command": step["action"]}, None, f"{ctx.where} trajectory[{j}]")
            messages.append(message("assistant", thought if thought is not None else step.get("response"),
                                    tool_calls=[call]))
            messages.append(message("tool", step.get("observation")))
            turns.append({"index": k, "done": step is steps[-1], "latency_s": _seconds(step.get("execution_time")),
                          "info": _step_info(step)})
        tools = [COMMAND_TOOL]
    else:
        assistant = [demo for m, demo in zip(messages, is_demo, strict=True) if m["role"] == "assistant"]
        matched = len(steps) == assistant.count(False)  # one step per assistant turn: the step belongs to that turn
        live = iter(steps if matched else [])
        turns = []
        for k, demo in enumerate(assistant):
            step = None if demo else next(live, None)
            turns.append({"index": k, "done": k == len(assistant) - 1,
                          "latency_s": _seconds(step.get("execution_time")) if step else None,
                          "info": {"demonstration": True} if demo else _step_info(step) if step else {}})
    problem = object_field(config.get("problem_statement"), ctx.where, "replay_config.problem_statement")
    agent = object_field(config.get("agent"), ctx.where, "replay_config.agent")
    model = (agent.get("model") or {}).get("name") if isinstance(agent.get("model"), dict) else None
    info = object_field(record.get("info"), ctx.where, "info")
    status, error = outcome(info.get("exit_status"))
    stats = object_field(info.get("model_stats"), ctx.where, "info.model_stats")
    env_config = object_field(config.get("env"), ctx.where, "replay_config.env")
    deployment = object_field(env_config.get("deployment"), ctx.where, "replay_config.env.deployment")
    issue_text = problem.get("text") if isinstance(problem.get("text"), str) else None
    if issue_text is None:
        first_user = next((m["content"] for m, demo in zip(messages, is_demo + [False] * len(messages), strict=False)
                           if m["role"] == "user" and m["content"] and not demo), None)
        issue_text = problem_statement(first_user)
    instance = next((v for v in (problem.get("id"), record.get("instance_id"), info.get("instance_id"))
                     if isinstance(v, str) and v), None) or ctx.path.name.removesuffix(".traj")
    repo = env_config.get("repo") if isinstance(env_config.get("repo"), str) else record.get("repo")
    if not isinstance(repo, str) and INSTANCE.match(instance):
        owner, name = INSTANCE.match(instance).groups()
        repo = f"{owner}/{name}"
    task = {"instance_id": instance, "problem_statement": issue_text, "repo": repo if isinstance(repo, str) else None,
            "image": deployment.get("image")}
    if isinstance(env_config.get("repo"), dict):
        task["repo_config"] = env_config["repo"]
    resolved = info.get("resolved", record.get("resolved"))
    unmatched = [] if legacy or matched else steps  # steps that fit no turn one to one: kept whole
    metadata = {"info": info, "environment": record.get("environment"), "trajectory_steps": len(steps),
                **({"trajectory": unmatched} if unmatched else {}),
                "demonstrations_skipped": demos, "legacy": legacy, "replay_config": config, DROPPED: dropped,
                "roles_detail": [m.get("message_type") for m in history if isinstance(m, dict)]}
    return make_row(ctx, native_id=instance, messages=messages, tools=tools, task=task, reward=record.get("reward"),
                    success=resolved, status=status, error=error, model=model, metadata=metadata, turns=turns,
                    instruction=text(issue_text),
                    prompt_tokens=stats.get("tokens_sent") or None, completion_tokens=stats.get("tokens_received") or None)


def _seconds(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
