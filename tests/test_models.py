"""The tiny offline model: builds, reloads with Auto*, keeps token ids, renders tools and masks."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("trl")

from click.testing import CliRunner  # noqa: E402

from omrl.models.tiny import build_tiny_model, cached_tiny_model, train_tokenizer  # noqa: E402

MESSAGES = [
    {"role": "system", "content": "Reach the goal."},
    {"role": "user", "content": "at 3 7 goal 3 3"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "move", "arguments": {"direction": "up"}}}]},
    {"role": "tool", "content": "at 3 6 goal 3 3"},
    {"role": "assistant", "content": "done"},
]
TOOLS = [{"type": "function", "function": {"name": "move", "description": "Move one step.", "parameters": {
    "type": "object", "properties": {"direction": {"type": "string"}}, "required": ["direction"]}}}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", hidden=64, layers=2, seed=1)


def test_loads_back_offline_and_runs(tiny):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny)
    tok = AutoTokenizer.from_pretrained(tiny)
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 64
    assert model.config.vocab_size == len(tok)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    ids = tok("at 3 7 goal 3 3", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tok)) and torch.isfinite(logits).all()


def test_token_ids_round_trip_through_save_and_load(tiny):
    from transformers import AutoTokenizer

    fresh = train_tokenizer()
    loaded = AutoTokenizer.from_pretrained(tiny)
    text = 'at 3 7 goal 42 99. Café ünï <tool_call>\n{"name": "move", "arguments": {"direction": "up"}}\n</tool_call>'
    assert fresh(text)["input_ids"] == loaded(text)["input_ids"]
    assert loaded.decode(loaded(text)["input_ids"]) == text
    # numbers 10-99 are single tokens; chat/tool markers are single tokens
    for piece in ("42", "<tool_call>", "</tool_response>", "<|im_start|>"):
        assert len(loaded(piece, add_special_tokens=False)["input_ids"]) == 1, piece
    # tool markers survive skip_special_tokens (tool calls are parsed from decoded text)
    ids = loaded("<tool_call>x</tool_call><|im_end|>")["input_ids"]
    assert loaded.decode(ids, skip_special_tokens=True) == "<tool_call>x</tool_call>"


def test_chat_template_renders_tools_and_tool_calls(tiny):
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    tok = AutoTokenizer.from_pretrained(tiny)
    assert tok.chat_template == qwen2_5_chat_template
    text = tok.apply_chat_template(MESSAGES, tools=TOOLS, tokenize=False)
    assert "<tools>\n" + json.dumps(TOOLS[0]) in text
    assert '<tool_call>\n{"name": "move", "arguments": {"direction": "up"}}\n</tool_call><|im_end|>' in text
    assert "<|im_start|>user\n<tool_response>\nat 3 6 goal 3 3\n</tool_response><|im_end|>" in text


def test_assistant_tokens_mask_with_trl_training_template(tiny):
    from transformers import AutoTokenizer
    from trl.chat_template_utils import get_training_chat_template

    tok = AutoTokenizer.from_pretrained(tiny)
    out = tok.apply_chat_template(MESSAGES, tools=TOOLS, chat_template=get_training_chat_template(tok),
                                  return_dict=True, return_assistant_tokens_mask=True)
    ids, mask = out["input_ids"], out["assistant_masks"]
    assert len(ids) == len(mask) and 0 < sum(mask) < len(mask)
    trained = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert '"direction": "up"' in trained and "done" in trained
    assert "at 3 6" not in trained and "Reach the goal" not in trained


def test_cli_builds_a_model(tmp_path):
    from omrl.cli.main import cli

    result = CliRunner().invoke(cli, ["models", "tiny", "--out", str(tmp_path / "m"), "--hidden", "32"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "m" / "config.json").exists() and (tmp_path / "m" / "tokenizer.json").exists()


def test_cached_model_is_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("OMRL_CACHE", str(tmp_path))
    first = cached_tiny_model(hidden=32)
    stamp = (first / "config.json").stat().st_mtime_ns
    assert cached_tiny_model(hidden=32) == first
    assert (first / "config.json").stat().st_mtime_ns == stamp
