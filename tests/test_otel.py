"""OpenTelemetry GenAI traces: files written by the real OpenTelemetry SDK and its exporters (OTLP JSON as
protobuf's JSON mapping and as the Collector's file exporter writes it, the SDK's span JSON), with the
attribute names taken from the published semantic conventions (opentelemetry-semantic-conventions for
GenAI, openinference-semantic-conventions for OpenInference), import as one trajectory per trace; and
omrl -> OTel -> omrl keeps token ids and logprobs exactly."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from test_roundtrip import hand_made_rows, rl_row

from omrl.cli.main import cli
from omrl.formats.importer import load_trajectories
from omrl.formats.records import FormatError
from omrl.store import Store

sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")  # the dev extra installs these
from google.protobuf.json_format import MessageToDict  # noqa: E402
from openinference.semconv.trace import (  # noqa: E402
    MessageAttributes,
    OpenInferenceSpanKindValues,
    SpanAttributes,
    ToolCallAttributes,
)
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as GA  # noqa: E402
from opentelemetry.trace import SpanKind, Status, StatusCode  # noqa: E402


def tracer():
    exporter = InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("agent-under-test"), exporter


def genai(role, *parts, **extra):
    return {"role": role, "parts": list(parts), **extra}


def instrumented_agent_run(t, question="What is 12 * 7?", fail_model_call=False):
    """What a GenAI-instrumented agent emits with content capture on: an invoke_agent span, a chat span per
    model call (the whole input each time), an execute_tool span per call."""
    system = [{"type": "text", "content": "You are a calculator agent."}]
    user = genai("user", {"type": "text", "content": question})
    call = genai("assistant", {"type": "reasoning", "content": "multiply with the tool"},
                 {"type": "tool_call", "id": "call_1", "name": "multiply", "arguments": {"a": 12, "b": 7}})
    result = genai("tool", {"type": "tool_call_response", "id": "call_1", "response": "84"})
    answer = genai("assistant", {"type": "text", "content": "12 * 7 = 84."})
    tools = [{"type": "function", "name": "multiply", "description": "a * b",
              "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}]
    with t.start_as_current_span("invoke_agent calculator", attributes={
            GA.GEN_AI_OPERATION_NAME: "invoke_agent", GA.GEN_AI_AGENT_NAME: "calculator",
            GA.GEN_AI_REQUEST_MODEL: "gpt-test", GA.GEN_AI_CONVERSATION_ID: "conv-1",
            GA.GEN_AI_INPUT_MESSAGES: json.dumps([user]), GA.GEN_AI_TOOL_DEFINITIONS: json.dumps(tools)}) as agent:
        with t.start_as_current_span("chat gpt-test", kind=SpanKind.CLIENT, attributes={
                GA.GEN_AI_OPERATION_NAME: "chat", GA.GEN_AI_PROVIDER_NAME: "openai", GA.GEN_AI_REQUEST_MODEL: "gpt-test",
                GA.GEN_AI_RESPONSE_MODEL: "gpt-test-2025", GA.GEN_AI_RESPONSE_ID: "resp-1",
                GA.GEN_AI_SYSTEM_INSTRUCTIONS: json.dumps(system), GA.GEN_AI_INPUT_MESSAGES: json.dumps([user]),
                GA.GEN_AI_OUTPUT_MESSAGES: json.dumps([{**call, "finish_reason": "tool_call"}]),
                GA.GEN_AI_USAGE_INPUT_TOKENS: 31, GA.GEN_AI_USAGE_OUTPUT_TOKENS: 12,
                GA.GEN_AI_RESPONSE_FINISH_REASONS: ["tool_call"]}):
            pass
        with t.start_as_current_span("execute_tool multiply", attributes={
                GA.GEN_AI_OPERATION_NAME: "execute_tool", GA.GEN_AI_TOOL_NAME: "multiply", GA.GEN_AI_TOOL_CALL_ID: "call_1",
                GA.GEN_AI_TOOL_CALL_ARGUMENTS: '{"a": 12, "b": 7}', GA.GEN_AI_TOOL_CALL_RESULT: "84"}):
            pass
        with t.start_as_current_span("chat gpt-test", kind=SpanKind.CLIENT, attributes={
                GA.GEN_AI_OPERATION_NAME: "chat", GA.GEN_AI_REQUEST_MODEL: "gpt-test",
                GA.GEN_AI_SYSTEM_INSTRUCTIONS: json.dumps(system),
                GA.GEN_AI_INPUT_MESSAGES: json.dumps([user, call, result]),
                GA.GEN_AI_OUTPUT_MESSAGES: json.dumps([{**answer, "finish_reason": "stop"}]),
                GA.GEN_AI_USAGE_INPUT_TOKENS: 50, GA.GEN_AI_USAGE_OUTPUT_TOKENS: 8}) as chat:
            if fail_model_call:
                chat.set_status(Status(StatusCode.ERROR, "rate limited"))
        agent.set_attribute(GA.GEN_AI_OUTPUT_MESSAGES, json.dumps([answer]))


def otlp_request(spans) -> dict:
    """The OTLP JSON of spans: protobuf's JSON mapping of the request the OTLP exporters send (ids base64)."""
    return MessageToDict(encode_spans(spans))


def collector_json(request: dict) -> dict:
    """The same request as the OTLP/JSON spec and the Collector's file exporter write it: ids in hex."""
    import base64

    request = json.loads(json.dumps(request))
    for block in request["resourceSpans"]:
        for scope in block["scopeSpans"]:
            for span in scope["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return request


def check_calculator(row: dict) -> None:
    assert [(m["role"], m["content"]) for m in row["messages"]] == [
        ("system", "You are a calculator agent."), ("user", "What is 12 * 7?"), ("assistant", None),
        ("tool", "84"), ("assistant", "12 * 7 = 84.")]
    call = row["messages"][2]
    assert call["reasoning"] == "multiply with the tool"
    assert [(c["id"], c["name"], json.loads(c["arguments"])) for c in call["tool_calls"]] == [
        ("call_1", "multiply", {"a": 12, "b": 7})]
    assert row["messages"][3]["tool_call_id"] == "call_1" and row["messages"][3]["name"] == "multiply"
    assert [(t["prompt_tokens"], t["completion_tokens"], t["done"]) for t in row["turns"]] == [(31, 12, False),
                                                                                                 (50, 8, True)]
    assert all(t["latency_s"] is None or t["latency_s"] >= 0 for t in row["turns"])
    first = json.loads(row["turns"][0]["info"])["otel"]["attributes"]
    assert first["gen_ai.response.id"] == "resp-1" and first["gen_ai.provider.name"] == "openai"
    assert row["model"] == "gpt-test" and row["instruction"] == "What is 12 * 7?"
    assert json.loads(row["tools"])[0]["function"]["name"] == "multiply"
    assert row["env"] == "import:otel" and row["status"] == "ok"


def test_otlp_json_from_the_real_sdk_imports_as_one_trajectory_per_trace(tmp_path):
    t, exporter = tracer()
    instrumented_agent_run(t)
    instrumented_agent_run(t, question="What is 2 * 3?")
    request = otlp_request(exporter.get_finished_spans())
    (tmp_path / "protobuf.json").write_text(json.dumps(request))
    (tmp_path / "collector.jsonl").write_text(json.dumps(collector_json(request)) + "\n")
    for name in ("protobuf.json", "collector.jsonl"):
        rows = load_trajectories(tmp_path / name)  # detected as otel
        assert len(rows) == 2, name
        check_calculator(rows[0])
        assert rows[1]["instruction"] == "What is 2 * 3?"
        assert rows[0]["task_id"] != rows[1]["task_id"]  # one task per trace
        meta = json.loads(rows[0]["metadata"])["otel"]
        agent = next(s for s in meta["spans"] if s.get("kind") == "agent")
        assert agent["attributes"]["gen_ai.conversation.id"] == "conv-1"  # nothing a span said is dropped


def test_the_sdk_span_json_imports_the_same(tmp_path):
    """ReadableSpan.to_json() (what ConsoleSpanExporter prints), one span per line."""
    t, exporter = tracer()
    instrumented_agent_run(t)
    path = tmp_path / "console.jsonl"
    path.write_text("".join(json.dumps(json.loads(s.to_json())) + "\n" for s in exporter.get_finished_spans()))
    (row,) = load_trajectories(path)
    check_calculator(row)
    assert row["turns"][0]["latency_s"] > 0  # from the spans' ISO times, to the nanosecond


def test_a_failed_model_call_is_a_policy_error(tmp_path):
    t, exporter = tracer()
    instrumented_agent_run(t, fail_model_call=True)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(otlp_request(exporter.get_finished_spans())))
    (row,) = load_trajectories(path)
    assert (row["status"], row["error"]) == ("policy_error", "rate limited")


def test_spans_without_captured_content_are_refused_saying_how_to_capture_it(tmp_path):
    t, exporter = tracer()
    with t.start_as_current_span("chat m", attributes={GA.GEN_AI_OPERATION_NAME: "chat",
                                                       GA.GEN_AI_USAGE_INPUT_TOKENS: 3}):
        pass
    path = tmp_path / "t.json"
    path.write_text(json.dumps(otlp_request(exporter.get_finished_spans())))
    result = CliRunner().invoke(cli, ["import", str(path), "--store", str(tmp_path / "s")])
    assert result.exit_code != 0
    assert "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT" in result.output and not (tmp_path / "s").exists()


def test_a_sub_agent_is_kept_beside_the_main_conversation(tmp_path):
    t, exporter = tracer()
    with t.start_as_current_span("invoke_agent boss", attributes={GA.GEN_AI_OPERATION_NAME: "invoke_agent"}):
        with t.start_as_current_span("chat m", attributes={
                GA.GEN_AI_OPERATION_NAME: "chat",
                GA.GEN_AI_INPUT_MESSAGES: json.dumps([genai("user", {"type": "text", "content": "Plan the trip."})]),
                GA.GEN_AI_OUTPUT_MESSAGES: json.dumps([genai("assistant", {"type": "text", "content": "Asking."})])}):
            pass
        helper = {GA.GEN_AI_OPERATION_NAME: "invoke_agent", GA.GEN_AI_AGENT_NAME: "helper"}
        call = {GA.GEN_AI_OPERATION_NAME: "chat",
                GA.GEN_AI_INPUT_MESSAGES: json.dumps([genai("user", {"type": "text", "content": "Find trains."})]),
                GA.GEN_AI_OUTPUT_MESSAGES: json.dumps([genai("assistant", {"type": "text", "content": "9:05."})])}
        with t.start_as_current_span("invoke_agent helper", attributes=helper), \
                t.start_as_current_span("chat m", attributes=call):
            pass
    path = tmp_path / "t.json"
    path.write_text(json.dumps(otlp_request(exporter.get_finished_spans())))
    (row,) = load_trajectories(path)
    assert [m["content"] for m in row["messages"]] == ["Plan the trip.", "Asking."]
    (sub,) = json.loads(row["metadata"])["otel"]["subagents"]
    assert sub["agent"] == "helper" and [m["content"] for m in sub["messages"]] == ["Find trains.", "9:05."]


def test_openinference_spans_import_the_same_way(tmp_path):
    """Spans as OpenInference instrumentations write them (Phoenix, Arize): flattened message attributes."""
    t, exporter = tracer()
    msg, tc = MessageAttributes, ToolCallAttributes
    inp, out = SpanAttributes.LLM_INPUT_MESSAGES, SpanAttributes.LLM_OUTPUT_MESSAGES
    kind = SpanAttributes.OPENINFERENCE_SPAN_KIND
    with t.start_as_current_span("agent", attributes={kind: OpenInferenceSpanKindValues.AGENT.value,
                                                      SpanAttributes.INPUT_VALUE: "Weather in Paris?"}):
        with t.start_as_current_span("ChatCompletion", attributes={
                kind: OpenInferenceSpanKindValues.LLM.value, SpanAttributes.LLM_MODEL_NAME: "gpt-oi",
                f"{inp}.0.{msg.MESSAGE_ROLE}": "system", f"{inp}.0.{msg.MESSAGE_CONTENT}": "Use tools.",
                f"{inp}.1.{msg.MESSAGE_ROLE}": "user", f"{inp}.1.{msg.MESSAGE_CONTENT}": "Weather in Paris?",
                f"{out}.0.{msg.MESSAGE_ROLE}": "assistant",
                f"{out}.0.{msg.MESSAGE_TOOL_CALLS}.0.{tc.TOOL_CALL_ID}": "c9",
                f"{out}.0.{msg.MESSAGE_TOOL_CALLS}.0.{tc.TOOL_CALL_FUNCTION_NAME}": "weather",
                f"{out}.0.{msg.MESSAGE_TOOL_CALLS}.0.{tc.TOOL_CALL_FUNCTION_ARGUMENTS_JSON}": '{"city": "Paris"}',
                SpanAttributes.LLM_TOKEN_COUNT_PROMPT: 20, SpanAttributes.LLM_TOKEN_COUNT_COMPLETION: 7,
                f"{SpanAttributes.LLM_TOOLS}.0.tool.json_schema": json.dumps(
                    {"type": "function", "function": {"name": "weather", "parameters": {}}})}):
            pass
        with t.start_as_current_span("weather", attributes={
                kind: OpenInferenceSpanKindValues.TOOL.value, SpanAttributes.TOOL_NAME: "weather",
                SpanAttributes.TOOL_ID: "c9", SpanAttributes.INPUT_VALUE: '{"city": "Paris"}',
                SpanAttributes.OUTPUT_VALUE: "18 C, clear"}):
            pass
        with t.start_as_current_span("ChatCompletion", attributes={
                kind: OpenInferenceSpanKindValues.LLM.value, SpanAttributes.LLM_MODEL_NAME: "gpt-oi",
                f"{inp}.0.{msg.MESSAGE_ROLE}": "system", f"{inp}.0.{msg.MESSAGE_CONTENT}": "Use tools.",
                f"{inp}.1.{msg.MESSAGE_ROLE}": "user", f"{inp}.1.{msg.MESSAGE_CONTENT}": "Weather in Paris?",
                f"{inp}.2.{msg.MESSAGE_ROLE}": "assistant",
                f"{inp}.2.{msg.MESSAGE_TOOL_CALLS}.0.{tc.TOOL_CALL_ID}": "c9",
                f"{inp}.2.{msg.MESSAGE_TOOL_CALLS}.0.{tc.TOOL_CALL_FUNCTION_NAME}": "weather",
                f"{inp}.2.{msg.MESSAGE_TOOL_CALLS}.0.{tc.TOOL_CALL_FUNCTION_ARGUMENTS_JSON}": '{"city": "Paris"}',
                f"{inp}.3.{msg.MESSAGE_ROLE}": "tool", f"{inp}.3.{msg.MESSAGE_TOOL_CALL_ID}": "c9",
                f"{inp}.3.{msg.MESSAGE_CONTENT}": "18 C, clear",
                f"{out}.0.{msg.MESSAGE_ROLE}": "assistant",
                f"{out}.0.{msg.MESSAGE_CONTENTS}.0.message_content.type": "reasoning",
                f"{out}.0.{msg.MESSAGE_CONTENTS}.0.message_content.text": "it is sunny",
                f"{out}.0.{msg.MESSAGE_CONTENTS}.1.message_content.type": "text",
                f"{out}.0.{msg.MESSAGE_CONTENTS}.1.message_content.text": "Clear, 18 C.",
                SpanAttributes.LLM_TOKEN_COUNT_PROMPT: 40, SpanAttributes.LLM_TOKEN_COUNT_COMPLETION: 5}):
            pass
    path = tmp_path / "phoenix.jsonl"
    path.write_text(json.dumps(collector_json(otlp_request(exporter.get_finished_spans()))) + "\n")
    (row,) = load_trajectories(path)
    assert [(m["role"], m["content"]) for m in row["messages"]] == [
        ("system", "Use tools."), ("user", "Weather in Paris?"), ("assistant", None), ("tool", "18 C, clear"),
        ("assistant", "Clear, 18 C.")]
    assert row["messages"][2]["tool_calls"][0] == {"id": "c9", "name": "weather", "arguments": '{"city": "Paris"}'}
    assert row["messages"][3]["tool_call_id"] == "c9" and row["messages"][4]["reasoning"] == "it is sunny"
    assert [(t["prompt_tokens"], t["completion_tokens"]) for t in row["turns"]] == [(20, 7), (40, 5)]
    assert row["model"] == "gpt-oi" and json.loads(row["tools"])[0]["function"]["name"] == "weather"


def test_omrl_to_otel_to_omrl_keeps_token_ids_and_logprobs_exactly(tmp_path):
    row = rl_row()
    store = Store.create(tmp_path / "s")
    store.append([row, *hand_made_rows()])
    out = tmp_path / "spans.jsonl"
    result = CliRunner().invoke(cli, ["export", str(store.path), "--out", str(out), "--format", "otel"])
    assert result.exit_code == 0, result.output
    again = Store.create(tmp_path / "again")
    again.append(load_trajectories(out))
    before = {r["task_id"]: r for r in store.read().to_pylist()}
    after = {r["task_id"]: r for r in again.read().to_pylist()}
    assert set(after) == set(before)
    for task, original in before.items():
        back = after[task]
        assert [{**t, "info": json.loads(t["info"])} for t in back["turns"]] == [
            {**t, "info": json.loads(t["info"])} for t in original["turns"]], task
        for key in ("model", "instruction", "tools", "reward", "success", "status", "error", "prompt_tokens",
                    "completion_tokens"):
            assert back[key] == original[key], (task, key)
        # Messages: all but the training flags of non-assistant messages (no place for them in GenAI messages).
        assert back["messages"] == [m if m["role"] == "assistant" else {**m, "trainable": None}
                                    for m in original["messages"]], task
    line = json.loads(out.read_text().splitlines()[0])
    spans = line["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert [s["name"] for s in spans] == ["invoke_agent omrl", "chat m", "execute_tool add", "execute_tool echo",
                                          "execute_tool get", "chat m"]


# ---------------------------------------------------------------- hostile traces


TRACE = "ab" * 16


def _span(i: int, parent: int | None, attrs: dict, start: str | None = None) -> dict:
    """An OTLP JSON span with hex ids (span i has id i + 1) and string attributes."""
    span = {"traceId": TRACE, "spanId": f"{i + 1:016x}", "name": f"s{i}", "startTimeUnixNano": start or str(10 + i),
            "endTimeUnixNano": str(11 + i), "attributes": [{"key": k, "value": {"stringValue": v}}
                                                          for k, v in attrs.items()]}
    if parent is not None:
        span["parentSpanId"] = f"{parent + 1:016x}"
    return span


def _trace_file(path, spans: list[dict]):
    path.write_text(json.dumps({"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": spans}]}]}))
    return path


AGENT = {"gen_ai.operation.name": "invoke_agent", "gen_ai.input.messages": json.dumps([genai("user", {
    "type": "text", "content": "hi"})])}


def _hostile(shape: str, n: int) -> list[dict]:
    """An agent span and n - 1 more: a chain each the child of the one before (the last a model call), or
    n - 1 model calls each with a new input message, or n - 1 tool results, all children of the agent."""
    spans = [_span(0, None, AGENT, start="1")]
    for i in range(1, n):
        if shape == "chain":
            spans.append(_span(i, i - 1, {}))
        elif shape == "chats":
            spans.append(_span(i, 0, {"gen_ai.operation.name": "chat", "gen_ai.input.messages": json.dumps(
                [genai("user", {"type": "text", "content": f"u{i}"})]), "gen_ai.output.messages": json.dumps(
                [genai("assistant", {"type": "text", "content": f"a{i}"})])}))
        else:
            spans.append(_span(i, 0, {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.call.id": f"c{i}",
                                      "gen_ai.tool.call.result": "r"}))
    if shape == "chain":  # the only message content, at the bottom of the chain
        spans[-1]["attributes"] += [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}}]
    return spans


@pytest.mark.parametrize("shape", ["chain", "chats", "tools"])
def test_20000_span_traces_import_in_one_pass(tmp_path, shape):
    """A 20,000-span parent chain (each span's agent was looked up by walking to the top: 214 s), 20,000 model
    calls and 20,000 tool results (each compared with the whole conversation so far) import in linear time."""
    from test_import_new_formats import import_in_child

    [row] = import_in_child(_trace_file(tmp_path / f"{shape}.json", _hostile(shape, 20_000)))
    expected = {"chain": 2, "chats": 1 + 2 * 19_999, "tools": 1 + 19_999}[shape]
    assert len(row) == expected and row[0] == ["user", []]


def test_a_trace_past_the_span_limit_is_refused_naming_file_and_record(tmp_path, monkeypatch):
    from omrl.formats import otel_spans

    monkeypatch.setattr(otel_spans, "MAX_TRACE_SPANS", 10)
    path = tmp_path / "wide.jsonl"
    path.write_text("".join(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}) + "\n"
                            for span in _hostile("tools", 11)))
    with pytest.raises(FormatError, match=rf"wide\.jsonl record 10: trace {TRACE} has more than 10 spans"):
        load_trajectories(path)
    ten = tmp_path / "ten.jsonl"
    ten.write_text("".join(path.read_text().splitlines(keepends=True)[:10]))
    assert len(load_trajectories(ten)) == 1  # at the limit: imported


@pytest.mark.parametrize("field, value, message", [
    ("startTimeUnixNano", "9" * 400, r"startTimeUnixNano: '9{20}'\.\.\. \(400 characters\) is too long"),
    ("startTimeUnixNano", str(2**64), r"startTimeUnixNano: 18446744073709551616 is out of range for a span time"),
    ("startTimeUnixNano", 10**400, r"startTimeUnixNano: 10{19}\.\.\. \(401 digits\) is out of range"),
    ("endTimeUnixNano", "-5", r"endTimeUnixNano: -5 is out of range for a span time"),
    ("intValue", "9" * 400, r"attribute 'n': '9{20}'\.\.\. \(400 characters\) is too long for an integer"),
    ("intValue", str(2**63), r"attribute 'n': 9223372036854775808 is out of range for an int64"),
    ("doubleValue", "abc", r"attribute 'n': not a number \('abc'\)"),
], ids=["400-digit time", "time past 2**64", "400-digit JSON number", "negative time", "400-digit int",
        "int past int64", "double not a number"])
def test_out_of_range_numbers_are_one_located_line(tmp_path, field, value, message):
    """A 400-digit time overflowed far from its span (a traceback); numbers OTLP cannot hold are refused where read."""
    span = _span(0, None, AGENT, start="1")
    if field.endswith("UnixNano"):
        span[field] = value
    else:
        span["attributes"].append({"key": "n", "value": {field: value}})
    path = _trace_file(tmp_path / "t.json", [span])
    with pytest.raises(FormatError, match=r"t\.json record 0 resourceSpans\[0\] scopeSpans\[0\] spans\[0\] " + message):
        load_trajectories(path)
    result = CliRunner().invoke(cli, ["import", str(path), "--store", str(tmp_path / "s")])
    assert result.exit_code == 1 and "Traceback" not in result.output and "t.json record 0" in result.output
    assert not (tmp_path / "s").exists()


def test_an_sdk_span_time_past_2554_is_one_located_line(tmp_path):
    """The SDK's ISO times reach the year 9999, and a negative offset beyond: refused where read, not overflowed later."""
    span = {"name": "agent", "context": {"trace_id": "0x" + TRACE, "span_id": "0x" + "11" * 8}, "parent_id": None,
            "start_time": "9999-12-31T23:59:59.123456789-23:59", "end_time": "9999-12-31T23:59:59-23:59",
            "attributes": dict(AGENT)}
    path = tmp_path / "sdk.jsonl"
    path.write_text(json.dumps(span) + "\n")
    with pytest.raises(FormatError, match=r"sdk\.jsonl record 0 start_time: \d+ is out of range for a span time"):
        load_trajectories(path)
