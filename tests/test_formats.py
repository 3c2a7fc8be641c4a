"""Importers: every real public file is detected and converted faithfully; edge cases of each format."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from omrl.formats.detect import detect_format
from omrl.formats.importer import FileReport, iter_trajectories, load_trajectories
from omrl.formats.records import FormatError
from omrl.schema.arrow import to_table

REAL_FORMATS = {
    "eto_sharegpt_3traj.json": "sharegpt",
    "openmanus-rl_webshop_val.parquet": "openmanus",
    "swe-gym_openhands_5traj.json": "openai",
    "swe-agent_marshmallow-1867.traj": "swe_agent",
    "toolbench_G1_answer_10.json": "toolbench",
}
TASK_FILES = ["gsm8k_test.jsonl", "agentbench_dbbench_dev.jsonl", "agentbench_os_dev.json", "swe-bench-lite_5tasks.json"]


def _write(path: Path, data) -> Path:
    path.write_text(json.dumps(data))
    return path


def _calls(row) -> list[dict]:
    return [c for m in row["messages"] for c in m["tool_calls"]]


def _assert_linked(row) -> None:
    """Every tool result answers a call made earlier in the same trajectory, and every call has an id."""
    seen = set()
    for m in row["messages"]:
        for c in m["tool_calls"]:
            assert c["id"], m
            seen.add(c["id"])
        if m["role"] == "tool":
            assert m["tool_call_id"] in seen, m


# ---------------------------------------------------------------- detection


@pytest.mark.parametrize("name", sorted(REAL_FORMATS))
def test_detects_every_real_trajectory_file(real_data, name):
    assert detect_format(real_data / name) == REAL_FORMATS[name]


@pytest.mark.parametrize("name", TASK_FILES)
def test_task_files_are_not_mistaken_for_trajectories(real_data, name):
    with pytest.raises(FormatError, match="cannot tell the format.*omrl tasks import"):
        detect_format(real_data / name)


# ---------------------------------------------------------------- real files


def test_sharegpt_real(real_data):
    source = json.loads((real_data / "eto_sharegpt_3traj.json").read_text())
    rows = load_trajectories(real_data / "eto_sharegpt_3traj.json")
    assert len(rows) == len(source)
    for row, rec in zip(rows, source, strict=True):
        assert row["task_id"] == rec["id"] and row["reward"] == rec["reward"]
        assert row["success"] is None  # ShareGPT states a reward, not success: nothing invented
        assert [m["content"] for m in row["messages"]] == [t["value"] for t in rec["conversations"]]
        roles = {"human": "user", "gpt": "assistant"}
        assert [m["role"] for m in row["messages"]] == [roles[t["from"]] for t in rec["conversations"]]
        # the first human turn is a preamble the agent only acknowledged ("OK"): the task is the next one
        assert rec["conversations"][1]["value"] == "OK"
        assert row["instruction"] == rec["conversations"][2]["value"] and "Instruction:" in row["instruction"]
        assert row["env"] == "import:sharegpt" and row["source"] == "imported:sharegpt"
        assert row["run_id"] == "import:eto_sharegpt_3traj" and row["round"] == 0
        assert json.loads(row["metadata"])["source"] == rec["source"]  # leftovers kept
    to_table(rows)  # fits the Arrow schema


def test_openmanus_real_keeps_loss_flags_and_gold(real_data):
    source = pq.read_table(real_data / "openmanus-rl_webshop_val.parquet").to_pylist()
    rows = load_trajectories(real_data / "openmanus-rl_webshop_val.parquet")
    assert len(rows) == len(source) == 20
    for row, rec in zip(rows, source, strict=True):
        assert row["task_id"] == rec["item_id"]
        flags = [m["trainable"] for m in row["messages"]]
        assert flags == [t["loss"] for t in rec["conversations"]]
        assert False in flags and True in flags  # the real file marks some gpt turns as not trained
        task = json.loads(row["task"])
        assert task["reward_model"]["ground_truth"] == rec["reward_model"]["ground_truth"]
        assert task["data_source"] == "webshop"
        # the tool-list preamble the agent acknowledged ("Ok.") is not the instruction: the WebShop task is
        assert rec["conversations"][1]["value"] == "Ok." and row["instruction"] == rec["conversations"][2]["value"]
        assert row["reward"] is None and row["success"] is None


def test_openai_real_swe_gym(real_data):
    source = json.loads((real_data / "swe-gym_openhands_5traj.json").read_text())
    rows = load_trajectories(real_data / "swe-gym_openhands_5traj.json")
    for row, rec in zip(rows, source, strict=True):
        assert row["task_id"] == rec["instance_id"]
        assert row["success"] is rec["resolved"] and row["reward"] is None
        assert len(row["messages"]) == len(rec["messages"])
        assert len(_calls(row)) == sum(len(m["tool_calls"] or []) for m in rec["messages"])
        original = [c["id"] for m in rec["messages"] for c in (m["tool_calls"] or [])]
        assert [c["id"] for c in _calls(row)] == original  # native ids kept
        _assert_linked(row)
        assert json.loads(row["tools"]) == rec["tools"]
        assert json.loads(row["task"])["test_result"] == rec["test_result"]
        assert json.loads(row["metadata"])["run_id"] == rec["run_id"]


def test_swe_agent_real_uses_history_and_info(real_data):
    rec = json.loads((real_data / "swe-agent_marshmallow-1867.traj").read_text())
    [row] = load_trajectories(real_data / "swe-agent_marshmallow-1867.traj")
    assert len(row["messages"]) == len(rec["history"])
    assert len(_calls(row)) == sum(len(m.get("tool_calls") or []) for m in rec["history"])
    _assert_linked(row)
    assert row["task_id"] == "marshmallow-code__marshmallow-1867"
    assert row["status"] == "ok"  # exit_status: submitted
    assert row["success"] is None and row["reward"] is None  # SWE-agent does not know if the patch resolves it
    assert row["model"] == "gpt-4o"
    assert json.loads(row["metadata"])["info"]["submission"] == rec["info"]["submission"]
    assert "TimeDelta serialization precision" in json.loads(row["task"])["problem_statement"]


def test_toolbench_real_takes_longest_snapshot(real_data):
    rec = json.loads((real_data / "toolbench_G1_answer_10.json").read_text())
    [row] = load_trajectories(real_data / "toolbench_G1_answer_10.json")
    longest = max(rec["answer_generation"]["train_messages"], key=len)
    assert len(row["messages"]) == len(longest)
    assert [c["name"] for c in _calls(row)] == [m["function_call"]["name"] for m in longest if m.get("function_call")]
    tool_msgs = [m for m in row["messages"] if m["role"] == "tool"]
    assert len(tool_msgs) == sum(1 for m in longest if m["role"] == "function")
    _assert_linked(row)
    for m in tool_msgs:  # linked by name: each result answers the call of the same function
        call = next(c for c in _calls(row) if c["id"] == m["tool_call_id"])
        assert call["name"] == m["name"]
    assert row["success"] is True and row["reward"] is None
    names = [t["function"]["name"] for t in json.loads(row["tools"])]
    assert names == [f["name"] for f in rec["answer_generation"]["function"]]
    assert rec["answer_generation"]["query"].strip() in row["instruction"]


def test_ids_are_deterministic_and_distinct(real_data):
    first = [r["id"] for r in load_trajectories(real_data / "openmanus-rl_webshop_val.parquet")]
    again = [r["id"] for r in load_trajectories(real_data / "openmanus-rl_webshop_val.parquet")]
    assert first == again and len(set(first)) == len(first)


# ---------------------------------------------------------------- edge cases


def test_openai_links_results_by_name_and_accepts_object_arguments(tmp_path):
    record = {"id": "t1", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "weather in "}, {"type": "text", "text": "Paris?"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "geo", "arguments": {"city": "Paris"}}},
            {"type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "name": "weather", "content": "sunny"},  # answers the second call, by name only
        {"role": "tool", "name": "geo", "content": "48.8N"},
        {"role": "assistant", "content": None, "function_call": {"name": "answer", "arguments": "{\"x\": 1}"}},
        {"role": "function", "name": "answer", "content": "ok"},
        {"role": "assistant", "content": "Sunny.", "weight": 0},
    ], "reward": 0.5}
    [row] = load_trajectories(_write(tmp_path / "chat.json", [record]))
    assert row["instruction"] == "weather in Paris?"
    calls = _calls(row)
    assert [c["name"] for c in calls] == ["geo", "weather", "answer"]
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}
    assert calls[0]["id"] == "call_1_0" and calls[2]["id"] == "call_4_0"  # generated, stable
    tools = [m for m in row["messages"] if m["role"] == "tool"]
    assert [t["tool_call_id"] for t in tools] == [calls[1]["id"], calls[0]["id"], calls[2]["id"]]
    assert row["messages"][-1]["trainable"] is False
    assert row["reward"] == 0.5 and row["success"] is None


def test_sharegpt_function_call_observation_and_mask(tmp_path):
    record = {"conversations": [
        {"from": "system", "value": "You are helpful."},
        {"from": "human", "value": "2+2?"},
        {"from": "gpt", "value": "Let me compute.", "mask": True},
        {"from": "function_call", "value": json.dumps({"name": "calc", "arguments": {"e": "2+2"}})},
        {"from": "observation", "value": "4"},
        {"from": "ai", "value": "4", "loss": True},
    ], "tools": json.dumps([{"name": "calc", "parameters": {"type": "object"}}])}
    [row] = load_trajectories(_write(tmp_path / "s.json", [record]), fmt="sharegpt")
    roles = [m["role"] for m in row["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]  # the call joins the text turn before it
    assert row["messages"][2]["trainable"] is False and row["messages"][4]["trainable"] is True
    assert row["messages"][2]["tool_calls"][0]["name"] == "calc"
    assert row["messages"][3]["tool_call_id"] == row["messages"][2]["tool_calls"][0]["id"]
    assert json.loads(row["tools"]) == [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    assert row["task_id"] == "s:0"  # no native id: file stem and index


def test_atif_steps_observations_and_metrics(tmp_path):
    doc = {"schema_version": "ATIF-v1.4", "session_id": "sess-1",
           "agent": {"name": "demo-agent", "version": "0.1", "model_name": "tiny"},
           "steps": [
               {"step_id": 1, "source": "user", "message": "Price of ACME?"},
               {"step_id": 2, "source": "agent", "message": "Looking it up.", "reasoning_content": "need a lookup",
                "tool_calls": [{"tool_call_id": "c1", "function_name": "quote", "arguments": {"ticker": "ACME"}}],
                "observation": {"results": [{"source_call_id": "c1", "content": "12.5"}]},
                "metrics": {"prompt_tokens": 30, "completion_tokens": 3, "completion_token_ids": [5, 6, 7],
                            "logprobs": [-0.1, -0.2, -0.3]}},
               {"step_id": 3, "source": "agent", "message": "ACME trades at 12.5."},
           ],
           "final_metrics": {"total_prompt_tokens": 70, "total_completion_tokens": 9}}
    path = _write(tmp_path / "run.json", doc)
    assert detect_format(path) == "atif"
    [row] = load_trajectories(path)
    assert [m["role"] for m in row["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert row["messages"][1]["reasoning"] == "need a lookup"
    assert row["messages"][2]["tool_call_id"] == "c1"
    assert row["turns"][0]["completion_ids"] == [5, 6, 7] and row["turns"][0]["prompt_tokens"] == 30
    assert row["turns"][1]["done"] is True and len(row["turns"]) == 2
    assert row["model"] == "tiny" and row["prompt_tokens"] == 70 and row["task_id"] == "sess-1"


def test_swe_agent_limit_is_truncated(tmp_path):
    doc = {"history": [{"role": "system", "content": "sys"}, {"role": "user", "content": [{"type": "text", "text": "fix"}]},
                       {"role": "assistant", "content": "giving up"}],
           "trajectory": [], "info": {"exit_status": "submitted (exit_cost)"}}
    [row] = load_trajectories(_write(tmp_path / "x.traj", doc))
    assert row["status"] == "truncated" and "exit_cost" in row["error"]
    assert row["instruction"] == "fix" and row["task_id"] == "x"


def test_bad_record_names_file_and_index(tmp_path):
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    bad_role = {"messages": [{"role": "wizard", "content": "?"}]}
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join([json.dumps(good), json.dumps(bad_role), "{not json", json.dumps({"messages": []})]) + "\n")
    with pytest.raises(FormatError, match=r"mixed\.jsonl record 1 messages\[0\]: unknown role 'wizard'"):
        load_trajectories(path, fmt="openai")
    report = FileReport(str(path), "openai")
    rows = list(iter_trajectories(path, "openai", skip_errors=True, report=report))
    assert len(rows) == 1 and report.records == 4
    assert report.skipped == {"unknown role": 1, "bad json": 1, "empty conversation": 1}
    assert any("record 2" in e and "not valid JSON" in e for e in report.examples)


def test_repeated_task_ids_become_samples_of_one_group(tmp_path):
    conv = [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]
    rows = load_trajectories(_write(tmp_path / "g.json", [{"id": "t", "conversations": conv}] * 3
                                    + [{"id": "u", "conversations": conv}]))
    assert [r["sample"] for r in rows] == [0, 1, 2, 0]
    assert len({r["group_id"] for r in rows[:3]}) == 1 and rows[3]["group_id"] != rows[0]["group_id"]
    assert len({r["id"] for r in rows}) == 4
