"""The bfcl environment: BFCL multi-turn entries played on bfcl-eval's own API classes and checker."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from omrl.envs import EnvSpecError, env_class, generate_tasks, make_env, unavailable
from omrl.envs.base import Action
from omrl.policies import make_policy
from omrl.policies.base import PolicyReply
from omrl.policies.scripted import action_reply
from omrl.rollout import RolloutSettings, collect, play_episodes
from omrl.store import Store
from omrl.testing.openai_server import FakeOpenAIServer
from omrl.view.transcript import render_trajectory
from tests.engine_helpers import gone_within, running

pytestmark = pytest.mark.skipif(unavailable(env_class("bfcl")) is not None,
                                reason="bfcl-eval is not installed (make test installs it)")
SETTINGS = RolloutSettings(env="bfcl", max_turns=120, concurrency=4)


def play(tasks, policy, settings=SETTINGS):
    return asyncio.run(play_episodes([(t, 0) for t in tasks], None, policy, settings, run_id="t"))


def turn_infos(row):
    """The per-user-turn check results stored in turns.info, in order."""
    infos = [json.loads(t["info"]) for t in row["turns"]]
    return [i for i in infos if "turn_valid" in i]


def test_expert_passes_bfcls_checker_on_50_base_tasks_and_random_fails():
    tasks = generate_tasks("bfcl", n=50, seed=0, split="multi_turn_base")
    expert = play(tasks, make_policy("scripted"))
    assert {e.status for e in expert} == {"ok"}
    assert sum(bool(e.success) for e in expert) / 50 >= 0.95
    for episode, task in zip(expert, tasks, strict=True):
        checks = turn_infos(episode.row)
        assert len(checks) == task.payload["turns"] and all(c["turn_valid"] for c in checks)
        assert episode.reward == 1.0
    random_policy = play(tasks, make_policy("random"))
    assert {e.status for e in random_policy} <= {"ok", "truncated"}
    assert sum(bool(e.success) for e in random_policy) / 50 < 0.1


@pytest.mark.parametrize("split", ["multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context"])
def test_expert_passes_the_other_categories(split):
    tasks = generate_tasks("bfcl", n=8, seed=3, split=split)
    episodes = play(tasks, make_policy("scripted"))
    assert all(e.success for e in episodes), [(e.row["task_id"], e.row["error"]) for e in episodes if not e.success]
    if split == "multi_turn_miss_param":  # a turn missing a parameter: nothing to call, not checked, passed
        assert any(not c["checked"] and c["turn_valid"] for e in episodes for c in turn_infos(e.row))


def test_miss_func_adds_the_held_out_functions_at_their_turn():
    task = next(t for t in generate_tasks("bfcl", n=200, split="multi_turn_miss_func")
                if t.payload["entry_id"] == "multi_turn_miss_func_0")
    env = make_env("bfcl")
    try:
        first = env.reset(task)
        names = [t["function"]["name"] for t in first.tools]
        assert "sort" not in names and "cd" in names
        results = []
        while not env.done:
            moves = env.expert_action()
            for move in moves if isinstance(moves, list) else [moves]:
                results.append(env.step(move))
        added = [r for r in results if r.tools is not None]
        assert len(added) == 1 and added[0].info["tools_added"] == ["sort"]
        assert added[0].observation == "I have updated some more functions you can choose from. What about now?"
        assert [t["function"]["name"] for t in added[0].tools] == [*names, "sort"]
        assert results[-1].info["success"] and results[-1].reward == 1.0
    finally:
        env.close()
    # Through the agent loop: the model is offered the new tool from that turn on; the row keeps the last set.
    row = play([task], make_policy("scripted"))[0].row
    assert row["success"] and "sort" in [t["function"]["name"] for t in json.loads(row["tools"])]
    # `omrl show` prints each user turn's verdict beside the reply that ended it.
    console = Console(width=200, record=True)
    console.print(render_trajectory(row))
    text = console.export_text()
    assert "user turn 0: passed" in text and "user turn 2: not checked (no ground-truth calls)" in text
    assert "→ sort(" in text


def test_tool_schemas_are_openai_function_schemas():
    from omrl.envs.bfcl import data

    env = make_env("bfcl")
    try:
        tools = env.reset(generate_tasks("bfcl", n=1, split="multi_turn_base")[0]).tools
    finally:
        env.close()
    assert tools and all(t["type"] == "function" and t["function"]["parameters"]["type"] == "object" for t in tools)
    json_types = {"string", "integer", "number", "boolean", "array", "object"}
    for name in ("GorillaFileSystem", "MathAPI", "TradingBot", "TravelAPI", "VehicleControlAPI", "MessageAPI",
                 "TwitterAPI", "TicketAPI"):
        for doc in data.function_docs(name):
            schema = data.tool_schema(doc)["function"]
            assert "response" not in schema and set(schema["parameters"]["required"]) <= set(
                schema["parameters"]["properties"])
            for spec in schema["parameters"]["properties"].values():
                assert spec["type"] in json_types
                if spec["type"] == "array":
                    assert spec["items"]["type"] in json_types
    math = {d["name"]: data.tool_schema(d)["function"] for d in data.function_docs("MathAPI")}
    base = math["power"]["parameters"]["properties"]["base"]
    assert base == {"type": "number", "format": "float",
                    "description": "The base number. This is a float type value."}


def test_wrong_calls_are_observations_and_the_episode_goes_on():
    task = generate_tasks("bfcl", n=200, split="multi_turn_base")[0]
    env = make_env("bfcl")
    try:
        env.reset(task)
        unknown = env.step(Action(tool="format_disk", arguments={}))
        assert unknown.observation == "Error during execution: name 'format_disk' is not defined"
        assert unknown.info["invalid_action"] and not unknown.done
        bad = env.step(Action(tool="cd", arguments={"directory": "x"}))
        assert bad.observation.startswith("Error during execution:") and "unexpected keyword" in bad.observation
        assert bad.info["invalid_action"]
        missing = env.step(Action(tool="cd", arguments={"folder": "no_such_folder"}))
        assert not missing.info.get("invalid_action") and "No such" in missing.observation  # the API's own error
        ok = env.step(Action(tool="ls", arguments={}))
        assert not ok.done and "current_directory_content" in ok.observation
    finally:
        env.close()


def bfcl_call(name: str, arguments: dict) -> str:
    """A call as BFCL's OpenAI handler decodes one for its checker (convert_to_function_call)."""
    return f"{name}({','.join(f'{k}={v!r}' for k, v in arguments.items())})"


def decoded_turns(row) -> list[list[list[str]]]:
    """A stored episode as BFCL's decoded model result: per user turn, per reply with calls, its calls."""
    turns: list[list[list[str]]] = []
    for message in row["messages"][1:]:
        if message["role"] == "user":
            turns.append([])
        elif message["role"] == "assistant" and message["tool_calls"]:
            turns[-1].append([bfcl_call(c["name"], json.loads(c["arguments"])) for c in message["tool_calls"]])
    return turns[:-1]  # the last user message is the end of the conversation


class NoisyExpert:
    """The expert with one mistake in some episodes: a call dropped, an argument changed, calls reversed, or an
    extra harmless call; the checker's verdict on these is what the test compares."""

    name = "noisy"

    def __init__(self, seed: int):
        self.seed = seed

    async def act(self, messages, tools, context):
        rng = context.scratch.setdefault("rng", random.Random(f"{self.seed}-{context.task.id}"))
        kind = context.scratch.setdefault("kind", rng.choice(["none", "drop", "change", "reverse", "extra"]))
        moves = context.env.expert_action()
        turn = sum(1 for m in messages if m["role"] == "assistant")
        if isinstance(moves, list) and not context.scratch.get("done") and rng.random() < 0.5:
            context.scratch["done"] = True
            if kind == "drop" and len(moves) > 1:
                moves.pop(rng.randrange(len(moves)))
            elif kind == "change":
                move = rng.choice(moves)
                for key, value in move.arguments.items():
                    if isinstance(value, str):
                        move.arguments[key] = value + "_x"
                        break
            elif kind == "reverse":
                moves.reverse()
            elif kind == "extra":
                moves.insert(0, Action(tool=rng.choice([t["function"]["name"] for t in tools]), arguments={}))
        return action_reply(moves, turn)


def test_verdicts_agree_with_bfcls_own_multi_turn_checker():
    """Our per-turn scoring (in the worker) against bfcl-eval's multi_turn_checker run on the same calls."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    from omrl.envs.bfcl import data

    tasks = generate_tasks("bfcl", n=30, seed=5, split="multi_turn_base") + generate_tasks(
        "bfcl", n=10, seed=5, split="multi_turn_miss_param")
    episodes = play(tasks, NoisyExpert(seed=1)) + play(tasks[:10], make_policy("random"))
    verdicts = []
    for i, episode in enumerate(episodes):
        row = episode.row
        assert row["status"] == "ok", row["error"]
        item = data.entry(episode.context.task.payload["entry_id"])
        result = multi_turn_checker(decoded_turns(row), item["ground_truth"], dict(item),
                                    data.category_of(item["id"]), f"omrl_check_{i}")
        verdicts.append((bool(row["success"]), result["valid"]))
        assert row["success"] == result["valid"], (row["task_id"], result.get("error_type"), turn_infos(row))
    assert {ours for ours, _ in verdicts} == {True, False}  # both verdicts were exercised


def test_splits_are_disjoint_and_generation_is_deterministic():
    cls = env_class("bfcl")
    ids = {split: {t.payload["entry_id"] for t in generate_tasks("bfcl", n=200, split=split)} for split in cls.splits}
    assert all(len(v) == 200 for v in ids.values())
    assert sum(len(v) for v in ids.values()) == len(set().union(*ids.values()))
    a = generate_tasks("bfcl", n=20, seed=7, split="multi_turn_base")
    assert [t.to_row() for t in a] == [t.to_row() for t in generate_tasks("bfcl", n=20, seed=7,
                                                                         split="multi_turn_base")]
    assert [t.id for t in a] != [t.id for t in generate_tasks("bfcl", n=20, seed=8, split="multi_turn_base")]
    train = generate_tasks("bfcl", n=160, split="multi_turn_long_context", scenarios="0-159")
    test = generate_tasks("bfcl", n=40, split="multi_turn_base", scenarios="160-199")
    assert {t.payload["scenario"] for t in train}.isdisjoint({t.payload["scenario"] for t in test})
    payload = a[0].payload
    assert set(payload) >= {"entry_id", "category", "scenario", "bfcl_eval_version"}
    with pytest.raises(EnvSpecError, match="has splits"):
        generate_tasks("bfcl", n=1, split="test")
    with pytest.raises(ValueError, match="41 entries"):
        generate_tasks("bfcl", n=50, split="multi_turn_base", scenarios="0-40")


class KillsTheEngine:
    """Plays the expert, but kills the environment's engine process before its second reply."""

    name = "killer"

    async def act(self, messages, tools, context):
        turn = sum(1 for m in messages if m["role"] == "assistant")
        if turn == 1:
            os.kill(context.env.engine.engine_pids()[0], signal.SIGKILL)
            context.env.engine.process.process.wait()
        return action_reply(context.env.expert_action(), turn)


def test_an_engine_killed_mid_episode_is_an_env_error_and_the_episode_is_stored(tmp_path: Path):
    tasks = generate_tasks("bfcl", n=3, seed=2, split="multi_turn_base")
    store = Store.create(tmp_path / "s")
    result = asyncio.run(collect("bfcl", tasks[:1], KillsTheEngine(), store, SETTINGS, run_id="k"))
    assert result.statuses["env_error"] == 1
    row = store.read().to_pylist()[0]
    assert row["status"] == "env_error" and "bfcl engine was killed by signal 9" in row["error"], row["error"]
    assert row["messages"][2]["tool_calls"] and row["reward"] is None
    # The next episodes get a fresh engine.
    again = asyncio.run(collect("bfcl", tasks, make_policy("scripted"), store, SETTINGS, run_id="s"))
    assert again.statuses["ok"] == 3 and again.success_rate == 1.0


def test_a_call_past_its_time_limit_ends_the_episode_and_the_engine_is_replaced():
    task = next(t for t in generate_tasks("bfcl", n=200, split="multi_turn_base")
                if "MathAPI" in t.payload["involved_classes"])
    env = make_env("bfcl", call_timeout_s=0.5)
    try:
        env.reset(task)
        pids = env.engine.engine_pids()
        slow = env.step(Action(tool="power", arguments={"base": 10, "exponent": 10 ** 9}))  # a huge integer
        assert slow.done and slow.info["error_type"] == "omrl:call_limit" and slow.info["success"] is False
        assert not env.engine.alive() and gone_within(pids)
        env.reset(task)
        assert env.engine.restarts == 1
        assert env.step(Action(tool="add", arguments={"a": 1, "b": 2})).observation == '{"result": 3}'
    finally:
        env.close()


def test_the_engine_does_not_outlive_a_killed_omrl_process():
    script = ("import time\nfrom omrl.envs import make_env\nenv = make_env('bfcl')\n"
              "print(env.engine.engine_pids()[0], flush=True)\ntime.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    try:
        worker = int(parent.stdout.readline())
        assert running(worker)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert gone_within([worker])
    finally:
        parent.kill()
        parent.wait()


def test_without_bfcl_eval_the_refusal_names_the_extra(monkeypatch):
    from omrl.envs.bfcl import BfclEnv, data

    data.api_class.cache_clear()
    monkeypatch.setitem(sys.modules, "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker", None)
    try:
        reason = BfclEnv.unavailable()
        assert reason is not None and "omrl[bfcl]" in reason and "--no-deps bfcl-eval" in reason
        assert "\n" not in reason
        with pytest.raises(EnvSpecError, match=r"cannot run here: needs bfcl-eval"):
            make_env("bfcl")
    finally:
        data.api_class.cache_clear()


def test_collect_through_a_real_openai_client_stores_every_episode(tmp_path: Path):
    """10 tasks through the openai client and a local HTTP server: the tools reach the server as sent, each
    episode is stored with a status; the server plays the ground truth read back from the prompt."""
    from omrl.envs.bfcl import data
    from omrl.policies.openai_policy import OpenAIPolicy

    tasks = generate_tasks("bfcl", n=10, seed=4, split="multi_turn_base")
    by_question = {t.instruction: data.entry(t.payload["entry_id"]) for t in tasks}

    def ground_truth(request: dict) -> dict:
        messages = request["messages"]
        item = by_question[messages[1]["content"]]
        turn = sum(1 for m in messages if m["role"] == "user") - 1
        if messages[-1]["role"] == "tool" or not item["ground_truth"][turn]:
            return {"content": "Done."}
        calls = [data.call_arguments(item, text) for text in item["ground_truth"][turn]]
        return {"content": None, "tool_calls": [{"name": n, "arguments": a} for n, a in calls]}

    store = Store.create(tmp_path / "s")
    with FakeOpenAIServer(responder=ground_truth) as server:
        policy = OpenAIPolicy("fake-model", base_url=server.base_url, backoff=0.01)
        result = asyncio.run(collect("bfcl", tasks, policy, store, SETTINGS, run_id="o"))
        first = server.requests[0]
    assert result.played == 10 and result.written == 10
    rows = store.read().to_pylist()
    assert all(r["status"] == "ok" for r in rows) and sum(r["success"] for r in rows) == 10
    assert [t["function"]["name"] for t in first["tools"]] == [t["function"]["name"] for t in json.loads(
        next(r for r in rows if r["instruction"] == first["messages"][1]["content"])["tools"])]


def test_expert_reply_of_several_calls_is_one_assistant_message():
    reply = action_reply([Action(tool="cd", arguments={"folder": "a"}), Action(tool="ls", arguments={})], 3)
    assert isinstance(reply, PolicyReply) and [c["id"] for c in reply.tool_calls] == ["call_3_0", "call_3_1"]
    assert action_reply(Action(text="Done."), 4).content == "Done."
