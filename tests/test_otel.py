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
