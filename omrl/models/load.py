"""The one way omrl loads a checkpoint's weights for training or generation, in the dtype that is fast where it
runs: float32 on a CPU, the checkpoint's own dtype (bf16 for the real models) on a GPU.

    model = load_model("runs/sft")                     # AutoModelForCausalLM
    trunk = load_model(path, AutoModel)                # a critic's trunk

Why not the checkpoint's dtype everywhere: most CPUs have no bf16 matrix units, and torch's bf16 kernels there
are emulated. One forward and backward pass of SmolLM2-135M on 16 x 75 tokens took 23 s in float32 and 276 s in
bf16 on this project's 2-core AMD EPYC (benchmarks/real_model.py --part training measures the GRPO step).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def cpu_has_bf16() -> bool:
    """Whether this CPU has bf16 matrix instructions (AVX512-BF16 or AMX); /proc/cpuinfo's flags, False elsewhere.
    omrl.serve.vllm serves in bf16 only where it does; training stays float32 on any CPU (fast_dtype)."""
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return any(flag in flags.split() for flag in ("avx512_bf16", "amx_bf16"))


def fast_dtype() -> Any:
    """float32 without a CUDA device; "auto" (the checkpoint's dtype) with one."""
    import torch

    return "auto" if torch.cuda.is_available() else torch.float32


def load_model(path: str | Path, model_class: Any = None) -> Any:
    """`model_class` (default AutoModelForCausalLM) from the checkpoint folder `path`, in fast_dtype()."""
    if model_class is None:
        from transformers import AutoModelForCausalLM as model_class
    return model_class.from_pretrained(path, dtype=fast_dtype())
