"""The scienceworld environment: ScienceWorld's simulator (a JVM) in an engine process, scored by itself."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from omrl.envs import EnvSpecError, env_class, generate_tasks, make_env, unavailable
from omrl.envs.base import Action
from omrl.policies import make_policy
from omrl.policies.scripted import action_reply
from omrl.rollout import RolloutSettings, collect, play_episodes
from omrl.store import Store
from tests.engine_helpers import gone_within, jvm_caps_seen

pytestmark = [pytest.mark.slow,  # the ScienceWorld simulator (Java)
              pytest.mark.skipif(unavailable(env_class("scienceworld")) is not None,
                                 reason="scienceworld or Java is missing (make system-deps; make test installs it)")]
SETTINGS = RolloutSettings(env="scienceworld", max_turns=40, concurrency=1)
SHORT = "find-non-living-thing,find-plant"  # gold paths of 5-10 steps: cheap to play


@pytest.fixture(scope="module")
def env():
    environment = make_env("scienceworld")
    yield environment
    pids = environment.engine.engine_pids()
    environment.close()
    assert gone_within(pids)  # the JVM went with it


def test_expert_plays_the_gold_path_to_completion():
    tasks = generate_tasks("scienceworld", n=2, seed=1, split="test", tasks=SHORT)
    episodes = asyncio.run(play_episodes([(t, 0) for t in tasks], None, make_policy("scripted"), SETTINGS,
                                         run_id="gold"))
    for episode in episodes:
        assert episode.status == "ok" and episode.success is True, episode.row["error"]
        assert episode.reward == pytest.approx(1.0)
        assert '"score": 100' in episode.row["turns"][-1]["info"]
        assert episode.row["messages"][1]["content"].startswith("Task: Your task is to find")


def test_wrong_commands_are_observations_and_a_failed_task_ends_unsolved(env):
    task = generate_tasks("scienceworld", n=1, seed=0, split="dev", tasks="find-animal")[0]
    first = env.reset(task)
    assert first.tools[0]["function"]["name"] == "act" and "focus on OBJ" in first.system_prompt
    nonsense = env.step(Action(tool="act", arguments={"command": "xyzzy the plugh"}))
    assert nonsense.info["invalid_action"] and not nonsense.done
    assert "No known action matches that input" in nonsense.observation
    assert env.step(Action(tool="jump", arguments={})).info["invalid_action"]
    assert env.step(Action(tool="act", arguments={"command": "  "})).observation.startswith("Invalid action")
    looked = env.step(Action(text="look around\nand more"))  # one command per step: the first line
    assert looked.info["command"] == "look around" and not looked.done
    wrong = env.step(Action(tool="act", arguments={"command": "focus on air"}))  # air is not an animal
    assert wrong.done and wrong.info["success"] is False and wrong.info["failed"] and wrong.reward == 0.0
    assert env.step(Action(text="look around")).info["invalid_action"]  # the episode is over


def test_splits_are_scienceworlds_own_and_disjoint_and_generation_is_deterministic():
    from omrl.envs.scienceworld.tasks import variation_table

    table = variation_table()
    assert len(table) == 30
    for name, splits in table.items():
        train, dev, test = (set(splits[s]) for s in ("train", "dev", "test"))
        assert train and dev and test and not (train & dev or train & test or dev & test), name
    tasks = generate_tasks("scienceworld", n=40, seed=3, split="test")
    assert len({t.payload["task_name"] for t in tasks}) == 30  # round robin over every task type
    assert all(t.payload["variation"] in table[t.payload["task_name"]]["test"] for t in tasks)
    assert len({t.id for t in tasks}) == 40
    again = generate_tasks("scienceworld", n=40, seed=3, split="test")
    assert [t.to_row() for t in tasks] == [t.to_row() for t in again]
    assert [t.id for t in generate_tasks("scienceworld", n=40, seed=4, split="test")] != [t.id for t in tasks]
    train_ids = {t.id for t in generate_tasks("scienceworld", n=200, split="train")}
    assert train_ids.isdisjoint(t.id for t in generate_tasks("scienceworld", n=200, split="test"))
    assert set(tasks[0].payload) >= {"task_name", "task_id", "variation", "simplifications", "scienceworld_version"}
    with pytest.raises(ValueError, match="unknown ScienceWorld task"):
        generate_tasks("scienceworld", n=1, split="test", tasks="bake-a-cake")


class KillsTheJvm:
    """Plays the expert, but kills the simulator's JVM before the third reply."""

    name = "killer"

    async def act(self, messages, tools, context):
        turn = sum(1 for m in messages if m["role"] == "assistant")
        if turn == 2:
            worker, *engine = context.env.engine.engine_pids()
            assert engine, "the JVM is a child in the engine's group"
            for pid in engine:
                os.kill(pid, signal.SIGKILL)
        return action_reply(context.env.expert_action(), turn)


def test_a_jvm_killed_mid_episode_is_an_env_error_and_the_episode_is_stored(tmp_path: Path):
    tasks = generate_tasks("scienceworld", n=1, seed=2, split="test", tasks="find-non-living-thing")
    store = Store.create(tmp_path / "s")
    result = asyncio.run(collect("scienceworld", tasks, KillsTheJvm(), store, SETTINGS, run_id="k"))
    assert result.statuses["env_error"] == 1
    row = store.read().to_pylist()[0]
    assert row["status"] == "env_error" and row["reward"] is None and len(row["turns"]) == 2
    assert "env.step" in row["error"]


def test_without_the_package_or_java_the_refusal_says_what_to_install(monkeypatch):
    from omrl.envs.scienceworld import env as scienceworld

    monkeypatch.setattr(scienceworld.shutil, "which", lambda name: None)
    reason = scienceworld.SciWorldEnv.unavailable()
    assert reason and "Java" in reason and "system-deps" in reason and "\n" not in reason
    monkeypatch.setitem(sys.modules, "scienceworld", None)
    assert "omrl[scienceworld]" in scienceworld.SciWorldEnv.unavailable()
    with pytest.raises(EnvSpecError, match="cannot run here: needs the scienceworld package"):
        make_env("scienceworld")


def test_the_jvm_heap_and_the_engine_memory_are_capped_by_options(env):
    from omrl.envs.scienceworld import SciWorldEnv

    options, heap = jvm_caps_seen(env.engine)
    assert options.endswith("-Xmx1024m") and 900 <= heap <= 1024, (options, heap)
    assert env.engine.memory is not None and env.engine.memory.mb == 1024 + 512
    limits = SciWorldEnv.resource_limits()
    assert "jvm_heap_mb=1024" in limits and "memory_mb=1536" in limits and "x 1536 MB" in limits
    small = make_env("scienceworld", jvm_heap_mb=256, memory_mb=0)
    try:
        options, heap = jvm_caps_seen(small.engine)
        assert options.endswith("-Xmx256m") and heap <= 256 and small.engine.memory is None
    finally:
        small.close()
    uncapped = make_env("scienceworld", jvm_heap_mb=0, memory_mb=0)  # the JVM's own default: a quarter of memory
    try:
        assert "-Xmx" not in jvm_caps_seen(uncapped.engine)[0] and uncapped.engine.memory is None
    finally:
        uncapped.close()
    with pytest.raises(ValueError, match="memory_mb must be a whole number"):
        make_env("scienceworld", memory_mb="lots")
