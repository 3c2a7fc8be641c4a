"""ATIF (Agent Trajectory Interchange Format, Harbor RFC 0001, v1.x): import and export.

A trajectory is {schema_version, session_id, trajectory_id, agent {name, version, model_name,
tool_definitions}, steps, final_metrics, extra, subagent_trajectories}. Each step has a source
(system/user/agent) and a message (text, or a list of content parts); agent steps may carry
reasoning_content, tool_calls [{tool_call_id, function_name, arguments}], an observation {results:
[{source_call_id, content, subagent_trajectory_ref}]} and metrics (prompt_tokens, completion_tokens,
prompt_token_ids, completion_token_ids, logprobs, ...).

Import: an agent step becomes an assistant message and one turn (its metrics: token counts,
completion_token_ids -> completion_ids, logprobs; prompt_token_ids and the step's other fields go to the
turn's info); each observation result answering a call becomes a tool message linked to it, a result
that answers no call (a step without calls) a user message. `is_copied_context` steps and agent steps
with `llm_call_count: 0` (no model made them) are trainable=false. Each embedded subagent trajectory
(`subagent_trajectories`) becomes a row of its own, parent_id the parent's row and task id
`<parent task>:<trajectory_id>`; a result that only points at a subagent is a tool message without
text, the reference kept in the parent's metadata.

Export (`to_record`, `export_records`): what omrl keeps and ATIF has no field for travels in the
`extra` objects ATIF provides, under the key "omrl" (a message's trainable flag and name, a missing text,
a tool result's link when it answers a call of an earlier step, a turn's reward, done, latency and info;
tool-call arguments that are not a JSON object, or not spaced as Python writes JSON), so omrl -> ATIF -> omrl keeps token ids and logprobs
exactly, and the messages too. Task id, reward, success, status, error and instruction are in the
trajectory's `extra`. Rows whose parent is exported with them are embedded as its subagent trajectories.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator
from typing import Any

from omrl import __version__
from omrl.formats.messages import message, tool_call
from omrl.formats.records import FormatError, RecordContext
from omrl.formats.rows import PREVIOUS_ID, make_row
from omrl.formats.values import list_field, object_field, require_dict, text
from omrl.schema.messages import arguments_value, tool_call_parts
from omrl.schema.payloads import decoded
from omrl.schema.rows import TrajectoryRow, TurnRow

NAME = "atif"
VERSION = "ATIF-v1.7"  # what we write: the RFC's current version (subagent embedding, extra on calls and results)
SOURCES = {"system": "system", "user": "user", "agent": "assistant"}
ROLE_SOURCES = {"system": "system", "user": "user", "assistant": "agent", "tool": "user"}
OMRL = "omrl"  # the key of omrl's own fields inside ATIF's `extra` objects
PROMPT_IDS = "prompt_token_ids"  # where a turn's prompt token ids live in turns.info
# Step fields the import maps to a message; the rest go to the turn's info (agent) or the metadata.
STEP_FIELDS = {"step_id", "source", "message", "reasoning_content", "tool_calls", "observation", "metrics"}
SUBAGENT = "atif_subagent"  # metadata key of a row imported from an embedded subagent trajectory


# ---------------------------------------------------------------- import


def convert(record: Any, ctx: RecordContext) -> list[dict[str, Any]]:
    """One ATIF trajectory -> its trajectory dict, then one per embedded subagent trajectory (depth first)."""
    record = require_dict(record, ctx)
    return _convert(record, ctx, parent=None, label=ctx.where)


def _convert(record: dict[str, Any], ctx: RecordContext, parent: dict[str, Any] | None,
             label: str) -> list[dict[str, Any]]:
    steps = record.get("steps")
    if not isinstance(steps, list) or not steps:
        raise FormatError(f"{label}: 'steps' must be a non-empty list", "empty conversation")
    messages: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    step_fields: dict[str, Any] = {}  # leftover fields of system/user steps, by step id
    refs: list[dict[str, Any]] = []  # observation results that point at subagent trajectories
    for k, step in enumerate(steps):
        at = f"{label} steps[{k}]"
        if not isinstance(step, dict) or step.get("source") not in SOURCES:
            raise FormatError(f"{at}: expected a step with source system/user/agent", "unknown role")
        own = object_field(object_field(step.get("extra"), at, "extra").get(OMRL), at, "extra.omrl")
        role = own.get("role") if own.get("role") in ("tool",) else SOURCES[step["source"]]
        calls = []
        for j, call in enumerate(list_field(step.get("tool_calls"), at, "tool_calls")):
            call = object_field(call, at, f"tool_calls[{j}]")
            call_own = object_field(object_field(call.get("extra"), at, "extra").get(OMRL), at, "tool call extra.omrl")
            arguments = call_own["arguments_text"] if isinstance(call_own.get("arguments_text"), str) else call.get("arguments")
            calls.append(tool_call(call.get("function_name"), arguments, call.get("tool_call_id"), f"{at} tool_calls[{j}]"))
        content = None if own.get("null_content") else _text(step.get("message"), at)
        reasoning = step.get("reasoning_content")
        flag = own.get("trainable")
        if flag is None and (step.get("is_copied_context") or (role == "assistant" and step.get("llm_call_count") == 0)):
            flag = False  # copied from another trajectory, or not written by a model: not the policy's to learn
        messages.append(message(role, content, reasoning=reasoning if isinstance(reasoning, str) else None,
                                tool_calls=calls, name=own.get("name"), trainable=flag,
                                tool_call_id=own.get("tool_call_id") if role == "tool" else None))
        leftover = {key: value for key, value in step.items() if key not in STEP_FIELDS}
        extra = dict(object_field(leftover.pop("extra", None), at, "extra"))
        extra.pop(OMRL, None)
        if extra:
            leftover["extra"] = extra
        if role == "assistant":
            turns.append(_turn(step, own, leftover, len(turns), at))
        elif leftover:
            step_fields[str(step.get("step_id", k + 1))] = leftover
        observation = object_field(step.get("observation"), at, "observation")
        for r, result in enumerate(list_field(observation.get("results"), at, "observation.results")):
            result = object_field(result, at, f"observation.results[{r}]")
            messages.append(_result_message(result, bool(calls), f"{at} observation.results[{r}]", refs))
    for k, turn in enumerate(turns):
        if turn["done"] is None:  # omrl writes `done` only where it is not the default: the last turn ends it
            turn["done"] = k == len(turns) - 1
    agent = object_field(record.get("agent"), label, "agent")
    final = object_field(record.get("final_metrics"), label, "final_metrics")
    extra = object_field(record.get("extra"), label, "extra")
    own = object_field(extra.get(OMRL), label, "extra.omrl")
    native = extra.get("task_id") or record.get("session_id") or record.get("trajectory_id")
    metadata = {key: record[key] for key in record if key not in ("steps", "subagent_trajectories")}
    metadata["agent"] = {key: value for key, value in agent.items() if key != "tool_definitions"}  # tools: a column
    metadata["extra"] = {key: value for key, value in extra.items() if key != OMRL} or None
    if step_fields:
        metadata["step_fields"] = step_fields
    if refs:
        metadata["subagent_refs"] = refs
    if parent is not None:
        native = f"{parent['task_id']}:{record.get('trajectory_id')}"
        metadata[SUBAGENT] = {"parent": parent["id"], "trajectory_id": record.get("trajectory_id")}
        ctx = dataclasses.replace(ctx, digest=f"{ctx.digest}/{record.get('trajectory_id')}")
    row = make_row(ctx, native_id=native, messages=messages, turns=turns,
                   tools=agent.get("tool_definitions"), reward=extra.get("reward"), success=extra.get("success"),
                   status=own.get("status") or "ok", error=own.get("error"), instruction=own.get("instruction"),
                   model=agent.get("model_name") if isinstance(agent.get("model_name"), str) else None,
                   metadata=metadata, prompt_tokens=final.get("total_prompt_tokens"),
                   completion_tokens=final.get("total_completion_tokens"))
    if parent is not None:
        row["parent_id"] = parent["id"]
        row.pop(PREVIOUS_ID, None)  # no earlier omrl version imported subagents: nothing to recognise
    rows = [row]
    subagents = list_field(record.get("subagent_trajectories"), label, "subagent_trajectories")
    seen: set[str] = set()
    for s, sub in enumerate(subagents):
        at = f"{label} subagent_trajectories[{s}]"
        sub = object_field(sub, at, "subagent trajectory")
        tid = sub.get("trajectory_id")
        if not isinstance(tid, str) or not tid or tid in seen:
            raise FormatError(f"{at}: an embedded subagent trajectory needs its own trajectory_id (text, unique)",
                              "bad subagent")
        seen.add(tid)
        rows += _convert(sub, ctx, parent=row, label=at)
    return rows


def _text(value: Any, where: str) -> str | None:
    """A message: text, or a list of content parts (text parts joined; image/audio parts kept as JSON)."""
    if value is None or isinstance(value, (str, list)):
        return text(value)
    raise FormatError(f"{where}: 'message' must be text or a list of content parts", "bad message")


def _turn(step: dict[str, Any], own: dict[str, Any], leftover: dict[str, Any], index: int, at: str) -> dict[str, Any]:
    metrics = dict(object_field(step.get("metrics"), at, "metrics"))
    turn_own = object_field(own.get("turn"), at, "extra.omrl.turn")
    info = dict(object_field(turn_own.get("info"), at, "extra.omrl.turn.info"))
    prompt_ids = metrics.pop("prompt_token_ids", None)
    if prompt_ids is not None:
        info[PROMPT_IDS] = prompt_ids
    turn = {"index": index, "prompt_tokens": metrics.pop("prompt_tokens", None),
            "completion_tokens": metrics.pop("completion_tokens", None),
            "completion_ids": metrics.pop("completion_token_ids", None) or [],
            "logprobs": metrics.pop("logprobs", None) or [],
            "reward": turn_own.get("reward"), "done": turn_own.get("done"), "latency_s": turn_own.get("latency_s")}
    if metrics:
        info["metrics"] = metrics  # cached_tokens, cost_usd, the provider's extra
    if leftover:
        info["atif"] = leftover  # timestamp, model_name, llm_call_count, the step's extra ...
    turn["info"] = info
    return turn


def _result_message(result: dict[str, Any], answers_calls: bool, at: str, refs: list[dict[str, Any]]) -> dict[str, Any]:
    """An observation result: a tool message when it answers a call (or its step made calls), else a user message."""
    own = object_field(object_field(result.get("extra"), at, "extra").get(OMRL), at, "extra.omrl")
    call_id = result.get("source_call_id") or own.get("tool_call_id")
    content = _text(result.get("content"), f"{at} content")
    ref = result.get("subagent_trajectory_ref")
    if ref:
        refs.append({"tool_call_id": call_id, "refs": ref})
    if call_id is None and not answers_calls and own.get("role") != "tool":
        return message("user", content, name=own.get("name"), trainable=own.get("trainable"))
    return message("tool", content, tool_call_id=call_id if isinstance(call_id, str) else None,
                   name=own.get("name"), trainable=own.get("trainable"))


# ---------------------------------------------------------------- export


def export_records(rows: Iterable[TrajectoryRow]) -> Iterator[dict[str, Any]]:
    """ATIF trajectories of store rows; a row imported as a subagent of another exported row is embedded in it."""
    rows = list(rows)
    ids = {row["id"] for row in rows}
    children: dict[str, list[TrajectoryRow]] = {}
    top = []
    for row in rows:
        parent = _subagent_parent(row)
        if parent in ids:
            children.setdefault(parent, []).append(row)
        else:
            top.append(row)
    for row in top:
        yield to_record(row, children)


def _subagent_parent(row: TrajectoryRow) -> str | None:
    if not row.get("parent_id"):
        return None
    meta = decoded(row.get("metadata"), None) or {}
    sub = meta.get(SUBAGENT) if isinstance(meta, dict) else None
    return row["parent_id"] if isinstance(sub, dict) and sub.get("parent") == row["parent_id"] else None


def to_record(row: TrajectoryRow, children: dict[str, list[TrajectoryRow]] | None = None) -> dict[str, Any]:
    """One store row as an ATIF trajectory (see the module docstring for where each field goes)."""
    children = children or {}
    meta = decoded(row.get("metadata"), None) or {}
    refs = {r.get("tool_call_id"): r.get("refs") for r in meta.get("subagent_refs") or [] if isinstance(r, dict)}
    turns = list(row.get("turns") or [])
    last = sum(1 for m in row["messages"] if m["role"] == "assistant") - 1
    steps: list[dict[str, Any]] = []
    assistant = 0
    for m in row["messages"]:
        owner = steps[-1] if steps and steps[-1]["source"] == "agent" else None
        if m["role"] == "tool" and owner is not None:
            owner.setdefault("observation", {"results": []})["results"].append(_result(m, owner, refs))
            continue
        step: dict[str, Any] = {"step_id": len(steps) + 1, "source": ROLE_SOURCES[m["role"]],
                                "message": m["content"] if m["content"] is not None else ""}
        own: dict[str, Any] = {}
        if m["content"] is None:
            own["null_content"] = True
        if m["role"] == "tool":  # a result before any agent step: a user step that says what it was
            own.update(role="tool", tool_call_id=m.get("tool_call_id"))
        if m.get("name"):
            own["name"] = m["name"]
        if m.get("trainable") is not None:
            own["trainable"] = m["trainable"]
        if m["role"] == "assistant":
            if m.get("reasoning") is not None:
                step["reasoning_content"] = m["reasoning"]
            if m["tool_calls"]:
                step["tool_calls"] = [_call(c) for c in m["tool_calls"]]
            turn = turns[assistant] if assistant < len(turns) else None
            assistant += 1
            if turn is not None:
                metrics, turn_own, fields = _metrics(turn, last=assistant - 1 == last)
                step.update(fields)
                if metrics:
                    step["metrics"] = metrics
                if turn_own:
                    own["turn"] = turn_own
        if own:
            step["extra"] = {**step.get("extra", {}), OMRL: own}
        steps.append(step)
    agent: dict[str, Any] = {"name": "omrl", "version": __version__}
    if row.get("model"):
        agent["model_name"] = row["model"]
    tools = decoded(row.get("tools"), None) or []
    if tools:
        agent["tool_definitions"] = tools
    own = {key: row.get(key) for key in ("instruction", "error") if row.get(key)}
    if row.get("status") not in (None, "ok"):
        own["status"] = row["status"]
    extra = {"task_id": row.get("task_id"), "reward": row.get("reward"), "success": row.get("success"),
             "omrl_id": row.get("id"), OMRL: own or None}
    final = {"total_prompt_tokens": row.get("prompt_tokens"), "total_completion_tokens": row.get("completion_tokens"),
             "total_steps": len(steps)}
    out = {"schema_version": VERSION, "session_id": row["id"], "trajectory_id": row["id"], "agent": agent,
           "steps": steps, "final_metrics": _present(final), "extra": _present(extra)}
    subs = [to_record(child, children) for child in children.get(row["id"], [])]
    for child, sub in zip(children.get(row["id"], []), subs, strict=True):
        sub["trajectory_id"] = (decoded(child.get("metadata"), None) or {}).get(SUBAGENT, {}).get("trajectory_id") or child["id"]
    if subs:
        out["subagent_trajectories"] = subs
    return out


def _present(values: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


def _call(call: dict[str, Any]) -> dict[str, Any]:
    cid, name, args = tool_call_parts(call)
    value = arguments_value(args)
    out = {"tool_call_id": cid or "", "function_name": name, "arguments": value if isinstance(value, dict) else {}}
    raw = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    if not isinstance(value, dict) or json.dumps(value, ensure_ascii=False) != raw:
        # ATIF's arguments are an object: text that is no object, or spaced otherwise, travels beside it
        out["extra"] = {OMRL: {"arguments_text": raw}}
    return out


def _result(m: dict[str, Any], owner: dict[str, Any], refs: dict[Any, Any]) -> dict[str, Any]:
    """A tool message as an observation result of the agent step before it."""
    calls = {c["tool_call_id"]: c["function_name"] for c in owner.get("tool_calls") or []}
    result: dict[str, Any] = {}
    own: dict[str, Any] = {}
    call_id = m.get("tool_call_id")
    if call_id in calls:
        result["source_call_id"] = call_id
    else:  # answers no call of this step (ATIF allows only those): the link travels beside it
        own.update(role="tool", tool_call_id=call_id)
    if m["content"] is not None:
        result["content"] = m["content"]
    if call_id in refs and refs[call_id]:
        result["subagent_trajectory_ref"] = refs[call_id]
    if m.get("name") and m["name"] != calls.get(call_id):
        own["name"] = m["name"]
    if m.get("trainable") is not None:
        own["trainable"] = m["trainable"]
    if own:
        result["extra"] = {OMRL: own}
    return result


METRICS = ("cached_tokens", "cost_usd", "extra")  # ATIF metrics an import keeps in turns.info["metrics"]
AGENT_STEP = ("timestamp", "model_name", "reasoning_effort", "llm_call_count", "is_copied_context", "extra")


def _metrics(turn: TurnRow, last: bool) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(ATIF step metrics, omrl's own turn fields, step fields) of one turn; `done` only when it is not `last`.

    What an ATIF import put in the turn's info (prompt token ids, other metrics, the step's own fields)
    goes back where it came from."""
    info = decoded(turn.get("info"), None) or {}
    info = dict(info) if isinstance(info, dict) else {"value": info}
    prompt_ids = info.pop(PROMPT_IDS, None)
    metrics = {"prompt_tokens": turn.get("prompt_tokens"), "completion_tokens": turn.get("completion_tokens"),
               "prompt_token_ids": prompt_ids, "completion_token_ids": turn.get("completion_ids") or None,
               "logprobs": list(turn["logprobs"]) if turn.get("logprobs") else None}
    fields: dict[str, Any] = {}
    if isinstance(info.get("metrics"), dict) and set(info["metrics"]) <= set(METRICS):
        metrics.update(info.pop("metrics"))
    if isinstance(info.get("atif"), dict) and set(info["atif"]) <= set(AGENT_STEP):
        fields = info.pop("atif")
    own = {"reward": turn.get("reward"), "done": turn.get("done") if bool(turn.get("done")) != last else None,
           "latency_s": turn.get("latency_s"),
           "info": info or None}
    return _present(metrics), _present(own), fields
