"""OpenTelemetry GenAI traces (and the OpenInference variant): one trajectory per trace; and the way back.

Spans are read by omrl.formats.otel_spans (OTLP JSON, one request per file or per line, or the Python
SDK's span JSON) and grouped by trace. A trace's spans, by start time:
- `invoke_agent` (gen_ai.operation.name; OpenInference span kind AGENT): the agent run. Its
  gen_ai.input.messages open the conversation, gen_ai.agent.name / gen_ai.request.model name the agent
  and model; an ERROR status makes the trajectory an env_error.
- `chat` / `text_completion` / `generate_content` (OpenInference: LLM): one model call, one assistant
  turn. Input messages (gen_ai.system_instructions + gen_ai.input.messages; OpenInference
  llm.input_messages.N.message.*; OpenLLMetry gen_ai.prompt.N.*) extend the conversation where they
  go beyond it; output messages (gen_ai.output.messages, llm.output_messages.N.*, gen_ai.completion.N.*)
  are the assistant's reply. gen_ai.usage.input_tokens / output_tokens (llm.token_count.prompt /
  completion) are the turn's token counts, the span's duration its latency. An ERROR status is a
  policy_error.
- `execute_tool` (OpenInference: TOOL): a tool call's result (gen_ai.tool.call.id / tool.id,
  gen_ai.tool.call.result / output.value) when no chat span showed it.
Messages are the GenAI JSON form [{role, parts: [{type: text|reasoning|tool_call|tool_call_response, ...}],
name}]. Everything a span carries that no message took (its other attributes, events, resource) is
kept in the turn's info (chat spans) or the row's metadata (the rest), never dropped.

omrl's own fields travel as `omrl.*` attributes, which other readers ignore: on chat spans the turn's
completion ids, logprobs, prompt ids, reward, done, info and the reply's trainable flag; on the agent
span the row's id, task id, reward, success, status, error and instruction, and the messages after the
last model call. So omrl -> OTel -> omrl keeps token ids and logprobs exactly.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

from omrl.formats.messages import message, tool_call
from omrl.formats.otel_spans import encode_attributes, read_traces
from omrl.formats.records import FormatError, RecordContext
from omrl.formats.rows import make_row
from omrl.formats.values import require_dict, text
from omrl.schema.messages import arguments_value, tool_call_parts
from omrl.schema.payloads import decoded, info_of, tools_of
from omrl.schema.rows import TrajectoryRow, TurnRow

NAME = "otel"
CHAT_OPS = ("chat", "text_completion", "generate_content")
OMRL = "omrl."
PROMPT_IDS = "prompt_token_ids"  # where a turn's prompt token ids live in turns.info (as the ATIF import puts them)
# Attributes a message list was read from: not repeated in the turn's info or the metadata.
MESSAGE_KEYS = ("gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions",
                "llm.input_messages.", "llm.output_messages.", "gen_ai.prompt.", "gen_ai.completion.",
                "gen_ai.tool.call.result", "gen_ai.tool.call.arguments", "gen_ai.tool.definitions", "llm.tools.")


# Attributes that went into the turn's own fields.
MAPPED = {"gen_ai.operation.name", "openinference.span.kind", "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens",
          "gen_ai.usage.prompt_tokens", "gen_ai.usage.completion_tokens", "llm.token_count.prompt",
          "llm.token_count.completion"}
MODEL_KEYS = ("gen_ai.response.model", "gen_ai.request.model", "llm.model_name")


def read_records(path) -> Iterator[tuple[int, dict[str, Any]]]:
    """The importer's records of a span file: one per trace (see omrl.formats.otel_spans)."""
    return read_traces(path)


# ---------------------------------------------------------------- import


def kind(span: dict[str, Any]) -> str | None:
    """agent, chat, tool, or None for a span that is none of them."""
    attrs = span["attributes"]
    op, oi = attrs.get("gen_ai.operation.name"), attrs.get("openinference.span.kind")
    if op == "invoke_agent" or oi == "AGENT":
        return "agent"
    if op in CHAT_OPS or oi == "LLM":
        return "chat"
    if op == "execute_tool" or oi == "TOOL":
        return "tool"
    return None


def convert(record: Any, ctx: RecordContext) -> dict[str, Any]:
    """One trace -> a trajectory dict."""
    record = require_dict(record, ctx)
    spans = record.get("spans") or []
    where = f"{ctx.where} (trace {record.get('trace_id')})"
    kinds = {s["span_id"]: kind(s) for s in spans}
    agents = [s for s in spans if kinds[s["span_id"]] == "agent"]
    root = min(agents, key=lambda s: (s["parent_id"] is not None, s["start"])) if agents else None
    own = {key[len(OMRL):]: value for key, value in (root["attributes"] if root else {}).items() if key.startswith(OMRL)}
    # Each span belongs to its nearest agent span: the root's (and those under no agent) make the
    # trajectory; a sub-agent's conversation is kept beside it, in the metadata.
    by_id = {s["span_id"]: s for s in spans}
    agent_of = _nearest_agents(by_id, kinds)
    groups: dict[str | None, list[dict[str, Any]]] = {}
    for span in spans:
        groups.setdefault(agent_of[span["span_id"]], []).append(span)
    main = root["span_id"] if root else None
    messages, turns, status, error = _play(groups.get(main, []) + (groups.get(None, []) if main else []),
                                           kinds, root, own, where)
    if not any(m["content"] or m["tool_calls"] or m["reasoning"] for m in messages):
        raise FormatError(f"{where}: no span holds message content (GenAI spans record it only when content "
                          "capture is on: OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true)", "no messages")
    subagents = []
    for agent_id, members in groups.items():
        if agent_id in (main, None):
            continue
        sub_messages, sub_turns, _, _ = _play(members, kinds, by_id[agent_id], {}, where)
        subagents.append({"agent": by_id[agent_id]["attributes"].get("gen_ai.agent.name",
                                                                      by_id[agent_id]["attributes"].get("agent.name")),
                          "span_id": agent_id, "messages": sub_messages, "turns": sub_turns})
    model = next((s["attributes"].get(key) for s in ([root] if root else []) + spans
                  for key in MODEL_KEYS if isinstance(s["attributes"].get(key), str)), None)
    for turn in turns:  # a model call's model is the row's: said once
        otel = turn["info"].get("otel")
        if otel is not None:
            otel["attributes"] = {k: v for k, v in otel["attributes"].items() if k not in MODEL_KEYS or v != model}
            if not otel["attributes"] and "events" not in otel:
                del turn["info"]["otel"]
    metadata = {"otel": {"trace_id": record.get("trace_id"), "spans": _leftovers(spans, kinds)}}
    if subagents:
        metadata["otel"]["subagents"] = subagents
    return make_row(ctx, native_id=own.get("task_id") or record.get("trace_id"), messages=messages, turns=turns,
                    tools=tool_definitions(root, spans, at=where), reward=own.get("reward"),
                    success=own.get("success"), status=status, error=error, model=model,
                    instruction=own.get("instruction"), metadata=metadata,
                    prompt_tokens=own.get("prompt_tokens"), completion_tokens=own.get("completion_tokens"),
                    created_at=_time(root["start"]) if root and root["start"] else None)


def _nearest_agents(by_id: dict[str, dict[str, Any]], kinds: dict[str, Any]) -> dict[str, str | None]:
    """The span id of the nearest agent span at or above each span (None: under no agent), in time linear
    in the number of spans: each chain is walked once, and what it found is remembered for every span on it.

    A parent that is not in the trace ends a chain; so does a cycle of parents (malformed, but seen)."""
    found: dict[str, str | None] = {}
    for start in by_id:
        chain: dict[str, None] = {}  # the spans walked from `start`, in order (a dict: a cycle is seen in O(1))
        current: str | None = start
        while current in by_id and current not in found and current not in chain and kinds[current] != "agent":
            chain[current] = None
            current = by_id[current]["parent_id"]
        if current in found:
            agent = found[current]
        elif current in by_id and kinds[current] == "agent":  # never in `chain`: the walk stops at agents
            agent = found[current] = current
        else:  # the top, a parent outside the trace, or a cycle
            agent = None
        found.update(dict.fromkeys(chain, agent))
    return found


def _play(spans: list[dict[str, Any]], kinds: dict[str, Any], root: dict[str, Any] | None, own: dict[str, Any],
          where: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str, str | None]:
    """(messages, turns, status, error) of one agent's spans, played in time order."""
    events = []
    for span in spans:
        k = kinds[span["span_id"]]
        if k == "agent":
            events += [(span["start"], 0, "agent_in", span), (span["end"], 3, "agent_out", span)]
        elif k in ("chat", "tool"):
            events.append((span["start"], 1 if k == "chat" else 2, k, span))
    events.sort(key=lambda e: (e[0], e[1]))
    conversation = Conversation()
    turns: list[dict[str, Any]] = []
    status, error = own.get("status") or "ok", own.get("error")
    for _, _, what, span in events:
        attrs, at = span["attributes"], f"{where} span {span['name']!r}"
        if what == "agent_in":
            conversation.merge(input_messages(attrs, at))
        elif what == "agent_out":
            conversation.merge(output_messages(attrs, at))
            if span is root:
                conversation.merge([m for raw in _json_list(own.get("final_messages"), at)
                                    for m in _split_tool_responses(_message(raw, at))])
                if span["status"]["code"] == "ERROR" and status == "ok":
                    status, error = "env_error", span["status"]["message"] or "the agent span failed"
        elif what == "chat":
            conversation.merge(input_messages(attrs, at))
            for reply in output_messages(attrs, at) or [message("assistant", None)]:
                reply.pop("_responses", None)
                finish = reply.pop("_finish", None)
                if attrs.get(OMRL + "trainable") is not None:
                    reply["trainable"] = bool(attrs[OMRL + "trainable"])
                conversation.append(reply)
                turns.append(_turn(span, len(turns), at))
                if finish is not None and OMRL + "turn.info" not in attrs:  # omrl's own info says it already
                    turns[-1]["info"].setdefault("finish_reason", finish)
            if span["status"]["code"] == "ERROR" and status == "ok":
                status, error = "policy_error", span["status"]["message"] or "the model call failed"
        else:
            result = tool_result(attrs, at)
            if result is not None and not (result["tool_call_id"] and conversation.answered(result["tool_call_id"])):
                conversation.append(result)
    for k, turn in enumerate(turns):
        if turn["done"] is None:
            turn["done"] = k == len(turns) - 1
    return conversation.messages, turns, status, error


class Conversation:
    """The messages of one agent's spans as they are played, with each message's match key kept beside it
    and counted: a span's messages are matched without recomputing every key of the conversation so far,
    a message no earlier one matches costs no scan at all, and a tool result is checked in O(1)."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.keys: list[tuple] = []
        self.counts: Counter[tuple] = Counter()  # key -> how many messages have it

    def insert(self, at: int, new: list[dict[str, Any]]) -> None:
        keys = [_key(m) for m in new]
        self.messages[at:at] = new
        self.keys[at:at] = keys
        self.counts.update(keys)

    def append(self, m: dict[str, Any]) -> None:
        self.insert(len(self.messages), [m])

    def answered(self, call_id: str) -> bool:
        """Whether a tool message answering `call_id` is in the conversation."""
        return self.counts[("tool", call_id)] > 0

    def merge(self, incoming: list[dict[str, Any]]) -> None:
        """Add the messages of `incoming` (a model call's whole input, say) that the conversation lacks, in its order.

        Messages are matched in order (a tool result by its call id, others by role, text and call ids); a
        run of new ones goes right before the next matched message, or at the end: a longer history extends
        the conversation, a system prompt first seen on a model call goes before the user's message, and a
        summary that replaced earlier turns goes where it first appeared."""
        position, pending = 0, []
        for m in incoming:
            found = self._find(_key(m), position)
            if found is None:
                pending.append(m)
                continue
            self.insert(found, pending)
            position, pending = found + len(pending) + 1, []
        self.insert(len(self.messages), pending)

    def _find(self, key: tuple, start: int) -> int | None:
        """The first position at or after `start` holding `key`; a key no message has is answered without a scan."""
        if not self.counts[key]:
            return None
        try:
            return self.keys.index(key, start)
        except ValueError:  # list.index's "not there": the key is only before `start`
            return None


def _key(m: dict[str, Any]) -> tuple:
    if m["role"] == "tool" and m.get("tool_call_id"):
        return ("tool", m["tool_call_id"])
    return (m["role"], m["content"] or "", tuple(c.get("id") or c["name"] for c in m["tool_calls"]))


def input_messages(attrs: dict[str, Any], at: str) -> list[dict[str, Any]]:
    """A model call's (or agent's) input messages in any of the three conventions."""
    out = []
    system = attrs.get("gen_ai.system_instructions")
    if system is not None:
        parts = _json_list(system, f"{at} gen_ai.system_instructions")
        out.append(message("system", "".join(_part_text(p) for p in parts)))
    if attrs.get("gen_ai.input.messages") is not None:
        for m in _json_list(attrs["gen_ai.input.messages"], f"{at} gen_ai.input.messages"):
            out += _split_tool_responses(_message(m, at))
        return out
    return out + [m for raw in indexed(attrs, "llm.input_messages.") for m in _split_tool_responses(_oi_message(raw, at))] \
        + [m for raw in indexed(attrs, "gen_ai.prompt.") for m in _split_tool_responses(_flat_message(raw, at))]


def output_messages(attrs: dict[str, Any], at: str) -> list[dict[str, Any]]:
    if attrs.get("gen_ai.output.messages") is not None:
        return [_message(m, at) for m in _json_list(attrs["gen_ai.output.messages"], f"{at} gen_ai.output.messages")]
    return [_oi_message(raw, at) for raw in indexed(attrs, "llm.output_messages.")] + \
        [_flat_message(raw, at) for raw in indexed(attrs, "gen_ai.completion.")]


def tool_result(attrs: dict[str, Any], at: str) -> dict[str, Any] | None:
    """The tool message an execute_tool / TOOL span reports, or None when it holds no result."""
    result = attrs.get("gen_ai.tool.call.result", attrs.get("output.value"))
    if result is None:
        return None
    call_id = attrs.get("gen_ai.tool.call.id", attrs.get("tool.id", attrs.get("tool_call.id")))
    return message("tool", result if isinstance(result, str) else json.dumps(result, ensure_ascii=False),
                   tool_call_id=call_id if isinstance(call_id, str) else None,
                   name=attrs.get("gen_ai.tool.name", attrs.get("tool.name")))


def _json_list(value: Any, at: str) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise FormatError(f"{at}: not valid JSON ({exc.msg})", "bad json") from None
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        raise FormatError(f"{at}: expected a list of messages", "bad messages")
    return value


def _part_text(part: Any) -> str:
    if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("content"), str):
        return part["content"]
    return text(part) if isinstance(part, str) else json.dumps(part, ensure_ascii=False)


def _message(raw: Any, at: str) -> dict[str, Any]:
    """A GenAI JSON message {role, parts, name} as a schema message (tool responses kept as parts for now)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("role"), str):
        raise FormatError(f"{at}: a message needs a role", "bad message")
    role = {"developer": "system", "model": "assistant"}.get(raw["role"], raw["role"])
    if role not in ("system", "user", "assistant", "tool"):
        raise FormatError(f"{at}: unknown role {raw['role']!r}", "unknown role")
    texts, reasoning, calls, responses = [], [], [], []
    parts = raw.get("parts")
    if parts is None and "content" in raw:  # some instrumentations write {role, content}
        parts = [{"type": "text", "content": raw["content"]}] if raw["content"] is not None else []
    for j, part in enumerate(parts if isinstance(parts, list) else []):
        kind_ = part.get("type") if isinstance(part, dict) else None
        if kind_ == "text" or kind_ is None and isinstance(part, str):
            texts.append(part["content"] if isinstance(part, dict) else part)
        elif kind_ == "reasoning":
            reasoning.append(part.get("content") or "")
        elif kind_ == "tool_call":
            args = part.get("arguments")
            calls.append(tool_call(part.get("name"), args, part.get("id"), f"{at} parts[{j}]"))
        elif kind_ == "tool_call_response":
            response = part.get("response")
            responses.append((part.get("id"), response if isinstance(response, str) or response is None
                              else json.dumps(response, ensure_ascii=False)))
        else:  # blobs, files, uris, a producer's own part types: kept as their JSON
            texts.append(json.dumps(part, ensure_ascii=False))
    msg = message(role, "".join(t if isinstance(t, str) else json.dumps(t) for t in texts) if texts else None,
                  reasoning="".join(reasoning) if reasoning else None, tool_calls=calls,
                  name=raw.get("name") if isinstance(raw.get("name"), str) else None)
    msg["_responses"] = responses
    if isinstance(raw.get("finish_reason"), str):
        msg["_finish"] = raw["finish_reason"]
    return msg


def _split_tool_responses(msg: dict[str, Any]) -> list[dict[str, Any]]:
    """A message's tool_call_response parts as tool messages of their own (one per response)."""
    responses = msg.pop("_responses", [])
    if not responses:
        return [msg]
    out = [message("tool", content, tool_call_id=call_id if isinstance(call_id, str) else None, name=msg["name"])
           for call_id, content in responses]
    if msg["content"] is not None or msg["tool_calls"]:
        out.insert(0, msg)
    return out


def indexed(attrs: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    """Flattened list attributes (`prefix.0.message.role`, ...) as a list of dicts of their rest keys."""
    items: dict[int, dict[str, Any]] = {}
    for key, value in attrs.items():
        if key.startswith(prefix):
            head, _, rest = key[len(prefix):].partition(".")
            if head.isdigit():
                items.setdefault(int(head), {})[rest] = value
    return [items[k] for k in sorted(items)]


def _calls_from(flat: dict[str, Any], prefix: str, names: tuple[str, str, str], at: str) -> list[dict[str, Any]]:
    """Flattened tool calls (`prefix.0.<id>`, `.<name>`, `.<arguments>`)."""
    id_key, name_key, args_key = names
    return [tool_call(c.get(name_key), c.get(args_key), c.get(id_key), f"{at} {prefix}{k}")
            for k, c in enumerate(indexed(flat, prefix))]


def _oi_message(flat: dict[str, Any], at: str) -> dict[str, Any]:
    """An OpenInference message (`message.role`, `message.content`, `message.contents.N.message_content.*`,
    `message.tool_calls.N.tool_call.*`, `message.tool_call_id`, `message.name`)."""
    role = flat.get("message.role")
    role = {"developer": "system", "model": "assistant", "function": "tool"}.get(role, role)
    if role not in ("system", "user", "assistant", "tool"):
        raise FormatError(f"{at}: unknown role {flat.get('message.role')!r}", "unknown role")
    texts, reasoning = [], []
    if flat.get("message.content") is not None:
        texts.append(flat["message.content"])
    for part in indexed(flat, "message.contents."):
        kind_, body = part.get("message_content.type"), part.get("message_content.text")
        if kind_ == "reasoning":
            reasoning.append(body or "")
        elif body is not None:
            texts.append(body)
        else:
            texts.append(json.dumps(part, ensure_ascii=False))
    calls = _calls_from(flat, "message.tool_calls.", ("tool_call.id", "tool_call.function.name",
                                                       "tool_call.function.arguments"), at)
    if flat.get("message.function_call_name"):
        calls.append(tool_call(flat["message.function_call_name"], flat.get("message.function_call_arguments_json"),
                               None, at))
    msg = message(role, "".join(map(str, texts)) if texts else None, reasoning="".join(reasoning) or None,
                  tool_calls=calls, tool_call_id=flat.get("message.tool_call_id"), name=flat.get("message.name"))
    msg["_responses"] = []
    return msg


def _flat_message(flat: dict[str, Any], at: str) -> dict[str, Any]:
    """An OpenLLMetry message (`gen_ai.prompt.N.role`, `.content`, `.tool_calls.M.name/arguments/id`,
    `.tool_call_id`)."""
    role = flat.get("role")
    role = {"developer": "system", "model": "assistant", "function": "tool"}.get(role, role)
    if role not in ("system", "user", "assistant", "tool"):
        raise FormatError(f"{at}: unknown role {flat.get('role')!r}", "unknown role")
    calls = _calls_from(flat, "tool_calls.", ("id", "name", "arguments"), at)
    msg = message(role, flat.get("content"), tool_calls=calls, tool_call_id=flat.get("tool_call_id"),
                  name=flat.get("name"))
    msg["_responses"] = []
    return msg


def _turn(span: dict[str, Any], index: int, at: str) -> dict[str, Any]:
    attrs = span["attributes"]
    info = attrs.get(OMRL + "turn.info")
    info = json.loads(info) if isinstance(info, str) else {}
    if attrs.get(OMRL + "turn.prompt_ids") is not None:
        info[PROMPT_IDS] = attrs[OMRL + "turn.prompt_ids"]
    kept = {k: v for k, v in attrs.items() if not k.startswith((OMRL, *MESSAGE_KEYS)) and k not in MAPPED}
    if kept or span["events"]:
        info["otel"] = {"span_id": span["span_id"], "name": span["name"], "attributes": kept,
                        **({"events": span["events"]} if span["events"] else {})}
    duration = (span["end"] - span["start"]) / 1e9 if span["end"] > span["start"] else None
    return {"index": index, "reward": attrs.get(OMRL + "turn.reward"), "done": attrs.get(OMRL + "turn.done"),
            "latency_s": duration,
            "prompt_tokens": attrs.get("gen_ai.usage.input_tokens", attrs.get("llm.token_count.prompt",
                                                                              attrs.get("gen_ai.usage.prompt_tokens"))),
            "completion_tokens": attrs.get("gen_ai.usage.output_tokens", attrs.get(
                "llm.token_count.completion", attrs.get("gen_ai.usage.completion_tokens"))),
            "completion_ids": attrs.get(OMRL + "turn.completion_ids") or [],
            "logprobs": attrs.get(OMRL + "turn.logprobs") or [], "info": info}


def tool_definitions(root: dict[str, Any] | None, spans: list[dict[str, Any]], at: str) -> list[Any] | None:
    """The tools offered: gen_ai.tool.definitions (agent span first, then model calls) or llm.tools.N.tool.json_schema."""
    for span in ([root] if root else []) + spans:
        attrs = span["attributes"]
        if attrs.get("gen_ai.tool.definitions") is not None:
            return [_openai_tool(t) for t in _json_list(attrs["gen_ai.tool.definitions"], f"{at} gen_ai.tool.definitions")]
        schemas = [t.get("tool.json_schema") for t in indexed(attrs, "llm.tools.")]
        if schemas:
            return [_openai_tool(json.loads(s) if isinstance(s, str) else s) for s in schemas]
    return None


def _openai_tool(tool: Any) -> Any:
    """A flat {type, name, description, parameters} tool in the schema's nested OpenAI form."""
    if isinstance(tool, dict) and "function" not in tool and "name" in tool:
        return {"type": tool.get("type", "function"), "function": {k: v for k, v in tool.items() if k != "type"}}
    return tool


def _leftovers(spans: list[dict[str, Any]], kinds: dict[str, str | None]) -> list[dict[str, Any]]:
    """What the row's messages and turns did not take from the trace's spans (chat spans are in turns.info)."""
    out = []
    for span in spans:
        k = kinds[span["span_id"]]
        if k == "chat":
            continue
        attrs = {key: v for key, v in span["attributes"].items() if not key.startswith(MESSAGE_KEYS)
                 and not key.startswith(OMRL)}
        entry = {"span_id": span["span_id"], "parent_id": span["parent_id"], "name": span["name"], "kind": k,
                 "attributes": attrs, "status": span["status"]}
        if span["events"]:
            entry["events"] = span["events"]
        out.append(entry)
    resources = {json.dumps(s["resource"], sort_keys=True, default=str) for s in spans if s["resource"]}
    if resources:
        out.append({"resources": [json.loads(r) for r in sorted(resources)]})
    return out


EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _time(nanos: int) -> datetime:
    return EPOCH + timedelta(microseconds=nanos // 1000)


# ---------------------------------------------------------------- export


def export_records(rows: Iterable[TrajectoryRow]) -> Iterator[dict[str, Any]]:
    """One OTLP JSON request (a line of the Collector's file exporter) per trajectory."""
    for row in rows:
        yield to_request(row)


def to_request(row: TrajectoryRow) -> dict[str, Any]:
    """A trajectory as one trace: an invoke_agent span, a chat span per assistant turn, an execute_tool span
    per answered call (see the module docstring)."""
    trace_id = hashlib.sha256(f"omrl:{row['id']}".encode("utf-8", "surrogatepass")).hexdigest()[:32]
    ids = iter(range(1, 10**9))

    def new_span_id() -> str:
        return hashlib.sha256(f"{trace_id}:{next(ids)}".encode()).hexdigest()[:16]

    created = row.get("created_at")
    if isinstance(created, datetime):
        created = created if created.tzinfo else created.replace(tzinfo=timezone.utc)
        clock = (created - EPOCH) // timedelta(microseconds=1) * 1000
    else:
        clock = 0
    root_id = new_span_id()
    spans: list[dict[str, Any]] = []
    turns = list(row.get("turns") or [])
    messages = row["messages"]
    model = row.get("model") or ""
    last = sum(1 for m in messages if m["role"] == "assistant") - 1
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
    final_from = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=len(messages) - 1) + 1
    start = clock
    assistant = 0
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        turn = turns[assistant] if assistant < len(turns) else {}
        duration = int(round((turn.get("latency_s") or 0) * 1e9))
        attrs = {"gen_ai.operation.name": "chat", "gen_ai.request.model": model or None,
                 "gen_ai.input.messages": json.dumps([_genai(x) for x in messages[:i]], ensure_ascii=False),
                 "gen_ai.output.messages": json.dumps([_genai(m, finish=_finish(turn, m))], ensure_ascii=False),
                 "gen_ai.usage.input_tokens": turn.get("prompt_tokens"),
                 "gen_ai.usage.output_tokens": turn.get("completion_tokens")}
        attrs.update(_turn_attributes(turn, m, last=assistant == last))
        spans.append(_span(trace_id, new_span_id(), root_id, f"chat {model}".strip(), 3, start, start + duration, attrs))
        start += duration + 1  # 1 ns apart: the order of the spans is the order of their start times
        assistant += 1
        for call in m["tool_calls"]:
            cid, name, args = tool_call_parts(call)
            result = next((x for x in messages[i + 1:] if x["role"] == "tool" and x.get("tool_call_id") == cid), None)
            attrs = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name, "gen_ai.tool.call.id": cid,
                     "gen_ai.tool.type": "function", "gen_ai.tool.call.arguments": args,
                     "gen_ai.tool.call.result": result["content"] if result is not None else None}
            spans.append(_span(trace_id, new_span_id(), root_id, f"execute_tool {name}", 1, start, start, attrs))
            start += 1
    tools = tools_of(row)
    own = {"id": row["id"], "task_id": row.get("task_id"), "reward": row.get("reward"), "success": row.get("success"),
           "status": row.get("status") if row.get("status") != "ok" else None, "error": row.get("error"),
           "instruction": row.get("instruction") or None, "prompt_tokens": row.get("prompt_tokens"),
           "completion_tokens": row.get("completion_tokens"),
           "final_messages": json.dumps([_genai(x) for x in messages[final_from:]], ensure_ascii=False)
           if final_from < len(messages) else None}
    root_attrs = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": row.get("env") or "omrl",
                  "gen_ai.request.model": model or None,
                  "gen_ai.input.messages": json.dumps([_genai(x) for x in messages[:first]], ensure_ascii=False),
                  "gen_ai.tool.definitions": json.dumps(tools, ensure_ascii=False) if tools else None,
                  **{OMRL + k: v for k, v in own.items()}}
    root = _span(trace_id, root_id, None, f"invoke_agent {root_attrs['gen_ai.agent.name']}", 1, clock, start, root_attrs)
    if row.get("status") in ("env_error", "policy_error", "timeout"):
        root["status"] = {"code": 2, "message": row.get("error") or row["status"]}
    from omrl import __version__

    return {"resourceSpans": [{
        "resource": {"attributes": encode_attributes({"service.name": "omrl"})},
        "scopeSpans": [{"scope": {"name": "omrl", "version": __version__}, "spans": [root, *spans]}]}]}


def _span(trace_id: str, span_id: str, parent: str | None, name: str, kind_: int, start: int, end: int,
          attrs: dict[str, Any]) -> dict[str, Any]:
    out = {"traceId": trace_id, "spanId": span_id, "name": name, "kind": kind_,
           "startTimeUnixNano": str(start), "endTimeUnixNano": str(end), "attributes": encode_attributes(attrs),
           "status": {}}
    if parent:
        out["parentSpanId"] = parent
    return out


def _genai(m: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    """A schema message in the GenAI JSON form."""
    parts: list[dict[str, Any]] = []
    if m["role"] == "tool":
        parts.append({"type": "tool_call_response", "id": m.get("tool_call_id"), "response": m["content"]})
    else:
        if m.get("reasoning") is not None:
            parts.append({"type": "reasoning", "content": m["reasoning"]})
        if m["content"] is not None:
            parts.append({"type": "text", "content": m["content"]})
        for cid, name, args in map(tool_call_parts, m["tool_calls"] or []):
            value = arguments_value(args)
            exact = isinstance(args, str) and value is not args and json.dumps(value, ensure_ascii=False) == args
            parts.append({"type": "tool_call", "id": cid, "name": name, "arguments": value if exact else args})
    out: dict[str, Any] = {"role": m["role"], "parts": parts}
    if m.get("name"):
        out["name"] = m["name"]
    if finish is not None:
        out["finish_reason"] = finish
    return out


def _finish(turn: TurnRow, m: dict[str, Any]) -> str:
    reason = info_of(turn).get("finish_reason")
    return reason if isinstance(reason, str) else ("tool_call" if m["tool_calls"] else "stop")


def _turn_attributes(turn: TurnRow, m: dict[str, Any], last: bool) -> dict[str, Any]:
    info = decoded(turn.get("info"), {})
    info = dict(info) if isinstance(info, dict) else {"value": info}
    prompt_ids = info.pop(PROMPT_IDS, None)
    return {OMRL + "turn.completion_ids": list(turn.get("completion_ids") or []) or None,
            OMRL + "turn.logprobs": [float(x) for x in turn.get("logprobs") or []] or None,
            OMRL + "turn.prompt_ids": prompt_ids,
            OMRL + "turn.reward": turn.get("reward"),
            OMRL + "turn.done": turn.get("done") if bool(turn.get("done")) != last else None,
            OMRL + "turn.info": json.dumps(info, ensure_ascii=False),  # always: it marks the span as omrl's
            OMRL + "trainable": m.get("trainable")}
