"""GRPO with step credit: TRL 1.16's GRPOTrainer, its episode advantage plus a per-token term that
rollout_func supplies (omrl/train/rl/step_credit.py: weight * the turn's step advantage on that turn's tokens).

    Trainer = step_credit_trainer()          # a GRPOTrainer subclass; TRL is imported on first use
    trainer = Trainer(model=..., reward_funcs=..., args=GRPOConfig(...), rollout_func=rollout, ...)

How TRL 1.16 gets there, and why one override suffices: the keys of rollout_func's output other than
prompt_ids / completion_ids / logprobs are copied onto `inputs` (one dict per rollout of this process)
inside `_generate_and_score_completions`, which then computes the group advantages of the rewards,
shape (B,), and returns them as `output["advantages"]`; `_compute_loss` unsqueezes only a 1-D
advantage, so a (B, T) one multiplies each token's clipped surrogate as it is. The subclass runs TRL's
method, then replaces the advantages with (episode advantage[b] + step[b][t]) * loss mask[b, t], where
step[b] is the rollout's `omrl_step_advantages` (a list per completion token, 0 on environment tokens).
The episode part stays TRL's (its scale_rewards, its unscorable-reward handling, its cross-process
group statistics); only the step term comes from omrl. A token whose total advantage is 0 (a flat
group and a step group without contrast) then gets no gradient from the surrogate.

Limits: the loss types whose surrogate is per token (SUPPORTED_LOSSES; vespo weighs whole sequences by
the advantage's sign and is refused), and the step term is computed by each process's rollout_func from
its own rollouts, so a GRPO group must not be split across processes (one process on a CPU).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

from omrl.errors import UsageError
from omrl.schema.rows import TrajectoryRow

STEP_ADVANTAGES = "omrl_step_advantages"  # the rollout_func output key (one list per rollout)
SUPPORTED_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo", "sapo")


def add_step_advantages(output: dict[str, Any], step_values: Sequence[Sequence[float] | None]) -> dict[str, Any]:
    """`output` of GRPOTrainer._generate_and_score_completions with its (B,) advantages replaced by
    (B, T) ones: (advantage[b] + step_values[b][t]) * loss mask (completion_mask, times tool_mask if any).

    `step_values[b]` has one value per completion token of rollout b before padding (shorter than T:
    the padding gets 0). A missing list or a longer one is a ValueError: the rollouts and the step
    credit no longer match, and training on a misaligned advantage would be silent damage."""
    import torch

    advantages = output["advantages"]
    completion_mask = output["completion_mask"]
    batch, length = completion_mask.shape
    if advantages.dim() != 1 or advantages.shape[0] != batch:
        raise UsageError(f"expected TRL's per-rollout advantages of shape ({batch},), got {tuple(advantages.shape)}")
    if len(step_values) != batch:
        raise UsageError(f"{len(step_values)} step-advantage lists for {batch} rollouts")
    step = torch.zeros((batch, length), dtype=advantages.dtype, device=advantages.device)
    for b, values in enumerate(step_values):
        if values is None:
            raise UsageError(f"rollout {b} has no {STEP_ADVANTAGES}: rollout_func must return one list per rollout")
        if len(values) > length:
            raise UsageError(f"rollout {b}: {len(values)} step advantages for {length} completion tokens")
        step[b, : len(values)] = torch.as_tensor([float(v) for v in values], dtype=advantages.dtype)
    mask = completion_mask if output.get("tool_mask") is None else completion_mask * output["tool_mask"]
    output["advantages"] = (advantages.unsqueeze(1) + step) * mask.to(advantages.dtype)
    return output


def rollout_step_advantages(rows: Sequence[TrajectoryRow], env_masks: Sequence[Sequence[int]], settings: Any,
                            rewards: Sequence[float | None] | None = None) -> list[list[float]]:
    """For rollout_func, between playing a step and storing it: the step credit of the step's rows (whole
    GRPO groups; `rewards` the ones TRL is given, default each row's), written into each turn's
    info["credit"] (rows changed in place, so it is stored) and returned as the STEP_ADVANTAGES lists
    (one per rollout, aligned with its env_mask; weight * step advantage on each turn's tokens)."""
    from omrl.train.rl.step_credit import credit_rows, step_token_advantages, store_in_turns

    credit = credit_rows(rows, settings, rewards)
    store_in_turns(rows, credit)
    return step_token_advantages(env_masks, credit)


@cache
def step_credit_trainer() -> type:
    """TRL's GRPOTrainer with per-token step advantages from rollout_func (see the module doc)."""
    from trl import GRPOTrainer

    class StepCreditGRPOTrainer(GRPOTrainer):
        """GRPOTrainer whose advantages are TRL's episode advantage + rollout_func's per-token step term."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if self.loss_type not in SUPPORTED_LOSSES:
                raise UsageError(f"step credit needs a per-token loss ({', '.join(SUPPORTED_LOSSES)}), "
                                 f"not loss_type={self.loss_type!r}")
            if self.rollout_func is None:
                raise UsageError(f"step credit needs a rollout_func that returns {STEP_ADVANTAGES}")

        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)  # copies the extra fields onto inputs
            episode = output["advantages"].clone()
            output = add_step_advantages(output, [x.get(STEP_ADVANTAGES) for x in inputs])
            # Logged: how large the step term is next to the episode advantage, over the trained tokens.
            mask = output["completion_mask"] * output.get("tool_mask", 1)
            step = (output["advantages"] - episode.unsqueeze(1)) * mask
            mode = "train" if self.model.training else "eval"
            tokens = float(mask.sum().clamp(min=1))
            self._metrics[mode]["step_credit/step_abs_mean"].append(float(step.abs().sum()) / tokens)
            self._metrics[mode]["step_credit/episode_abs_mean"].append(
                float((episode.abs().unsqueeze(1) * mask).sum()) / tokens)
            return output

    return StepCreditGRPOTrainer
