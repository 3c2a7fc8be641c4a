"""The training bridge: store -> masked, split, length-grouped SFT examples on the tiny model's real template."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("trl")

from omrl.schema import Annotation, Message, ToolCall, Trajectory  # noqa: E402
from omrl.schema.messages import to_chat_template  # noqa: E402
from omrl.store import Store  # noqa: E402
from omrl.train.data.bridge import (  # noqa: E402
    BridgeReport,
    TokenBudgetBatchSampler,
    batches_padding_fraction,
    chat_dataset,
    default_token_budget,
    load_rows,
    rl_rewards,
    sft_dataset,
    sft_examples,
    token_budget_batches,
)
from omrl.train.data.masks import incremental_mask, is_trainable, template_mask  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "move", "description": "Move one step.", "parameters": {
    "type": "object", "properties": {"direction": {"type": "string"}}, "required": ["direction"]}}},
    {"type": "function", "function": {"name": "guess", "parameters": {
        "type": "object", "properties": {"number": {"type": "integer"}}}}}]


def trajectory(tid: str, steps: int, *, untrainable: tuple[int, ...] = (), reward: float = 1.0,
               group: str = "g", status: str = "ok", final: str = "done") -> Trajectory:
    """A grid-like episode: system, user, then `steps` tool-call turns with results, then a final answer."""
    messages = [Message("system", "Reach the goal."), Message("user", "at 3 7 goal 3 3")]
    for k in range(steps):
        messages.append(Message("assistant", "", tool_calls=[ToolCall("move", json.dumps({"direction": "up"}),
                                                                      id=f"c{k}")],
                                trainable=False if k in untrainable else None))
        messages.append(Message("tool", f"at 3 {6 - k} goal 3 3", tool_call_id=f"c{k}"))
    messages.append(Message("assistant", final))
    return Trajectory(id=tid, task_id=tid.split("-")[0], group_id=group, messages=messages, tools=json.dumps(TOOLS),
                      reward=reward, success=reward > 0, status=status)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from omrl.models.tiny import cached_tiny_model

    return AutoTokenizer.from_pretrained(cached_tiny_model())


def chat(traj: Trajectory):
    row = traj.to_row()
    return to_chat_template(row["messages"]), [is_trainable(m) for m in row["messages"]]


def test_template_and_incremental_masks_agree(tokenizer):
    for traj in (trajectory("a", 0), trajectory("b", 1), trajectory("c", 3)):
        messages, _ = chat(traj)
        for tools in (TOOLS, None):
            inc_ids, inc_mask = incremental_mask(tokenizer, messages, tools)
            tpl_ids, tpl_mask = template_mask(tokenizer, messages, tools)
            assert inc_ids == tpl_ids
            assert inc_mask == tpl_mask
            assert 0 < sum(inc_mask) < len(inc_mask)


def test_consecutive_tool_results_and_user_turns_mask_the_same(tokenizer):
    messages = [{"role": "user", "content": "go"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": "move", "arguments": {"direction": "up"}}},
                    {"type": "function", "function": {"name": "guess", "arguments": {"number": 42}}}]},
                {"role": "tool", "content": "moved"}, {"role": "tool", "content": "too low"},
                {"role": "user", "content": "continue"}, {"role": "assistant", "content": "ok"}]
    assert incremental_mask(tokenizer, messages, TOOLS) == template_mask(tokenizer, messages, TOOLS)


def test_only_trainable_assistant_tokens_carry_loss(tokenizer):
    traj = trajectory("a", 3, untrainable=(1,))
    row = traj.to_row()
    row["messages"][3]["trainable"] = True  # a tool result flagged trainable still never trains
    messages = to_chat_template(row["messages"])
    trainable = [is_trainable(m) for m in row["messages"]]
    assert trainable == [False, False, True, False, False, False, True, False, True]
    ids, mask = incremental_mask(tokenizer, messages, TOOLS, trainable)
    trained = tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert trained.count("<tool_call>") == 2  # turns 0 and 2, not the untrainable turn 1
    assert "done" in trained and trained.count("<|im_end|>") == 3
    for observation in ("at 3 6", "at 3 5", "Reach the goal", "at 3 7", "<tool_response>", "# Tools"):
        assert observation not in trained
    # The untrainable assistant turn's tokens, present in the input, carry no loss.
    full = tokenizer.decode(ids)
    assert full.count("<tool_call>") == 3 + 2  # three calls plus two mentions in the system prompt


def test_sft_examples_choose_template_or_incremental_masks(tokenizer):
    rows = [trajectory("a-0", 2).to_row(), trajectory("b-0", 2, untrainable=(0,)).to_row()]
    examples, report = sft_examples(rows, tokenizer, max_length=None)
    assert report.mask_source == {"template": 1, "incremental": 1}
    assert len(examples) == 2 and report.examples == 2
    assert sum(examples[0]["assistant_masks"]) > sum(examples[1]["assistant_masks"])
    assert report.trained_tokens == sum(sum(e["assistant_masks"]) for e in examples)
    with pytest.raises(ValueError, match="untrainable"):
        sft_examples(rows, tokenizer, max_length=None, mask_source="template")
    with pytest.raises(ValueError, match="mask_source must be one of"):  # a typo is not silently 'incremental'
        sft_examples(rows, tokenizer, max_length=None, mask_source="templates")


def test_long_trajectories_are_split_at_turn_boundaries_or_dropped(tokenizer):
    rows = [trajectory("long-0", 12).to_row(), trajectory("short-0", 1).to_row()]
    full, _ = sft_examples(rows, tokenizer, max_length=None)
    long_len = len(full[0]["input_ids"])
    short_len = len(full[1]["input_ids"])
    limit = (long_len + short_len) // 2
    assert short_len < limit < long_len

    split, report = sft_examples(rows, tokenizer, max_length=limit, overflow="split")
    assert report.split_trajectories == 1 and len(split) >= 3
    assert all(len(e["input_ids"]) <= limit for e in split)
    parts = [e for e in split if e["id"].startswith("long-0#")]
    assert len(parts) >= 2
    for part in parts:
        text = tokenizer.decode(part["input_ids"])
        # each part repeats the head and holds whole turns: it starts with the system prompt and ends a turn
        assert text.startswith("<|im_start|>system\nReach the goal.") and "at 3 7 goal 3 3" in text
        assert text.endswith("<|im_end|>\n")
    # every trained turn of the long trajectory is trained exactly once across its parts
    assert sum(tokenizer.decode([i for i, m in zip(p["input_ids"], p["assistant_masks"], strict=True) if m])
               .count("<tool_call>") for p in parts) == 12

    dropped, report = sft_examples(rows, tokenizer, max_length=limit, overflow="drop")
    assert [e["id"] for e in dropped] == ["short-0"] and report.dropped == {"too long": 1}

    nothing, report = sft_examples(rows, tokenizer, max_length=20, overflow="split")
    assert nothing == [] and report.dropped_turns == 13 + 2  # no turn fits next to the head


def test_token_budget_batches_keep_padding_small_and_cover_every_example():
    import random

    rng = random.Random(0)
    lengths = [max(20, round(rng.lognormvariate(5.5, 0.8))) for _ in range(400)]  # heavy-tailed
    budget = default_token_budget(lengths, 8)
    assert budget == round(8 * sum(lengths) / 400)
    batches = token_budget_batches(lengths, budget, seed=1)
    assert sorted(i for b in batches for i in b) == list(range(400))
    for batch in batches:
        widest = max(lengths[i] for i in batch)
        assert widest * len(batch) <= budget or len(batch) == 1  # an over-long example travels alone
    sizes = {len(b) for b in batches}
    assert max(sizes) > 8 > min(sizes)  # short examples go in big batches, long ones in small
    grouped = batches_padding_fraction(lengths, batches)
    shuffled = list(range(400))
    rng.shuffle(shuffled)
    naive = batches_padding_fraction(lengths, [shuffled[k:k + 8] for k in range(0, 400, 8)])
    assert grouped <= 0.1 < 0.3 < naive
    assert batches_padding_fraction([5, 3, 4], [[0, 1], [2]]) == pytest.approx(1 - 12 / 14)
    assert token_budget_batches([1000, 10, 10], 100) in ([[0], [1, 2]], [[1, 2], [0]])
    with pytest.raises(ValueError, match="budget"):
        token_budget_batches(lengths, 0)


def test_batch_sampler_reshuffles_per_epoch_with_a_fixed_length():
    lengths = [10 + (i % 7) * 13 for i in range(60)]
    sampler = TokenBudgetBatchSampler(lengths, 120, seed=3)
    first = list(sampler)
    assert len(first) == len(sampler) and list(sampler) == first  # deterministic within an epoch
    sampler.set_epoch(1)
    second = list(sampler)
    assert len(second) == len(sampler) and second != first
    assert sorted(i for b in second for i in b) == list(range(60))
    assert sampler.padding_fraction() == batches_padding_fraction(lengths, first)
    assert sampler.batch_size is None  # accelerate: variable batch sizes


def test_sft_dataset_from_store_with_where(tmp_path, tokenizer):
    store = Store.create(tmp_path / "s")
    store.append([trajectory(f"t{i}-0", i % 4, reward=float(i % 2)).to_row() for i in range(12)]
                 + [trajectory("bad-0", 1, status="env_error").to_row()])
    dataset, report = sft_dataset(store, tokenizer, where="reward > 0", max_length=4096)
    assert report.trajectories == 7 and report.dropped == {"status env_error": 1}  # the broken row matched too
    assert report.examples == 6 and len(dataset) == 6
    assert set(dataset.column_names) == {"id", "input_ids", "assistant_masks"}
    _, report = sft_dataset(store, tokenizer, max_length=4096)
    assert report.dropped == {"status env_error": 1} and report.examples == 12
    with pytest.raises(ValueError, match="no trainable examples"):
        sft_dataset(store, tokenizer, where="reward > 5")


def test_chat_dataset_is_trl_conversational_and_keeps_arguments(tokenizer):
    from trl.data_utils import is_conversational

    traj = trajectory("x-0", 1)
    other = trajectory("y-0", 0)
    other.messages.insert(2, Message("assistant", "", tool_calls=[ToolCall("guess", '{"number": 7}')]))
    other.messages.insert(3, Message("tool", "too low"))
    ds = chat_dataset([traj.to_row(), other.to_row()])
    assert is_conversational(ds[0])
    assert ds[0]["messages"][2]["tool_calls"][0]["function"]["arguments"] == {"direction": "up"}
    assert ds[1]["messages"][2]["tool_calls"][0]["function"]["arguments"] == {"number": 7}
    # What TRL's assistant_only_loss tokenises equals what the bridge produces.
    example = ds[1]
    ids, mask = template_mask(tokenizer, example["messages"], json.loads(example["tools"]))
    ours, _ = sft_examples([other.to_row()], tokenizer, max_length=None, mask_source="incremental")
    assert ours[0]["input_ids"] == ids and ours[0]["assistant_masks"] == mask


def test_rl_rewards_use_the_combined_reward_and_count_missing_components(tmp_path):
    store = Store.create(tmp_path / "s")
    store.append([trajectory(f"t{i}-0", 1, reward=float(i)).to_row() for i in range(3)])
    store.append([Annotation("t0-0", "judge", score=0.5).to_row(),
                  Annotation("t1-0", "judge", status="error", error="judge down").to_row()], table="annotations")
    rows = load_rows(store)
    env = rl_rewards(store, rows)
    assert env.values == [0.0, 1.0, 2.0] and env.source == "env" and env.n_missing == 0
    recipe = {"name": "combined", "components": {"env_reward": 1.0, "judge": 2.0}}
    combined = rl_rewards(store, rows, recipe)
    # t0: 0 + 2 * 0.5; t1's judge failed and t2 was never judged: null rewards, counted, not 0
    assert combined.values == [1.0, None, None] and combined.source == "combined"
    assert combined.n_missing == 2 and combined.missing == {"judge": 2}
    renorm = rl_rewards(store, rows, {**recipe, "missing": "renormalize"})
    assert renorm.values == [1.0, pytest.approx(3.0), pytest.approx(6.0)]  # env reward scaled by 3/1
    assert renorm.missing == {"judge": 2} and renorm.n_missing == 0


def test_report_summary_names_drops():
    report = BridgeReport(trajectories=3, examples=2)
    report.drop("too long")
    assert "too long: 1" in report.summary()
