"""LLM-as-judge through the real `openai` client against the local scripted server."""

from __future__ import annotations

import json
import re

import pytest

from omrl.annotate.judge import JudgeConfig, parse_json_reply
from omrl.annotate.render import render_trajectory
from omrl.annotate.rubric import load_rubric
from omrl.annotate.runner import annotate
from omrl.schema import Message, ToolCall, Trajectory
from omrl.store import Store
from omrl.testing.openai_server import FakeOpenAIServer

RUBRIC = load_rubric({"name": "q", "criteria": ["correct answer"], "scale": {"min": 0, "max": 10},
                           "examples": [{"trajectory": "TASK: 1+1\nOUTCOME: final answer: 2", "score": 10}]})


def traj(tid: str, answer: str, task_id: str = "t", sample: int = 0) -> dict:
    msgs = [Message("user", "What is 6*7?"),
            Message("assistant", None, tool_calls=[ToolCall("answer", json.dumps({"answer": answer}), "c1")])]
    return Trajectory(id=tid, task_id=task_id, run_id="r", sample=sample, messages=msgs, instruction="What is 6*7?",
                      task=json.dumps({"answer": "42"}), reward=float(answer == "42")).to_row()


def answers_in(text: str) -> list[str]:
    return re.findall(r"final answer: (\S+)", text)


def pointwise_responder(request: dict) -> dict:
    (answer,) = answers_in(request["messages"][-1]["content"])
    return {"content": json.dumps({"score": 9 if answer == "42" else 2, "rationale": f"answer {answer}"})}


def config(server: FakeOpenAIServer, mode: str = "pointwise", **kw) -> JudgeConfig:
    return JudgeConfig(rubric=RUBRIC, model="judge-m", base_url=server.base_url, mode=mode, **kw)


@pytest.fixture
def store(tmp_path):
    s = Store.create(tmp_path / "s")
    s.append([traj("a", "42"), traj("b", "41", sample=1), traj("c", "42", sample=2)])
    return s


def judged(store: Store, annotator: str) -> dict[str, dict]:
    rows = store.sql(f"SELECT * FROM latest_annotations WHERE annotator = '{annotator}'").to_pylist()
    return {r["trajectory_id"]: r for r in rows}


def test_pointwise_scores_tokens_cost_and_cache(store):
    with FakeOpenAIServer(responder=pointwise_responder) as server:
        cfg = config(server, price_prompt=1.0, price_completion=2.0)
        first = annotate(store, judge=cfg)
        assert server.calls == 3 and first.judge.cache_hits == 0
        got = judged(store, "judge:q")
        assert {k: v["score"] for k, v in got.items()} == {"a": 9.0, "b": 2.0, "c": 9.0}
        a = got["a"]
        assert a["status"] == "ok" and a["judge_model"] == "judge-m" and a["rationale"] == "answer 42"
        assert a["prompt_tokens"] > 0 and a["completion_tokens"] > 0 and len(a["prompt_hash"]) == 64
        assert a["cost_usd"] == pytest.approx((a["prompt_tokens"] * 1.0 + a["completion_tokens"] * 2.0) / 1e6)
        # The rubric and the few-shot example reach the judge; the env reward does not.
        sent = server.requests[0]["messages"]
        assert "correct answer" in sent[0]["content"] and sent[1]["content"].startswith("Trajectory:")
        assert "reward" not in sent[-1]["content"].lower()
        resumed = annotate(store, judge=cfg)  # a plain re-run resumes: everything is already scored
        assert resumed.judge is None and resumed.written["judge:q"] == 0 and resumed.already_done["judge:q"] == 3
        second = annotate(store, judge=cfg, redo=True)
        assert server.calls == 3  # zero new calls: every reply came from the cache
        assert second.judge.cache_hits == 3 and second.written["judge:q"] == 3
    assert (store.path / "cache" / "judge" / "replies.jsonl").is_file()
    assert store.sql("SELECT count(*) AS n FROM annotations").column("n")[0].as_py() == 6  # history kept


def test_invalid_replies_are_retried_then_stored_as_errors(tmp_path):
    store = Store.create(tmp_path / "s")
    store.append([traj("a", "42")])
    with FakeOpenAIServer() as server:
        cfg = config(server, concurrency=1, max_invalid=2)
        server.enqueue({"content": "I think it is good"},  # not JSON
                       {"content": '```json\n{"score": 11}\n```'},  # fenced, but out of range
                       {"content": '```json\n{"score": 7, "rationale": "ok"}\n```'})
        annotate(store, judge=cfg)
        assert server.calls == 3
        # The re-ask tells the judge what was wrong.
        assert "outside the scale" in server.requests[2]["messages"][-1]["content"]
        assert judged(store, "judge:q")["a"]["score"] == 7.0

        store2 = Store.create(tmp_path / "s2")
        store2.append([traj("b", "41")])
        server.enqueue(*[{"content": '{"score": "high"}'}] * 3)
        summary = annotate(store2, judge=cfg)
        row = judged(store2, "judge:q")["b"]
        assert row["status"] == "error" and row["score"] is None and "invalid judge reply" in row["error"]
        assert summary.errors["judge:q"] == 1 and summary.judge.invalid_replies == 3
        # Errors are not cached: the next run asks again.
        server.enqueue({"content": '{"score": 3}'})
        annotate(store2, judge=cfg)
        assert server.calls == 7 and judged(store2, "judge:q")["b"]["score"] == 3.0


def test_transport_errors_backoff_then_succeed_or_fail(tmp_path):
    store = Store.create(tmp_path / "s")
    store.append([traj("a", "42")])
    with FakeOpenAIServer() as server:
        server.enqueue({"status": 429}, {"status": 500}, {"raw": "garbage"}, {"raw": '{"choices": []}'},
                       {"content": '{"score": 5}'})
        summary = annotate(store, judge=config(server, max_retries=4))
        assert server.calls == 5 and summary.judge.transport_retries == 4
        assert judged(store, "judge:q")["a"]["score"] == 5.0
        store2 = Store.create(tmp_path / "s2")
        store2.append([traj("b", "42")])
        server.enqueue(*[{"status": 503}] * 3)
        annotate(store2, judge=config(server, max_retries=2))
        row = judged(store2, "judge:q")["b"]
        assert row["status"] == "error" and "after 3 attempts" in row["error"]


def pairwise_responder(request: dict) -> dict:
    text = request["messages"][-1]["content"]
    a, b = answers_in(text)
    pref = "tie" if (a == "42") == (b == "42") else ("A" if a == "42" else "B")
    return {"content": json.dumps({"preference": pref, "rationale": "x"})}


def test_pairwise_sends_both_orders_and_combines(store):
    store.append([traj("solo", "42", task_id="other")])
    with FakeOpenAIServer(responder=pairwise_responder) as server:
        summary = annotate(store, judge=config(server, mode="pairwise"))
        assert server.calls == 6  # 3 pairs in task t, each in both orders; "solo" has no partner
        assert summary.skipped["judge:q:pairwise"] == 1
        orders = {tuple(answers_in(r["messages"][-1]["content"])) for r in server.requests}
        assert ("42", "41") in orders and ("41", "42") in orders
        got = judged(store, "judge:q:pairwise")
        assert got["b"]["score"] == 0.0  # lost both pairs
        assert got["a"]["score"] == pytest.approx(0.75) and got["c"]["score"] == pytest.approx(0.75)
        assert got["a"]["kind"] == "pairwise" and "solo" not in got

    # A judge that always prefers the first position: both orders cancel out into ties.
    with FakeOpenAIServer(default={"content": '{"preference": "A"}'}) as server:
        assert annotate(store, judge=config(server, mode="pairwise")).judge.calls == 0  # resumed: all scored
        annotate(store, judge=config(server, mode="pairwise", temperature=0.5), redo=True)
        got = judged(store, "judge:q:pairwise")
        assert {v["score"] for v in got.values()} == {0.5}
        assert json.loads(got["a"]["metadata"])["position_inconsistent"] == 2


def group_responder(request: dict) -> dict:
    text = request["messages"][-1]["content"]
    blocks = text.split("=== TRAJECTORY ")[1:]
    scores = [{"id": i, "score": 8 if "final answer: 42" in blk else 1} for i, blk in enumerate(blocks, 1)]
    return {"content": json.dumps({"scores": scores})}


def test_group_mode_one_call_per_group(store):
    store.append([traj("d", "42", task_id="u"), traj("e", "0", task_id="u", sample=1)])
    with FakeOpenAIServer(responder=group_responder) as server:
        annotate(store, judge=config(server, mode="group"))
        assert server.calls == 2  # two groups, five trajectories
        got = judged(store, "judge:q:group")
        assert {k: v["score"] for k, v in got.items()} == {"a": 8, "b": 1, "c": 8, "d": 8, "e": 1}
        # A reply missing one sample is invalid -> re-asked -> error for the whole group.
        server.responder = lambda req: {"content": '{"scores": [{"id": 1, "score": 3}]}'}
        store.append([traj("f", "42", task_id="w"), traj("g", "1", task_id="w", sample=1)])
        annotate(store, judge=config(server, mode="group", max_invalid=1), where="task_id = 'w'")
        got = judged(store, "judge:q:group")
        assert got["f"]["status"] == "error" and "ids" in got["f"]["error"]


def test_truncation_keeps_task_final_turns_and_outcome():
    msgs = [Message("system", "Rules."), Message("user", "Find the file.")]
    for i in range(40):
        msgs.append(Message("assistant", None, tool_calls=[ToolCall("ls", json.dumps({"i": i}), f"c{i}")]))
        msgs.append(Message("tool", f"listing {i} " + "x" * 300, tool_call_id=f"c{i}", name="ls"))
    msgs.append(Message("assistant", None, tool_calls=[ToolCall("answer", '{"answer": "found.txt"}', "cz")]))
    row = Trajectory(id="long", task_id="t", messages=msgs, instruction="Find the file.").to_row()
    text = render_trajectory(row, max_chars=4000, keep_last=4)
    assert len(text) <= 4000
    assert text.startswith("TASK: Find the file.") and "SYSTEM: Rules." in text and "USER: Find the file." in text
    assert "[... 77 messages elided ...]" in text  # 83 messages: 2 lead + 4 last kept
    assert "listing 39" in text and "listing 38" in text and "listing 37" not in text
    assert text.endswith("OUTCOME: status=ok; final answer: found.txt")
    tight = render_trajectory(row, max_chars=600, keep_last=4)
    assert "chars elided" in tight and tight.endswith("final answer: found.txt") and len(tight) <= 600
    short = render_trajectory(traj("s", "42"))
    assert "elided" not in short


def test_reply_parsing_and_rubric_files():
    assert parse_json_reply('Sure!\n```json\n{"score": 3}\n```') == {"score": 3}
    assert parse_json_reply('verdict: {"score": 1} done') == {"score": 1}
    with pytest.raises(ValueError):
        parse_json_reply("[1, 2]")
    from pathlib import Path

    for path in sorted((Path(__file__).resolve().parents[1] / "recipes" / "judges").glob("*.yaml")):
        rubric = load_rubric(path)
        assert rubric.criteria and rubric.scale_min < rubric.scale_max
    with pytest.raises(ValueError, match="outside the scale"):
        load_rubric({"name": "x", "criteria": ["c"], "scale": {"min": 0, "max": 1},
                          "examples": [{"trajectory": "t", "score": 5}]})
    with pytest.raises(ValueError, match="max_invalid must be at least 0"):
        JudgeConfig(rubric=RUBRIC, model="m", base_url="http://x/v1", max_invalid=-1)


def test_annotate_cli_metrics_judge_and_reward(store, tmp_path):
    from click.testing import CliRunner

    from omrl.cli.main import cli

    rubric = tmp_path / "r.yaml"
    rubric.write_text("name: q\ncriteria: [correct answer]\nscale: {min: 0, max: 10}\n")
    recipe = tmp_path / "reward.yaml"
    recipe.write_text("components:\n  exact_match: 1.0\n  judge:q: {weight: 1.0, scale: [0, 10]}\n")
    with FakeOpenAIServer(responder=pointwise_responder) as server:
        args = ["annotate", str(store.path), "--metric", "exact_match", "--judge", str(rubric), "--judge-model", "m",
                "--base-url", server.base_url, "--concurrency", "4", "--reward-recipe", str(recipe)]
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
        assert "judge: 3 calls, 0 cache hits" in result.output and "judge:q" in result.output
        result = CliRunner().invoke(cli, args)  # a re-run resumes: nothing left to annotate
        assert result.exit_code == 0 and "judge:" not in result.output.split("reward:")[0].split("┘")[-1]
        assert server.calls == 3 and store.count("annotations") == 9
        result = CliRunner().invoke(cli, args + ["--redo"])
        assert "judge: 0 calls, 3 cache hits" in result.output and server.calls == 3
    rewards = {r["trajectory_id"]: r["reward"] for r in store.sql("SELECT trajectory_id, reward FROM scores").to_pylist()}
    assert rewards == pytest.approx({"a": 1.9, "b": 0.2, "c": 1.9})
    bad = CliRunner().invoke(cli, ["annotate", str(store.path), "--judge", str(rubric)])
    assert bad.exit_code != 0 and "--judge-model" in bad.output


# ---------------------------------------------------------------- prompt budget (8,192-token judges)


def long_traj(tid: str, turns: int, sample: int = 0) -> dict:
    msgs = [Message("system", "Solve it."), Message("user", "What is 6*7?")]
    for k in range(turns):
        msgs.append(Message("assistant", f"thinking step {k} " + "blah " * 60))
        msgs.append(Message("user", f"observation {k} " + "data " * 60))
    msgs.append(Message("assistant", None, tool_calls=[ToolCall("answer", json.dumps({"answer": "42"}), "c1")]))
    return Trajectory(id=tid, task_id="t", run_id="r", sample=sample, messages=msgs, instruction="What is 6*7?",
                      task=json.dumps({"answer": "42"}), reward=1.0).to_row()


def flat_group_responder(request: dict) -> dict:
    n = request["messages"][-1]["content"].count("=== TRAJECTORY ")
    return {"content": json.dumps({"scores": [{"id": i, "score": 5} for i in range(1, n + 1)]})}


def prompt_chars(request: dict) -> int:
    return sum(len(m["content"] or "") for m in request["messages"])


def test_requests_carry_max_tokens_and_prompts_fit_max_prompt_tokens(tmp_path):
    store = Store.create(tmp_path / "s")
    store.append([long_traj(f"x{i}", 40, sample=i) for i in range(2)])
    with FakeOpenAIServer(responder=flat_group_responder) as server:
        # The llama.cpp case of the issue: a group of two long trajectories, an 8,192-token context.
        cfg = config(server, mode="group", max_tokens=256, max_prompt_tokens=8192 - 256)
        summary = annotate(store, judge=cfg)
    assert summary.errors["judge:q:group"] == 0 and server.calls == 1
    request = server.requests[0]
    assert request["max_tokens"] == 256
    assert prompt_chars(request) / cfg.chars_per_token <= 8192 - 256  # within budget by the stated estimate
    assert "messages elided" in request["messages"][-1]["content"]  # the long-trajectory rule did the cutting


def test_a_group_larger_than_group_max_is_scored_in_chunks(tmp_path):
    store = Store.create(tmp_path / "s")
    store.append([traj(f"g{i}", "42" if i % 2 else "41", sample=i) for i in range(5)])
    with FakeOpenAIServer(responder=flat_group_responder) as server:
        annotate(store, judge=config(server, mode="group", group_max=2))
    sizes = sorted(r["messages"][-1]["content"].count("=== TRAJECTORY ") for r in server.requests)
    assert sizes == [1, 2, 2]
    rows = judged(store, "judge:q:group")
    assert len(rows) == 5 and all(r["status"] == "ok" for r in rows.values())
    assert {json.loads(r["metadata"])["chunks"] for r in rows.values()} == {3}


def test_a_prompt_that_cannot_fit_is_an_error_not_a_request(tmp_path):
    store = Store.create(tmp_path / "s")
    store.append([long_traj("y", 5)])
    with FakeOpenAIServer(responder=pointwise_responder) as server:
        summary = annotate(store, judge=config(server, max_prompt_tokens=300))
    assert server.calls == 0 and summary.errors["judge:q"] == 1
    (row,) = judged(store, "judge:q").values()
    assert row["status"] == "error" and row["score"] is None and "max_prompt_tokens" in row["error"]


def test_re_asks_send_the_original_prompt_and_a_clipped_reply_so_prompts_do_not_grow(store):
    junk = "no json here " * 500
    with FakeOpenAIServer(default={"content": junk}) as server:
        summary = annotate(store, judge=config(server, max_invalid=3), where="id = 'a'")
    assert summary.errors["judge:q"] == 1 and server.calls == 4
    sizes = [prompt_chars(r) for r in server.requests]
    assert sizes[1] == sizes[2] == sizes[3]  # every re-ask is the same size, not one reply longer each time
    assert sizes[1] - sizes[0] < 1200 < len(junk)


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_recipe_judge_without_a_server_stops_up_front_in_one_line(store, monkeypatch):
    from omrl.annotate.runner import annotate_with_recipe
    from omrl.errors import UsageError

    url = f"http://127.0.0.1:{closed_port()}/v1"
    monkeypatch.setenv("OMRL_JUDGE_URL", url)
    monkeypatch.setenv("OMRL_JUDGE_MODEL", "m")
    with pytest.raises(UsageError) as caught:
        annotate_with_recipe(store, "shipped:reward")
    line = str(caught.value)
    assert "\n" not in line and f"judge judge:task_quality of reward recipe shipped:reward needs a server at {url}" in line
    assert "set OMRL_JUDGE_URL" in line and "shipped:reward_offline" in line
    assert store.count("annotations") == 0  # not an error annotation per row
    # The same judge given by hand, without a recipe: the line names its URL too.
    with pytest.raises(UsageError, match=f"judge judge:q needs a server at {re.escape(url)} and none answers"):
        annotate(store, judge=JudgeConfig(rubric=RUBRIC, model="m", base_url=url))
    assert store.count("annotations") == 0


def test_a_reachable_judge_that_fails_still_writes_error_rows_never_zero(store):
    with FakeOpenAIServer(responder=lambda request: {"status": 500}) as server:
        summary = annotate(store, judge=config(server, max_retries=0))
    assert summary.errors["judge:q"] == 3
    rows = store.read("annotations").to_pylist()
    assert len(rows) == 3 and all(r["status"] == "error" and r["score"] is None for r in rows)


def test_offline_the_shipped_reward_recipe_says_what_it_needs_and_the_offline_one_runs(store):
    from click.testing import CliRunner

    from omrl.cli.main import cli

    args = ["annotate", str(store.path), "--metric", "exact_match", "--reward-recipe"]
    result = CliRunner().invoke(cli, [*args, "shipped:reward"], terminal_width=400)
    assert result.exit_code != 0
    assert "judge:task_quality (--judge shipped:judges/task_quality" in result.output
    assert "$OMRL_JUDGE_URL" in result.output and "shipped:reward_offline" in result.output
    assert store.count("annotations") == 0  # stopped before writing anything
    result = CliRunner().invoke(cli, [*args, "shipped:reward_offline"], terminal_width=400)
    assert result.exit_code == 0, result.output
    statuses = store.sql("SELECT annotator, status FROM annotations").to_pylist()
    assert len(statuses) == 6 and {r["status"] for r in statuses} == {"ok"}
