"""omrl.models.load: a checkpoint saved in bf16 (as the real models are) is trained and sampled in float32 on a
CPU, where bf16 kernels are emulated (about 12x slower per training step, measured in the module docstring)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def test_a_bf16_checkpoint_loads_in_float32_on_a_cpu_and_keeps_its_weights(tmp_path):
    from transformers import AutoModelForCausalLM

    from omrl.models.load import fast_dtype, load_model
    from omrl.models.tiny import build_tiny_model

    folder = build_tiny_model(tmp_path / "tiny", hidden=32, layers=1)
    saved = AutoModelForCausalLM.from_pretrained(folder).to(torch.bfloat16)
    saved.save_pretrained(tmp_path / "bf16")
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "bf16").dtype == torch.bfloat16  # what it would be

    loaded = load_model(tmp_path / "bf16")
    if torch.cuda.is_available():
        assert fast_dtype() == "auto" and loaded.dtype == torch.bfloat16
        return
    assert fast_dtype() == torch.float32 and loaded.dtype == torch.float32
    for name, weight in saved.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], weight.float()), name  # bf16 widens to float32 exactly
