"""SFT through TRL on the tiny model: finite loss, parameters change, checkpoint reloads; LoRA and TRL batching."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("trl")

from tests.train_helpers import demo_store, mixed_length_store  # noqa: E402

pytestmark = pytest.mark.slow  # each test trains a tiny model


@pytest.fixture(scope="module")
def tiny():
    from omrl.models.tiny import cached_tiny_model

    return cached_tiny_model()


def _params(path):
    from transformers import AutoModelForCausalLM

    return {k: v.clone() for k, v in AutoModelForCausalLM.from_pretrained(path).state_dict().items()}


def test_one_sft_step_changes_parameters_with_finite_loss(tmp_path, tiny):
    from omrl.train.algorithms.sft import train_sft
    from omrl.train.config.sft import SFTRecipe

    store = demo_store(tmp_path / "s", untrainable=True)
    recipe = SFTRecipe(model=str(tiny), store=str(store.path), output_dir=str(tmp_path / "out"), batch_size=4,
                       max_steps=1, logging_steps=1, quiet=True, learning_rate=1e-3)
    result = train_sft(recipe)
    assert len(result.losses) == 1 and math.isfinite(result.losses[0]) and result.losses[0] > 0
    before, after = _params(tiny), _params(result.checkpoint)
    changed = [k for k in before if not before[k].equal(after[k])]
    assert changed and "model.embed_tokens.weight" in changed
    record = json.loads((result.checkpoint / "omrl_sft.json").read_text())
    assert record["bridge"]["examples"] == 8 and record["bridge"]["mask_source"] == {"incremental": 8}
    assert record["bridge"]["padding_fraction"] < 0.2
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(result.checkpoint).chat_template == AutoTokenizer.from_pretrained(
        tiny).chat_template


def test_sft_learns_the_demonstrations(tmp_path, tiny):
    from omrl.train.algorithms.sft import train_sft
    from omrl.train.config.sft import SFTRecipe

    store = demo_store(tmp_path / "s")
    result = train_sft(SFTRecipe(model=str(tiny), store=str(store.path), output_dir=str(tmp_path / "o"),
                                 batch_size=4, epochs=6, logging_steps=2, quiet=True, learning_rate=3e-3))
    assert result.losses[-1] < result.losses[0] - 1.0  # measured 6.46 -> 4.58


def test_token_budget_batches_are_what_the_model_is_fed(tmp_path, tiny):
    from omrl.train.algorithms.sft import train_sft
    from omrl.train.config.sft import SFTRecipe

    store = mixed_length_store(tmp_path / "s", n=24, max_turns=8)
    result = train_sft(SFTRecipe(model=str(tiny), store=str(store.path), output_dir=str(tmp_path / "o"),
                                 batch_size=4, epochs=2, logging_steps=1, quiet=True))
    report = result.details["bridge"]
    assert report["token_budget"] > 0 and report["batches_per_epoch"] >= 3
    # Every example once per epoch, in variable-size batches whose padding is what the bridge reported.
    assert result.details["batches"] == 2 * report["batches_per_epoch"] == len(result.losses)
    assert result.details["train_tokens"] == 2 * report["tokens"]
    assert result.details["fed_padding_fraction"] == pytest.approx(report["padding_fraction"])
    assert report["padding_fraction"] < 0.15 and all(math.isfinite(x) for x in result.losses)


def test_lora_and_trl_batching(tmp_path, tiny):
    pytest.importorskip("peft")
    from omrl.train.algorithms.sft import train_sft
    from omrl.train.config.sft import SFTRecipe

    store = demo_store(tmp_path / "s")
    recipe = SFTRecipe(model=str(tiny), store=str(store.path), output_dir=str(tmp_path / "lora"), batch_size=4,
                       max_steps=1, logging_steps=1, quiet=True, batching="trl")
    recipe.lora.enabled = True
    recipe.lora.r = 4
    result = train_sft(recipe)
    assert math.isfinite(result.losses[0])
    assert (result.checkpoint / "config.json").exists()  # merged back into a plain checkpoint
    bad = demo_store(tmp_path / "u", untrainable=True)
    with pytest.raises(ValueError, match="untrainable assistant turn"):
        train_sft(SFTRecipe(model=str(tiny), store=str(bad.path), output_dir=str(tmp_path / "x"), batching="trl"))
