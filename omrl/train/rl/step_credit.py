"""Step-level credit from anchor states (GiGPO-style): steps of a GRPO group that act from the same
environment state form a step group, and each step is compared with the others of its group.

    credit = step_credit([EpisodeSteps("task-1", 1.0, [0.0, 1.0], ["s0", "s1"]), ...], gamma=0.95)
    credit.advantages[i][k]   # episode advantage of i + weight * step advantage of its turn k

- Episode advantage: the GRPO group advantage of the episode's reward (omrl.train.rl.advantages).
- Step return: the discounted sum of the turn rewards from that turn on, gamma per turn.
- Step group: (episode group, anchor the turn acts from: the state, or with `anchor: visited` the state and
  the set of states before it). An anchor of None is a group of its own.
- Step advantage: the group advantage of the step returns within the step group (0 for a group of one
  or a flat group: nothing to compare).
- An episode without a reward (failed, or a missing judge score) is left out of every group and gets
  advantage 0 everywhere, as TRL leaves it out of its group's baseline: never scored as 0.

From stored rows (what GRPO's rollout_func holds after a step): `credit_rows(rows, settings)` reads each
row's group_id, turn rewards and the states its turns act from (`turn_states`: environments report a
hashable key as `info["state"]` after each step, the state that step led to; the first turn acts from
the reset state, which every episode of a task shares); `store_in_turns` writes each turn's step group,
size, return and advantages into its `info["credit"]`, so they are stored with the rollout and visible in
SQL (`json_extract(info, '$.credit.step_advantage')` in the turns view); `token_advantages` spreads
per-turn values over each turn's trainable tokens (env_mask 1; environment tokens 0), which is what
omrl/train/rl/grpo_credit.py adds to TRL's episode advantage. Pure Python (token_advantages reads the
turns' token runs with omrl.train.rl.gae.turn_spans, which loads torch).
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from omrl.errors import UsageError
from omrl.schema.payloads import info_of
from omrl.schema.rows import TrajectoryRow
from omrl.train.rl.advantages import group_advantages

RESET_STATE = "<reset>"
Anchor = Literal["state", "visited"]  # what makes two steps comparable
ANCHORS = get_args(Anchor)


@dataclass
class StepCreditSettings:
    """GiGPO-style step credit for GRPO (a recipe's `step_credit` section)."""

    weight: float = field(default=1.0, metadata={
        "help": "weight of the step advantage: advantage = episode advantage + weight * step advantage "
                "(GiGPO's omega; 0 is plain GRPO)"})
    gamma: float = field(default=0.95, metadata={
        "help": "discount per turn of the step returns that step groups compare (GiGPO's default)"})
    scale_std: bool = field(default=True, metadata={
        "help": "divide step advantages by their step group's std (false: r - mean, Dr. GRPO style)"})
    anchor: Anchor = field(default="state", metadata={
        "help": "what makes two steps comparable: state (the environment's state, GiGPO's anchor) or visited "
                "(that state and the set of states the episode saw before it: for partially observed games, "
                "where the right move depends on what was already searched)"})


@dataclass
class EpisodeSteps:
    group: str  # the GRPO group (run, round, task)
    reward: float | None  # the episode's reward; None: failed or unscored, left out of every group
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
    weight: float = 1.0
    scored: list[bool] = field(default_factory=list)  # False: no reward, left out of every group


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
            raise UsageError(f"episode {i}: {len(e.states)} states for {len(e.turn_rewards)} turns")
    scored = [i for i, e in enumerate(episodes) if e.reward is not None]
    episode_adv = [0.0] * len(episodes)
    for i, a in zip(scored, group_advantages([episodes[i].reward for i in scored],
                                             [episodes[i].group for i in scored], scale_std=scale_std, eps=eps),
                    strict=True):
        episode_adv[i] = a
    returns = [discounted_returns(e.turn_rewards, gamma) for e in episodes]
    keys: list[list[str | None]] = [
        [None if state is None or e.reward is None else json.dumps([e.group, repr(state)]) for state in e.states]
        for e in episodes]
    flat_returns, flat_keys = [], []
    for i in scored:
        for k, key in enumerate(keys[i]):
            flat_returns.append(returns[i][k])
            flat_keys.append(key if key is not None else json.dumps([i, k, "own"]))  # a group of its own
    sizes: dict[str, int] = {}
    for key in flat_keys:
        sizes[key] = sizes.get(key, 0) + 1
    flat_adv = group_advantages(flat_returns, flat_keys, scale_std=scale_std, eps=eps) if flat_keys else []
    step_adv = [[0.0] * len(e.turn_rewards) for e in episodes]
    step_sizes = [[0] * len(e.turn_rewards) for e in episodes]
    n = 0
    for i in scored:
        count = len(keys[i])
        step_adv[i] = flat_adv[n: n + count]
        step_sizes[i] = [sizes[key] for key in flat_keys[n: n + count]]
        n += count
    combined = [[episode_adv[i] + weight * a for a in step_adv[i]] for i in range(len(episodes))]
    return StepCredit(episode_adv, returns, keys, step_sizes, step_adv, combined, weight,
                      [e.reward is not None for e in episodes])


def turn_states(row: TrajectoryRow, reset_state: Hashable = RESET_STATE) -> list[Hashable | None]:
    """The state each turn of a stored row acts from: the reset state, then each step's `info["state"]`
    (None where an environment did not report one, or a turn made several steps without one)."""
    states: list[Hashable | None] = []
    previous: Hashable | None = reset_state
    for turn in row.get("turns") or []:
        states.append(previous)
        info = info_of(turn)
        state = info.get("state")
        if state is None and info.get("steps"):
            last = info["steps"][-1]
            state = last.get("state") if isinstance(last, dict) else None
        previous = json.dumps(state, sort_keys=True) if isinstance(state, (list, dict)) else state
    return states


def visited_states(states: Sequence[Hashable | None]) -> list[Hashable | None]:
    """Each state paired with the set of states before it in the episode (sorted): the anchor `visited`.
    After an unknown state (None) the set is unknown too: None from there on."""
    out: list[Hashable | None] = []
    seen: set[str] = set()
    for state in states:
        if state is None or (out and out[-1] is None):
            out.append(None)
            continue
        out.append((state, tuple(sorted(seen))))
        seen.add(repr(state))
    return out


def episodes_from_rows(rows: Sequence[TrajectoryRow], rewards: Sequence[float | None] | None = None,
                       anchor: str = "state") -> list[EpisodeSteps]:
    """One EpisodeSteps per stored row: its group_id, the anchors its turns act from (`anchor`:
    StepCreditSettings.anchor), its turn rewards.

    `rewards` (default: each row's reward) is the episode reward GRPO trains on, e.g. a combined judge
    score; what the turn rewards do not account for is added to the last turn, so with gamma 1 the
    step return of the first turn is the episode reward."""
    if rewards is not None and len(rewards) != len(rows):
        raise UsageError(f"{len(rewards)} rewards for {len(rows)} rows")
    out = []
    for i, row in enumerate(rows):
        reward = row.get("reward") if rewards is None else rewards[i]
        turn_rewards = [float(t.get("reward") or 0.0) for t in row.get("turns") or []]
        if reward is not None and turn_rewards:
            turn_rewards[-1] += float(reward) - sum(turn_rewards)
        states = turn_states(row)
        out.append(EpisodeSteps(str(row.get("group_id") or row.get("task_id")), reward, turn_rewards,
                                visited_states(states) if anchor == "visited" else states))
    return out


def credit_rows(rows: Sequence[TrajectoryRow], settings: StepCreditSettings | None = None,
                rewards: Sequence[float | None] | None = None) -> StepCredit:
    """Step credit of a batch of stored rows (one or more whole GRPO groups) as `settings` say."""
    settings = settings or StepCreditSettings()
    return step_credit(episodes_from_rows(rows, rewards, settings.anchor), gamma=settings.gamma, weight=settings.weight,
                       scale_std=settings.scale_std)


def store_in_turns(rows: Sequence[TrajectoryRow], credit: StepCredit) -> None:
    """Write each turn's credit into its info JSON (rows changed in place, before they are appended):
    `info["credit"]` = group (the step group key, null: alone), size, return, episode_advantage,
    step_advantage and advantage (combined)."""
    if len(rows) != len(credit.step_groups):
        raise UsageError(f"credit for {len(credit.step_groups)} episodes, {len(rows)} rows")
    for i, row in enumerate(rows):
        turns = row.get("turns") or []
        if len(turns) != len(credit.step_groups[i]):
            raise UsageError(f"row {row.get('id')}: {len(turns)} turns, credit for {len(credit.step_groups[i])}")
        for k, turn in enumerate(turns):
            info = info_of(turn)
            info["credit"] = {"group": credit.step_groups[i][k], "size": credit.step_group_sizes[i][k],
                              "return": credit.step_returns[i][k], "episode_advantage": credit.episode_advantages[i],
                              "step_advantage": credit.step_advantages[i][k], "advantage": credit.advantages[i][k]}
            turn["info"] = json.dumps(info, ensure_ascii=False, default=str)


def token_advantages(env_mask: Sequence[int], turn_values: Sequence[float]) -> list[float]:
    """Turn k's value on every token of the k-th run of trainable tokens (env_mask 1); 0 on environment
    tokens. A ValueError when the runs and the turns differ in number (the trace is not that episode's)."""
    from omrl.train.rl.gae import turn_spans

    spans = turn_spans([int(bool(m)) for m in env_mask])
    if len(spans) != len(turn_values):
        raise UsageError(f"{len(turn_values)} turns but {len(spans)} runs of trainable tokens in env_mask")
    out = [0.0] * len(env_mask)
    for (first, last), value in zip(spans, turn_values, strict=True):
        out[first: last + 1] = [float(value)] * (last - first + 1)
    return out


def step_token_advantages(env_masks: Sequence[Sequence[int]], credit: StepCredit) -> list[list[float]]:
    """Per episode and completion token: weight * the turn's step advantage (0 on environment tokens and
    for episodes without a reward): the term grpo_credit adds to TRL's episode advantage."""
    if len(env_masks) != len(credit.step_advantages):
        raise UsageError(f"{len(env_masks)} token traces for {len(credit.step_advantages)} episodes")
    out = []
    for mask, values, scored in zip(env_masks, credit.step_advantages, credit.scored, strict=True):
        if not scored:
            out.append([0.0] * len(mask))  # no reward: no credit, whatever its trace holds (maybe a placeholder)
            continue
        out.append(token_advantages(mask, [credit.weight * v for v in values]))
    return out


# What step credit did, from the stored turns (info.credit): per turn its step group's size, its step and
# episode advantages. {where} is a condition on the turns view, e.g. a training run's run ids.
CREDIT_COUNTS_SQL = """
WITH credit AS (
    SELECT json_extract_string(info, '$.credit.group') AS step_group,
           CAST(json_extract(info, '$.credit.size') AS INTEGER) AS size,
           abs(CAST(json_extract(info, '$.credit.step_advantage') AS DOUBLE)) > 1e-9 AS step_nonzero,
           abs(CAST(json_extract(info, '$.credit.episode_advantage') AS DOUBLE)) > 1e-9 AS episode_nonzero
    FROM turns WHERE ({where}) AND json_valid(info) AND json_extract(info, '$.credit') IS NOT NULL
)
SELECT count(*) AS turns,
       count(*) FILTER (WHERE size > 1) AS turns_in_step_group,
       count(*) FILTER (WHERE step_nonzero) AS turns_nonzero_step,
       count(*) FILTER (WHERE step_nonzero AND NOT episode_nonzero) AS turns_step_only,
       count(DISTINCT step_group) FILTER (WHERE size > 1) AS step_groups,
       count(*) FILTER (WHERE size = 1) AS size_1,
       count(*) FILTER (WHERE size BETWEEN 2 AND 3) AS size_2_3,
       count(*) FILTER (WHERE size BETWEEN 4 AND 7) AS size_4_7,
       count(*) FILTER (WHERE size BETWEEN 8 AND 15) AS size_8_15,
       count(*) FILTER (WHERE size >= 16) AS size_16_up,
       max(size) AS max_size
FROM credit
"""


def credit_diagnostics(sources: Sequence[tuple[Any, str]]) -> dict[str, Any]:
    """What step credit did over the stored turns of `sources` ((store, condition on its turns view) pairs):
    the share of turns in a step group of 2 or more, the share with a nonzero step advantage (and of those
    whose episode advantage is 0: credit GRPO alone would not give), the mean size of the step groups, and
    the turns by the size of their step group."""
    totals: dict[str, int] = {}
    for store, where in sources:
        row = store.sql(CREDIT_COUNTS_SQL.format(where=where)).to_pylist()[0]
        for key, value in row.items():
            value = int(value or 0)
            totals[key] = max(totals.get(key, 0), value) if key == "max_size" else totals.get(key, 0) + value
    turns = totals.get("turns", 0)

    def share(key: str) -> float | None:
        return round(totals[key] / turns, 4) if turns else None

    groups = totals.get("step_groups", 0)
    return {"turns": turns, "share_in_step_group": share("turns_in_step_group"),
            "share_nonzero_step_advantage": share("turns_nonzero_step"),
            "share_step_advantage_where_episode_advantage_0": share("turns_step_only"),
            "step_groups": groups,
            "mean_step_group_size": round(totals["turns_in_step_group"] / groups, 2) if groups else None,
            "max_step_group_size": totals.get("max_size"),
            "turns_by_group_size": {k.removeprefix("size_").replace("_", "-"): totals.get(k, 0)
                                    for k in ("size_1", "size_2_3", "size_4_7", "size_8_15", "size_16_up")}}
