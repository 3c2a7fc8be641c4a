"""The one agent loop: messages, turns, statuses and errors, with a small counting environment."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from omrl.envs.base import Action, Reset, StepResult, Task, tool_schema
from omrl.policies import PolicyError, PolicyReply, make_policy
from omrl.rollout.agent import run_episode
from omrl.schema import group_id, trajectory_id


class CountEnv:
    """Count up to the task's target with add(amount), then submit(); reward 1 when the count is right.

    Options make it slow (step_sleep), broken (fail_at: raise on that step number, or on tasks whose
    payload says fail), or text-driven (text=True: actions are the plain words "add" / "submit").
    """

    name = "count"
    TOOLS = [tool_schema("add", "Add to the counter.", {"amount": {"type": "integer"}}),
             tool_schema("submit", "Submit the count.", {})]

    def __init__(self, step_sleep: float = 0.0, fail_at: int | None = None, text: bool = False):
        self.step_sleep, self.fail_at, self.text = step_sleep, fail_at, text
        self.steps = 0
        self.closed = False

    def reset(self, task: Task) -> Reset:
        self.task, self.count, self.steps = task, 0, 0
        if task.payload.get("fail_reset"):
            raise RuntimeError("reset exploded")
        return Reset(observation=f"Count to {task.payload['target']}.", tools=[] if self.text else self.TOOLS,
                     system_prompt="You count." if not self.text else None)

    def step(self, action: Action) -> StepResult:
        self.steps += 1
        if self.step_sleep:
            time.sleep(self.step_sleep)
        if self.fail_at is not None and self.steps >= self.fail_at or self.task.payload.get("fail_step"):
            raise RuntimeError(f"step {self.steps} exploded")
        tool = action.tool if not self.text else action.text.strip()
        if tool == "add":
            self.count += int(action.arguments.get("amount", 1)) if not self.text else 1
            return StepResult(observation=f"count={self.count}", reward=0.1)
        if tool == "submit":
            ok = self.count == self.task.payload["target"]
            return StepResult(observation="right" if ok else "wrong", reward=1.0 if ok else 0.0, done=True,
                              info={"success": ok})
        return StepResult(observation=f"unknown action {tool!r}", info={"invalid_action": True})

    def expert_action(self) -> Action:
        more = self.count < self.task.payload["target"]
        if self.text:
            return Action(text="add" if more else "submit")
        return Action(tool="add", arguments={"amount": 1}) if more else Action(tool="submit")

    def close(self) -> None:
        self.closed = True


def count_tasks(n: int, target: int = 2, **payload: Any) -> list[Task]:
    return [Task(id=f"t{i}", instruction=f"Count to {target}.", answer=str(target), env="count",
                 payload={"target": target, **payload}) for i in range(n)]


class ReplyPolicy:
    """Plays a fixed list of replies (or raises / sleeps when the item says so)."""

    name = "replies"

    def __init__(self, *replies: Any):
        self.replies = list(replies)

    async def act(self, messages, tools, context) -> PolicyReply:
        item = self.replies.pop(0)
        if isinstance(item, Exception):
            raise item
        if isinstance(item, float):
            await asyncio.sleep(item)
            return PolicyReply(content="late")
        return item


def play(env, task, policy, **kw):
    kw.setdefault("run_id", "r")
    kw.setdefault("max_turns", 10)
    return asyncio.run(run_episode(env, task, policy, **kw))


def test_scripted_episode_records_messages_turns_and_ids():
    env, task = CountEnv(), count_tasks(1)[0]
    ep = play(env, task, make_policy("scripted"), round=2, sample=3, seed=7)
    row = ep.row
    assert row["status"] == "ok" and row["success"] is True and row["error"] is None
    assert row["reward"] == pytest.approx(1.2)  # 0.1 + 0.1 + 1.0
    assert row["id"] == trajectory_id("r", 2, "t0", 3) and row["group_id"] == group_id("r", 2, "t0")
    roles = [m["role"] for m in row["messages"]]
    assert roles == ["system", "user"] + ["assistant", "tool"] * 3
    assert row["messages"][0]["content"] == "You count."
    first_call = row["messages"][2]["tool_calls"][0]
    assert first_call["name"] == "add" and json.loads(first_call["arguments"]) == {"amount": 1}
    assert row["messages"][3]["tool_call_id"] == first_call["id"] and row["messages"][3]["name"] == "add"
    assert [m["content"] for m in row["messages"] if m["role"] == "tool"] == ["count=1", "count=2", "right"]
    assert [t["reward"] for t in row["turns"]] == [0.1, 0.1, 1.0]
    assert [t["done"] for t in row["turns"]] == [False, False, True]
    assert row["num_turns"] == 3 and json.loads(row["task"])["answer"] == "2"
    assert json.loads(row["tools"])[0]["function"]["name"] == "add"
    assert ep.context.episode_id == row["id"] and ep.context.seed == 7


def test_max_turns_truncates_with_failure_not_error():
    ep = play(CountEnv(), count_tasks(1, target=5)[0], make_policy("scripted"), max_turns=2)
    assert ep.status == "truncated" and ep.success is False and ep.row["error"] is None
    assert ep.reward == pytest.approx(0.2) and ep.row["num_turns"] == 2


def test_env_error_is_stored_with_text_and_no_score():
    ep = play(CountEnv(fail_at=2), count_tasks(1)[0], make_policy("scripted"))
    assert ep.status == "env_error" and "step 2 exploded" in ep.row["error"]
    assert ep.reward is None and ep.success is None
    assert json.loads(ep.row["metadata"])["partial_reward"] == pytest.approx(0.1)
    ep = play(CountEnv(), count_tasks(1, fail_reset=True)[0], make_policy("scripted"))
    assert ep.status == "env_error" and "env.reset failed" in ep.row["error"] and ep.row["messages"] == []


def test_invalid_json_arguments_become_an_observation_without_env_step():
    env = CountEnv()
    bad = PolicyReply(tool_calls=[{"id": "c1", "name": "add", "arguments": '{"amount": 1'}])
    good = PolicyReply(tool_calls=[{"id": "c2", "name": "submit", "arguments": "{}"}])
    ep = play(env, count_tasks(1, target=0)[0], ReplyPolicy(bad, good))
    assert ep.status == "ok" and ep.success is True
    assert env.steps == 1  # only submit reached the environment
    tool_msg = ep.row["messages"][3]
    assert tool_msg["role"] == "tool" and tool_msg["tool_call_id"] == "c1"
    assert "not valid JSON" in tool_msg["content"]
    assert json.loads(ep.row["turns"][0]["info"])["invalid_action"] is True
    assert json.loads(ep.row["metadata"])["invalid_actions"] == 1


def test_text_replies_step_as_text_and_come_back_as_user_messages():
    ep = play(CountEnv(text=True), count_tasks(1, target=1)[0], make_policy("scripted"))
    assert ep.status == "ok" and ep.success is True
    assert [m["role"] for m in ep.row["messages"]] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert ep.row["messages"][2]["content"] == "add" and ep.row["messages"][3]["content"] == "count=1"


def test_policy_error_and_timeouts():
    ep = play(CountEnv(), count_tasks(1)[0], ReplyPolicy(PolicyError("endpoint down")))
    assert ep.status == "policy_error" and "endpoint down" in ep.row["error"] and ep.reward is None
    ep = play(CountEnv(), count_tasks(1)[0], ReplyPolicy(ZeroDivisionError("bug")))
    assert ep.status == "policy_error" and "ZeroDivisionError" in ep.row["error"]
    ep = play(CountEnv(), count_tasks(1)[0], ReplyPolicy(5.0), turn_timeout=0.1)
    assert ep.status == "timeout" and "turn_timeout" in ep.row["error"] and ep.success is None
    ep = play(CountEnv(step_sleep=0.05), count_tasks(1, target=50)[0], make_policy("scripted"),
              max_turns=100, episode_timeout=0.3)
    assert ep.status == "timeout" and "episode_timeout" in ep.row["error"]


def test_random_policy_plays_valid_tools_deterministically():
    a = play(CountEnv(), count_tasks(1, target=3)[0], make_policy("random"), seed=1, max_turns=6)
    b = play(CountEnv(), count_tasks(1, target=3)[0], make_policy("random"), seed=1, max_turns=6)
    calls = [[c["name"] for c in m["tool_calls"]] for m in a.row["messages"] if m["role"] == "assistant"]
    assert calls and all(c[0] in ("add", "submit") for c in calls)
    assert a.row["messages"] == b.row["messages"]


def test_scripted_policy_needs_an_expert():
    class NoExpert(CountEnv):
        expert_action = None

    ep = play(NoExpert(), count_tasks(1)[0], make_policy("scripted"))
    assert ep.status == "policy_error" and "no scripted expert" in ep.row["error"]


def test_done_step_with_none_info_and_reward_is_scored_not_crashed():
    class Bare(CountEnv):
        def step(self, action):
            result = super().step(action)
            return StepResult(result.observation, reward=None, done=result.done, info=None) if result.done else result

    ep = play(Bare(), count_tasks(1)[0], make_policy("scripted"))
    assert ep.status == "ok" and ep.success is False and ep.reward == pytest.approx(0.2)
