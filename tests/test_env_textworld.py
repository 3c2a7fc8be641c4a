"""TextWorld (`--env textworld`): games built locally and cached, walkthroughs win, engines replaced on death."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from omrl.envs import EnvSpecError, generate_tasks, make_env
from omrl.envs.base import Action
from omrl.envs.textworld import TextWorldEnv, build_games
from omrl.envs.textworld.env import game_key
from omrl.envs.textworld.tasks import split_of
from omrl.errors import UsageError
from omrl.policies import make_policy
from omrl.rollout import EnvPool, RolloutSettings, collect, eval_metrics, play_episodes
from omrl.store import Store
from tests.engine_helpers import KillingPolicy, require_env

pytestmark = pytest.mark.slow  # real TextWorld games

# Small games: a one-room cooking game (fetch one ingredient) and a two-room quest of two actions.
COOKING = {"recipe": 1, "take": 1, "go": 1, "open": False, "cook": False, "cut": False}
CUSTOM = {"rooms": 2, "objects": 3, "quest_length": 2}


@pytest.fixture(scope="module")
def games(tmp_path_factory):
    """Two cooking games and one custom quest of the test split, built once into a cache of their own."""
    require_env("textworld")
    cache = tmp_path_factory.mktemp("textworld-cache")
    tasks = (generate_tasks("textworld", 2, seed=1, split="test", max_steps=30, **COOKING)
             + generate_tasks("textworld", 1, seed=1, split="test", theme="custom", max_steps=30, **CUSTOM))
    build_games(tasks, str(cache))
    return tasks, str(cache)


@pytest.fixture(scope="module")
def pool(games):
    """Engines shared by the tests that do not kill them (starting one imports TextWorld: seconds)."""
    shared = EnvPool(lambda: make_env("textworld", cache=games[1]))
    yield shared
    asyncio.run(shared.close())


def play(tasks, policy, cache, tmp_path, pool=None, **knobs):
    """Collect into a new store (through `pool`'s engines when given); the result and the stored rows."""
    store = Store.create(tmp_path / "store")
    if pool is None:
        result = asyncio.run(collect("textworld", tasks, policy, store, max_turns=40,
                                     env_options={"cache": cache}, **knobs))
        return result, store.read().to_pylist()
    settings = RolloutSettings(env="textworld", max_turns=40, concurrency=knobs.get("concurrency", 1))
    episodes = asyncio.run(play_episodes([(t, s) for t in tasks for s in range(knobs.get("samples", 1))], None,
                                         policy, settings, run_id=knobs["run_id"], pool=pool))
    store.append([e.row for e in episodes])
    return eval_metrics([e.row for e in episodes])["textworld"], store.read().to_pylist()


def test_the_walkthrough_wins_every_game_and_random_play_is_scored(games, pool, tmp_path):
    tasks, cache = games
    metrics, rows = play(tasks, make_policy("scripted"), cache, tmp_path, pool, concurrency=2, run_id="expert")
    assert metrics["errors"] == 0 and metrics["success_rate"] == 1.0 and len(rows) == 3, [r["error"] for r in rows]
    for row in rows:
        assert abs(row["reward"] - 1.0) < 1e-9  # the normalised score
        last = json.loads(row["turns"][-1]["info"])
        assert last["won"] is True and last["success"] is True and last["score"] == last["max_score"]
        first = row["messages"][1]["content"]
        assert "Admissible commands:" in first and "$$$$" not in first  # the banner is dropped
    metrics, rows = play(tasks, make_policy("random"), cache, tmp_path / "random", pool, samples=2, concurrency=2,
                         run_id="random")
    assert metrics["errors"] == 0 and metrics["episodes"] == 6 and metrics["success_rate"] < 1.0
    assert all(0.0 <= r["reward"] <= 1.0 for r in rows)
    ended = [json.loads(r["turns"][-1]["info"]) for r in rows if r["status"] == "ok"]
    assert all(e["won"] or e["lost"] or e.get("out_of_steps") for e in ended)


def test_a_wrong_command_is_an_observation(games, pool):
    tasks, cache = games
    env = asyncio.run(pool.acquire())
    try:
        first = env.reset(tasks[0])
        for command, answer in (("dance with the fridge", "not a verb I recognise"),
                                ("take the moon", "can't see any such thing")):
            result = env.step(Action(tool="act", arguments={"command": command}))
            assert not result.done and result.info["invalid_action"] and answer in result.observation
            assert result.reward == 0.0
        result = env.step(Action(tool="look", arguments={}))
        assert result.info["invalid_action"] and result.observation.startswith("Invalid action")
        again = env.reset(tasks[0])  # the same instance, a fresh game
        assert again.observation == first.observation
    finally:
        asyncio.run(pool.release(env, tasks[0], reuse=True))
    text = make_env("textworld", cache=cache, action_format="text", admissible=False)
    try:
        first = text.reset(tasks[0])
        assert "Admissible commands" not in first.observation and not first.tools
        looked = text.step(Action(text="I will look first.\nAction: inventory"))
        assert looked.info["command"] == "inventory" and "invalid_action" not in looked.info
    finally:
        text.close()


def test_an_engine_killed_mid_episode_is_env_error_and_the_episode_is_stored(games, tmp_path):
    tasks, cache = games
    policy = KillingPolicy(at=2, which="engine")
    result, rows = play(tasks[:2], policy, cache, tmp_path, concurrency=1, run_id="kill")
    by_status = {r["status"]: r for r in rows}
    assert policy.killed and set(by_status) == {"env_error", "ok"}, [(r["status"], r["error"]) for r in rows]
    broken = by_status["env_error"]
    assert "textworld engine" in broken["error"] and "killed by signal 9" in broken["error"]
    assert broken["reward"] is None and broken["num_turns"] == 2
    assert by_status["ok"]["success"] is True  # the next episode played in a new engine


def test_splits_are_disjoint_by_seed_and_tasks_are_deterministic():
    require_env("textworld")
    seeds = {}
    for split in TextWorldEnv.splits:
        made = generate_tasks("textworld", 200, seed=0, split=split)
        seeds[split] = {t.payload["seed"] for t in made}
        assert len(seeds[split]) == 200 and all(split_of(s) == split for s in seeds[split])
        assert len({t.id for t in made}) == 200
    assert not (seeds["train"] & seeds["validation"] or seeds["train"] & seeds["test"]
                or seeds["validation"] & seeds["test"])
    one = generate_tasks("textworld", 5, seed=7, split="train", recipe=3)
    assert [t.to_row() for t in one] == [t.to_row() for t in generate_tasks("textworld", 5, seed=7, split="train",
                                                                           recipe=3)]
    assert [t.id for t in one] != [t.id for t in generate_tasks("textworld", 5, seed=8, split="train", recipe=3)]
    payload = one[0].payload
    assert set(payload) == {"theme", "seed", "options", "max_steps", "textworld"}
    assert payload["options"]["recipe"] == 3 and payload["options"]["go"] == 6  # defaults filled in


def test_a_missing_game_is_rebuilt_identically_from_its_payload(games, tmp_path):
    # The second cooking game: the fixture's engine built it after the first one (with the knowledge base
    # it keeps between games, and its hash seed); the new engine builds it first, in another process.
    tasks, cache = games
    key = game_key(TextWorldEnv.payload_of(tasks[1]))
    files = {suffix: (Path(cache) / f"{key}{suffix}").read_bytes() for suffix in (".z8", ".json", ".meta.json")}
    for suffix in files:
        (Path(cache) / f"{key}{suffix}").unlink()
    env = make_env("textworld", cache=cache)  # a new engine process: rebuilt there from the payload
    try:
        env.reset(tasks[1])
    finally:
        env.close()
    assert {suffix: (Path(cache) / f"{key}{suffix}").read_bytes() for suffix in files} == files


def test_bad_options_are_refused_in_one_line():
    require_env("textworld")
    with pytest.raises(UsageError, match="go .rooms. must be 1, 6, 9 or 12"):
        generate_tasks("textworld", 2, go=5)
    with pytest.raises(UsageError, match="take must be an integer from 0 to 1"):
        generate_tasks("textworld", 2, recipe=1, take=2)
    with pytest.raises(UsageError, match="unknown textworld custom option"):
        generate_tasks("textworld", 2, theme="custom", recipe=2)
    with pytest.raises(UsageError, match="theme must be one of"):
        generate_tasks("textworld", 2, theme="zork")
    with pytest.raises(EnvSpecError, match="splits train, validation, test"):
        generate_tasks("textworld", 2, split="dev")


def test_missing_package_is_one_line(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "textworld" else real(name, *a))
    assert TextWorldEnv.unavailable() == "needs the textworld extra: pip install 'omrl[textworld]'"
    with pytest.raises(EnvSpecError, match=r"cannot run here: needs the textworld extra"):
        make_env("textworld")
