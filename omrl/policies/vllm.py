"""A policy that generates through TRL's vLLM integration (GRPO with use_vllm), with HFPolicy's token traces.

    policy = VLLMPolicy.from_trainer(trainer)          # inside a GRPO rollout_func, on a GPU machine
    episodes = await play_episodes(jobs, None, policy, settings, run_id="grpo")

Generation goes through `trainer.vllm_generation` (trl.generation.vllm_generation.VLLMGeneration), the
object GRPOTrainer builds when use_vllm is set, in both its modes: "colocate" (a vLLM engine in the
training process) and "server" (`trl vllm-serve`, reached through trl.extras.vllm_client). Its call is

    generate(prompts: list[list[int]], images, num_generations, profiler=None)
        -> (prompt_ids, completion_ids, logprobs[seq][token][k], logprob_token_ids[seq][token][k] | None)

Weights: GRPOTrainer calls `vllm_generation.sync_weights()` itself before each step's rollout_func when
the step changed, so a policy made from the trainer always samples from the current weights.

Everything else is HFPolicy's (omrl/policies/hf.py): the token-native multi-turn trace in
context.scratch["hf"] (prompt ids, then sampled ids verbatim and the environment's tokens masked), the
batching of concurrent act() calls, tool-call parsing. Differences, by vLLM's API:
- Sampling settings live on the generator (temperature, max_completion_length); each batch sets them
  for its group of turns and puts them back after.
- Samples are not seeded per episode (VLLMGeneration has no per-request seed): a seeded run is not
  reproducible the way HFPolicy's is.
- In server mode with several training processes, generate() is a collective: every process must call
  it equally often, which multi-turn episodes of different lengths do not guarantee. One process (or
  colocate mode) is the supported setting.
"""

from __future__ import annotations

from typing import Any

from omrl.policies.base import PolicyError
from omrl.policies.hf import HFPolicy


class VLLMPolicy(HFPolicy):
    """HFPolicy's traces and batching, with generation done by a TRL VLLMGeneration (or anything with its API)."""

    def __init__(self, generator: Any, tokenizer: Any, *, max_new_tokens: int = 64, temperature: float | None = None,
                 batch_window: float = 0.01, max_batch: int = 256, name: str | None = None) -> None:
        for needed in ("generate", "temperature", "max_completion_length"):
            if not hasattr(generator, needed):
                raise TypeError(f"VLLMPolicy needs a trl VLLMGeneration-like generator; {generator!r} has no "
                                f"{needed!r}")
        super().__init__(None, tokenizer, max_new_tokens=max_new_tokens, temperature=temperature,
                         batch_window=batch_window, max_batch=max_batch, name=name or "vllm")
        self.generator = generator

    @classmethod
    def from_trainer(cls, trainer: Any, **options: Any) -> VLLMPolicy:
        """The policy of a GRPOTrainer built with use_vllm=True (its vllm_generation and tokenizer)."""
        generator = getattr(trainer, "vllm_generation", None)
        if generator is None:
            raise PolicyError("the trainer has no vLLM generation: build it with use_vllm=True (needs a GPU and vllm)")
        tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
        options.setdefault("max_new_tokens", trainer.args.max_completion_length)
        options.setdefault("name", getattr(trainer.model, "name_or_path", None) or "vllm")
        return cls(generator, tokenizer, **options)

    def _generate(self, batch: list[list[int]], temperature: float, max_new: int, seeds: list[int]
                  ) -> list[tuple[list[int], list[float], bool]]:
        """One generator call for prompts sharing (temperature, max_new): (new ids, logprobs, ended) each."""
        self.batches.append(len(batch))
        generator = self.generator
        saved = generator.temperature, generator.max_completion_length
        # vLLM treats temperature 0 as greedy, as HFPolicy does.
        generator.temperature, generator.max_completion_length = float(temperature), int(max_new)
        try:
            _, completions, logprobs, logprob_ids = generator.generate(prompts=[list(ids) for ids in batch],
                                                                      images=None, num_generations=1)
        finally:
            generator.temperature, generator.max_completion_length = saved
        if len(completions) != len(batch) or logprobs is None or len(logprobs) != len(batch):
            raise PolicyError(f"vLLM returned {len(completions)} completions and "
                              f"{'no' if logprobs is None else len(logprobs)} logprob lists for {len(batch)} prompts "
                              "(generation needs logprobs: VLLMGeneration's logprobs must not be None)")
        out = []
        for row, ids in enumerate(completions):
            ids = [int(i) for i in ids][:max_new]
            sampled = self._sampled_logprobs(ids, logprobs[row], None if logprob_ids is None else logprob_ids[row])
            out.append((ids, sampled, bool(ids) and ids[-1] == self.eos_id))
        return out

    @staticmethod
    def _sampled_logprobs(ids: list[int], per_token: list[list[float | None]],
                          per_token_ids: list[list[int]] | None) -> list[float]:
        """The logprob of each sampled token: the entry whose id is the sampled one when ids are given (vLLM
        always includes the sampled token), else the first (TRL's choice with logprobs=0)."""
        if len(per_token) < len(ids):
            raise PolicyError(f"vLLM returned {len(per_token)} logprobs for {len(ids)} tokens")
        out = []
        for position, token in enumerate(ids):
            values = per_token[position]
            index = 0
            if per_token_ids is not None and token in per_token_ids[position]:
                index = per_token_ids[position].index(token)
            value = values[index] if values else None
            if value is None:  # TRL turns vLLM's NaN into None
                raise PolicyError(f"vLLM returned no logprob for sampled token {token} at position {position}")
            out.append(float(value))
        return out
