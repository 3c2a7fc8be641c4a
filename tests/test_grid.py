"""The grid environment of the learning demo: tasks, rules, rewards and the (noisy) scripted expert."""

from __future__ import annotations

import asyncio

from omrl.agent import run_episode
from omrl.envs.base import Action
from omrl.envs.grid import GridEnv, grid_tasks
from omrl.policies.scripted import ScriptedPolicy
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
