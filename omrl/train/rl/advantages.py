"""Group-relative advantages (GRPO): each trajectory's reward compared with the others of its group."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from omrl.errors import UsageError
from omrl.schema.rows import TrajectoryRow


def group_advantages(rewards: Sequence[float], group_ids: Sequence[str], *, scale_std: bool = True,
                     eps: float = 1e-4) -> list[float]:
    """(r - group mean) / (group std + eps), std with Bessel's correction as TRL computes it.

    A flat group (all rewards equal) and a group of one give zeros: they carry no signal about which
    attempt was better. With `scale_std=False` the advantage is r - mean (Dr. GRPO's unbiased variant).
    """
    if len(rewards) != len(group_ids):
        raise UsageError(f"{len(rewards)} rewards but {len(group_ids)} group ids")
    members: dict[str, list[int]] = defaultdict(list)
    for i, (reward, group) in enumerate(zip(rewards, group_ids, strict=True)):
        if reward is None or not math.isfinite(reward):
            raise UsageError(f"reward {i} (group {group!r}) is {reward!r}: drop or annotate it before training")
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


def turn_rewards(row: TrajectoryRow, episode_reward: float | None = None) -> list[float] | None:
    """Per-turn rewards of a stored trajectory (turns[].reward, what the environment paid each step), for
    turn- or token-level advantages (omrl/train/rl/gae.py, the PPO path).

    `episode_reward`: the reward the episode is trained on when it is not the environment's (a reward
    recipe's combined reward, e.g. a judge's score): the difference from the turns' sum is paid on the last
    turn, so the turns add up to it and the environment's shaping is kept. None when there is nothing to
    train on: a failed episode, no turns, or a missing combined reward (never a 0 in its place).
    """
    turns = row.get("turns") or []
    if not turns:
        return None
    values = [float(t.get("reward") or 0.0) for t in turns]  # a turn without a reward paid nothing
    if episode_reward is None:
        if row.get("reward") is None:
            return None
        return values
    if not math.isfinite(episode_reward):
        raise UsageError(f"episode reward {episode_reward!r} of {row.get('id')!r} is not finite")
    values[-1] += episode_reward - sum(values)
    return values
