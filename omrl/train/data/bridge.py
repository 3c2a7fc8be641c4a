"""The bridge from a store to TRL: trajectories -> chat examples -> tokenized, masked, length-grouped batches.

- `load_rows(store, where)`: the trajectories to train on (SQL filter, broken episodes skipped and counted).
- `chat_dataset(rows)`: conversational `messages` + `tools` (TRL's own format, for `assistant_only_loss`).
- `sft_examples(rows, tokenizer, ...)`: pre-tokenized `input_ids` + `assistant_masks` honouring per-message
  `trainable` flags; trajectories longer than `max_length` are split at turn boundaries or dropped. Rows
  whose turns carry the ids the policy sampled are trained from them, turn by turn (`token_source`,
  omrl.train.data.token_bridge), so what is trained is what was sampled.
- Every rendering is of the conversation the model saw (omrl.policies.tokens_check.seen_messages: tools that went to
  the model as text are in its messages, not in the template's `tools`).
- `TokenBudgetBatchSampler(lengths, budget)`: variable-size batches of nearly equal lengths, each at most
  `budget` tokens once padded (longest x count), so padding stays small; `batches_padding_fraction` measures it.
- `rl_rewards(store, rows, recipe)`: the reward RL trains on (the combined reward of a reward recipe when one
  is configured, the env reward otherwise); missing rewards are None and counted, never 0.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

from omrl.errors import UsageError
from omrl.policies.tokens_check import seen_messages, seen_tools
from omrl.schema import TrajectoryRow, is_failed  # is_failed: env_error, policy_error, timeout
from omrl.schema.messages import to_chat_template
from omrl.train.data.masks import MaskError, incremental_mask, is_trainable, template_mask
from omrl.train.data.token_bridge import check_token_source, drifting_turns, row_token_source, stored_examples

MaskSource = Literal["auto", "template", "incremental"]  # an SFT recipe's mask_source
MASK_SOURCES = get_args(MaskSource)


@dataclass
class BridgeReport:
    """What the bridge did with the store's trajectories; every dropped row is counted with its reason."""

    trajectories: int = 0
    examples: int = 0
    split_trajectories: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    dropped_turns: int = 0
    tokens: int = 0
    trained_tokens: int = 0
    padding_fraction: float | None = None
    token_budget: int | None = None
    batches_per_epoch: int | None = None
    mask_source: dict[str, int] = field(default_factory=dict)
    token_source: str | None = None  # auto, stored or render (omrl.train.data.token_bridge)
    turns_from_stored_ids: int = 0  # assistant turns trained on the ids the policy sampled
    turns_rendered: int = 0  # assistant turns trained on the template's re-tokenisation
    # Rendered turns whose stored ids the rendering does not reproduce (trained on tokens never sampled);
    # 0 under auto and stored, which train every turn that has ids from them.
    drifting_turns_trained_from_render: int = 0

    def drop(self, reason: str, n: int = 1) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + n

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        dropped = ", ".join(f"{k}: {v}" for k, v in sorted(self.dropped.items())) or "none"
        pad = "n/a" if self.padding_fraction is None else f"{self.padding_fraction:.3f}"
        return (f"{self.trajectories} trajectories -> {self.examples} examples "
                f"({self.split_trajectories} split, dropped {dropped}, {self.dropped_turns} turns too long); "
                f"{self.tokens} tokens, {self.trained_tokens} trained; padding {pad}; turns: "
                f"{self.turns_from_stored_ids} from stored ids, {self.turns_rendered} rendered "
                f"({self.drifting_turns_trained_from_render} drifting)")


# ------------------------------------------------------------------------------------------- reading


def load_rows(store, where: str | None = None, *, skip_broken: bool = True,
              report: BridgeReport | None = None) -> list[TrajectoryRow]:
    """Trajectory rows of `store` (a Store or path) matching the SQL `where`, ordered by id for determinism."""
    from omrl.store import Store
    from omrl.store.query import select_where

    store = store if isinstance(store, Store) else Store(store)
    rows = select_where(store, where or None, order_by="id").to_pylist()  # `where`: one checked condition
    kept = []
    for row in rows:
        if skip_broken and is_failed(row.get("status")):  # no failed episode is trained on
            if report is not None:
                report.drop(f"status {row['status']}")
            continue
        kept.append(row)
    if report is not None:
        report.trajectories += len(rows)
    return kept


def chat_example(row: TrajectoryRow) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[bool]]:
    """(chat-template messages (omrl.schema.messages.to_chat_template), tools, trainable flag per message) of one row,
    as the model saw it (omrl.policies.tokens_check.seen_messages: tools sent as text are in the messages, not in tools)."""
    if not row.get("messages"):
        raise UsageError(f"trajectory {row.get('id')!r}: no messages")
    seen = seen_messages(row)
    return to_chat_template(seen), seen_tools(row), [is_trainable(m) for m in seen]


def chat_dataset(rows: Sequence[TrajectoryRow]):
    """A `datasets.Dataset` of conversational `messages` + `tools` (JSON text), TRL's SFT format.

    Tool-call arguments are stored as JSON values so rows with different argument shapes do not get each
    other's keys filled in with nulls (which the chat template would then render).
    """
    from datasets import Dataset, Features, Json, List, Value

    call = {"type": Value("string"), "id": Value("string"),
            "function": {"name": Value("string"), "arguments": Json()}}
    message = {"role": Value("string"), "content": Value("string"), "tool_calls": List(call),
               "tool_call_id": Value("string"), "name": Value("string"), "reasoning_content": Value("string")}
    features = Features({"id": Value("string"), "messages": List(message), "tools": Value("string")})
    records = []
    for row in rows:
        messages, tools, _ = chat_example(row)
        records.append({"id": row["id"], "messages": messages, "tools": json.dumps(tools)})
    return Dataset.from_list(records, features=features)


# ------------------------------------------------------------------------------------- tokenization


def _mask(tokenizer, messages, tools, trainable, mask_source: str, report: BridgeReport):
    """input_ids and loss mask, from the template's generation markers when they can express the flags."""
    assistant_all = all(t == (m["role"] == "assistant") for m, t in zip(messages, trainable, strict=True))
    if mask_source in ("auto", "template") and assistant_all:
        try:
            ids, mask = template_mask(tokenizer, messages, tools)
            report.mask_source["template"] = report.mask_source.get("template", 0) + 1
            return ids, mask
        except MaskError:
            if mask_source == "template":
                raise
    elif mask_source == "template":
        raise MaskError("mask_source 'template' cannot honour untrainable assistant turns; use 'auto'")
    report.mask_source["incremental"] = report.mask_source.get("incremental", 0) + 1
    return incremental_mask(tokenizer, messages, tools, trainable)


def _segments(messages: list[dict[str, Any]]) -> tuple[int, list[tuple[int, int]]]:
    """End of the head (messages before the first assistant turn) and the [start, end) of each turn."""
    starts = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not starts:
        return len(messages), []
    bounds = starts + [len(messages)]
    return starts[0], [(bounds[k], bounds[k + 1]) for k in range(len(starts))]


def sft_examples(rows: Sequence[TrajectoryRow], tokenizer, *, max_length: int | None = 2048,
                 overflow: str = "split", mask_source: str = "auto", token_source: str = "auto",
                 report: BridgeReport | None = None) -> tuple[list[dict[str, Any]], BridgeReport]:
    """Tokenized SFT examples {id, input_ids, assistant_masks} with loss only on trainable assistant tokens.

    token_source (omrl.train.data.token_bridge): auto trains every row that has sampled ids from them, one example
    per turn, and renders the others; stored drops (and counts) rows lacking ids; render renders every row.
    A rendered row: overflow="split": a trajectory longer than `max_length` becomes several examples, each the
    head (system/user messages before the first assistant turn) followed by consecutive whole turns; a single
    turn that cannot fit is dropped and counted. overflow="drop": the trajectory is dropped and counted.
    A row trained turn by turn drops (split) a turn longer than `max_length`, or (drop) the row.
    """
    if overflow not in ("split", "drop"):
        raise UsageError(f"overflow must be 'split' or 'drop', not {overflow!r}")
    if mask_source not in MASK_SOURCES:
        raise UsageError(f"mask_source must be one of {', '.join(MASK_SOURCES)}, not {mask_source!r}")
    check_token_source(token_source)
    report = report or BridgeReport()
    report.token_source = token_source
    examples: list[dict[str, Any]] = []

    def add(example_id: str, ids: list[int], mask: list[int]) -> None:
        if not any(mask):
            report.drop("no trainable tokens")
            return
        examples.append({"id": example_id, "input_ids": ids, "assistant_masks": mask})
        report.tokens += len(ids)
        report.trained_tokens += sum(mask)

    for row in rows:
        messages, tools, trainable = chat_example(row)
        if not any(trainable):
            report.drop("no trainable messages")
            continue
        source = row_token_source(row, token_source)
        if source is None:
            report.drop("missing completion ids")
            continue
        if source == "stored":
            parts = stored_examples(row, tokenizer, max_length=max_length, overflow=overflow, report=report)
        else:
            parts = _rendered(row, tokenizer, messages, tools, trainable, max_length, overflow, mask_source, report)
        for example_id, ids, mask in parts:
            add(example_id, ids, mask)
    report.examples = len(examples)
    return examples, report


def _rendered(row, tokenizer, messages, tools, trainable, max_length, overflow, mask_source, report):
    """(example id, input_ids, mask) of a row rendered whole (split at turns when too long); its trained turns
    are counted in `report`, and those of them whose stored ids the rendering does not reproduce."""
    ids, mask = _mask(tokenizer, messages, tools, trainable, mask_source, report)
    if max_length is None or len(ids) <= max_length:
        trained = sum(t and m["role"] == "assistant" for m, t in zip(messages, trainable, strict=True))
        parts = [(row["id"], ids, mask)]
    elif overflow == "drop":
        report.drop("too long")
        return []
    else:
        report.split_trajectories += 1
        chunks = list(_split(tokenizer, messages, tools, trainable, max_length, mask_source, report))
        trained = sum(n for _, _, n in chunks)
        parts = [(f"{row['id']}#{part + 1}", ids, mask) for part, (ids, mask, _) in enumerate(chunks)]
    report.turns_rendered += trained
    if parts:  # a drifting turn dropped from a split row as too long still counts: it is rare, and a warning
        report.drifting_turns_trained_from_render += drifting_turns(row, tokenizer)
    return parts


def _split(tokenizer, messages, tools, trainable, max_length, mask_source, report):
    """Greedy chunks (ids, mask, trainable turns in it) of whole turns after the repeated head, each at most
    `max_length` tokens."""
    head_end, turns = _segments(messages)
    head = list(range(head_end))
    chunk: list[tuple[int, int]] = []
    best = None

    def encode(turn_list):
        idx = head + [i for a, b in turn_list for i in range(a, b)]
        ids, mask = _mask(tokenizer, [messages[i] for i in idx], tools, [trainable[i] for i in idx], mask_source,
                          report)
        return ids, mask, sum(trainable[a] for a, _ in turn_list)  # a: the turn's assistant message

    for turn in turns:
        candidate = encode(chunk + [turn])
        if len(candidate[0]) <= max_length:
            chunk, best = chunk + [turn], candidate
            continue
        if not chunk:  # the turn alone (just encoded) does not fit
            report.dropped_turns += 1
            continue
        yield best
        alone = encode([turn])
        if len(alone[0]) <= max_length:
            chunk, best = [turn], alone
        else:
            report.dropped_turns += 1
            chunk, best = [], None
    if chunk:
        yield best


# ---------------------------------------------------------------------------------------- batching


def token_budget_batches(lengths: Sequence[int], budget: int, *, seed: int = 0, epoch: int = 0) -> list[list[int]]:
    """Batches of example indices whose padded size (longest length x count) is at most `budget` tokens.

    Examples are sorted by length (random tie-break) and cut greedily, so each batch holds examples of
    nearly equal length and short examples travel in large batches; the batch order is then shuffled so
    the gradient stream does not go short-to-long. An example longer than the budget is a batch alone.
    Every index appears exactly once. Deterministic in (seed, epoch).
    """
    if budget < 1:
        raise UsageError(f"token budget must be >= 1, not {budget}")
    rng = random.Random(f"{seed}:{epoch}")
    order = list(range(len(lengths)))
    rng.shuffle(order)
    order.sort(key=lambda i: lengths[i])  # stable: equal lengths keep their shuffled order
    batches: list[list[int]] = []
    batch: list[int] = []
    for i in order:
        # Ascending order: the newcomer is the longest, so it sets the padded width of the batch.
        if batch and lengths[i] * (len(batch) + 1) > budget:
            batches.append(batch)
            batch = []
        batch.append(i)
    if batch:
        batches.append(batch)
    rng.shuffle(batches)
    return batches


def batches_padding_fraction(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> float:
    """Share of pad tokens when each batch of indices is padded to its longest example."""
    padded = real = 0
    for batch in batches:
        sizes = [lengths[i] for i in batch]
        if sizes:
            padded += max(sizes) * len(sizes)
            real += sum(sizes)
    return 0.0 if padded == 0 else 1 - real / padded


def default_token_budget(lengths: Sequence[int], batch_size: int) -> int:
    """`batch_size` x the mean example length: on average a batch then holds about `batch_size` examples."""
    if not lengths:
        raise UsageError("no examples to batch")
    return max(1, round(batch_size * sum(lengths) / len(lengths)))


class TokenBudgetBatchSampler:
    """A batch sampler (torch DataLoader `batch_sampler=`) of variable-size, token-budget batches.

    The Trainer calls `set_epoch` before each epoch, which reshuffles ties and the batch order. `batch_size`
    is None on purpose: it tells accelerate's sharding (DDP: every process takes every world-th batch) that
    batch sizes vary.
    """

    batch_size = None
    drop_last = False

    def __init__(self, lengths: Sequence[int], budget: int, *, seed: int = 0):
        self.lengths = list(lengths)
        self.budget = int(budget)
        self.seed = seed
        self.epoch = 0
        # Sorting makes the multiset of batch widths the same in every epoch, so the length is fixed.
        self._len = len(token_budget_batches(self.lengths, self.budget, seed=seed))

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def batches(self, epoch: int | None = None) -> list[list[int]]:
        return token_budget_batches(self.lengths, self.budget, seed=self.seed,
                                    epoch=self.epoch if epoch is None else epoch)

    def padding_fraction(self) -> float:
        return batches_padding_fraction(self.lengths, self.batches(0))

    def __iter__(self):
        return iter(self.batches())

    def __len__(self) -> int:
        return self._len


def sft_dataset(store, tokenizer, *, where: str | None = None, max_length: int | None = 2048,
                overflow: str = "split", mask_source: str = "auto", token_source: str = "auto"):
    """(datasets.Dataset of {id, input_ids, assistant_masks}, BridgeReport): one row per example, ready for
    TRL's SFTTrainer; batch it with `TokenBudgetBatchSampler` over the `input_ids` lengths."""
    from datasets import Dataset

    report = BridgeReport()
    rows = load_rows(store, where, report=report)
    examples, report = sft_examples(rows, tokenizer, max_length=max_length, overflow=overflow,
                                    mask_source=mask_source, token_source=token_source, report=report)
    if not examples:
        raise UsageError(f"no trainable examples in the store ({report.summary()})")
    return Dataset.from_list(examples), report


# ------------------------------------------------------------------------------------------- rewards


@dataclass
class RLRewards:
    """The reward RL trains on, one per row; None where it is missing (never a zero), with the count why."""

    values: list[float | None]
    source: str  # "env" or the reward recipe's name
    missing: dict[str, int] = field(default_factory=dict)  # component -> rows lacking it

    @property
    def n_missing(self) -> int:
        return sum(v is None for v in self.values)


def rl_rewards(store, rows: Sequence[TrajectoryRow], recipe=None) -> RLRewards:
    """The combined reward of `recipe` (omrl.annotate.reward: a path, mapping or RewardRecipe) for each row,
    or the env reward when no recipe is configured.

    A row lacking a component (an annotator that has not scored it, or failed) gets None and is counted
    under that component: the caller drops it rather than train on an invented zero.
    """
    if recipe is None:
        values = [row.get("reward") for row in rows]
        missing = sum(v is None for v in values)
        return RLRewards(values, "env", {"env_reward": missing} if missing else {})
    from omrl.annotate.reward import combined_reward, load_reward_recipe
    from omrl.store import Store

    store = store if isinstance(store, Store) else Store(store)
    recipe = load_reward_recipe(recipe)
    table = combined_reward(store, recipe).to_pylist()
    by_id = {r["trajectory_id"]: r for r in table}
    values: list[float | None] = []
    missing: dict[str, int] = {}
    for row in rows:
        found = by_id.get(row["id"])
        if found is None:
            raise UsageError(f"trajectory {row['id']!r} is not in store {store.path}")
        values.append(found["reward"])
        for name in filter(None, (found["missing"] or "").split(",")):
            missing[name] = missing.get(name, 0) + 1
    return RLRewards(values, recipe.name, missing)
