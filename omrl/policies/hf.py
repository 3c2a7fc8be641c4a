"""`hf:PATH`: an in-process transformers model as a policy, batched across the episodes in flight.

Concurrent `act()` calls are gathered into one left-padded, KV-cached decoding batch; each turn samples
from its own generator seeded by (episode seed, episode id, tokens so far), so a seeded run draws the
same tokens whatever batch a turn lands in (batches form by timing). Generation is token-native:
each episode keeps its token trace in `context.scratch["hf"]` (see `token_trace`): the first prompt's
ids, then every turn's sampled ids verbatim and, between turns, only the tokens of the NEW messages
(the delta of the chat-template rendering). What GRPO trains on is therefore exactly what was sampled,
never a re-tokenisation of decoded text. Each reply carries its completion ids and their logprobs
(log-softmax of logits / temperature, as TRL computes them).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from omrl.errors import UsageError
from omrl.policies.base import EpisodeContext, PolicyError, PolicyReply
from omrl.policies.parsing import parse_tool_calls, split_reasoning
from omrl.schema.messages import to_chat_template

SCRATCH_KEY = "hf"


@dataclass
class _Request:
    key: str  # the episode id: batches are generated in this order
    ids: list[int]
    temperature: float
    max_new_tokens: int
    seed: int  # this turn's sampling seed: its samples do not depend on which batch it lands in
    future: asyncio.Future
    result: tuple[list[int], list[float], bool] | None = field(default=None)


def token_trace(context: EpisodeContext | dict[str, Any]) -> dict[str, list] | None:
    """The episode's token trace: prompt_ids, completion_ids (model and env tokens), env_mask
    (1 = sampled by the model, 0 = environment/template tokens) and logprobs (0.0 on env tokens)."""
    scratch = context if isinstance(context, dict) else context.scratch
    state = scratch.get(SCRATCH_KEY)
    if state is None:
        return None
    return {key: list(state[key]) for key in ("prompt_ids", "completion_ids", "env_mask", "logprobs")}


def _cache_name(model: Any) -> str:
    """The name of the KV-cache argument and output of `model.forward`.

    transformers 5.24 renamed `past_key_values` to `cache`; GPU images often ship an older release."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class HFPolicy:
    """A transformers causal LM (a path or a loaded model + tokenizer) acting in many episodes at once."""

    @classmethod
    def from_spec(cls, arg: str, **options: Any) -> HFPolicy:
        """`hf:PATH` or `hf:NAME`: a model folder, a model omrl fetches by name (omrl models list) or a Hub name."""
        if not arg:
            raise UsageError("hf policy needs a model folder or name: hf:PATH or hf:NAME")
        return cls(arg, **options)

    def __init__(self, model: Any, tokenizer: Any = None, *, max_new_tokens: int = 64,
                 temperature: float | None = None, device: str | None = None, batch_window: float = 0.01,
                 max_batch: int = 256, name: str | None = None) -> None:
        if isinstance(model, str):
            from transformers import AutoTokenizer

            from omrl.models.load import load_model
            from omrl.models.real import resolve_model

            name = name or model
            path = resolve_model(model)  # a known name -> its cache folder (or "run: omrl models fetch NAME")
            try:
                tokenizer = tokenizer or AutoTokenizer.from_pretrained(path)
                model = load_model(path)
            except OSError as exc:
                raise PolicyError(f"cannot load model {model!r}: {exc}") from None
        if tokenizer is None:
            raise UsageError("HFPolicy needs a tokenizer when given a loaded model")
        if device is not None:
            model = model.to(device)
        self.model = model
        self.tokenizer = tokenizer
        self.name = name or getattr(model, "name_or_path", None) or "hf"
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature  # None: use the episode's temperature
        self.batch_window = batch_window
        self.max_batch = max_batch
        self.eos_text = tokenizer.eos_token
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        self.batches: list[int] = []  # size of every generate call, for tests and benchmarks
        self._pending: list[_Request] = []
        self._runner: asyncio.Task | None = None

    # ------------------------------------------------------------ the Policy protocol

    async def act(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                  context: EpisodeContext) -> PolicyReply:
        ids = self._extend_trace(messages, tools, context)
        temperature = self.temperature if self.temperature is not None else context.temperature
        max_new = context.max_tokens or self.max_new_tokens
        loop = asyncio.get_running_loop()
        request = _Request(str(context.episode_id), ids, float(temperature or 0.0), int(max_new),
                           self._turn_seed(context), loop.create_future())
        self._pending.append(request)
        if self._runner is None or self._runner.done() or self._runner.get_loop() is not loop:
            self._runner = loop.create_task(self._run_batches())
        new_ids, logprobs, ended = await request.future

        state = context.scratch[SCRATCH_KEY]
        state["completion_ids"].extend(new_ids)
        state["env_mask"].extend([1] * len(new_ids))
        state["logprobs"].extend(logprobs)
        state["ended"] = ended
        state["n_messages"] = len(messages)

        text = self.tokenizer.decode(new_ids, skip_special_tokens=True)
        content, reasoning = split_reasoning(text)
        calls: list[dict[str, Any]] = []
        if tools:  # a text environment gets the text as is, even if it looks like a ReAct action
            content, calls = parse_tool_calls(content, tools)
        return PolicyReply(content=content, tool_calls=calls, reasoning=reasoning, raw_text=text,
                           finish_reason="stop" if ended else "length", prompt_tokens=len(ids),
                           completion_tokens=len(new_ids), completion_ids=new_ids, logprobs=logprobs)

    @staticmethod
    def _turn_seed(context: EpisodeContext) -> int:
        """A seed for this turn from (episode seed, episode id, tokens so far); unseeded: from torch's RNG."""
        if context.seed is None:
            import torch

            return int(torch.randint(0, 2**62, (1,)).item())
        import hashlib

        done = len(context.scratch[SCRATCH_KEY]["completion_ids"])
        digest = hashlib.sha256(f"{context.seed}\n{context.episode_id}\n{done}".encode()).digest()
        return int.from_bytes(digest[:8], "big") >> 2

    # ------------------------------------------------------------ token-native multi-turn

    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], generation: bool) -> str:
        # The bridge renders stored conversations through the same converter: same text, same token ids.
        return self.tokenizer.apply_chat_template(to_chat_template(messages), tools=tools or None, tokenize=False,
                                                  add_generation_prompt=generation)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _extend_trace(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                      context: EpisodeContext) -> list[int]:
        """Bring the episode's token trace up to `messages`; return the ids to generate from."""
        state = context.scratch.get(SCRATCH_KEY)
        if state is None:
            prompt = self._encode(self._render(messages, tools, True))
            context.scratch[SCRATCH_KEY] = {"prompt_ids": prompt, "completion_ids": [], "env_mask": [],
                                            "logprobs": [], "n_messages": len(messages), "ended": True}
            return list(prompt)
        seen = state["n_messages"]  # messages[seen] is the reply this policy produced last turn
        if len(messages) <= seen + 1:
            raise PolicyError("HFPolicy: the conversation did not grow since the last turn")
        full = self._render(messages, tools, True)
        prefix = self._render(messages[: seen + 1], tools, False)
        end = prefix.rfind(self.eos_text)
        if not full.startswith(prefix) or end < 0:
            raise PolicyError("HFPolicy: the chat template does not render earlier turns stably; "
                              "token-native multi-turn needs a prefix-stable template")
        # The sampled reply stops at its end-of-turn token; everything after it (the template's
        # newline, the new observation, the next generation prompt) enters as environment tokens.
        delta = self._encode(full[end + len(self.eos_text):])
        if not state["ended"]:  # the reply was cut at max_new_tokens: close the turn for the model
            delta = [self.eos_id, *delta]
        state["completion_ids"].extend(delta)
        state["env_mask"].extend([0] * len(delta))
        state["logprobs"].extend([0.0] * len(delta))
        return state["prompt_ids"] + state["completion_ids"]

    # ------------------------------------------------------------ batching

    async def _run_batches(self) -> None:
        """Drain the queue: wait until no more requests arrive, then generate them in one batch."""
        while self._pending:
            while True:  # let the other episodes of this step reach act() before generating
                count = len(self._pending)
                await asyncio.sleep(self.batch_window)
                if len(self._pending) == count or len(self._pending) >= self.max_batch:
                    break
            # Arrival order depends on thread scheduling; the episode order does not. Sorting makes which
            # row draws which random numbers (and so a seeded run's samples) independent of timing.
            self._pending.sort(key=lambda r: r.key)
            batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch:]
            try:
                results = await asyncio.to_thread(self.generate_batch, [(r.ids, r.temperature, r.max_new_tokens,
                                                                         r.seed) for r in batch])
            except Exception as exc:  # every waiting episode learns why, as a policy error
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(PolicyError(f"generation failed: {exc}"))
                continue
            for request, result in zip(batch, results, strict=True):
                if not request.future.done():
                    request.future.set_result(result)

    def generate_batch(self, prompts: list[tuple[list[int], float, int, int]]
                       ) -> list[tuple[list[int], list[float], bool]]:
        """Generate for many prompts (ids, temperature, max_new_tokens, seed): (new ids, logprobs, ended) each."""
        groups: dict[tuple[float, int], list[int]] = {}
        for index, (_, temperature, max_new, _) in enumerate(prompts):
            groups.setdefault((temperature, max_new), []).append(index)
        results: list[Any] = [None] * len(prompts)
        for (temperature, max_new), indices in groups.items():
            outputs = self._generate([prompts[i][0] for i in indices], temperature, max_new,
                                     [prompts[i][3] for i in indices])
            for i, output in zip(indices, outputs, strict=True):
                results[i] = output
        return results

    def _generate(self, batch: list[list[int]], temperature: float, max_new: int, seeds: list[int]
                  ) -> list[tuple[list[int], list[float], bool]]:
        """Left-padded batched decoding with a KV cache; each row samples from its own seeded generator.

        A hand-written loop rather than `model.generate`: generate draws every row from one global RNG,
        so a row's sample would depend on the other rows of its batch (and so on timing)."""
        import torch

        self.batches.append(len(batch))
        device = next(self.model.parameters()).device
        width = max(len(ids) for ids in batch)
        input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, ids in enumerate(batch):  # left padding: every prompt ends where generation starts
            input_ids[row, width - len(ids):] = torch.tensor(ids)
            attention[row, width - len(ids):] = 1
        input_ids, attention = input_ids.to(device), attention.to(device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        sample = temperature > 0
        scale = temperature if sample else 1.0  # no top-k/top-p: logprobs match TRL's
        generators = [torch.Generator().manual_seed(seed) for seed in seeds] if sample else []
        tokens: list[list[int]] = [[] for _ in batch]
        logps: list[list[float]] = [[] for _ in batch]
        open_rows = set(range(len(batch)))
        cache_name = _cache_name(self.model)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                out = self.model(input_ids=input_ids, attention_mask=attention, position_ids=positions,
                                 use_cache=True)
                for step in range(max_new):
                    logprobs = torch.log_softmax(out.logits[:, -1].float().cpu() / scale, dim=-1)
                    if sample:
                        probs = logprobs.exp()
                        chosen = [int(torch.multinomial(probs[row], 1, generator=generators[row]))
                                  for row in range(len(batch))]
                    else:
                        chosen = logprobs.argmax(-1).tolist()
                    for row in list(open_rows):
                        tokens[row].append(chosen[row])
                        logps[row].append(float(logprobs[row, chosen[row]]))
                        if chosen[row] == self.eos_id:
                            open_rows.discard(row)
                    if not open_rows or step == max_new - 1:
                        break
                    attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=1)
                    positions = positions[:, -1:] + 1
                    out = self.model(input_ids=torch.tensor(chosen, device=device)[:, None],
                                     attention_mask=attention, position_ids=positions,
                                     **{cache_name: getattr(out, cache_name)}, use_cache=True)
        finally:
            self.model.train(was_training)
        return [(tokens[row], logps[row], bool(tokens[row]) and tokens[row][-1] == self.eos_id)
                for row in range(len(batch))]
