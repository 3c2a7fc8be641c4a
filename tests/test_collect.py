"""The rollout engine: collect through the real openai client against a local server, failures, resume, eval."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_agent import CountEnv, count_tasks

from omrl.cli.main import cli
from omrl.envs.base import Task
from omrl.policies import make_policy
from omrl.policies.openai_policy import OpenAIPolicy
from omrl.rollout import collect, default_run_name, eval_metrics, evaluate, pass_at_k
from omrl.schema import trajectory_id
from omrl.store import Store
from omrl.testing.openai_server import FakeOpenAIServer


def counting_expert(request: dict) -> dict:
    """Plays CountEnv's expert from the prompt: add(1) until the target, then submit()."""
    target = int(re.search(r"Count to (\d+)", request["messages"][1]["content"]).group(1))
    done = sum(1 for m in request["messages"] if m["role"] == "tool")
    if done < target:
        return {"content": f"adding {done + 1}", "tool_calls": [{"name": "add", "arguments": {"amount": 1}}]}
    return {"content": None, "tool_calls": [{"name": "submit", "arguments": {}}]}


def run(coro):
    return asyncio.run(coro)


def test_collect_through_openai_client_stores_the_script(tmp_path: Path):
    store = Store.create(tmp_path / "s")
    tasks = count_tasks(3, target=2)
    with FakeOpenAIServer(responder=counting_expert) as server:
        policy = OpenAIPolicy("fake-model", base_url=server.base_url, backoff=0.01)
        result = run(collect(CountEnv, tasks, policy, store, samples=2, concurrency=4, run_id="r1", temperature=0.5))
        requests = list(server.requests)
    assert (result.played, result.written, result.success_rate) == (6, 6, 1.0)
    assert len(requests) == 6 * 3
    rows = store.read().to_pylist()
    assert sorted(r["id"] for r in rows) == sorted(trajectory_id("r1", 0, t.id, s) for t in tasks for s in (0, 1))
    for row in rows:
        assert row["status"] == "ok" and row["model"] == "fake-model" and row["env"] == "count"
        assistant = [m for m in row["messages"] if m["role"] == "assistant"]
        assert [m["tool_calls"][0]["name"] for m in assistant] == ["add", "add", "submit"]
        assert [m["content"] for m in assistant] == ["adding 1", "adding 2", None]
        tool = [m for m in row["messages"] if m["role"] == "tool"]
        assert [m["content"] for m in tool] == ["count=1", "count=2", "right"]
        assert [m["tool_call_id"] for m in tool] == [m["tool_calls"][0]["id"] for m in assistant]
        assert [t["reward"] for t in row["turns"]] == [0.1, 0.1, 1.0] and row["reward"] == pytest.approx(1.2)
        assert all(t["prompt_tokens"] > 0 for t in row["turns"]) and row["completion_tokens"] > 0
    # The model saw the tool results in chat-API form, tied to its own call ids.
    last = max(requests, key=lambda r: len(r["messages"]))["messages"]
    assert last[2]["tool_calls"][0]["function"]["name"] == "add" and last[3]["role"] == "tool"
    assert last[3]["tool_call_id"] == last[2]["tool_calls"][0]["id"] and requests[0]["temperature"] == 0.5
    assert store.check() == []


def test_server_failures_are_retried_then_stored_as_errors(tmp_path: Path):
    failures = {7: {"status": 429}, 8: {"status": 500}, 9: {"raw": "not json"}, 6: {"hang": 1.0}}

    def responder(request: dict) -> dict:
        target = int(re.search(r"Count to (\d+)", request["messages"][1]["content"]).group(1))
        return failures.get(target) or counting_expert(request)

    tasks = [Task(id=f"t{n}", instruction="", payload={"target": n}) for n in (1, 6, 7, 8, 9)]
    store = Store.create(tmp_path / "s")
    with FakeOpenAIServer(responder=responder) as server:
        policy = OpenAIPolicy("m", base_url=server.base_url, retries=2, backoff=0.01)
        result = run(collect(CountEnv, tasks, policy, store, concurrency=5, run_id="r",
                             model_call_timeout=0.3))
        per_task = {}
        for request in server.requests:
            key = request["messages"][1]["content"]
            per_task[key] = per_task.get(key, 0) + 1
    assert result.played == 5 and result.errors == 4
    rows = {r["task_id"]: r for r in store.read().to_pylist()}
    assert rows["t1"]["status"] == "ok" and rows["t1"]["success"] is True
    assert rows["t6"]["status"] == "timeout" and "no reply within 0.3s" in rows["t6"]["error"]
    assert rows["t7"]["status"] == "policy_error" and "429" in rows["t7"]["error"]
    assert rows["t8"]["status"] == "policy_error" and "500" in rows["t8"]["error"]
    assert rows["t9"]["status"] == "policy_error" and "JSONDecodeError" in rows["t9"]["error"]
    for n in (6, 7, 8, 9):
        assert per_task[f"Count to {n}."] == 3  # the first try and 2 retries
        assert rows[f"t{n}"]["reward"] is None and rows[f"t{n}"]["success"] is None


def test_env_errors_are_stored_and_the_run_goes_on(tmp_path: Path):
    tasks = count_tasks(4) + [Task(id="bad", instruction="", payload={"target": 1, "fail_step": True}),
                              Task(id="bad-reset", instruction="", payload={"target": 1, "fail_reset": True})]
    store = Store.create(tmp_path / "s")
    result = run(collect(CountEnv, tasks, make_policy("scripted"), store, concurrency=3, run_id="r"))
    rows = {r["task_id"]: r for r in store.read().to_pylist()}
    assert result.played == 6 and result.statuses == {"ok": 4, "env_error": 2}
    assert "exploded" in rows["bad"]["error"] and "reset exploded" in rows["bad-reset"]["error"]
    assert all(rows[f"t{i}"]["success"] for i in range(4))


def test_max_turns_truncates(tmp_path: Path):
    store = Store.create(tmp_path / "s")
    result = run(collect(CountEnv, count_tasks(2, target=9), make_policy("scripted"), store, max_turns=3,
                         run_id="r"))
    assert result.statuses == {"truncated": 2}
    assert [r["num_turns"] for r in store.read().to_pylist()] == [3, 3]


def test_resume_skips_stored_episodes_and_batches_are_parts(tmp_path: Path):
    store = Store.create(tmp_path / "s")
    tasks = count_tasks(5, target=1)
    first = run(collect(CountEnv, tasks[:3], make_policy("scripted"), store, samples=2, run_id="r",
                        batch_size=2))
    assert (first.played, first.skipped) == (6, 0)
    assert 2 <= len(store.parts()) <= 3  # batches of 2 (rows finishing during an append join the next)
    second = run(collect(CountEnv, tasks, make_policy("scripted"), store, samples=2, run_id="r"))
    assert (second.played, second.skipped, second.total) == (4, 6, 10)
    third = run(collect(CountEnv, tasks, make_policy("scripted"), store, samples=2, run_id="r"))
    assert third.played == 0 and third.skipped == 10
    ids = store.read(columns=["id"]).column("id").to_pylist()
    assert len(ids) == 10 == len(set(ids))
    # Another round of the same run is new work.
    assert run(collect(CountEnv, tasks, make_policy("scripted"), store, samples=2, run_id="r", round=1)).played == 10


def test_cancelled_run_keeps_finished_episodes_and_resumes(tmp_path: Path):
    store = Store.create(tmp_path / "s")
    tasks = count_tasks(12, target=2)

    async def cancel_midway():
        job = asyncio.create_task(collect(lambda: CountEnv(step_sleep=0.05), tasks, make_policy("scripted"), store,
                                          concurrency=2, run_id="r", batch_size=100))
        await asyncio.sleep(0.6)
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job

    run(cancel_midway())
    kept = store.count()
    assert 0 < kept < 12  # finished episodes were flushed although the batch was not full
    result = run(collect(CountEnv, tasks, make_policy("scripted"), store, run_id="r"))
    assert result.played == 12 - kept and store.count() == 12 and store.check() == []


def test_retry_failed_replays_failed_episodes_and_keeps_them_as_history(tmp_path: Path):
    store = Store.create(tmp_path / "s")
    tasks = count_tasks(3, target=1)
    policy = make_policy("scripted")
    run(collect(lambda: CountEnv(fail_at=1), tasks[:2], policy, store, samples=2, run_id="r"))  # 4 env_errors
    run(collect(CountEnv, tasks[2:], policy, store, samples=2, run_id="r"))  # 2 ok
    plain = run(collect(CountEnv, tasks, policy, store, samples=2, run_id="r"))
    assert (plain.played, plain.skipped) == (0, 6)  # without the flag a failed episode counts as stored

    retried = run(collect(CountEnv, tasks, policy, store, samples=2, run_id="r", retry_failed=True))
    assert (retried.played, retried.retried, retried.skipped, retried.written) == (4, 4, 2, 4)
    rows = store.read(columns=["id", "task_id", "sample", "status", "metadata"]).to_pylist()
    assert len(rows) == 10 and len({r["id"] for r in rows}) == 10
    failed = [r for r in rows if r["status"] == "env_error"]
    assert {(r["task_id"], r["sample"]) for r in failed} == {(t.id, s) for t in tasks[:2] for s in (0, 1)}
    replayed = {r["id"]: r for r in rows if json.loads(r["metadata"]).get("attempt") == 1}
    assert set(replayed) == {trajectory_id("r", 0, t.id, s, 1) for t in tasks[:2] for s in (0, 1)}
    assert {r["status"] for r in replayed.values()} == {"ok"}
    assert trajectory_id("r", 0, "t0", 0, 0) == trajectory_id("r", 0, "t0", 0)  # first plays keep their ids

    again = run(collect(CountEnv, tasks, policy, store, samples=2, run_id="r", retry_failed=True))
    assert (again.played, again.retried, again.skipped) == (0, 0, 6)  # the last attempts succeeded
    ev = run(evaluate(CountEnv, tasks, policy, store, samples=2, run_id="r"))  # reads each episode's last attempt
    assert (ev.collect.played, ev.metrics["count"]["episodes"], ev.metrics["count"]["errors"]) == (0, 6, 0)


def test_cli_collect_retry_failed_says_how_many_were_retried(tmp_path: Path):
    tasks_file = write_tasks(tmp_path / "t.jsonl", count_tasks(2, target=1))
    args = ["collect", "--env", "test_agent:CountEnv", "--tasks", str(tasks_file), "--policy", "scripted",
            "--store", str(tmp_path / "s"), "--run", "r", "--no-progress"]
    first = CliRunner().invoke(cli, [*args, "--env-option", "fail_at=1"], terminal_width=200)
    assert first.exit_code == 0 and "--retry-failed" in first.output, first.output
    plain = CliRunner().invoke(cli, args, terminal_width=200)
    assert "0 played, 2 already stored" in plain.output, plain.output
    retry = CliRunner().invoke(cli, [*args, "--retry-failed"], terminal_width=200)
    assert retry.exit_code == 0, retry.output
    assert "2 played (2 failed before, retried), 0 already stored, 2 written" in retry.output
    assert Store(tmp_path / "s").count() == 4
    assert "--retry-failed" in CliRunner().invoke(cli, ["eval", "--help"]).output


def test_a_failing_on_episode_callback_keeps_the_finished_row(tmp_path: Path):
    store = Store.create(tmp_path / "s")

    def explode(episode):
        raise RuntimeError("callback bug")

    with pytest.raises(RuntimeError, match="callback bug"):
        run(collect(CountEnv, count_tasks(1, target=1), make_policy("scripted"), store, run_id="r", on_episode=explode))
    assert store.count() == 1
    with pytest.raises(ValueError, match="flush_seconds must be positive"):
        run(collect(CountEnv, count_tasks(1), make_policy("scripted"), store, run_id="r2", flush_seconds=0))


def test_pass_at_k_and_eval_metrics():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 4, 2) == 1.0
    rows = [{"env": "e", "task_id": "a", "status": "ok", "reward": 1.0, "success": True},
            {"env": "e", "task_id": "a", "status": "ok", "reward": 0.0, "success": False},
            {"env": "e", "task_id": "b", "status": "policy_error", "reward": None, "success": None},
            {"env": "e", "task_id": "b", "status": "ok", "reward": 0.0, "success": False}]
    m = eval_metrics(rows, ks=(1, 2))["e"]  # the policy_error episode is counted beside the rate, not as unsolved
    assert m["success_rate"] == pytest.approx(1 / 3) and m["mean_reward"] == pytest.approx(1 / 3)
    assert m["errors"] == m["failed"] == 1 and m["unknown_success"] == 0
    assert m["pass@1"] == pytest.approx(0.25) and "pass@2" not in m  # task b has one known outcome
    rows.append({"env": "e", "task_id": "b", "status": "ok", "reward": 1.0, "success": True})
    m = eval_metrics(rows, ks=(1, 2))["e"]
    assert m["pass@1"] == pytest.approx(0.5) and m["pass@2"] == pytest.approx(1.0)


def test_evaluate_math_env_with_scripted_and_random(tmp_path: Path):
    from omrl.envs.math import generate_tasks

    tasks = generate_tasks(6, seed=3)
    store = Store.create(tmp_path / "s")
    good = run(evaluate("math", tasks, make_policy("scripted"), store, samples=2))
    assert good.metrics["math"]["success_rate"] == 1.0 and good.metrics["math"]["pass@2"] == 1.0
    assert good.collect.run_id.startswith("eval-")
    rows = store.read().to_pylist()
    assert {r["source"] for r in rows} == {"eval"} and len(rows) == 12
    assert all(json.loads(r["messages"][-2]["tool_calls"][0]["arguments"]).get("value") for r in rows)
    bad = run(evaluate("math", tasks, make_policy("random"), store, samples=2, max_turns=3,
                       run_id="eval-random"))
    assert bad.metrics["math"]["success_rate"] < 0.5 and bad.metrics["math"]["episodes"] == 12


def test_default_run_name_is_stable():
    a = default_run_name("math", "tasks.parquet", "openai:Qwen/Qwen2.5-7B")
    assert a == default_run_name("math", "tasks.parquet", "openai:Qwen/Qwen2.5-7B")
    assert a != default_run_name("math", "other.parquet", "openai:Qwen/Qwen2.5-7B")
    assert a.startswith("math-tasks-Qwen2.5-7B-")


def write_tasks(path: Path, tasks: list[Task]) -> Path:
    path.write_text("".join(json.dumps(t.to_row()) + "\n" for t in tasks))
    return path


def test_cli_collect_and_eval_with_openai_server(tmp_path: Path):
    from omrl.envs.math import generate_tasks

    tasks = generate_tasks(4, seed=1)
    tasks_file = write_tasks(tmp_path / "math.jsonl", tasks)
    answers = {t.instruction: t.answer for t in tasks}

    def answer(request: dict) -> dict:
        return {"content": f'<tool_call>{{"name": "answer", "arguments": {{"value": '
                           f'"{answers[request["messages"][1]["content"]]}"}}}}</tool_call>'}

    runner = CliRunner()
    with FakeOpenAIServer(responder=answer) as server:
        args = ["--env", "math", "--tasks", str(tasks_file), "--policy", "openai:fake", "--base-url",
                server.base_url, "--no-progress"]
        out = runner.invoke(cli, ["collect", *args, "--store", str(tmp_path / "s"), "-n", "2"])
        assert out.exit_code == 0, out.output
        assert "8 played" in out.output
        again = runner.invoke(cli, ["collect", *args, "--store", str(tmp_path / "s"), "-n", "2"])
        assert "0 played, 8 already stored" in again.output and server.calls == 8
        ev = runner.invoke(cli, ["eval", *args, "-k", "2", "--limit", "3"])
    assert ev.exit_code == 0, ev.output
    assert "100.0%" in ev.output and "pass@2" in ev.output
    rows = Store(tmp_path / "s").read().to_pylist()
    assert all(r["success"] for r in rows)
    assert "<tool_call>" in json.loads(rows[0]["turns"][0]["info"])["raw_text"]


def test_cli_rejects_bad_input(tmp_path: Path):
    tasks_file = write_tasks(tmp_path / "t.jsonl", count_tasks(1))
    out = CliRunner().invoke(cli, ["collect", "--env", "nope", "--tasks", str(tasks_file), "--policy", "scripted",
                                   "--store", str(tmp_path / "s")])
    assert out.exit_code != 0 and "unknown environment" in out.output
    out = CliRunner().invoke(cli, ["collect", "--env", "math", "--tasks", str(tasks_file), "--policy", "what",
                                   "--store", str(tmp_path / "s")])
    assert out.exit_code != 0 and "unknown policy" in out.output


def test_collect_and_eval_flags_are_the_rollout_settings(tmp_path: Path, monkeypatch):
    import dataclasses

    import omrl.rollout
    from omrl.rollout import CollectResult, RolloutSettings

    seen = {}

    async def fake_collect(env_spec, tasks, policy, store, settings=None, **kwargs):
        seen["settings"] = settings
        return CollectResult(run_id="r", round=kwargs.get("round", 0), total=0, skipped=0)

    monkeypatch.setattr(omrl.rollout, "collect", fake_collect)
    tasks_file = write_tasks(tmp_path / "t.jsonl", count_tasks(1))
    out = CliRunner().invoke(cli, ["collect", "--env", "math", "--tasks", str(tasks_file), "--policy", "scripted",
                                   "--store", str(tmp_path / "s"), "--max-turns", "3", "--max-tokens", "7",
                                   "--temperature", "0.5", "--seed", "9", "--turn-timeout", "2.5", "-c", "2",
                                   "--env-option", "max_calculator_calls=3", "--unsafe-no-sandbox", "--no-progress"])
    assert out.exit_code == 0, out.output
    assert seen["settings"] == RolloutSettings(env="math", env_options={"max_calculator_calls": 3, "unsafe_no_sandbox": True},
                                               max_turns=3, max_new_tokens=7, temperature=0.5, seed=9,
                                               model_call_timeout=120.0, turn_timeout=2.5, concurrency=2)
    for command in ("collect", "eval"):
        text = CliRunner().invoke(cli, [command, "--help"], terminal_width=200).output
        for f in dataclasses.fields(RolloutSettings):
            assert f.metadata["flag"] in text, f"{command} has no flag for {f.name}"


def test_a_lone_surrogate_in_a_reply_is_stored_replaced_and_loses_no_batch(tmp_path: Path):
    """A server's JSON escape of half a UTF-16 pair: the turn goes on, the row is stored with U+FFFD."""

    def responder(request: dict) -> dict:
        reply = counting_expert(request)
        if reply["tool_calls"][0]["name"] == "add":
            reply["content"] = "adding \udc00"  # json.dumps sends it as the escape "\udc00"
            reply["tool_calls"][0]["arguments"] = '{"amount": 1, "note": "\ud800"}'
        return reply

    store = Store.create(tmp_path / "s")
    tasks = count_tasks(3, target=2)
    with FakeOpenAIServer(responder=responder) as server:
        policy = OpenAIPolicy("m", base_url=server.base_url)
        result = run(collect(CountEnv, tasks, policy, store, samples=2, concurrency=3, run_id="r"))
        sent = [m for r in server.requests for m in r["messages"] if m["role"] == "assistant"]
    assert (result.played, result.written, dict(result.statuses)) == (6, 6, {"ok": 6})
    rows = store.read().to_pylist()
    assert len(rows) == 6 and store.check() == []
    for row in rows:
        assistant = [m for m in row["messages"] if m["role"] == "assistant"]
        assert [m["content"] for m in assistant] == ["adding \ufffd", "adding \ufffd", None]
        assert "\ufffd" in assistant[0]["tool_calls"][0]["arguments"]
        assert json.loads(row["metadata"])["replaced_surrogates"] == 4
    assert sent and all(m["content"] in ("adding \ufffd", None) for m in sent)  # the model got back valid text
