"""Step-level credit for GRPO (omrl/train/step_credit.py): step groups and advantages on hand-made groups,
rows' turn infos in and out, per-token spreading, and the credit stored with real grid rollouts."""

from __future__ import annotations

import asyncio
import json

import pytest

from omrl.train.step_credit import (
    RESET_STATE,
    EpisodeSteps,
    StepCreditSettings,
    credit_rows,
    discounted_returns,
    episodes_from_rows,
    step_credit,
    step_token_advantages,
    store_in_turns,
    token_advantages,
    turn_states,
)


def test_step_groups_and_step_advantages_on_a_hand_made_group():
    assert discounted_returns([0, 0, 1], 0.5) == [0.25, 0.5, 1.0]
    episodes = [EpisodeSteps("g", 1.0, [0.0, 1.0], ["A", "B"]),  # all three start at A; 0 and 2 meet at B
                EpisodeSteps("g", 0.0, [0.0, 0.0], ["A", "C"]),
                EpisodeSteps("g", 0.0, [0.0, 0.0], ["A", "B"]),
                EpisodeSteps("h", 0.0, [0.0], ["A"])]  # another task's A is another step group
    out = step_credit(episodes, gamma=1.0, scale_std=False)
    assert out.episode_advantages == pytest.approx([2 / 3, -1 / 3, -1 / 3, 0.0])
    assert out.step_returns == [[1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [0.0]]
    assert out.step_group_sizes == [[3, 2], [3, 1], [3, 2], [1]]
    # (g, A): returns 1, 0, 0 -> 2/3, -1/3, -1/3; (g, B): 1 vs 0 -> +-1/2; (g, C) and (h, A) alone -> 0.
    assert out.step_advantages == [pytest.approx(v) for v in ([2 / 3, 0.5], [-1 / 3, 0.0], [-1 / 3, -0.5], [0.0])]
    assert out.advantages == [pytest.approx(v) for v in ([4 / 3, 7 / 6], [-2 / 3, -1 / 3], [-2 / 3, -5 / 6], [0.0])]
    assert out.step_groups[0][1] == out.step_groups[2][1] != out.step_groups[3][0]
    half = step_credit(episodes, gamma=1.0, scale_std=False, weight=0.5)
    assert half.advantages[0] == pytest.approx([2 / 3 + 1 / 3, 2 / 3 + 0.25])


def test_unknown_states_are_groups_of_their_own_and_stored_turns_give_states():
    out = step_credit([EpisodeSteps("g", 1.0, [1.0], [None]), EpisodeSteps("g", 0.0, [0.0], [None])], gamma=1.0)
    assert out.step_advantages == [[0.0], [0.0]] and out.step_groups == [[None], [None]]
    row = {"turns": [{"info": '{"state": [1, 2]}'}, {"info": "{}"}, {"info": '{"steps": [{"state": "x"}]}'}]}
    assert turn_states(row) == [RESET_STATE, "[1, 2]", None]
    with pytest.raises(ValueError, match="states"):
        step_credit([EpisodeSteps("g", 1.0, [1.0, 0.0], ["A"])])


def turn(state, reward=0.0):
    return {"info": json.dumps({"state": state}), "reward": reward}


# One task's group as stored rows: e0 and e2 meet at cell "a" after their first move; e3 failed (no reward).
ROWS = [
    {"id": "e0", "group_id": "g", "reward": 1.0, "turns": [turn("a"), turn("goal", 1.0)]},
    {"id": "e1", "group_id": "g", "reward": 0.0, "turns": [turn("b"), turn("c")]},
    {"id": "e2", "group_id": "g", "reward": 0.5, "turns": [turn("a"), turn("d", 0.5)]},
    {"id": "e3", "group_id": "g", "reward": None, "turns": [turn("a")]},
]


def test_rows_give_known_step_groups_and_advantages_and_a_failed_episode_is_left_out():
    credit = credit_rows(ROWS, StepCreditSettings(weight=1.0, gamma=1.0, scale_std=False))
    # episodes: rewards 1, 0, 0.5 (e3 left out, not a 0) -> mean 0.5
    assert credit.episode_advantages == pytest.approx([0.5, -0.5, 0.0, 0.0])
    assert credit.step_group_sizes == [[3, 2], [3, 1], [3, 2], [0]]  # e3's visit to "a" is not counted
    # (g, reset): 1, 0, 0.5 -> 0.5, -0.5, 0; (g, a): e0's turn 2 returns 1, e2's 0.5 -> +-0.25; (g, b) alone
    assert credit.step_advantages == [pytest.approx(v) for v in ([0.5, 0.25], [-0.5, 0.0], [0.0, -0.25], [0.0])]
    assert credit.advantages == [pytest.approx(v) for v in ([1.0, 0.75], [-1.0, -0.5], [0.0, -0.25], [0.0])]
    assert credit.step_groups[3] == [None] and credit.scored == [True, True, True, False]
    discounted = credit_rows(ROWS, StepCreditSettings(gamma=0.5, scale_std=False))
    assert discounted.step_returns[0] == [0.5, 1.0] and discounted.step_advantages[0] == pytest.approx([0.25, 0.25])
    scaled = credit_rows(ROWS, StepCreditSettings(gamma=1.0))  # std of (1, 0, 0.5) with Bessel's correction: 0.5
    assert scaled.step_advantages[0][0] == pytest.approx(0.5 / (0.5 + 1e-4))


def test_an_outside_episode_reward_lands_on_the_last_turn():
    # A judge's combined reward of 0.8 for e0 (the env paid 1.0): the turns account for it, the first turn's
    # undiscounted return is the reward GRPO trains on.
    episodes = episodes_from_rows(ROWS, rewards=[0.8, 0.0, 0.5, None])
    assert episodes[0].turn_rewards == [0.0, pytest.approx(0.8)] and episodes[3].reward is None
    assert episodes[0].states == [RESET_STATE, "a"] and episodes[0].group == "g"
    with pytest.raises(ValueError, match="rewards"):
        episodes_from_rows(ROWS, rewards=[1.0])


def test_turn_values_spread_over_each_turns_trainable_tokens_only():
    mask = [0, 1, 1, 0, 0, 0, 1, 0]  # template token, turn 1 (2 tokens), observation, turn 2, template
    assert token_advantages(mask, [0.5, -2.0]) == [0.0, 0.5, 0.5, 0.0, 0.0, 0.0, -2.0, 0.0]
    with pytest.raises(ValueError, match="runs"):
        token_advantages(mask, [1.0])
    credit = credit_rows(ROWS, StepCreditSettings(weight=2.0, gamma=1.0, scale_std=False))
    masks = [[1, 0, 1, 1], [1, 0, 1], [1, 1, 0, 1], [0]]  # e3: a placeholder trace with no turn tokens
    tokens = step_token_advantages(masks, credit)
    assert tokens == [pytest.approx(v) for v in ([1.0, 0.0, 0.5, 0.5], [-1.0, 0.0, 0.0], [0.0, 0.0, 0.0, -0.5],
                                                 [0.0])]
    with pytest.raises(ValueError, match="traces"):
        step_token_advantages(masks[:2], credit)


def test_credit_of_real_grid_rollouts_is_stored_in_turn_info_and_visible_in_sql(tmp_path):
    from omrl.envs.grid import grid_wall_tasks
    from omrl.policies.scripted import ScriptedPolicy
    from omrl.query import run_query
    from omrl.rollout import RolloutSettings, play_episodes
    from omrl.store import Store

    tasks = grid_wall_tasks(2, seed=0, split="train")
    settings = RolloutSettings(env="grid", env_options={"noise": 0.5, "seed": 3}, max_turns=20, concurrency=8)
    episodes = asyncio.run(play_episodes([(t, s) for t in tasks for s in range(4)], None, ScriptedPolicy(),
                                         settings, run_id="credit"))
    rows = [e.row for e in episodes]
    credit = credit_rows(rows, StepCreditSettings(gamma=1.0))
    store_in_turns(rows, credit)
    store = Store.create(tmp_path / "store")
    store.append(rows)
    got = run_query(store, "SELECT trajectory_id, index, json_extract_string(info, '$.state') AS state, "
                           "json_extract_string(info, '$.credit.group') AS step_group, "
                           "CAST(json_extract(info, '$.credit.size') AS INTEGER) AS size, "
                           "CAST(json_extract(info, '$.credit.advantage') AS DOUBLE) AS advantage "
                           "FROM turns ORDER BY trajectory_id, index").to_pylist()
    assert len(got) == sum(len(r["turns"]) for r in rows)
    for i, row in enumerate(rows):
        mine = [g for g in got if g["trajectory_id"] == row["id"]]
        assert [g["advantage"] for g in mine] == pytest.approx(credit.advantages[i])
        assert [g["size"] for g in mine] == credit.step_group_sizes[i]
    # every episode of a task starts from the reset state: the first turns of a group form one step group of 4
    firsts = [g for g in got if g["index"] == 0]
    assert {g["size"] for g in firsts} == {4} and len({g["step_group"] for g in firsts}) == 2
    # a state the step reports is the next turn's anchor: same (group, state) -> same step group key
    by_key = {}
    for g in got:
        by_key.setdefault(g["step_group"], set()).add(g["size"])
    assert all(len(sizes) == 1 for sizes in by_key.values())
    with pytest.raises(ValueError, match="rows"):
        store_in_turns(rows[:1], credit)
