"""Tiny offline models for tests and the CPU demo: a 2-layer Qwen2 and a BPE tokenizer trained on the spot.

Nothing is downloaded. The tokenizer uses exactly the normalizer (NFC), pre-tokenizer (Qwen's split regex +
byte-level) and decoder that transformers' `Qwen2Tokenizer` rebuilds when it loads a checkpoint, so token
ids are identical before and after `save_pretrained` / `AutoTokenizer.from_pretrained`. The chat template
is TRL's bundled `qwen2_5` template verbatim, so TRL recognises it (assistant-only loss swaps in its
generation-marked training variant; tool calls render as `<tool_call>` JSON blocks).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

# Chat-format tokens. Only the first three are "special" (skipped when decoding with
# skip_special_tokens); the tool markers must survive decoding so tool calls can be parsed from text.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

# Qwen's pre-tokenizer splits every digit apart, so BPE can never learn "42"; numbers 10-99 become
# added tokens instead (single digits are already single tokens), which the grid and number envs like.
NUMBER_TOKENS = [str(n) for n in range(10, 100)]

_BASE_CORPUS = [
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    "# Tools\n\nYou may call one or more functions to assist with the user query.",
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:",
    '{"name": <function-name>, "arguments": <args-json-object>}',
    '{"type": "function", "function": {"name": "move", "description": "Move one step.", "parameters": '
    '{"type": "object", "properties": {"direction": {"type": "string", "enum": ["up", "down", "left", '
    '"right"]}}, "required": ["direction"]}}}',
    '{"type": "function", "function": {"name": "guess", "description": "Guess the secret number.", '
    '"parameters": {"type": "object", "properties": {"number": {"type": "integer"}}, "required": ["number"]}}}',
    '{"type": "function", "function": {"name": "answer", "description": "Submit the final answer.", '
    '"parameters": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}}',
    "You are in a grid. You are at 3 7 and the goal is at 3 3. The goal is 2 left and 3 up. Reach the goal.",
    "at 3 7 goal 3 3 moved up now at 3 6 wall blocked invalid action reached the goal done",
    "Guess the secret number between 1 and 100. higher lower correct too high too low",
    "What is the answer? Compute the sum. The result is 42. Submit the final answer.",
    "The quick brown fox jumps over the lazy dog. Error: unknown tool. Invalid arguments. Try again.",
    "search calculator python read_file write_file observation result success failed step steps left",
]


def default_corpus() -> list[str]:
    """Text the tiny tokenizer is trained on: chat-format strings, tool schemas and the shipped envs' words."""
    corpus = list(_BASE_CORPUS)
    for direction in ("up", "down", "left", "right"):
        call = {"name": "move", "arguments": {"direction": direction}}
        corpus.append(f"<|im_start|>assistant\n<tool_call>\n{json.dumps(call)}\n</tool_call><|im_end|>\n")
        corpus.append(f"<|im_start|>user\n<tool_response>\nmoved {direction}\n</tool_response><|im_end|>\n")
    for n in (1, 7, 25, 50, 99):
        call = {"name": "guess", "arguments": {"number": n}}
        corpus.append(f"<tool_call>\n{json.dumps(call)}\n</tool_call>")
    corpus.extend(_env_corpus())
    return corpus


def _env_corpus() -> list[str]:
    """Prompts and tool schemas of the environments that have landed (best effort: none is required)."""
    texts: list[str] = []
    try:
        from omrl import envs
    except ImportError:
        return texts
    for name in getattr(envs, "__all__", []):
        obj = getattr(envs, name, None)
        doc = getattr(obj, "__doc__", None)
        if doc:
            texts.append(doc)
    return texts


def train_tokenizer(corpus: Iterable[str] | None = None, vocab_size: int = 1024):
    """A `Qwen2Tokenizer` whose BPE vocabulary and merges are learned from `corpus` (offline, seconds)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import AddedToken
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX, Qwen2Tokenizer

    texts = list(corpus) if corpus is not None else default_corpus()
    backend = Tokenizer(models.BPE())
    # Same pipeline as Qwen2Tokenizer.__init__, so the learned merges apply identically after reload.
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    model = json.loads(backend.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]

    tokenizer = Qwen2Tokenizer(
        vocab=model["vocab"],
        merges=merges,
        unk_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS + NUMBER_TOKENS])
    tokenizer.chat_template = qwen2_5_chat_template()
    tokenizer.model_max_length = 2048
    return tokenizer


def qwen2_5_chat_template() -> str:
    """TRL's bundled Qwen2.5 chat template, verbatim (TRL identifies templates by exact text)."""
    from trl.chat_template_utils import qwen2_5_chat_template as template

    return template


def build_tiny_model(
    out_dir: str | Path,
    *,
    hidden: int = 128,
    layers: int = 2,
    vocab_size: int = 1024,
    seed: int = 0,
    corpus: Iterable[str] | None = None,
    max_positions: int = 2048,
) -> Path:
    """Build and save a tiny random Qwen2ForCausalLM + tokenizer in `out_dir`; loadable offline with Auto*."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(corpus, vocab_size=vocab_size)
    heads = max(1, hidden // 32)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, do_sample=True, temperature=1.0
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def count_parameters(model) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def cached_tiny_model(*, hidden: int = 64, layers: int = 2, seed: int = 0, vocab_size: int = 1024) -> Path:
    """A tiny model built once per machine and reused (tests share it); built atomically, safe to race."""
    import hashlib
    import os
    import shutil
    import tempfile

    import transformers

    key = json.dumps([hidden, layers, seed, vocab_size, default_corpus(), transformers.__version__])
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    root = Path(os.environ.get("OMRL_CACHE", Path(tempfile.gettempdir()) / "omrl-cache"))
    final = root / f"tiny-qwen2-h{hidden}-l{layers}-s{seed}-{digest}"
    if (final / "config.json").exists() and (final / "tokenizer.json").exists():
        return final
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
    build_tiny_model(staging, hidden=hidden, layers=layers, seed=seed, vocab_size=vocab_size)
    try:
        staging.rename(final)
    except OSError:  # another process finished first: keep theirs
        shutil.rmtree(staging, ignore_errors=True)
    return final
