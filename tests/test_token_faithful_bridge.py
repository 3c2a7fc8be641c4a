"""The token-faithful bridge: a turn whose sampled ids are a non-canonical tokenisation of its text is trained on
those ids, not on their re-tokenisation; the prompt is the conversation as the model saw it (tools sent as text
included), which the agent loop records and `store check --tokens` checks against."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from omrl.envs.grid import GridEnv, grid_tasks  # noqa: E402
from omrl.policies.openai_policy import OpenAIPolicy  # noqa: E402
from omrl.policies.parsing import text_tool_messages  # noqa: E402
from omrl.policies.tokens_check import check_tokens, seen_messages  # noqa: E402
from omrl.rollout.agent import run_episode  # noqa: E402
from omrl.schema import Message, ToolCall, Trajectory, Turn  # noqa: E402
from omrl.schema.messages import to_chat_template, to_openai  # noqa: E402
from omrl.testing.openai_server import FakeOpenAIServer  # noqa: E402
from omrl.train.data.bridge import chat_dataset, sft_examples  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "move", "description": "Move one step.", "parameters": {
    "type": "object", "properties": {"direction": {"type": "string"}}, "required": ["direction"]}}}]
SMOLLM2 = Path.home() / ".cache/omrl/models/smollm2-135m-instruct"
# SmolLM2-135M-Instruct's chat template, verbatim: ChatML that ignores `tools` and `tool_calls`.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from omrl.models.tiny import cached_tiny_model

    return AutoTokenizer.from_pretrained(cached_tiny_model())


@pytest.fixture(scope="module")
def smol_template(tokenizer):
    """The tiny tokenizer with SmolLM2's template: a model served without tool support, offline."""
    import copy

    other = copy.deepcopy(tokenizer)
    other.chat_template = SMOLLM2_TEMPLATE
    return other


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def byte_ids(tokenizer, text: str) -> list[int]:
    """A valid but non-canonical tokenisation of `text`: one token per character (ASCII, byte-level BPE)."""
    ids = [i for char in text for i in encode(tokenizer, char)]
    assert tokenizer.decode(ids) == text and ids != encode(tokenizer, text)
    return ids


def text_row(tokenizer, first: list[int] | None, second: list[int] | None, *, finish: str = "stop",
             trainable_second: bool | None = None) -> dict:
    """A two-turn text episode (no tools) whose turns carry `first` / `second` as their sampled ids."""
    messages = [Message("system", "Reach the goal."), Message("user", "at 3 7 goal 3 3"),
                Message("assistant", "left"), Message("user", "moved left"),
                Message("assistant", "goal", trainable=trainable_second)]
    turns = [Turn(0, info=json.dumps({"finish_reason": finish}), completion_ids=first or []),
             Turn(1, done=True, info=json.dumps({"finish_reason": "stop"}), completion_ids=second or [])]
    return Trajectory(id="t", task_id="t", messages=messages, turns=turns, reward=1.0, success=True).to_row()


def trained(example: dict) -> list[int]:
    return [i for i, m in zip(example["input_ids"], example["assistant_masks"], strict=True) if m]


def contains(ids: list[int], run: list[int]) -> bool:
    return any(ids[i:i + len(run)] == run for i in range(len(ids) - len(run) + 1))


def prompt_ids(tokenizer, chat_messages: list[dict], tools=None) -> list[int]:
    """What a server tokenises for the next reply: the template's text with the generation prompt."""
    text = tokenizer.apply_chat_template(chat_messages, tools=tools, tokenize=False, add_generation_prompt=True)
    return encode(tokenizer, text)


# ------------------------------------------------------------------------------ sampled ids are trained


def test_a_drifting_turn_is_trained_from_its_stored_ids(tokenizer):
    eos = tokenizer.eos_token_id
    sampled = byte_ids(tokenizer, "left") + [eos]  # what the model sampled: "l" "e" "f" "t"
    canonical = encode(tokenizer, "left") + [eos]  # what re-tokenising its text gives
    row = text_row(tokenizer, sampled, encode(tokenizer, "goal") + [eos])
    drift = check_tokens([row], "tiny", tokenizer)
    assert [(d.turn, d.kind, d.position) for d in drift.drifts] == [(0, "completion", 0)]  # the turn drifts

    examples, report = sft_examples([row], tokenizer, max_length=None)
    assert [e["id"] for e in examples] == ["t#turn0", "t#turn1"]
    first = examples[0]
    assert trained(first) == sampled and trained(first) != canonical
    chat = to_chat_template(row["messages"])
    head = prompt_ids(tokenizer, chat[:2])
    assert first["input_ids"] == head + sampled and first["assistant_masks"] == [0] * len(head) + [1] * len(sampled)
    second = examples[1]
    assert second["input_ids"][:-len(trained(second))] == prompt_ids(tokenizer, chat[:4])  # later prompt: rendered
    assert (report.token_source, report.turns_from_stored_ids, report.turns_rendered,
            report.drifting_turns_trained_from_render, report.examples) == ("auto", 2, 0, 0, 2)
    assert report.trained_tokens == len(sampled) + len(trained(second)) and report.mask_source == {"turn": 2}
    assert "2 from stored ids, 0 rendered (0 drifting)" in report.summary()
    stored, stored_report = sft_examples([row], tokenizer, max_length=None, token_source="stored")
    assert stored == examples and stored_report.turns_from_stored_ids == 2

    rendered, report = sft_examples([row], tokenizer, max_length=None, token_source="render")
    assert len(rendered) == 1 and "left<|im_end|>" in tokenizer.decode(trained(rendered[0]))
    assert not contains(trained(rendered[0]), sampled[:-1])  # rendering trains the re-tokenisation, not the sample
    assert (report.turns_from_stored_ids, report.turns_rendered, report.drifting_turns_trained_from_render) == (0, 2, 1)


def test_the_end_token_follows_how_the_reply_ended(tokenizer):
    """A reply cut at max_tokens never wrote the end-of-turn token; one that stopped did, even if the server's ids
    leave it out."""
    eos = tokenizer.eos_token_id
    ids = byte_ids(tokenizer, "left")
    cut, _ = sft_examples([text_row(tokenizer, ids, [5, eos], finish="length")], tokenizer, max_length=None)
    stopped, _ = sft_examples([text_row(tokenizer, ids, [5, eos], finish="stop")], tokenizer, max_length=None)
    assert trained(cut[0]) == ids and trained(stopped[0]) == ids + [eos]
    row = text_row(tokenizer, ids, [5, eos], finish="length")
    assert check_tokens([row], "tiny", tokenizer).drifts[0].position == 0  # the check reads ids the same way


def test_turns_without_ids_are_rendered_alone_and_stored_mode_requires_ids(tokenizer):
    eos = tokenizer.eos_token_id
    sampled = byte_ids(tokenizer, "left") + [eos]
    partial = text_row(tokenizer, sampled, None)
    examples, report = sft_examples([partial], tokenizer, max_length=None)
    assert [trained(e) for e in examples] == [sampled, encode(tokenizer, "goal<|im_end|>")]
    assert (report.turns_from_stored_ids, report.turns_rendered, report.drifting_turns_trained_from_render) == (1, 1, 0)

    nothing, report = sft_examples([partial], tokenizer, max_length=None, token_source="stored")
    assert nothing == [] and report.dropped == {"missing completion ids": 1}
    # An untrainable turn needs no ids: the row trains its one trainable turn from what was sampled.
    untrained = text_row(tokenizer, sampled, None, trainable_second=False)
    examples, report = sft_examples([untrained], tokenizer, max_length=None, token_source="stored")
    assert [trained(e) for e in examples] == [sampled] and report.turns_from_stored_ids == 1

    without_ids = text_row(tokenizer, None, None)  # auto renders it whole, as before
    examples, report = sft_examples([without_ids], tokenizer, max_length=None)
    assert [e["id"] for e in examples] == ["t"] and (report.turns_from_stored_ids, report.turns_rendered) == (0, 2)
    with pytest.raises(ValueError, match="token_source must be one of"):
        sft_examples([without_ids], tokenizer, token_source="sampled")


def test_a_turn_longer_than_max_length_is_dropped_or_drops_the_row(tokenizer):
    eos = tokenizer.eos_token_id
    row = text_row(tokenizer, byte_ids(tokenizer, "left") + [eos], encode(tokenizer, "goal") + [eos])
    full, _ = sft_examples([row], tokenizer, max_length=None)
    limit = len(full[0]["input_ids"])  # the first turn fits, the second (longer prompt) does not
    assert len(full[1]["input_ids"]) > limit
    split, report = sft_examples([row], tokenizer, max_length=limit)
    assert [e["id"] for e in split] == ["t#turn0"] and report.dropped_turns == 1
    dropped, report = sft_examples([row], tokenizer, max_length=limit, overflow="drop")
    assert dropped == [] and report.dropped == {"too long": 1}


# ------------------------------------------------------------------------------ tools sent as text


def text_tools_row(tokenizer, *, recorded: bool = True) -> tuple[dict, list[dict]]:
    """A tool-using episode of a model served without tool support, its ids the canonical tokenisation of what it
    was sent and wrote (text_tool_messages, rendered by SmolLM2's template); and that seen conversation."""
    call = ToolCall("move", '{"direction": "up"}', "c0")
    messages = [Message("system", "Reach the goal."), Message("user", "at 3 7 goal 3 3"),
                Message("assistant", None, tool_calls=[call]), Message("tool", "moved up", tool_call_id="c0"),
                Message("assistant", "done")]
    meta = json.dumps({"prompt_format": "text_tools"} if recorded else {})
    row = Trajectory(id="tt", task_id="tt", messages=messages, tools=json.dumps(TOOLS), metadata=meta,
                     turns=[Turn(0), Turn(1, done=True)]).to_row()
    seen = to_chat_template(text_tool_messages(row["messages"], TOOLS))
    for turn, at in zip(row["turns"], (2, 4), strict=True):
        prompt = tokenizer.apply_chat_template(seen[:at], tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(seen[:at + 1], tokenize=False)
        reply = full[len(prompt):full.index("<|im_end|>", len(prompt)) + len("<|im_end|>")]
        turn["completion_ids"], turn["prompt_tokens"] = encode(tokenizer, reply), len(encode(tokenizer, prompt))
    return row, seen


def test_a_text_tools_row_is_checked_against_the_prompt_the_model_saw(smol_template):
    row, seen = text_tools_row(smol_template)
    assert "<tool_call>" in seen[2]["content"] and "<tools>" in seen[0]["content"]
    report = check_tokens([row], "smollm2-template", smol_template)
    assert report.turns == 2 and report.ok, [d.describe() for d in report.drifts]
    # Unrecorded, the same row is read as native: SmolLM2's template drops the tool call, a false drift.
    unrecorded, _ = text_tools_row(smol_template, recorded=False)
    report = check_tokens([unrecorded], "smollm2-template", smol_template)
    assert report.drifts and report.drifts[0].turn == 0


def test_a_text_tools_row_trains_its_sampled_call_after_the_text_prompt(smol_template):
    row, seen = text_tools_row(smol_template)
    examples, report = sft_examples([row], smol_template, max_length=None)
    assert [trained(e) for e in examples] == [t["completion_ids"] for t in row["turns"]]
    assert examples[1]["input_ids"][:-len(trained(examples[1]))] == prompt_ids(smol_template, seen[:4])
    text = smol_template.decode(examples[1]["input_ids"])
    assert "<tools>" in text and "<tool_response>\nmoved up\n</tool_response>" in text
    assert report.turns_from_stored_ids == 2 and report.drifting_turns_trained_from_render == 0
    rendered, report = sft_examples([row], smol_template, max_length=None, token_source="render")
    assert '"name": "move"' in smol_template.decode(trained(rendered[0]))  # rendered as seen: the call is there
    assert report.drifting_turns_trained_from_render == 0  # canonical ids: no drift
    (record,) = chat_dataset([row]).to_list()  # TRL's conversational format: the same seen conversation
    assert record["tools"] == "[]" and record["messages"][2]["content"] == seen[2]["content"]


def test_the_sft_recipe_takes_a_token_source():
    from omrl.config import RecipeError, load_recipe
    from omrl.train.config.sft import SFTRecipe

    keys = {"model": "m", "store": "s", "output_dir": "o"}
    assert SFTRecipe(**keys).token_source == "auto"
    assert load_recipe(keys, SFTRecipe, ["token_source=stored"]).token_source == "stored"
    with pytest.raises(RecipeError, match="token_source must be one of auto, stored, render, not 'sampled'"):
        load_recipe(keys, SFTRecipe, ["token_source=sampled"])
    with pytest.raises(ValueError, match="needs batching: bridge"):
        SFTRecipe(**keys, token_source="stored", batching="trl")


@pytest.mark.skipif(not SMOLLM2.exists(), reason="the SmolLM2 folder is not in the model cache")
def test_smollm2_tokenizer_text_tools_row_checks_clean_and_trains_stored_ids():
    from transformers import AutoTokenizer

    smol = AutoTokenizer.from_pretrained(SMOLLM2)
    row, _ = text_tools_row(smol)
    assert check_tokens([row], str(SMOLLM2), smol).ok
    eos = smol.eos_token_id
    sampled = byte_ids(smol, "left") + [eos]
    examples, report = sft_examples([text_row(smol, sampled, None)], smol, max_length=None)
    assert trained(examples[0]) == sampled and report.turns_from_stored_ids == 1


# ------------------------------------------------------------------------------ the record


def test_the_agent_records_text_tools_and_seen_messages_rebuild_what_was_sent():
    """tool_format auto against a server that refuses tools: the episode records prompt_format text_tools, and
    the stored row, passed through seen_messages, gives back exactly the messages the server received."""
    refuse = {"status": 400, "message": '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser'}
    call = '<tool_call>\n{"name": "move", "arguments": {"direction": "up"}}\n</tool_call>'
    with FakeOpenAIServer() as server:
        server.enqueue(refuse, {"content": call}, {"content": call})
        policy = OpenAIPolicy("m", base_url=server.base_url, api_key="k", retries=0, tokens="off",
                              context_length=100_000)
        with pytest.warns(UserWarning, match="does not take tools"):
            episode = asyncio.run(run_episode(GridEnv(action_format="tool"), grid_tasks(1, seed=0)[0], policy, run_id="r", max_turns=2))
        sent = server.requests[-1]["messages"]
    row = episode.row
    assert json.loads(row["metadata"])["prompt_format"] == "text_tools" and len(server.requests) == 3
    assert to_openai(seen_messages(row))[:len(sent)] == sent
    assert '"name": "move"' in sent[2]["content"]  # the earlier call, named as the model wrote it
    native = OpenAIPolicy("m", base_url="http://127.0.0.1:9/v1", tool_format="native")
    assert native.prompt_format == "native" and OpenAIPolicy("m", tool_format="text").prompt_format == "text_tools"


def test_the_real_model_benchmark_counts_drifting_turns_trained_from_anything_but_what_the_server_saw(tokenizer):
    """benchmarks/real_model.py's token_drift_trained_turns: 0 for a drifting turn trained from its stored ids;
    1 when the trained prompt is not as long as the one the server counted."""
    import importlib.util

    from omrl.models.tiny import cached_tiny_model

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "real_model.py"
    spec = importlib.util.spec_from_file_location("real_model_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    eos = tokenizer.eos_token_id
    row = text_row(tokenizer, byte_ids(tokenizer, "left") + [eos], encode(tokenizer, "goal") + [eos])
    drifts = check_tokens([row], "tiny", tokenizer).drifts
    assert len(drifts) == 1
    assert bench.drift_trained_otherwise([row], drifts, cached_tiny_model()) == 0
    row["turns"][0]["prompt_tokens"] = 3  # the server saw another prompt than the one the bridge trains
    assert bench.drift_trained_otherwise([row], drifts, cached_tiny_model()) == 1
