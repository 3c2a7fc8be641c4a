"""Augmentation: lineage, outcomes kept, consistent tool renames, error recovery, redundant steps."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from omrl.annotate.inputs import final_answer, parse_json
from omrl.cli.main import cli
from omrl.curate.augment import augment_store, augmented_id, llm_paraphraser
from omrl.envs.base import tool_schema
from omrl.schema import Message, ToolCall, Trajectory, Turn
from omrl.store import Store
from omrl.testing.openai_server import FakeOpenAIServer

TOOLS = [tool_schema("read_file", "Read a file.", {"path": {"type": "string"}}),
         tool_schema("answer", "Submit the answer.", {"answer": {"type": "string"}})]
INSTRUCTION = "Find the size of config.txt in 3 steps."


def traj(tid: str = "t1", repeat: bool = True) -> dict:
    read = ToolCall("read_file", '{"path": "config.txt"}', "c1")
    msgs = [Message("system", "Call read_file to read files and answer to submit."), Message("user", INSTRUCTION),
            Message("assistant", None, tool_calls=[read]),
            Message("tool", "- size: 120\n- owner: root\n- mode: 644", tool_call_id="c1", name="read_file")]
    if repeat:
        msgs += [Message("assistant", None, tool_calls=[ToolCall("read_file", '{ "path":"config.txt" }', "c2")]),
                 Message("tool", "- size: 120\n- owner: root\n- mode: 644", tool_call_id="c2", name="read_file")]
    msgs.append(Message("assistant", None, tool_calls=[ToolCall("answer", '{"answer": "120"}', "c3")]))
    n_assistant = sum(m.role == "assistant" for m in msgs)
    return Trajectory(id=tid, task_id="size", messages=msgs, instruction=INSTRUCTION, tools=json.dumps(TOOLS),
                      reward=1.0, success=True, turns=[Turn(i, reward=0.0) for i in range(n_assistant)]).to_row()


@pytest.fixture
def store(tmp_path):
    s = Store.create(tmp_path / "src")
    s.append([traj("t1"), traj("t2", repeat=False)])
    s.append([{"trajectory_id": "t1", "annotator": "q", "score": 1.0}], table="annotations")
    return s


def rows_by_source(path) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in Store(path).read().to_pylist():
        out.setdefault(r["source"], []).append(r)
    return out


def test_lineage_outcome_and_determinism(store, tmp_path):
    ops = ["paraphrase", "observation_noise", "tool_rename", "error_recovery", "drop_redundant"]
    res = augment_store(store, tmp_path / "a", ops, n=2, seed=7)
    assert res.written["drop_redundant"] == 2 and res.not_applicable["drop_redundant"] == 2  # only t1 repeats
    by = rows_by_source(tmp_path / "a")
    assert len(by["collected"]) == 2
    for op in ops:
        for r in by[f"augmented:{op}"]:
            assert r["parent_id"] in {"t1", "t2"} and r["reward"] == 1.0 and r["success"] is True
            meta = json.loads(r["metadata"])["augment"]
            assert meta["op"] == op and r["id"] == augmented_id(r["parent_id"], op, meta["k"], 7)
    again = augment_store(store, tmp_path / "b", ops, n=2, seed=7)
    assert again.written == res.written
    a = {r["id"]: r["messages"] for r in Store(tmp_path / "a").read().to_pylist()}
    b = {r["id"]: r["messages"] for r in Store(tmp_path / "b").read().to_pylist()}
    assert a == b  # same seed: same ids and same contents
    assert Store(tmp_path / "a").manifest["lineage"][0]["options"]["ops"] == ops
    assert Store(tmp_path / "a").read("annotations").column("trajectory_id").to_pylist() == ["t1"]


def test_tool_rename_is_consistent(store, tmp_path):
    augment_store(store, tmp_path / "a", ["tool_rename"], n=1, seed=1, keep_originals=False)
    (row, _) = sorted(rows_by_source(tmp_path / "a")["augmented:tool_rename"], key=lambda r: r["parent_id"])
    mapping = json.loads(row["metadata"])["tool_rename"]
    assert set(mapping) == {"read_file", "answer"} and all(k != v for k, v in mapping.items())
    offered = {t["function"]["name"] for t in json.loads(row["tools"])}
    called = {c["name"] for m in row["messages"] for c in m["tool_calls"]}
    observed = {m["name"] for m in row["messages"] if m["role"] == "tool"}
    assert offered == set(mapping.values())
    assert called <= offered and observed <= offered
    assert mapping["read_file"] in row["messages"][0]["content"] and not re.search(r"\bread_file\b", row["messages"][0]["content"])
    # The answer is still found under its new name.
    assert final_answer(row["messages"], json.loads(row["metadata"])) == "120"


def test_error_recovery_inserts_untrainable_failure(store, tmp_path):
    augment_store(store, tmp_path / "a", ["error_recovery"], seed=3, keep_originals=False)
    for row in rows_by_source(tmp_path / "a")["augmented:error_recovery"]:
        parent = traj(row["parent_id"], repeat=row["parent_id"] == "t1")
        msgs = row["messages"]
        assert len(msgs) == len(parent["messages"]) + 2
        i = next(i for i, m in enumerate(msgs) if m["trainable"] is False and m["role"] == "assistant")
        failed, observation, retry = msgs[i], msgs[i + 1], msgs[i + 2]
        assert observation["role"] == "tool" and observation["trainable"] is False
        assert observation["content"].startswith("Error:")
        assert observation["tool_call_id"] == failed["tool_calls"][0]["id"]
        assert retry["role"] == "assistant" and retry["trainable"] is None and retry["tool_calls"]
        assert failed["tool_calls"][0] != retry["tool_calls"][0]
        assert len(row["turns"]) == row["num_turns"] == sum(m["role"] == "assistant" for m in msgs)
        assert [t["index"] for t in row["turns"]] == list(range(len(row["turns"])))


def test_drop_redundant_and_observation_noise(store, tmp_path):
    augment_store(store, tmp_path / "a", ["drop_redundant", "observation_noise"], seed=0, keep_originals=False)
    by = rows_by_source(tmp_path / "a")
    (dropped,) = by["augmented:drop_redundant"]
    assert dropped["parent_id"] == "t1"
    assert [c["id"] for m in dropped["messages"] for c in m["tool_calls"]] == ["c1", "c3"]
    assert "c2" not in {m["tool_call_id"] for m in dropped["messages"]}
    assert len(dropped["turns"]) == dropped["num_turns"] == 2
    original = traj("t2", repeat=False)["messages"][3]["content"]
    for row in by["augmented:observation_noise"]:
        tool_texts = [m["content"] for m in row["messages"] if m["role"] == "tool"]
        assert any(t != original for t in tool_texts)
        # Noise never removes the fact the answer rests on.
        assert all("size: 120" in t for t in tool_texts)


def test_paraphrase_rules_and_llm(store, tmp_path):
    augment_store(store, tmp_path / "a", ["paraphrase"], n=2, seed=5, keep_originals=False)
    for row in rows_by_source(tmp_path / "a")["augmented:paraphrase"]:
        assert row["instruction"] != INSTRUCTION and "3" in row["instruction"] and "config.txt" in row["instruction"]
        assert row["messages"][1]["content"] == row["instruction"]
    with FakeOpenAIServer() as server:
        server.enqueue({"content": "What is the size of config.txt? Use 3 steps."},
                       {"content": "What is the size of config.txt?"})  # drops the number: refused
        para = llm_paraphraser(server.base_url, "m")
        res = augment_store(store, tmp_path / "b", ["paraphrase"], keep_originals=False, paraphraser=para,
                            where="id = 't1'")
        assert server.calls == 1 and res.written["paraphrase"] == 1
        (row,) = Store(tmp_path / "b").read().to_pylist()
        assert row["instruction"] == "What is the size of config.txt? Use 3 steps."
        res = augment_store(store, tmp_path / "c", ["paraphrase"], keep_originals=False, paraphraser=para,
                            where="id = 't2'")
        assert res.not_applicable["paraphrase"] == 1 and res.written["paraphrase"] == 0
        server.enqueue({"status": 500}, {"status": 500}, {"status": 500})  # the client retries twice, then fails
        res = augment_store(store, tmp_path / "d", ["paraphrase"], keep_originals=False, paraphraser=para,
                            where="id = 't1'")
        assert res.failed["paraphrase"] == 1 and res.written["paraphrase"] == 0
        assert "paraphrase endpoint failed" in res.errors[0]
        server.enqueue({"content": ""})
        res = augment_store(store, tmp_path / "e", ["paraphrase"], keep_originals=False, paraphraser=para,
                            where="id = 't1'")
        assert res.failed["paraphrase"] == 1 and res.not_applicable["paraphrase"] == 0
        assert "empty reply" in res.errors[0]


def test_augment_cli(store, tmp_path):
    result = CliRunner().invoke(cli, ["augment", str(store.path), "--out", str(tmp_path / "a"), "--op", "tool_rename",
                                      "--op", "error_recovery", "--n", "2", "--seed", "1"])
    assert result.exit_code == 0, result.output
    assert "tool_rename" in result.output
    assert Store(tmp_path / "a").count() == 2 + 2 * 2 * 2
    assert parse_json(Store(tmp_path / "a").manifest["lineage"][0]["options"]["n"], 2) == 2
