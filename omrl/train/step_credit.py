"""Step-level credit from anchor states (GiGPO-style): steps of a GRPO group that act from the same
environment state form a step group, and each step is compared with the others of its group.

    credit = step_credit([EpisodeSteps("task-1", 1.0, [0.0, 1.0], ["s0", "s1"]), ...], gamma=0.95)
    credit.advantages[i][k]   # episode advantage of i + weight * step advantage of its turn k

- Episode advantage: the GRPO group advantage of the episode's reward (omrl.train.advantages).
- Step return: the discounted sum of the turn rewards from that turn on, gamma per turn.
- Step group: (episode group, state the turn acts from). A state of None is a group of its own.
- Step advantage: the group advantage of the step returns within the step group (0 for a group of one
  or a flat group: nothing to compare).

`turn_states(row)` reads the states a stored row's turns act from: environments report a hashable key
as `info["state"]` after each step (the state that step led to); the first turn acts from the reset
state, which every episode of a task shares. Pure Python; nothing here is wired into GRPO yet.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from omrl.train.advantages import group_advantages

RESET_STATE = "<reset>"


@dataclass
class EpisodeSteps:
    group: str  # the GRPO group (run, round, task)
    reward: float  # the episode's reward
    turn_rewards: Sequence[float]
    states: Sequence[Hashable | None]  # the state each turn acts from (len == len(turn_rewards))


@dataclass
class StepCredit:
    episode_advantages: list[float]
    step_returns: list[list[float]]
    step_groups: list[list[str | None]]  # the step group key of every turn (None: a group of its own)
    step_group_sizes: list[list[int]]
    step_advantages: list[list[float]]
    advantages: list[list[float]] = field(default_factory=list)  # combined, per turn


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    out, running = [0.0] * len(rewards), 0.0
    for k in range(len(rewards) - 1, -1, -1):
        running = float(rewards[k]) + gamma * running
        out[k] = running
    return out


def step_credit(episodes: Sequence[EpisodeSteps], *, gamma: float = 0.95, weight: float = 1.0,
                scale_std: bool = True, eps: float = 1e-4) -> StepCredit:
    """Episode, step and combined advantages of a batch of GRPO groups (see the module doc)."""
    for i, e in enumerate(episodes):
        if len(e.states) != len(e.turn_rewards):
            raise ValueError(f"episode {i}: {len(e.states)} states for {len(e.turn_rewards)} turns")
    episode_adv = group_advantages([e.reward for e in episodes], [e.group for e in episodes],
                                   scale_std=scale_std, eps=eps)
    returns = [discounted_returns(e.turn_rewards, gamma) for e in episodes]
    keys: list[list[str | None]] = [
        [None if state is None else json.dumps([e.group, repr(state)]) for state in e.states] for e in episodes]
    flat_returns, flat_keys = [], []
    for i, episode_keys in enumerate(keys):
        for k, key in enumerate(episode_keys):
            flat_returns.append(returns[i][k])
            flat_keys.append(key if key is not None else json.dumps([i, k, "own"]))  # a group of its own
    sizes: dict[str, int] = {}
    for key in flat_keys:
        sizes[key] = sizes.get(key, 0) + 1
    flat_adv = group_advantages(flat_returns, flat_keys, scale_std=scale_std, eps=eps) if flat_keys else []
    step_adv, step_sizes, combined, n = [], [], [], 0
    for i, episode_keys in enumerate(keys):
        count = len(episode_keys)
        step_adv.append(flat_adv[n: n + count])
        step_sizes.append([sizes[key] for key in flat_keys[n: n + count]])
        combined.append([episode_adv[i] + weight * a for a in flat_adv[n: n + count]])
        n += count
    return StepCredit(episode_adv, returns, keys, step_sizes, step_adv, combined)


def turn_states(row: dict[str, Any], reset_state: Hashable = RESET_STATE) -> list[Hashable | None]:
    """The state each turn of a stored row acts from: the reset state, then each step's `info["state"]`
    (None where an environment did not report one, or a turn made several steps without one)."""
    states: list[Hashable | None] = []
    previous: Hashable | None = reset_state
    for turn in row.get("turns") or []:
        states.append(previous)
        try:
            info = json.loads(turn.get("info") or "{}")
        except (TypeError, ValueError):
            info = {}
        state = info.get("state") if isinstance(info, dict) else None
        if state is None and isinstance(info, dict) and info.get("steps"):
            last = info["steps"][-1]
            state = last.get("state") if isinstance(last, dict) else None
        previous = json.dumps(state, sort_keys=True) if isinstance(state, (list, dict)) else state
    return states
