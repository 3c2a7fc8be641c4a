"""GAE for multi-turn agents: environment tokens skipped, at token or at turn level (pure torch).

A multi-turn episode is one token sequence: the model's tokens (mask 1, trainable) with the
environment's and the chat template's tokens between them (mask 0). The rules here:

- Environment tokens get no advantage, no return, no value loss, and they do not break the
  recursion: they are skipped, so gamma and lambda apply per trainable step, never per observation
  token (an observation of 40 tokens does not decay the reward 40 times).
- A reward that sits on a masked token (a terminal reward after trailing environment tokens) is moved
  to the trainable token before it, undecayed: it always reaches the last assistant token.
- `token` level: every trainable token is a step; each turn's reward is placed on the turn's last
  trainable token (`place_turn_rewards`).
- `turn` level: one step per assistant turn; the turn's value is read at its first trainable token
  (the state the turn acts from), its reward is every reward of the turn (the one on its last
  trainable token) and the masked tokens after it; all tokens of the turn share the turn's advantage,
  and the value is trained at the turn's first token only.

    rewards = place_turn_rewards(mask, [[0.0, 1.0]])            # two turns, reward at the end of the 2nd
    out = gae(rewards, values, mask, gamma=1.0, lam=0.95, level="turn")
    adv = masked_whiten(out.advantages, mask)                  # statistics over trainable tokens only

Tensors are [batch, time]; `mask` is 1/0 (bool or float).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import get_args

import torch

from omrl.errors import UsageError
from omrl.train.config.ppo import GAELevel

LEVELS = get_args(GAELevel)


@dataclass
class GAEResult:
    advantages: torch.Tensor  # [B, T]; 0 on masked tokens
    returns: torch.Tensor  # [B, T]; value targets, 0 where value_mask is 0
    value_mask: torch.Tensor  # [B, T] float; where the value is trained (token: every trainable token)


def turn_spans(mask_row: torch.Tensor | Sequence[int]) -> list[tuple[int, int]]:
    """The assistant turns of one sequence: (first, last) index of each run of trainable tokens."""
    values = [bool(v) for v in (mask_row.tolist() if isinstance(mask_row, torch.Tensor) else mask_row)]
    spans, start = [], None
    for i, on in enumerate(values):
        if on and start is None:
            start = i
        elif not on and start is not None:
            spans.append((start, i - 1))
            start = None
    if start is not None:
        spans.append((start, len(values) - 1))
    return spans


def place_turn_rewards(mask: torch.Tensor, turn_rewards: Sequence[Sequence[float]],
                       terminal: Sequence[float] | None = None) -> torch.Tensor:
    """Token rewards [B, T]: turn k's reward on the last trainable token of the k-th trainable run.

    `terminal[b]` (a reward the turns do not carry, e.g. an episode-level score) goes on the row's last
    trainable token, never on a trailing environment token. Turns beyond the runs found (a turn whose
    reply was empty) add to the last run; a row without trainable tokens gets no reward.
    """
    out = torch.zeros(mask.shape, dtype=torch.float32)
    if len(turn_rewards) != mask.shape[0]:
        raise UsageError(f"{len(turn_rewards)} reward lists for {mask.shape[0]} sequences")
    for b, rewards in enumerate(turn_rewards):
        spans = turn_spans(mask[b])
        if not spans:
            continue
        for k, reward in enumerate(rewards):
            out[b, spans[min(k, len(spans) - 1)][1]] += float(reward)
        if terminal is not None:
            out[b, spans[-1][1]] += float(terminal[b])
    return out


def masked_gae(rewards: torch.Tensor, values: torch.Tensor, step_mask: torch.Tensor, gamma: float = 1.0,
               lam: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over the positions where `step_mask` is 1, in order; the others are skipped.

    delta_k = r_k + gamma * V_{k+1} - V_k and A_k = delta_k + gamma * lam * A_{k+1} over the steps k of
    a row (V after its last step is 0: the episode ended). A reward on a skipped position is added to
    the step before it. Returns (advantages, returns = A + V), both 0 off the steps.
    """
    if rewards.shape != values.shape or rewards.shape != step_mask.shape:
        raise UsageError(f"shapes differ: rewards {tuple(rewards.shape)}, values {tuple(values.shape)}, "
                         f"mask {tuple(step_mask.shape)}")
    rewards, values = rewards.float(), values.float()
    on = step_mask.bool()
    batch, length = rewards.shape
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros(batch, dtype=rewards.dtype, device=rewards.device)
    next_adv = torch.zeros_like(next_value)
    pending = torch.zeros_like(next_value)  # rewards of skipped positions, waiting for the step before them
    for t in range(length - 1, -1, -1):
        m = on[:, t]
        reward = rewards[:, t] + pending
        delta = reward + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        advantages[:, t] = torch.where(m, adv, torch.zeros_like(adv))
        next_value = torch.where(m, values[:, t], next_value)
        next_adv = torch.where(m, adv, next_adv)
        pending = torch.where(m, torch.zeros_like(pending), reward)
    returns = torch.where(on, advantages + values, torch.zeros_like(advantages))
    return advantages, returns


def turn_starts(mask: torch.Tensor) -> torch.Tensor:
    """1 at the first trainable token of every assistant turn (a 0 -> 1 edge), else 0."""
    on = mask.bool()
    before = torch.zeros_like(on)
    before[:, 1:] = on[:, :-1]
    return (on & ~before).float()


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 1.0,
        level: str = "token") -> GAEResult:
    """Advantages and value targets at `token` or `turn` level (see the module doc)."""
    if level not in LEVELS:
        raise UsageError(f"level must be one of {LEVELS}, got {level!r}")
    mask_f = mask.float()
    if level == "token":
        advantages, returns = masked_gae(rewards, values, mask_f, gamma, lam)
        return GAEResult(advantages, returns, mask_f)
    starts = turn_starts(mask)
    step_adv, returns = masked_gae(rewards, values, starts, gamma, lam)
    # Every token of a turn takes its turn's advantage: the index of the latest turn start, carried forward.
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(starts)
    latest = torch.where(starts.bool(), positions, torch.zeros_like(positions)).cummax(dim=1).values
    advantages = step_adv.gather(1, latest) * mask_f
    return GAEResult(advantages, returns, starts)


# `reduce` (optional): sums a tensor over the training processes (no gradient), so that the statistics
# below are those of the whole batch, not of one process's share; None: this process's tensors only.
Reduce = Callable[[torch.Tensor], torch.Tensor]


def masked_mean(values: torch.Tensor, mask: torch.Tensor, reduce: Reduce | None = None) -> torch.Tensor:
    """Mean of `values` over the masked-in entries (0 when there is none)."""
    mask = mask.float()
    total, count = (values * mask).sum(), mask.sum()
    if reduce is not None:
        total, count = reduce(torch.stack([total.detach(), count]))
    return total / count.clamp(min=1.0)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True,
               reduce: Reduce | None = None) -> torch.Tensor:
    """Variance over the masked-in entries (two passes: the mean first, then the squared deviations)."""
    mask = mask.float()
    mean = masked_mean(values, mask, reduce)
    squares, count = (((values - mean) * mask) ** 2).sum(), mask.sum()
    if reduce is not None:
        squares, count = reduce(torch.stack([squares.detach(), count]))
    var = squares / count.clamp(min=1.0)
    if unbiased and count > 1:
        var = var * count / (count - 1)
    return var


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8,
                  reduce: Reduce | None = None) -> torch.Tensor:
    """(x - mean) / std with mean and std over the masked-in entries only; 0 on the others."""
    mean, var = masked_mean(values, mask, reduce), masked_var(values, mask, reduce=reduce)
    whitened = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * mask.float()


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
                       reduce: Reduce | None = None) -> float:
    """1 - Var(returns - values) / Var(returns) over the masked-in entries (nan when returns are flat)."""
    var_returns = masked_var(returns, mask, reduce=reduce)
    if float(var_returns) == 0.0:
        return float("nan")
    return float(1.0 - masked_var(returns - values, mask, reduce=reduce) / var_returns)
