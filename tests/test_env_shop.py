from __future__ import annotations

import random

from omrl.envs import make_env
from omrl.envs.base import Action
from omrl.envs.shop import catalogue, generate_tasks, shop_reward
from omrl.envs.toolenv import play_episode
from omrl.tasks import load_tasks, shipped_datasets_dir


def test_expert_buys_the_goal_on_every_shipped_and_generated_task():
    tasks = load_tasks(shipped_datasets_dir() / "tasks" / "shop.jsonl") + generate_tasks(20, seed=7)
    for task in tasks:
        total, last, _ = play_episode(make_env("shop"), task)
        assert last.info["success"] and abs(total - 1.0) < 1e-9 and last.info["bought"] == task.answer, task.id


def test_catalogue_is_deterministic():
    assert [p.asin for p in catalogue(3, 50)] == [p.asin for p in catalogue.__wrapped__(3, 50)]
    assert [p.asin for p in catalogue(3, 50)] != [p.asin for p in catalogue(4, 50)]


def test_text_actions_pages_and_partial_reward():
    task = generate_tasks(1, seed=1)[0]
    goal = task.payload["goal"]
    env = make_env("shop")
    assert "[Search]" in env.reset(task).observation
    results = env.step(Action(text=f"Thought: look for it.\nAction: search[{' '.join(goal['attributes'])} {goal['query']}]"))
    assert "Total results" in results.observation and "[Back to Search]" in results.observation
    while goal["asin"] not in results.observation:
        results = env.step(Action(text="click[Next >]"))
    item = env.step(Action(text=f"click[{goal['asin']}]"))
    assert "[Buy Now]" in item.observation
    bought = env.step(Action(tool="click", arguments={"label": "Buy Now"}))  # no options chosen
    n_att, n_opt = len(goal["attributes"]), len(goal["options"])
    assert bought.done and abs(bought.reward - (n_att + 1) / (n_att + n_opt + 1)) < 1e-9
    assert bought.info["success"] is False


def test_invalid_actions_are_observations():
    env = make_env("shop")
    env.reset(generate_tasks(1, seed=2)[0])
    not_here = env.step(Action(text="click[Buy Now]"))
    assert not_here.info["invalid_action"] and "not clickable" in not_here.observation
    assert env.step(Action(text="dance")).info["invalid_action"]
    env.step(Action(text="search[shirt]"))
    no_bar = env.step(Action(tool="search", arguments={"query": "mug"}))
    assert no_bar.info["invalid_action"] and "no search bar" in no_bar.observation


def test_wrong_product_type_scores_low():
    products = catalogue(0, 200)
    task = generate_tasks(1, seed=0)[0]
    goal = task.payload["goal"]
    other = next(p for p in products if p.query != goal["query"] and not set(p.title.lower().split()) &
                 set(goal["query"].split()) and p.product_category.split(" › ")[0] !=
                 goal["product_category"].split(" › ")[0])
    reward, details = shop_reward(other, {}, goal)
    assert reward == 0.0 and details["r_type"] == 0.0


def test_random_policy_rarely_succeeds():
    rng = random.Random(0)
    tasks = generate_tasks(20, seed=3)
    wins = sum(play_episode(make_env("shop"), t, max_steps=20, rng=rng)[1].info.get("success", False) for t in tasks)
    assert wins < 5


def test_a_goal_missing_keys_fails_at_reset_naming_them():
    import pytest

    task = generate_tasks(1, seed=2)[0]
    del task.payload["goal"]["price_upper"]
    with pytest.raises(ValueError, match=r"lacks \['price_upper'\]"):
        make_env("shop").reset(task)
