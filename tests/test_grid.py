"""The grid environment of the learning demo: tasks, rules, rewards and the (noisy) scripted expert."""

from __future__ import annotations

import asyncio

from omrl.envs.base import Action
from omrl.envs.grid import GridEnv, grid_tasks
from omrl.policies.scripted import ScriptedPolicy
from omrl.rollout.agent import run_episode
from omrl.tasks import load_tasks


def play(env: GridEnv, task, moves):
    env.reset(task)
    result = None
    for move in moves:
        result = env.step(Action(text=move))
        if result.done:
            break
    return result


def test_tasks_are_deterministic_and_splits_disjoint():
    train, again = grid_tasks(300, seed=1, split="train"), grid_tasks(300, seed=1, split="train")
    assert [t.id for t in train] == [t.id for t in again]
    held_out = grid_tasks(200, seed=1, split="eval")
    pairs = {(tuple(t.payload["start"]), tuple(t.payload["goal"])) for t in train}
    assert not pairs & {(tuple(t.payload["start"]), tuple(t.payload["goal"])) for t in held_out}
    assert len({t.id for t in train}) == 300


def test_shipped_task_files_match_the_generator():
    shipped = load_tasks("datasets/tasks/grid_eval.jsonl")
    assert [t.id for t in shipped] == [t.id for t in grid_tasks(len(shipped), seed=0, split="eval")]


def test_noise_free_expert_solves_every_task_with_full_reward():
    for task in grid_tasks(50, seed=0, split="eval"):
        env = GridEnv(noise=0.0)
        env.reset(task)
        result = None
        while result is None or not result.done:
            result = env.step(env.expert_action())
        assert result.info["success"] and result.reward == 1.0, task.id


def test_efficient_beats_merely_valid_and_budget_ends_episode():
    task = grid_tasks(1, seed=0, split="train")[0]
    sx, sy = task.payload["start"]
    gx, gy = task.payload["goal"]
    straight = ["right" if gx > sx else "left"] * abs(gx - sx) + ["down" if gy > sy else "up"] * abs(gy - sy)
    direct = play(GridEnv(), task, straight)
    assert direct.done and direct.info["success"] and direct.reward == 1.0
    # A detour (one wrong move, then back) still succeeds but earns less.
    wrong = {"right": "left", "left": "right", "up": "down", "down": "up"}
    first = straight[0]
    detour_moves = [wrong[first], first, *straight]
    env = GridEnv()
    detour = play(env, task, detour_moves)
    if detour.info.get("invalid", 0) == 0:  # the wrong move stayed on the board
        assert detour.info["success"] and 0 < detour.reward < 1.0
    # Wandering away runs out of budget: done, no success, reward 0.
    away = play(GridEnv(), task, [wrong[first]] * 20)
    assert away.done and not away.info["success"] and away.reward == 0.0


def test_invalid_actions_are_observations_not_exceptions():
    env = GridEnv()
    task = grid_tasks(1, seed=0, split="train")[0]
    env.reset(task)
    result = env.step(Action(text="jump"))
    assert result.info["invalid_action"] and "invalid action" in result.observation and not result.done
    tool_env = GridEnv(action_format="tool")
    first = tool_env.reset(task)
    assert first.tools[0]["function"]["name"] == "move"
    assert tool_env.step(Action(tool="move", arguments={"direction": "sideways"})).info["invalid_action"]
    assert tool_env.step(Action(tool="move", arguments=["up"])).info["invalid_action"]  # not an object


def test_a_text_action_is_the_move_alone():
    from omrl.envs.base import Task

    task = Task(id="g", instruction="", env="grid", payload={"size": 7, "start": [4, 4], "goal": [1, 1]})
    for text, valid in (("left", True), (" Up.\n", True), ("RIGHT", True), ("left goal", False),
                        ("left left", False), ("go left", False), ("", False)):
        env = GridEnv()
        env.reset(task)
        assert bool(env.step(Action(text=text)).info.get("invalid_action")) is not valid, text


def test_observations_spell_out_the_goal_offset_in_few_words():
    from omrl.envs.base import Task

    env = GridEnv()
    task = Task(id="g", instruction="", env="grid", payload={"size": 7, "start": [7, 7], "goal": [4, 5]})
    assert env.reset(task).observation == "goal: 3 left, 2 up"
    assert env.step(Action(text="left")).observation == "goal: 2 left, 2 up"
    assert env.step(Action(text="down")).observation == "blocked, goal: 2 left, 2 up"
    assert env.step(Action(text="up")).observation == "goal: 2 left, 1 up"


def test_noisy_expert_through_the_agent_loop_is_imperfect_but_competent():
    tasks = grid_tasks(100, seed=0, split="eval")

    async def main():
        return await asyncio.gather(*[run_episode(GridEnv(noise=0.3, seed=7), t, ScriptedPolicy(), run_id="t",
                                                  max_turns=14) for t in tasks])

    rows = [e.row for e in asyncio.run(main())]
    success = sum(r["success"] for r in rows) / len(rows)
    assert 0.4 < success < 0.9  # room for RL to improve on imitation
    assert all(r["status"] == "ok" for r in rows)
    assert rows[0]["messages"][2] == {**rows[0]["messages"][2], "role": "assistant"}


def test_every_step_reports_the_position_it_led_to_as_a_hashable_state():
    from omrl.envs.base import Task

    env = GridEnv()
    env.reset(Task(id="g", instruction="", env="grid", payload={"size": 7, "start": [7, 7], "goal": [4, 5]}))
    assert env.step(Action(text="left")).info["state"] == "6,7"
    assert env.step(Action(text="down")).info["state"] == "6,7"  # a bump stays put
    assert env.step(Action(text="jump")).info["state"] == "6,7"  # so does an invalid action
    assert env.step(Action(text="up")).info["state"] == "6,6"


def test_states_are_stored_with_the_rollouts_and_visible_in_sql(tmp_path):
    from omrl.rollout import RolloutSettings, collect
    from omrl.store import Store
    from omrl.store.query import run_query
    from omrl.train.rl.step_credit import turn_states

    store = Store.create(tmp_path / "store")
    tasks = grid_tasks(3, seed=0, split="eval")
    settings = RolloutSettings(env="grid", env_options={"noise": 0.3, "seed": 1}, max_turns=14, concurrency=4)
    asyncio.run(collect(None, tasks, ScriptedPolicy(), store, settings, samples=2, run_id="s"))
    table = run_query(store, "SELECT trajectory_id, index, json_extract_string(info, '$.state') AS state "
                             "FROM turns ORDER BY trajectory_id, index").to_pylist()
    rows = {r["id"]: r for r in store.read().to_pylist()}
    assert len(rows) == 6 and len(table) == sum(len(r["turns"]) for r in rows.values())
    for row in rows.values():
        task = next(t for t in tasks if t.id == row["task_id"])
        # replay the stored moves: each turn's state is where that move led
        env = GridEnv()
        env.reset(task)
        expected = [env.step(Action(text=m["content"])).info["state"]
                    for m in row["messages"] if m["role"] == "assistant"]
        assert [r["state"] for r in table if r["trajectory_id"] == row["id"]] == expected
        states = turn_states(row)
        assert states[0] == "<reset>" and states[1:] == expected[:-1]  # the state each turn acts from


def test_walled_tasks_block_the_straight_route_and_stay_solvable():
    from omrl.envs.grid import grid_wall_tasks
    from omrl.envs.grid.env import distances_to

    train, held_out = grid_wall_tasks(300, seed=0, split="train"), grid_wall_tasks(100, seed=0, split="eval")
    assert [t.id for t in train] == [t.id for t in grid_wall_tasks(300, seed=0, split="train")]
    assert not {t.id for t in train} & {t.id for t in held_out}
    for task in train + held_out:
        size, walls = task.payload["size"], {tuple(c) for c in task.payload["walls"]}
        start, goal = tuple(task.payload["start"]), tuple(task.payload["goal"])
        manhattan = abs(start[0] - goal[0]) + abs(start[1] - goal[1])
        shortest = distances_to(size, walls, goal).get(start)
        assert shortest is not None and shortest > manhattan, task.id  # reachable, and only round the wall
        assert start not in walls and goal not in walls


def test_walled_grid_observes_adjacent_walls_and_pays_against_the_shortest_path():
    from omrl.envs.base import Task

    # a wall on row 3 from x=1 to x=4 between (2, 5) and the goal (2, 1): the way round is via x=5
    task = Task(id="w", instruction="", env="grid",
                payload={"size": 7, "start": [2, 5], "goal": [2, 1], "walls": [[1, 3], [2, 3], [3, 3], [4, 3]]})
    env = GridEnv()
    assert env.reset(task).observation == "goal: 4 up"
    assert env.budget == 4 + 6 + 2  # shortest path 10 (3 right, 4 up, 3 left), + 2
    assert env.step(Action(text="up")).observation == "goal: 3 up; wall: up"
    assert env.step(Action(text="up")).observation == "blocked, goal: 3 up; wall: up"
    for move in ["right", "right", "right", "up", "up", "up", "left", "left"]:
        result = env.step(Action(text=move))
        assert not result.done
    result = env.step(Action(text="left"))
    assert result.done and result.info["success"] and result.reward == 1.0 - 0.25  # 11 steps for 10 (one bump)


def test_walled_expert_walks_a_shortest_path_and_imitating_it_is_imperfect():
    from omrl.envs.grid import grid_wall_tasks

    tasks = grid_wall_tasks(100, seed=0, split="eval")
    for task in tasks:
        env = GridEnv(noise=0.0, seed=3)
        env.reset(task)
        result = None
        while result is None or not result.done:
            result = env.step(env.expert_action())
        assert result.info["success"] and result.reward == 1.0, task.id

    async def main():
        return await asyncio.gather(*[run_episode(GridEnv(noise=0.3, seed=7), t, ScriptedPolicy(), run_id="t",
                                                  max_turns=20) for t in tasks])

    rows = [e.row for e in asyncio.run(main())]
    assert 0.15 < sum(r["success"] for r in rows) / len(rows) < 0.6  # harder than the plain grid's 0.4-0.9


def test_shipped_walled_task_files_match_the_generator():
    from omrl.envs.grid import grid_wall_tasks

    for split in ("train", "eval"):
        shipped = load_tasks(f"datasets/tasks/grid_walls_{split}.jsonl")
        assert [t.payload for t in shipped] == [t.payload for t in grid_wall_tasks(len(shipped), seed=0, split=split)]


def test_slack_sets_the_budget_beyond_the_shortest_path():
    from omrl.envs.base import Task
    from omrl.envs.grid import grid_wall_tasks

    plain = Task(id="g", instruction="", env="grid", payload={"size": 7, "start": [7, 7], "goal": [4, 5]})
    walled = grid_wall_tasks(1, seed=0, split="eval")[0]
    for slack in (0, 2, 6):
        env = GridEnv(slack=slack)
        env.reset(plain)
        assert env.budget == 5 + slack
        env.reset(walled)
        assert env.budget == env.distance + slack
    env = GridEnv(slack=0)
    env.reset(plain)
    result = env.step(Action(text="down"))  # budget 5, a bump into the border: the goal is out of reach
    for move in ["left", "left", "left", "up"]:
        result = env.step(Action(text=move))
    assert result.done and not result.info["success"]
    import pytest

    with pytest.raises(ValueError, match="slack"):
        GridEnv(slack=-1)
