"""Token-faithful SFT examples: what is trained is exactly what the policy sampled (turns[].completion_ids).

Re-tokenising a sampled reply's text does not give back the sampled ids in many turns (a model may sample a
non-canonical tokenisation: SmolLM2 served by vLLM drifted in 14 of 32 turns); training the re-tokenised
text teaches tokens the model never produced. So a row whose turns carry their sampled ids is trained from
them, one example per trainable assistant turn, in the shape the bridge gives every example:

    input_ids       = prompt ids + completion ids
    assistant_masks = 0 on the prompt, 1 on the completion

prompt: the conversation before the turn as the model saw it (omrl.policies.tokens_check.seen_messages: tools that went
as text are rewritten as the policy sent them), rendered by the chat template with the generation prompt and
tokenised as the server does (vLLM: same template, same text, no added special tokens). completion: the stored
ids, plus the end-of-turn token only where the reply finished naturally but the ids lack it
(tokens_check.sampled_completion); a reply cut at max_tokens is trained without it. A turn of such a row that
has no ids is rendered alone: the same prompt, the template's text for the reply re-tokenised.

`token_source` (the SFT recipe's key) chooses, per row:
- auto: rows with stored ids are trained from them turn by turn; rows without any are rendered whole, one
  example per trajectory (omrl.train.data.bridge), as before.
- stored: only rows whose every trainable assistant turn has ids; the others are dropped and counted.
- render: every row rendered whole; turns whose stored ids the rendering does not reproduce are counted
  (BridgeReport.drifting_turns_trained_from_render).

Each turn repeats its prompt, so a multi-turn row costs more tokens than its one rendered example: the price of
training each reply in the context it was sampled in. For omrl's hf policy the context was the episode's token
trace, which the template's rendering reproduces where the template is prefix-stable (tokens_check checks it).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from omrl.errors import UsageError
from omrl.policies.tokens_check import (
    check_row,
    encode,
    render_turn,
    sampled_completion,
    seen_messages,
    seen_tools,
)
from omrl.schema.messages import to_chat_template
from omrl.schema.rows import TrajectoryRow
from omrl.train.data.masks import MaskError, is_trainable

TokenSource = Literal["auto", "stored", "render"]  # an SFT recipe's token_source
TOKEN_SOURCES = get_args(TokenSource)


def check_token_source(token_source: str) -> None:
    """Refuse a token_source that is not one of TOKEN_SOURCES (a typo must not silently render)."""
    if token_source not in TOKEN_SOURCES:
        raise UsageError(f"token_source must be one of {', '.join(TOKEN_SOURCES)}, not {token_source!r}")


def _assistant_turns(row: TrajectoryRow, messages: list[dict[str, Any]]) -> list[tuple[int, int, dict[str, Any]]]:
    """(turn number, position in `messages`, turns[] entry) of each assistant message; the k-th assistant
    message is the k-th turn (the agent loop appends one of each per turn); a missing entry is {}."""
    turns = row.get("turns") or []
    positions = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    return [(k, at, turns[k] if k < len(turns) else {}) for k, at in enumerate(positions)]


def row_token_source(row: TrajectoryRow, token_source: str) -> str | None:
    """How `row` is trained under `token_source`: "stored" (turn by turn, from its sampled ids where it has
    them), "render" (whole), or None (token_source stored and a trainable turn lacks ids: the row is dropped)."""
    if token_source == "render":
        return "render"
    messages = row.get("messages") or []
    trained = [turn for _, at, turn in _assistant_turns(row, messages) if is_trainable(messages[at])]
    with_ids = sum(bool(turn.get("completion_ids")) for turn in trained)
    if token_source == "stored":
        return "stored" if trained and with_ids == len(trained) else None
    # auto: one turn with ids is enough: rendering the row whole would train that turn's re-tokenisation.
    return "stored" if with_ids else "render"


def turn_examples(row: TrajectoryRow, tokenizer: Any) -> list[tuple[int, list[int], list[int], bool]]:
    """(turn index, input_ids, assistant_masks, from stored ids) of each trainable assistant turn of `row`, as
    the module docstring says; a turn without ids whose reply the template cannot locate raises MaskError."""
    messages = seen_messages(row)
    chat, tools = to_chat_template(messages), seen_tools(row)
    out = []
    for k, at, turn in _assistant_turns(row, messages):
        if not is_trainable(messages[at]):
            continue
        prompt, rendered = render_turn(tokenizer, chat, tools, at)
        completion = sampled_completion(turn, tokenizer.eos_token_id)
        from_stored = bool(completion)
        if not from_stored:
            if rendered is None:
                raise MaskError(f"trajectory {row.get('id')!r} turn {k}: the chat template does not render the "
                                "conversation before the turn as a prefix of the one with it")
            completion = rendered
        prompt_ids = encode(tokenizer, prompt)
        out.append((turn.get("index", k), prompt_ids + completion, [0] * len(prompt_ids) + [1] * len(completion),
                    from_stored))
    return out


def stored_examples(row: TrajectoryRow, tokenizer: Any, *, max_length: int | None, overflow: str,
                    report: Any) -> list[tuple[str, list[int], list[int]]]:
    """(example id, input_ids, assistant_masks) of `row` trained turn by turn, counted in `report` (a
    BridgeReport): turns from stored ids or rendered, turns too long for `max_length` (overflow "split": the
    turn is dropped; "drop": the whole row is)."""
    examples = turn_examples(row, tokenizer)
    if overflow == "drop" and max_length is not None and any(len(ids) > max_length for _, ids, _, _ in examples):
        report.drop("too long")
        return []
    out = []
    for index, ids, mask, from_stored in examples:
        if max_length is not None and len(ids) > max_length:
            report.dropped_turns += 1
            continue
        if from_stored:
            report.turns_from_stored_ids += 1
        else:
            report.turns_rendered += 1
        report.mask_source["turn"] = report.mask_source.get("turn", 0) + 1
        out.append((f"{row['id']}#turn{index}", ids, mask))
    return out


def drifting_turns(row: TrajectoryRow, tokenizer: Any) -> int:
    """Trainable assistant turns of `row` whose stored ids the template's re-tokenisation does not reproduce
    (omrl.policies.tokens_check's completion and template drifts): what rendering the row would train wrongly."""
    if not any(turn.get("completion_ids") for turn in row.get("turns") or []):
        return 0
    messages = seen_messages(row)
    _, drifts = check_row(row, tokenizer)
    return sum(d.kind in ("completion", "template") and is_trainable(messages[d.message]) for d in drifts)
