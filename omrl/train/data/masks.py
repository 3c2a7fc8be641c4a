"""Loss masks: which tokens of a rendered conversation are trained.

A message trains when `trainable` is True, or when it is None and the role is assistant; tool results,
observations, user and system turns never train. Two ways to get token masks, tested to agree:

- `template_mask`: the chat template's `{% generation %}` markers (TRL's generation-marked variant of a
  known template), via `apply_chat_template(..., return_assistant_tokens_mask=True)`. It marks every
  assistant turn, so it is only usable when all assistant turns are trainable.
- `incremental_mask`: render the conversation prefix by prefix and diff the texts, giving the character
  span of every message; tokens whose first character lies in a trainable span carry loss. Works with any
  prefix-preserving template and honours per-message `trainable` flags.

Both exclude the role header (`<|im_start|>assistant`) and include the end-of-turn token, as TRL does.
"""

from __future__ import annotations

from typing import Any

from omrl.errors import OmrlError


class MaskError(OmrlError, ValueError):
    """A conversation that cannot be masked (template not prefix-preserving, nothing to render)."""


def is_trainable(message: dict[str, Any]) -> bool:
    """True when the message's tokens carry loss: explicit flag, else assistant role."""
    flag = message.get("trainable")
    if flag is not None and message.get("role") in ("system", "user", "tool") and flag:
        # A stored flag cannot make observations trainable: they are the environment's words, not the policy's.
        return False
    return bool(flag) if flag is not None else message.get("role") == "assistant"


def render(tokenizer, messages: list[dict[str, Any]], tools: list[dict] | None = None, *,
           add_generation_prompt: bool = False, chat_template: str | None = None) -> str:
    """The chat template's text for `messages` (no tokenisation)."""
    return tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                         add_generation_prompt=add_generation_prompt, chat_template=chat_template)


def message_spans(tokenizer, messages: list[dict[str, Any]], tools: list[dict] | None = None) -> tuple[str, list]:
    """The full rendered text and, per message, the (start, end) characters of what it adds.

    An assistant message's span starts after its role header, so the header (which the prompt supplies at
    inference time) is never trained.
    """
    if not messages:
        raise MaskError("empty conversation")
    full = render(tokenizer, messages, tools)
    spans = []
    end = 0
    for i, message in enumerate(messages):
        # A message ends where its prefix rendering stops agreeing with the full text: templates may close a
        # block differently when the message is last (Qwen closes a run of tool results only after the last).
        text = render(tokenizer, messages[: i + 1], tools)
        start, end = end, _common_prefix(text, full)
        if end < start:
            raise MaskError(f"chat template is not prefix-preserving at message {i} ({message['role']})")
        if message["role"] == "assistant" and i > 0:
            # The generation prompt is the header the template opens this turn with ("<|im_start|>assistant\n");
            # its trailing whitespace belongs to the turn, as in TRL's generation-marked templates.
            before = render(tokenizer, messages[:i], tools)
            header = render(tokenizer, messages[:i], tools, add_generation_prompt=True)[len(before):].rstrip()
            if full.startswith(header, start):
                start += len(header)
        spans.append((start, end))
    return full, spans


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # binary search on the first differing character
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def incremental_mask(tokenizer, messages: list[dict[str, Any]], tools: list[dict] | None = None,
                     trainable: list[bool] | None = None) -> tuple[list[int], list[int]]:
    """(input_ids, mask) with 1 on tokens of trainable messages, found by prefix-by-prefix rendering."""
    trainable = trainable if trainable is not None else [is_trainable(m) for m in messages]
    full, spans = message_spans(tokenizer, messages, tools)
    encoded = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    keep = [span for span, flag in zip(spans, trainable, strict=True) if flag]
    mask = []
    for start, _end in encoded["offset_mapping"]:
        mask.append(int(any(a <= start < b for a, b in keep)))
    return list(encoded["input_ids"]), mask


def training_template(tokenizer) -> str | None:
    """A generation-marked chat template for this tokenizer (its own, or TRL's variant), or None."""
    template = tokenizer.chat_template
    if isinstance(template, str) and "{% generation %}" in template.replace("{%-", "{%").replace("-%}", "%}"):
        return template
    try:
        from trl.chat_template_utils import get_training_chat_template

        return get_training_chat_template(tokenizer)
    except (ValueError, ImportError):
        return None


def template_mask(tokenizer, messages: list[dict[str, Any]], tools: list[dict] | None = None,
                  chat_template: str | None = None) -> tuple[list[int], list[int]]:
    """(input_ids, mask) from the template's generation markers: every assistant turn is marked."""
    template = chat_template or training_template(tokenizer)
    if template is None:
        raise MaskError("the chat template has no {% generation %} markers and TRL knows no training variant")
    out = tokenizer.apply_chat_template(messages, tools=tools or None, chat_template=template, tokenize=True,
                                        return_dict=True, return_assistant_tokens_mask=True)
    return list(out["input_ids"]), list(out["assistant_masks"])
