"""Group-relative advantages (GRPO): each trajectory's reward compared with the others of its group."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence


def group_advantages(rewards: Sequence[float], group_ids: Sequence[str], *, scale_std: bool = True,
                     eps: float = 1e-4) -> list[float]:
    """(r - group mean) / (group std + eps), std with Bessel's correction as TRL computes it.

    A flat group (all rewards equal) and a group of one give zeros: they carry no signal about which
    attempt was better. With `scale_std=False` the advantage is r - mean (Dr. GRPO's unbiased variant).
    """
    if len(rewards) != len(group_ids):
        raise ValueError(f"{len(rewards)} rewards but {len(group_ids)} group ids")
    members: dict[str, list[int]] = defaultdict(list)
    for i, (reward, group) in enumerate(zip(rewards, group_ids, strict=True)):
        if reward is None or not math.isfinite(reward):
            raise ValueError(f"reward {i} (group {group!r}) is {reward!r}: drop or annotate it before training")
        members[group].append(i)
    out = [0.0] * len(rewards)
    for indices in members.values():
        values = [float(rewards[i]) for i in indices]
        mean = sum(values) / len(values)
        if len(values) < 2 or max(values) - min(values) == 0:
            continue
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
        for i, value in zip(indices, values, strict=True):
            out[i] = (value - mean) / (std + eps) if scale_std else value - mean
    return out


def flat_groups(rewards: Sequence[float], group_ids: Sequence[str]) -> set[str]:
    """Groups whose rewards are all equal (no learning signal for GRPO)."""
    seen: dict[str, set[float]] = defaultdict(set)
    for reward, group in zip(rewards, group_ids, strict=True):
        seen[group].add(float(reward))
    return {group for group, values in seen.items() if len(values) == 1}
