"""SWE-agent .traj, legacy (no replay_config) and current: demonstrations skipped, issue text as the task, steps kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from omrl.cli.main import cli
from omrl.formats.importer import iter_trajectories, load_trajectories
from omrl.formats.records import FormatError
from omrl.formats.swe_agent import COMMAND
from omrl.store import Store

ISSUE = "TimeDelta serialization precision\nIt rounds 345 ms down to 344."
DEMO = "Here is a demonstration of how to correctly accomplish this task.\n--- DEMONSTRATION ---\nISSUE:\nother bug\n"


def _legacy() -> dict:
    """The shape of SWE-agent 0.x trajectories: demonstration in history, plain-text turns, steps in trajectory."""
    issue_msg = (f"We're currently solving the following issue within our repository. Here's the issue text:\n"
                 f"ISSUE:\n{ISSUE}\n\nINSTRUCTIONS:\nNow, you're going to solve this issue on your own.")
    steps = [
        {"thought": "Let's reproduce it first.", "action": "create reproduce.py\n",
         "observation": "[File: /repo/reproduce.py (1 lines total)]", "response": "Let's reproduce it first.\n```\ncreate reproduce.py\n```",
         "state": json.dumps({"open_file": "/repo/reproduce.py", "working_dir": "/repo"}), "execution_time": 0.5},
        {"thought": "Now submit.", "action": "submit\n", "observation": "diff --git a/x b/x",
         "response": "Now submit.\n```\nsubmit\n```", "state": json.dumps({"open_file": "n/a", "working_dir": "/repo"})},
    ]
    history = [{"role": "system", "content": "SETTING: You are an autonomous programmer.", "agent": "primary"},
               {"role": "user", "content": DEMO, "agent": "primary", "is_demo": True},
               {"role": "user", "content": issue_msg, "agent": "primary"}]
    for step in steps:
        history += [{"role": "assistant", "content": step["response"], "thought": step["thought"],
                     "action": step["action"], "agent": "primary"},
                    {"role": "user", "content": step["observation"], "agent": "primary"}]
    return {"environment": "swe_main", "trajectory": steps, "history": history,
            "info": {"exit_status": "submitted", "submission": "diff --git a/x b/x",
                     "model_stats": {"tokens_sent": 1200, "tokens_received": 80}}}


def _write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def test_legacy_traj_field_by_field(tmp_path):
    doc = _legacy()
    [row] = load_trajectories(_write(tmp_path / "marshmallow-code__marshmallow-1867.traj", doc))
    assert row["instruction"] == ISSUE  # not the demonstration, not the wrapper text
    task = json.loads(row["task"])
    assert task["problem_statement"] == ISSUE
    assert task["instance_id"] == row["task_id"] == "marshmallow-code__marshmallow-1867"
    assert task["repo"] == "marshmallow-code/marshmallow"
    assert all(DEMO not in (m["content"] or "") for m in row["messages"])
    roles = [m["role"] for m in row["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool"]
    steps = doc["trajectory"]
    for k, step in enumerate(steps):
        assistant, tool = row["messages"][2 + 2 * k], row["messages"][3 + 2 * k]
        assert assistant["content"] == step["thought"]
        [call] = assistant["tool_calls"]
        assert call["name"] == COMMAND and json.loads(call["arguments"]) == {"command": step["action"]}
        assert tool["content"] == step["observation"] and tool["tool_call_id"] == call["id"]
        info = json.loads(row["turns"][k]["info"])
        assert info["state"] == json.loads(step["state"]) and info["response"] == step["response"]
    assert row["turns"][0]["latency_s"] == 0.5 and row["turns"][-1]["done"] is True
    assert [t["function"]["name"] for t in json.loads(row["tools"])] == [COMMAND]
    assert row["status"] == "ok" and row["success"] is None and row["reward"] is None
    assert row["prompt_tokens"] == 1200 and row["completion_tokens"] == 80
    meta = json.loads(row["metadata"])
    assert meta["demonstrations_skipped"] == 1 and meta["legacy"] is True
    assert meta["info"]["submission"] == doc["info"]["submission"]


def test_legacy_traj_without_steps_uses_history_and_skips_demos(tmp_path):
    doc = _legacy()
    doc["trajectory"] = []
    [row] = load_trajectories(_write(tmp_path / "x.traj", doc))
    assert row["instruction"] == ISSUE
    assert [m["role"] for m in row["messages"]][:3] == ["system", "user", "assistant"]
    assert len(row["messages"]) == len(doc["history"]) - 1  # the demonstration left out


def test_ai_role_and_text_key(tmp_path):
    doc = {"history": [{"role": "system", "text": "sys"}, {"role": "user", "text": "fix the bug"},
                       {"role": "ai", "text": "done"}], "info": {}}
    [row] = load_trajectories(_write(tmp_path / "y.traj", doc))
    assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant"]
    assert row["messages"][2]["content"] == "done" and row["instruction"] == "fix the bug"


def test_current_traj_keeps_step_state(real_data):
    rec = json.loads((real_data / "swe-agent_marshmallow-1867.traj").read_text())
    [row] = load_trajectories(real_data / "swe-agent_marshmallow-1867.traj")
    assert len(row["turns"]) == len(rec["trajectory"])
    for turn, step in zip(row["turns"], rec["trajectory"], strict=True):
        info = json.loads(turn["info"])
        assert info["state"] == step["state"] and info["thought"] == step["thought"]
    task = json.loads(row["task"])
    assert task["repo"] == "marshmallow-code/marshmallow" and row["instruction"].startswith("TimeDelta serialization")


def test_bad_legacy_step_is_located_and_the_store_unchanged(tmp_path):
    good = _write(tmp_path / "in" / "a.traj", _legacy())
    doc = _legacy()
    doc["trajectory"][1] = "not a step"
    bad = _write(tmp_path / "in" / "b.traj", doc)
    with pytest.raises(FormatError, match=r"b\.traj record 0: 'trajectory\[1\]' must be an object"):
        load_trajectories(bad)
    store = tmp_path / "s"
    runner = CliRunner()
    assert runner.invoke(cli, ["import", str(good), "--store", str(store)]).exit_code == 0
    parts = sorted(p.name for p in Store(store).parts())
    result = runner.invoke(cli, ["import", str(good), str(bad), "--store", str(store)])
    assert result.exit_code == 1 and "b.traj record 0" in result.output
    assert sorted(p.name for p in Store(store).parts()) == parts and Store(store).count() == 1


def test_keep_demos_keeps_demonstrations_untrained_and_out_of_the_instruction(tmp_path):
    doc = _legacy()
    # a demonstration given as a whole exchange (user, assistant, user), as some SWE-agent configs write it
    doc["history"][1:2] = [{"role": "user", "content": DEMO, "is_demo": True},
                           {"role": "assistant", "content": "demo action", "is_demo": True},
                           {"role": "user", "content": "demo observation", "is_demo": True}]
    path = _write(tmp_path / "d.traj", doc)
    [plain] = load_trajectories(path)
    [kept] = list(iter_trajectories(path, keep_demos=True))
    assert [m["content"] for m in kept["messages"][1:4]] == [DEMO, "demo action", "demo observation"]
    assert all(m["trainable"] is False for m in kept["messages"][1:4])
    assert kept["instruction"] == plain["instruction"] == ISSUE
    assert len(kept["messages"]) == len(plain["messages"]) + 3
    assert len(kept["turns"]) == sum(1 for m in kept["messages"] if m["role"] == "assistant") == 3
    assert json.loads(kept["turns"][0]["info"]) == {"demonstration": True}
    assert json.loads(kept["turns"][1]["info"])["response"] == doc["trajectory"][0]["response"]
    assert kept["id"] == plain["id"]  # the same data: importing it again with --keep-demos adds nothing
    result = CliRunner().invoke(cli, ["import", str(path), "--store", str(tmp_path / "s"), "--keep-demos"])
    assert result.exit_code == 0, result.output
    [row] = Store(tmp_path / "s").read().to_pylist()
    assert row["messages"][1]["trainable"] is False
