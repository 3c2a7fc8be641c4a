"""TextWorldExpress (`--env twx`): a real JVM per instance, gold paths, its own seed folds, no JVM ever left."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from omrl.envs import EnvSpecError, generate_tasks, make_env
from omrl.envs.base import Action, InvalidTask
from omrl.envs.twx import TwxEnv
from omrl.envs.twx.tasks import FOLD_SEEDS, canonical_params, draw_seeds
from omrl.errors import UsageError
from omrl.policies import make_policy
from omrl.rollout import EnvPool, RolloutSettings, collect, eval_metrics, play_episodes
from omrl.store import Store
from omrl.tasks import write_tasks
from omrl.view.transcript import render_trajectory
from tests.engine_helpers import ROOT, KillingPolicy, jvm_caps_seen, kill_collect_mid_run, require_env

pytestmark = pytest.mark.slow  # the TextWorldExpress engine (Java)

SMALL = "numLocations=3,numIngredients=2,numDistractorItems=2"  # short gold paths: fast tests


@pytest.fixture(scope="module")
def tasks():
    require_env("twx")
    return generate_tasks("twx", 4, seed=3, split="test", params=SMALL, step_limit=40)


@pytest.fixture(scope="module")
def pool(tasks):
    """Engines shared by the tests that do not kill them (a JVM start is the slow part)."""
    shared = EnvPool(lambda: make_env("twx"))
    yield shared
    asyncio.run(shared.close())


def play(tasks, policy, tmp_path, pool=None, **knobs):
    """Collect into a new store (through `pool`'s engines when given); the result and the stored rows."""
    store = Store.create(tmp_path / "store")
    if pool is None:
        result = asyncio.run(collect("twx", tasks, policy, store, max_turns=60, **knobs))
        return result, store.read().to_pylist()
    settings = RolloutSettings(env="twx", max_turns=60, concurrency=knobs.get("concurrency", 1))
    episodes = asyncio.run(play_episodes([(t, s) for t in tasks for s in range(knobs.get("samples", 1))], None,
                                         policy, settings, run_id=knobs["run_id"], pool=pool))
    store.append([e.row for e in episodes])
    return eval_metrics([e.row for e in episodes])["twx"], store.read().to_pylist()


def test_the_gold_path_wins_and_a_random_policy_does_not(tasks, pool, tmp_path):
    metrics, rows = play(tasks, make_policy("scripted"), tmp_path, pool, concurrency=2, run_id="expert")
    assert metrics["errors"] == 0 and metrics["success_rate"] == 1.0 and len(rows) == 4
    assert all(abs(r["reward"] - 1.0) < 1e-9 for r in rows)
    last = json.loads(rows[0]["turns"][-1]["info"])
    assert last["success"] is True and last["score"] == 1.0 and "moves" in last
    assert json.loads(rows[0]["tools"])[0]["function"]["name"] == "act"
    assert "Admissible commands:" in rows[0]["messages"][1]["content"]
    shown = render_trajectory(rows[0])  # the viewer's and `omrl show`'s renderer: commands and score per turn
    from rich.console import Console

    console = Console(width=120, record=True)
    console.print(shown)
    text = console.export_text()
    assert "act" in text and "score 1" in text

    metrics, rows = play(tasks, make_policy("random"), tmp_path / "random", pool, concurrency=2, run_id="random")
    assert metrics["errors"] == 0 and metrics["episodes"] == 4 and metrics["success_rate"] == 0.0


def test_gold_paths_depend_only_on_the_task(pool, tmp_path):
    """Coin's and TWC's gold agents walk at random: the same path in two engines, in any order, and it wins."""
    walks = (generate_tasks("twx", 6, seed=0, split="train", game="coin", step_limit=40,
                            params="numLocations=6,includeDoors=0,numDistractorItems=0")
             + generate_tasks("twx", 2, seed=0, split="train", game="twc", step_limit=40,
                              params="numLocations=3,numItemsToPutAway=2"))

    def gold(env, order):
        paths = {}
        for task in order:
            env.reset(task)
            paths[task.id] = env.expert_path()
        return paths

    shared, fresh = asyncio.run(pool.acquire()), make_env("twx")  # another engine: its own JVM and Python
    try:
        first = gold(shared, walks)
        assert gold(fresh, walks[::-1]) == first == gold(shared, walks[3:] + walks[:3])
    finally:
        fresh.close()
        asyncio.run(pool.release(shared, walks[0], reuse=True))
    assert sum(len(path) > 3 for path in first.values()) >= 4  # walks, not the coin in the first room
    metrics, _ = play(walks, make_policy("scripted"), tmp_path, pool, concurrency=2, run_id="walks")
    assert metrics["errors"] == 0 and metrics["success_rate"] == 1.0


def test_a_wrong_command_is_an_observation(tasks, pool):
    env = asyncio.run(pool.acquire())
    try:
        first = env.reset(tasks[0])
        assert tasks[0].instruction in first.observation
        wrong = env.step(Action(tool="act", arguments={"command": "dance with the fridge"}))
        assert not wrong.done and wrong.info["invalid_action"] and "Unknown action" in wrong.observation
        for bad in (Action(tool="act", arguments={}), Action(tool="jump", arguments={"command": "x"}),
                    Action(tool="act", arguments={"command": "   "})):
            result = env.step(bad)
            assert result.info["invalid_action"] and not result.done and result.observation.startswith("Invalid")
        injected = env.step(Action(tool="act", arguments={"command": "look around\ntake knife"}))
        assert injected.info["command"] == "look around take knife"  # one line: never two commands
        text = make_env("twx", action_format="text")
        try:
            text.reset(tasks[0])
            looked = text.step(Action(text="Thought: I should look.\nAction: look around"))
            assert looked.info["command"] == "look around" and "invalid_action" not in looked.info
        finally:
            text.close()
        # The same instance plays a second episode from a fresh start.
        again = env.reset(tasks[0])
        assert again.observation == first.observation
    finally:
        asyncio.run(pool.release(env, tasks[0], reuse=True))


@pytest.mark.parametrize("which", ["child", "engine"])
def test_an_engine_killed_mid_episode_is_env_error_and_the_episode_is_stored(tasks, tmp_path, which):
    policy = KillingPolicy(at=2, which=which)  # child: the JVM; engine: the omrl engine process hosting it
    result, rows = play(tasks[:2], policy, tmp_path, concurrency=1, run_id=f"kill-{which}")
    assert policy.killed and len(rows) == 2
    by_status = {r["status"]: r for r in rows}
    assert set(by_status) == {"env_error", "ok"}, [(r["status"], r["error"]) for r in rows]
    broken = by_status["env_error"]
    assert broken["reward"] is None and broken["success"] is None and "twx engine" in broken["error"]
    assert broken["num_turns"] == 2  # the turns before the kill are kept, and the call it failed on:
    assert broken["messages"][-1]["role"] == "assistant" and "env.step" in broken["error"]
    assert by_status["ok"]["success"] is True  # the next episode got a new engine


def test_the_jvm_heap_and_the_engine_memory_are_capped_by_options(pool):
    env = asyncio.run(pool.acquire())
    try:
        options, heap = jvm_caps_seen(env.engine)
        assert options.endswith("-Xmx512m") and 450 <= heap <= 512, (options, heap)
        assert env.engine.memory is not None and env.engine.memory.mb == 512 + 512
    finally:
        asyncio.run(pool.release(env, None, reuse=True))
    limits = TwxEnv.resource_limits()
    assert "jvm_heap_mb=512" in limits and "memory_mb=1024" in limits
    small = make_env("twx", jvm_heap_mb=128, memory_mb=2048)
    try:
        options, heap = jvm_caps_seen(small.engine)
        assert options.endswith("-Xmx128m") and heap <= 128 and small.engine.memory.mb == 2048
    finally:
        small.close()
    with pytest.raises(ValueError, match="jvm_heap_mb must be a whole number"):
        make_env("twx", jvm_heap_mb=-1)


def test_brief_observations_and_state_keys(pool):
    coin = generate_tasks("twx", 1, seed=0, split="train", game="coin",
                          params="numLocations=4,includeDoors=0,numDistractorItems=0", step_limit=12)[0]
    full = asyncio.run(pool.acquire())
    brief = make_env("twx", observation="brief", action_format="text")
    try:
        shown = {"full": full.reset(coin).observation, "brief": brief.reset(coin).observation}
        assert shown["brief"].startswith(coin.instruction) and "You are in the kitchen." in shown["brief"]
        assert "In one part of the room" in shown["full"] and "In one part of the room" not in shown["brief"]
        commands = shown["brief"].split("Admissible commands: ")[1]
        assert commands == shown["full"].split("Admissible commands: ")[1]  # the same valid actions
        there = next(c for c in commands.split(", ") if c.startswith("move "))
        back = {"north": "south", "south": "north", "east": "west", "west": "east"}[there.split()[1]]
        states = {"full": [], "brief": []}
        for command in (there, f"move {back}", there):
            step_full = full.step(Action(tool="act", arguments={"command": command}))
            step_brief = brief.step(Action(text=command))
            assert step_brief.observation.startswith("You are in the ")
            assert step_brief.observation.split("\n")[0].count(". ") == 0  # one sentence, then the commands
            assert len(step_brief.observation) < len(step_full.observation)
            states["full"].append(step_full.info["state"])
            states["brief"].append(step_brief.info["state"])
        assert states["full"] == states["brief"]  # the state is the game's, whatever is shown
        first, home, again = states["brief"]
        assert first == again != home and len(first) == 16
    finally:
        brief.close()
        asyncio.run(pool.release(full, coin, reuse=True))
    with pytest.raises(UsageError, match="observation must be one of full, brief"):
        TwxEnv(observation="short")


def test_show_tried_lists_the_commands_already_sent_in_the_same_state():
    coin = generate_tasks("twx", 1, seed=0, split="train", game="coin",
                          params="numLocations=4,includeDoors=0,numDistractorItems=0", step_limit=12)[0]
    env = make_env("twx", observation="brief", action_format="text", show_tried=True)
    try:
        first = env.reset(coin).observation
        assert "Already tried" not in first
        there = next(c for c in first.split("Admissible commands: ")[1].split(", ") if c.startswith("move "))
        back = "move " + {"north": "south", "south": "north", "east": "west", "west": "east"}[there.split()[1]]
        steps = [env.step(Action(text=command)) for command in ("look around", there, back, there)]
        notes = [step.observation.split("\n\n") for step in steps]
        assert notes[0][1] == "Already tried here: look around"  # the same room: the command it just sent
        assert not any(part.startswith("Already tried") for part in notes[1])  # a room not seen before
        assert notes[2][1] == f"Already tried here: look around, {there}"  # back home: both, in order, once
        assert notes[3][1] == f"Already tried here: {back}"  # the other room: what was sent there
        assert notes[3][-1].startswith("Admissible commands: ")  # the notes come before the commands
        again = env.reset(coin).observation
        assert again == first  # a new episode starts with no notes
        assert "Already tried" not in env.step(Action(text=there)).observation
    finally:
        env.close()
    with pytest.raises(UsageError, match="show_tried must be true or false"):
        TwxEnv(show_tried="no")


def test_splits_are_the_package_folds_disjoint_and_generation_is_deterministic(tasks, pool):
    seeds = {split: draw_seeds(1000, 0, split, "coin") for split in TwxEnv.splits}
    for split, drawn in seeds.items():
        assert len(set(drawn)) == 1000 and set(drawn) == set(FOLD_SEEDS[split])  # the whole fold, each once
        assert draw_seeds(20, 0, split, "coin") == drawn[:20]
    assert not (set(seeds["train"]) & set(seeds["dev"]) or set(seeds["dev"]) & set(seeds["test"])
                or set(seeds["train"]) & set(seeds["test"]))
    assert draw_seeds(20, 1, "test", "coin") != draw_seeds(20, 0, "test", "coin")
    assert all(t.payload["fold"] == "test" == t.split and t.payload["seed"] in FOLD_SEEDS["test"] for t in tasks)
    again = generate_tasks("twx", 4, seed=3, split="test", params=SMALL, step_limit=40)
    assert [t.to_row() for t in again] == [t.to_row() for t in tasks]
    assert [t.payload["seed"] for t in tasks] == draw_seeds(4, 3, "test", "cookingworld")
    payload = tasks[0].payload
    assert set(payload) == {"game", "params", "seed", "fold", "step_limit", "textworld_express"}
    # The same payload replays the same game: the same first observation from two engines.
    env1, env2 = asyncio.run(pool.acquire()), asyncio.run(pool.acquire())
    try:
        assert env1 is not env2 and env1.reset(tasks[1]).observation == env2.reset(tasks[1]).observation
    finally:
        for env in (env1, env2):
            asyncio.run(pool.release(env, tasks[1], reuse=True))


def test_bad_generation_options_are_refused_in_one_line():
    require_env("twx")
    with pytest.raises(UsageError, match="Unrecognized property name"):
        generate_tasks("twx", 2, game="coin", params="numLocationz=5")
    with pytest.raises(UsageError, match="game must be one of"):
        generate_tasks("twx", 2, game="chess")
    with pytest.raises(EnvSpecError, match="splits train, dev, test"):
        generate_tasks("twx", 2, split="validation")
    assert canonical_params({"numLocations": 5, "includeDoors": False}) == "includeDoors=0,numLocations=5"
    assert canonical_params("numLocations=5, includeDoors=0") == "includeDoors=0,numLocations=5"


def test_missing_java_or_package_is_one_line(monkeypatch):
    import importlib.util
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert "Java" in TwxEnv.unavailable() and "openjdk-17-jre-headless" in TwxEnv.unavailable()
    with pytest.raises(EnvSpecError, match="cannot run here: needs Java"):
        make_env("twx")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "textworld_express" else real(name, *a))
    assert TwxEnv.unavailable() == "needs the twx extra: pip install 'omrl[twx]'"


def test_kill_9_of_collect_mid_run_leaves_no_java(tasks, tmp_path):
    many = generate_tasks("twx", 40, seed=5, split="train")
    write_tasks(many, tmp_path / "tasks.jsonl")
    engines, left = kill_collect_mid_run(
        ["collect", "--env", "twx", "--tasks", str(tmp_path / "tasks.jsonl"), "--policy", "scripted",
         "--store", str(tmp_path / "store"), "--max-turns", "120", "-c", "2", "--no-progress"], ROOT, "java")
    assert engines and left == []


def test_the_study_fingerprint_sees_the_map_and_the_coin_not_only_the_first_room():
    """Coin games with 6 rooms start in few distinct rooms, so their first observations repeat; the structure
    hook (TwxEnv.fingerprint: every room's contents and exits) tells the games apart, and the same game under
    another id and seed-free payload keys is still the same task."""
    from omrl.study.fingerprint import fingerprint_parts, fingerprint_tasks

    require_env("twx")
    coins = generate_tasks("twx", 24, seed=0, split="train", game="coin", step_limit=16,
                           params="numLocations=6,includeDoors=0,numDistractorItems=0")
    renamed = dataclasses.replace(coins[0], id="another-id", split="test")
    prints = fingerprint_tasks("twx", [*coins, renamed], {"action_format": "text", "observation": "brief"})
    env = make_env("twx", action_format="text", observation="brief")
    try:
        starts = set()
        for task in coins[:8]:
            parts = fingerprint_parts(env, task)  # resets env to task
            assert "start: " in parts["structure"] and "coin" in parts["structure"]
            starts.add(json.dumps(parts["start"], sort_keys=True))
    finally:
        env.close()
    assert prints[renamed.id] == prints[coins[0].id]
    assert len({prints[t.id] for t in coins}) > len(starts)  # more games told apart than first rooms seen
    assert len({prints[t.id] for t in coins}) >= 20


def test_expert_detours_take_random_moves_walk_them_back_and_still_reach_the_coin():
    """expert_detours (demonstrations of lesser quality): the scripted expert sometimes steps aside and walks
    back, so its commands are the gold path with (move, back) pairs inserted, the same for the same task."""
    require_env("twx")
    coins = generate_tasks("twx", 3, seed=1, split="train", game="coin", step_limit=80,
                           params="numLocations=6,includeDoors=0,numDistractorItems=0")
    back = {"move north": "move south", "move south": "move north", "move east": "move west",
            "move west": "move east"}

    def expert_commands(env, task):
        env.reset(task)
        sent = []
        while not env.done and len(sent) < 80:
            action = env.expert_action()
            sent.append(action.text)
            result = env.step(action)
        return sent, bool(result.info.get("success"))

    gold_env, noisy_env = make_env("twx", action_format="text"), make_env("twx", action_format="text",
                                                                           expert_detours=0.5)
    try:
        detours = 0
        for task in coins:
            gold, won = expert_commands(gold_env, task)
            noisy, noisy_won = expert_commands(noisy_env, task)
            assert won and noisy_won, (gold, noisy)
            assert noisy == expert_commands(noisy_env, task)[0]  # seeded by the task: the same demo again
            # Read the noisy commands against the gold path: each is the path's next command, or a move
            # followed at once by its way back (where a move is both, the path's next one decides).
            played, i = 0, 0
            while i < len(noisy):
                if noisy[i:i + 2] == [noisy[i], back.get(noisy[i])] and noisy[i:i + 2] != gold[played:played + 2]:
                    detours, i = detours + 1, i + 2
                else:
                    assert noisy[i] == gold[played], (gold, noisy)
                    played, i = played + 1, i + 1
            assert played == len(gold), (gold, noisy)
        assert detours >= 2
    finally:
        gold_env.close()
        noisy_env.close()
    with pytest.raises(UsageError, match="expert_detours"):
        make_env("twx", expert_detours=1.5)


def test_the_search_expert_finds_the_coin_by_visiting_each_room_once():
    """expert=search: a depth-first search of the rooms (the ceiling of a policy that sees one room at a time)
    wins Coin within the step limit, never enters a room by a new move twice, and is refused on other games."""
    require_env("twx")
    coins = generate_tasks("twx", 6, seed=3, split="test", game="coin", step_limit=16,
                           params="numLocations=6,includeDoors=0,numDistractorItems=0")
    env = make_env("twx", action_format="text", expert="search")
    try:
        for task in coins:
            env.reset(task)
            rooms, sent = [env.state], []
            while not env.done and len(sent) < 16:
                action = env.expert_action()
                sent.append(action.text)
                result = env.step(action)
                rooms.append(env.state)
            assert result.info.get("success") and sent[-1] == "take coin", sent
            # a depth-first search takes no move twice from the same room (a walk that loops does)
            moves = list(zip(rooms[:-2], sent[:-1], strict=True))
            assert len(set(moves)) == len(moves), moves
            assert len(set(rooms[:-1])) <= 6  # six rooms (the last state: the coin taken)
        cooking = generate_tasks("twx", 1, seed=0, split="test")
        with pytest.raises(InvalidTask, match="expert=search plays Coin only"):
            env.reset(cooking[0])
    finally:
        env.close()
    with pytest.raises(UsageError, match="twx expert must be gold or search"):
        make_env("twx", expert="greedy")
