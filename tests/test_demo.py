"""The learning demo's recipe handling and SFT batching (the full demo itself is `make demo`, minutes long)."""

from __future__ import annotations

import random

import pytest

from omrl.demo import DemoRecipe, _grouped_order, parse_overrides


def test_grouped_order_covers_every_example_once_per_epoch_in_similar_length_batches():
    rng = random.Random(0)
    lengths = [rng.randint(20, 400) for _ in range(250)]
    order = _grouped_order(lengths, batch_size=32, epochs=3, seed=0)
    assert len(order) == 750
    for epoch in range(3):
        assert sorted(order[epoch * 250:(epoch + 1) * 250]) == list(range(250))

    def padding(indices):
        batches = [indices[i: i + 32] for i in range(0, len(indices), 32)]
        return 1 - sum(lengths) / sum(max(lengths[i] for i in b) * len(b) for b in batches)

    shuffled = list(range(250))
    rng.shuffle(shuffled)
    assert padding(order[:250]) < 0.15 and padding(shuffled) > 0.3
    assert _grouped_order(lengths, 32, 3, seed=0) == order
    assert _grouped_order(lengths, 32, 3, seed=1) != order


def test_recipe_overrides_merge_grpo_settings_and_reject_unknown_keys(tmp_path):
    overrides = parse_overrides(["sft_epochs=3", "grpo.max_steps=7", "eval_samples=2"])
    recipe = DemoRecipe.load("recipes/quickstart.yaml", **overrides)
    assert recipe.sft_epochs == 3 and recipe.eval_samples == 2
    assert recipe.grpo["max_steps"] == 7 and recipe.grpo["learning_rate"] == 0.0002  # the rest kept
    with pytest.raises(ValueError, match="sft_epoch"):
        DemoRecipe.load("recipes/quickstart.yaml", sft_epoch=3)
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_overrides(["sft_epochs"])
