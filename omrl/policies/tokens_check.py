"""Token fidelity: does re-tokenising the stored messages with a model's chat template give back the token
ids the policy sampled (turns[].completion_ids)?

Training re-renders a stored conversation through `omrl.schema.messages.to_chat_template` and the tokenizer; RL
on a trajectory whose text no longer tokenises to what the model sampled (an edited message, a reply
that decodes and re-encodes differently, tool calls re-serialised with other spacing, reasoning the
template drops) trains on tokens the model never produced, silently. This check renders, for every
assistant turn that has completion ids, the conversation before it with the generation prompt and the
conversation up to and including it; the text between the two, up to the end-of-turn token, is the
turn's completion, and its ids must be the stored ones. It also compares the prompt's length with the
turn's prompt_tokens (an edited observation shows there; reported only when no earlier turn of the
trajectory drifted, since an earlier drift is in every later prompt). Each drift names the trajectory, the turn,
the first differing position and the decoded text around it.

The conversation re-rendered is the one the model saw (`seen_messages`, `seen_tools`): an episode whose tools went
as text (metadata["prompt_format"] == "text_tools", recorded by the agent loop) is passed through
omrl.policies.parsing.text_tool_messages and rendered without `tools`, as the policy sent it. The training
bridge (omrl.train.data.token_bridge) builds its examples from the same functions, so the check and the training
agree on what a turn's prompt and completion are.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from omrl.errors import UsageError
from omrl.policies.parsing import TEXT_TOOLS_FORMAT, text_tool_messages
from omrl.schema.messages import to_chat_template
from omrl.schema.payloads import decoded, info_of
from omrl.schema.rows import TrajectoryRow, TurnRow

CONTEXT_CHARS = 80  # decoded text shown before a drift
SHOWN_TOKENS = 6  # tokens shown from the drift on, each side


@dataclass
class Drift:
    """Where re-tokenising a stored turn stops giving the stored ids."""

    trajectory_id: str
    turn: int  # index of the assistant turn (turns[].index order)
    message: int  # position of its assistant message in the conversation the model saw (seen_messages)
    kind: str  # completion: ids differ at `position`; prompt: the prompt's length differs; template: no prefix
    position: int | None = None  # first differing position in the completion ids
    stored: list[int] = field(default_factory=list)  # ids from `position` on (a few), as stored
    retokenised: list[int] = field(default_factory=list)  # the same span, re-tokenised
    stored_text: str = ""
    retokenised_text: str = ""
    context: str = ""  # decoded text just before the drift
    detail: str = ""

    def describe(self) -> str:
        head = f"{self.trajectory_id} turn {self.turn} (message {self.message})"
        if self.kind != "completion":
            return f"{head}: {self.detail}"
        return (f"{head}: completion token {self.position} differs: stored {self.stored_text!r} {self.stored} vs "
                f"re-tokenised {self.retokenised_text!r} {self.retokenised}; after ...{self.context!r}")


@dataclass
class TokenReport:
    model: str
    trajectories: int = 0  # trajectories with completion ids, checked
    turns: int = 0  # turns checked
    without_ids: int = 0  # trajectories with no completion ids at all (nothing to check)
    drifts: list[Drift] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.drifts


def load_tokenizer(model: str) -> Any:
    """The tokenizer (with its chat template) of a local checkpoint or a Hub model id."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model)
    except OSError as exc:
        raise UsageError(f"cannot load the tokenizer of {model!r}: {exc}") from None
    if not getattr(tokenizer, "chat_template", None):
        raise UsageError(f"{model!r} has no chat template: there is nothing to re-render the messages with")
    return tokenizer


def _first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# ------------------------------------------------------------------- the conversation as the model saw it


def _json_field(row: TrajectoryRow, name: str, default: Any) -> Any:
    """A JSON-text column of `row` as its value (a dict or list given as is); invalid JSON is a UsageError."""
    try:
        return decoded(row.get(name), default)
    except json.JSONDecodeError as exc:
        raise UsageError(f"trajectory {row.get('id')!r}: field {name!r} is not valid JSON ({exc})") from None


def parse_tools(row: TrajectoryRow) -> list[dict[str, Any]]:
    """The row's tool schemas as objects (the store keeps them as JSON text)."""
    parsed = _json_field(row, "tools", [])
    if not isinstance(parsed, list):
        raise UsageError(f"trajectory {row.get('id')!r}: field 'tools' must be a JSON list")
    return parsed


def prompt_format(row: TrajectoryRow) -> str:
    """How the row's conversation went to the model: metadata["prompt_format"], "native" when unrecorded."""
    meta = _json_field(row, "metadata", {})
    fmt = meta.get("prompt_format") if isinstance(meta, dict) else None
    return fmt or "native"


def _tools_as_text(row: TrajectoryRow) -> bool:
    # The policy rewrites the conversation only when there are tools to describe (OpenAIPolicy._request).
    return prompt_format(row) == TEXT_TOOLS_FORMAT and bool(parse_tools(row))


def seen_messages(row: TrajectoryRow) -> list[dict[str, Any]]:
    """The row's messages (store shape) as the model read them: through text_tool_messages when its tools
    went as text, else as stored. Assistant turns keep their order and `trainable` flags."""
    messages = list(row.get("messages") or [])
    return text_tool_messages(messages, parse_tools(row)) if _tools_as_text(row) else messages


def seen_tools(row: TrajectoryRow) -> list[dict[str, Any]]:
    """The tools the chat template was given: none when they went as text (they are in the system message)."""
    return [] if _tools_as_text(row) else parse_tools(row)


def encode(tokenizer: Any, text: str) -> list[int]:
    """Ids of rendered chat text as a server tokenises it (vLLM: the template writes the special tokens)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def render_turn(tokenizer: Any, chat: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                at: int) -> tuple[str, list[int] | None]:
    """(prompt, reply ids) of the assistant message `chat[at]` (chat-template messages): the prompt is the
    text before it with the generation prompt, what a server tokenises; the reply ids are the template's text
    for it up to and including the end-of-turn token, None when the template does not write the prompt as a
    prefix of the conversation with the reply (the reply cannot be located)."""
    def render(upto: int, generation: bool) -> str:
        return tokenizer.apply_chat_template(chat[:upto], tools=tools or None, tokenize=False,
                                             add_generation_prompt=generation)

    prompt, full = render(at, True), render(at + 1, False)
    if not full.startswith(prompt):
        return prompt, None
    rest = full[len(prompt):]
    eos_text = tokenizer.eos_token
    end = rest.find(eos_text) if eos_text else -1
    return prompt, encode(tokenizer, rest[: end + len(eos_text)] if end >= 0 else rest)


def finish_reason(turn: TurnRow) -> str | None:
    """The turn's finish_reason ("stop", "length", ...) as the agent loop keeps it in turns[].info."""
    return info_of(turn).get("finish_reason")


def sampled_completion(turn: TurnRow, eos_id: int | None) -> list[int]:
    """The turn's completion as the model wrote it: its stored ids, plus the end-of-turn token when they lack
    it but the reply finished naturally (finish_reason "stop": a server that leaves the stop token out).
    Without that, ids that do not end with it are a reply cut at max_tokens: the model never wrote it."""
    stored = list(turn.get("completion_ids") or [])
    if stored and eos_id is not None and stored[-1] != eos_id and finish_reason(turn) == "stop":
        stored.append(eos_id)
    return stored


# ------------------------------------------------------------------------------------------ the check


def check_row(row: TrajectoryRow, tokenizer: Any) -> tuple[int, list[Drift]]:
    """(turns checked, drifts) of one stored trajectory row, against the conversation the model saw."""
    messages = seen_messages(row)
    chat, tools = to_chat_template(messages), seen_tools(row)
    turns = row.get("turns") or []
    positions = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    eos_id = tokenizer.eos_token_id

    checked, drifts = 0, []
    for k, turn in enumerate(turns):
        if not turn.get("completion_ids") or k >= len(positions):
            continue
        checked += 1
        at = positions[k]
        index = turn.get("index", k)
        prompt, expected = render_turn(tokenizer, chat, tools, at)
        if expected is None:
            drifts.append(Drift(row["id"], index, at, "template",
                                detail="the chat template does not render the conversation before this turn as a "
                                       "prefix of the conversation with it: completion ids cannot be located"))
            continue
        stored = sampled_completion(turn, eos_id)
        if stored[-1] != eos_id and expected and expected[-1] == eos_id:
            expected = expected[:-1]  # the reply was cut at max_new_tokens: the model never wrote the end token
        position = _first_difference(stored, expected)
        if position is not None:
            before = tokenizer.decode(stored[:position])
            context = (prompt + before)[-CONTEXT_CHARS:]
            a, b = stored[position:position + SHOWN_TOKENS], expected[position:position + SHOWN_TOKENS]
            drifts.append(Drift(row["id"], index, at, "completion", position, a, b, tokenizer.decode(a),
                                tokenizer.decode(b), context))
            continue
        prompt_tokens = turn.get("prompt_tokens")
        # An earlier drift of this row is in this prompt too: only the first cause is reported.
        if not drifts and prompt_tokens is not None and prompt_tokens != (n := len(encode(tokenizer, prompt))):
            drifts.append(Drift(row["id"], index, at, "prompt",
                                detail=f"the prompt re-tokenises to {n} tokens, the turn "
                                       f"records {prompt_tokens}: a message before this turn changed"))
    return checked, drifts


def check_tokens(rows: Iterable[TrajectoryRow], model: str, tokenizer: Any = None) -> TokenReport:
    """Re-tokenise every stored turn that has completion ids with `model`'s chat template (see the module docstring)."""
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model)
    report = TokenReport(model)
    for row in rows:
        checked, drifts = check_row(row, tokenizer)
        if not checked:
            report.without_ids += 1
            continue
        report.trajectories += 1
        report.turns += checked
        report.drifts.extend(drifts)
    return report


def check_store_tokens(store: Any, model: str, where: str | None = None) -> TokenReport:
    """check_tokens over a store's trajectories (or those matching a WHERE clause), read in batches."""
    table = store.select(where)
    tokenizer = load_tokenizer(model)
    rows = (row for batch in table.to_batches(max_chunksize=500) for row in batch.to_pylist())
    return check_tokens(rows, model, tokenizer)
