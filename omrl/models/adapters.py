"""LoRA checkpoints: a trained model saved as its adapter (and, on request, merged into plain weights), and an
adapter merged later into a plain checkpoint every loader reads (transformers, vLLM, omrl's policies).

    save_checkpoint(model, tokenizer, "runs/grpo-1", merge=True)   # runs/grpo-1/adapter/ + merged runs/grpo-1/
    merge_adapter("runs/grpo-1/adapter", "runs/grpo-1-merged")     # `omrl models merge`

A trainer's output_dir with LoRA holds the adapter in `adapter/` (peft's adapter_config.json and
adapter_model.safetensors, with the tokenizer) and, when merged, the merged model at the top, so the next
stage loads output_dir as before. Without LoRA the model is saved at the top as always.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omrl.errors import UsageError

ADAPTER_DIR = "adapter"  # the adapter's folder inside a trainer's output_dir


def is_peft_model(model: Any) -> bool:
    """Whether `model` is a peft model (carries adapters)."""
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def save_checkpoint(model: Any, tokenizer: Any, out: str | Path, *, merge: bool = True) -> Path:
    """Save `model` + `tokenizer` to `out`: a plain model at the top; a peft model's adapter in out/adapter and,
    with `merge`, the adapters merged into the weights at the top (this merges `model` in place: save last)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if not is_peft_model(model):
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        return out
    adapter = out / ADAPTER_DIR
    model.save_pretrained(adapter)
    tokenizer.save_pretrained(adapter)
    if merge:
        merged = model.merge_and_unload()
        merged.save_pretrained(out)
        tokenizer.save_pretrained(out)
    return out


def adapter_base(adapter_dir: str | Path) -> str:
    """The base checkpoint an adapter was trained on (its adapter_config.json's base_model_name_or_path)."""
    config = Path(adapter_dir) / "adapter_config.json"
    if not config.is_file():
        raise UsageError(f"{adapter_dir}: no adapter_config.json (not a LoRA adapter folder; a trainer's adapter "
                         f"is in OUTPUT_DIR/{ADAPTER_DIR})")
    base = json.loads(config.read_text()).get("base_model_name_or_path")
    if not base:
        raise UsageError(f"{config}: no base_model_name_or_path; name the base model")
    return base


def load_adapter(adapter_dir: str | Path, base: str | None = None) -> Any:
    """The peft model of `adapter_dir` on its base checkpoint (`base`, default the one it names), in eval mode."""
    from peft import PeftModel

    from omrl.models.load import load_model
    from omrl.models.real import resolve_model

    model = load_model(resolve_model(base or adapter_base(adapter_dir)))
    return PeftModel.from_pretrained(model, str(adapter_dir)).eval()


def merge_adapter(adapter_dir: str | Path, out: str | Path, base: str | None = None) -> Path:
    """Merge the LoRA adapter in `adapter_dir` into its base checkpoint (`base`, default the one it names) and
    save the plain model with the tokenizer (the adapter's, else the base's) to `out`."""
    from transformers import AutoTokenizer

    from omrl.models.real import resolve_model

    adapter_dir, out = Path(adapter_dir), Path(out)
    base = base or adapter_base(adapter_dir)
    merged = load_adapter(adapter_dir, base).merge_and_unload()
    has_tokenizer = (adapter_dir / "tokenizer_config.json").is_file()
    tokenizer = AutoTokenizer.from_pretrained(adapter_dir if has_tokenizer else resolve_model(base))
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
