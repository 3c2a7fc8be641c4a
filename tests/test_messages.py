"""omrl.schema.messages: the one converter; the policy and the bridge tokenise a tool-calling conversation identically."""

from __future__ import annotations

import asyncio
import json

import pytest

from omrl.schema import normalize_trajectory
from omrl.schema.messages import arguments_text, arguments_value, to_chat_template, to_openai, tool_call_parts

TOOLS = [{"type": "function", "function": {"name": "move", "description": "Move one step.", "parameters": {
    "type": "object", "properties": {"direction": {"type": "string"}}, "required": ["direction"]}}},
    {"type": "function", "function": {"name": "guess", "parameters": {
        "type": "object", "properties": {"number": {"type": "integer"}}}}}]


def live_conversation() -> list[dict]:
    """A conversation as the agent loop holds it while playing: calls nested under `function`, JSON text."""
    def call(cid, name, args):
        return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}

    return [{"role": "system", "content": "Reach the goal."},
            {"role": "user", "content": "at 3 7 goal 3 3"},
            {"role": "assistant", "content": None, "tool_calls": [call("c0", "move", {"direction": "up"})]},
            {"role": "tool", "tool_call_id": "c0", "name": "move", "content": "at 3 6 goal 3 3"},
            {"role": "assistant", "content": "two calls", "tool_calls": [
                call("c1", "move", {"direction": "up"}), call("c2", "guess", {"number": 42})]},
            {"role": "tool", "tool_call_id": "c1", "name": "move", "content": "at 3 5 goal 3 3"},
            {"role": "tool", "tool_call_id": "c2", "name": "guess", "content": "too low"},
            {"role": "assistant", "content": "done"}]


def stored_row(messages: list[dict]) -> dict:
    """The row the agent loop stores for that conversation (flat calls, arguments as JSON text)."""
    return normalize_trajectory({"id": "t0", "task_id": "t0", "messages": messages, "tools": TOOLS,
                                 "reward": 1.0, "success": True, "status": "ok"})


# ---------------------------------------------------------------- the converter


def test_live_and_stored_shapes_convert_the_same():
    live = live_conversation()
    stored = stored_row(live)["messages"]
    assert stored[2]["tool_calls"] == [{"id": "c0", "name": "move", "arguments": '{"direction": "up"}'}]
    assert to_chat_template(live) == to_chat_template(stored)
    assert to_openai(live) == to_openai(stored)


def test_openai_target_has_json_text_and_the_chat_template_target_objects():
    stored = stored_row(live_conversation())["messages"]
    api = to_openai(stored)[4]["tool_calls"]
    assert api[1] == {"id": "c2", "type": "function", "function": {"name": "guess", "arguments": '{"number": 42}'}}
    chat = to_chat_template(stored)[4]["tool_calls"]
    assert chat[1] == {"id": "c2", "type": "function", "function": {"name": "guess", "arguments": {"number": 42}}}
    assert to_openai(stored)[2]["content"] is None and to_chat_template(stored)[2]["content"] == ""


def test_invalid_arguments_are_kept_as_written():
    assert arguments_value('{"x": ') == '{"x": ' and arguments_text('{"x": ') == '{"x": '
    assert arguments_value(None) == {} and arguments_text(None) == "{}" and arguments_text({"a": "é"}) == '{"a": "é"}'
    assert tool_call_parts({"name": "f", "arguments": "{}"}) == (None, "f", "{}")


def test_export_form_keeps_reasoning_and_weights():
    msgs = [{"role": "user", "content": "q", "trainable": None},
            {"role": "assistant", "content": "a", "reasoning": "r", "trainable": False, "tool_calls": []}]
    out = to_openai(msgs, export=True)
    assert out[1] == {"role": "assistant", "content": "a", "reasoning_content": "r", "weight": 0}
    assert to_openai(msgs)[1] == {"role": "assistant", "content": "a"}
    assert to_chat_template(msgs)[1]["reasoning_content"] == "r"


# ---------------------------------------------------------------- train/inference identity


@pytest.fixture(scope="module")
def tiny():
    pytest.importorskip("torch")
    pytest.importorskip("trl")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from omrl.models.tiny import cached_tiny_model

    path = cached_tiny_model()
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def policy_trace(model, tokenizer, live: list[dict], bridge_ids: list[int]) -> list[int]:
    """The token trace HFPolicy builds while playing `live`, its model "sampling" each assistant turn's tokens.

    The generation is replaced by handing back the next assistant turn as the bridge tokenises it (up to its
    end-of-turn token): everything else, the first prompt and the environment deltas between turns, is
    HFPolicy's own prompt building."""
    from omrl.envs.base import Task
    from omrl.policies.base import EpisodeContext
    from omrl.policies.hf import HFPolicy, token_trace

    policy = HFPolicy(model, tokenizer, max_new_tokens=64)

    def generate_batch(prompts):
        (ids, _, _, _), = prompts
        assert ids == bridge_ids[: len(ids)], "the policy's prompt differs from the bridge's tokens"
        end = bridge_ids.index(tokenizer.eos_token_id, len(ids)) + 1
        sampled = bridge_ids[len(ids):end]
        return [(sampled, [0.0] * len(sampled), True)]

    policy.generate_batch = generate_batch
    context = EpisodeContext(env=None, task=Task(id="t0", instruction="i"), episode_id="t0", temperature=0.0)
    replies = []
    for upto in [i for i, m in enumerate(live) if m["role"] == "assistant"]:
        replies.append(asyncio.run(policy.act(live[:upto], TOOLS, context)))
    # What the model "wrote" parses back into the calls of the conversation.
    assert [[(c["name"], json.loads(c["arguments"])) for c in r.tool_calls] for r in replies] == [
        [(name, json.loads(args)) for _, name, args in map(tool_call_parts, m.get("tool_calls") or [])]
        for m in live if m["role"] == "assistant"]
    trace = token_trace(context)
    return trace["prompt_ids"] + trace["completion_ids"]


@pytest.mark.parametrize("mask_source", ["template", "incremental"])
def test_policy_and_bridge_give_identical_token_ids(tiny, mask_source):
    from omrl.train.data.bridge import sft_examples

    model, tokenizer = tiny
    live = live_conversation()
    (example,), _ = sft_examples([stored_row(live)], tokenizer, max_length=None, mask_source=mask_source)
    bridge_ids = example["input_ids"]
    text = tokenizer.decode(bridge_ids)
    assert '"arguments": {"number": 42}' in text and '"arguments": "' not in text  # objects, not quoted text

    trace = policy_trace(model, tokenizer, live, bridge_ids)
    assert trace == bridge_ids[: len(trace)]
    # The bridge only adds the template's newline after the last end-of-turn token.
    assert tokenizer.decode(bridge_ids[len(trace):]).strip() == ""
    # And the policy's rendering of the whole conversation is the bridge's example, token for token.
    from omrl.policies.hf import HFPolicy

    policy = HFPolicy(model, tokenizer)
    assert policy._encode(policy._render(live, TOOLS, False)) == bridge_ids
