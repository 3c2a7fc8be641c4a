"""Round trips through every export format: store -> export -> import, and import -> export -> import.

Compared, field by field: messages (role, content, reasoning, tool calls with PARSED arguments and their
ids, tool_call_id links, name, trainable), reward, success, task id, tools, model, instruction, and the
per-turn token ids and logprobs. Row ids, run ids and metadata are not compared: an imported row's id
comes from the file's content, its run from the file's path.

What each format cannot carry is measured aspect by aspect and listed in docs/formats.md's table by
tests/test_loss_table.py, which checks the table against the code; `dropped` below applies exactly
those losses to the hand-made rows, field by field (ADP: no system role; one message per action;
ShareGPT, OpenAI, ADP: no token ids; OpenAI, OTel: no training flags on non-assistant messages).
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from omrl.cli.main import cli
from omrl.formats.exporters import export_store
from omrl.formats.importer import load_trajectories
from omrl.formats.rows import first_user_text
from omrl.schema import Message, ToolCall, Trajectory, Turn
from omrl.schema.messages import arguments_value
from omrl.store import Store

TOOLS = json.dumps([
    {"type": "function", "function": {"name": "read", "description": "Read a file",
                                      "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "run", "parameters": {"type": "object",
                                                                     "properties": {"cmd": {"type": "string"}}}}},
])


def hand_made_rows() -> list[dict]:
    """Three trajectories: parallel tool calls answered in order, reasoning, trainable flags both ways,
    arguments that are not valid JSON, rewards and successes set and unset, token ids on some turns."""
    fix = Trajectory(
        id="fix", task_id="repo-1", model="m-7b", instruction="Fix the failing test in a.py.", tools=TOOLS,
        messages=[
            Message("system", "You are a coding agent."),
            Message("user", "Fix the failing test in a.py."),
            Message("assistant", "Let me look.", reasoning="read it first",
                    tool_calls=[ToolCall("read", '{"path": "a.py"}', "c1")]),
            Message("tool", "def f(): return 1", tool_call_id="c1", name="read"),
            Message("assistant", None, tool_calls=[ToolCall("run", '{"cmd": "pytest -x"}', "c2"),
                                                   ToolCall("read", '{"path":"test_a.py"}', "c3")],
                    trainable=False),
            Message("tool", "1 failed", tool_call_id="c2", name="run"),
            Message("tool", "assert f() == 2", tool_call_id="c3", name="read"),
            Message("assistant", "Changed f to return 2.", trainable=True),
        ],
        turns=[Turn(0, prompt_tokens=30, completion_tokens=3, completion_ids=[5, 6, 7], logprobs=[-0.5, -0.25, 0.0]),
               Turn(1, prompt_tokens=50, completion_tokens=2, completion_ids=[8, 9], logprobs=[-1.0, -2.0]),
               Turn(2, done=True, prompt_tokens=70, completion_tokens=1, completion_ids=[10], logprobs=[-0.125])],
        reward=1.0, success=True,
    ).to_row()
    chat = Trajectory(
        id="chat", task_id="q-2", model="m-7b", instruction="What is 2 + 2?",
        messages=[Message("user", "What is 2 + 2?", name="alice"),
                  Message("assistant", "5", trainable=False),
                  Message("user", "Try again."),
                  Message("assistant", "4")],
        turns=[Turn(0), Turn(1, done=True)], reward=0.0, success=False,
    ).to_row()
    odd = Trajectory(
        id="odd", task_id="t-3", instruction="Run it.", tools=TOOLS,
        messages=[Message("system", "Be brief."),
                  Message("user", "Run it.", trainable=False),
                  Message("assistant", "", tool_calls=[ToolCall("run", "ls -la (not json)", "k1")]),
                  Message("tool", "a.py", tool_call_id="k1", name="run"),
                  Message("assistant", "Done.")],
        turns=[Turn(0), Turn(1, done=True)],
    ).to_row()
    return [fix, chat, odd]


def rl_row() -> dict:
    """A collected-style row with everything RL needs: per-turn prompt and completion token ids, float32
    logprobs, token counts, rewards, latencies and info, a truncated status with its error, reasoning,
    compactly written and non-JSON call arguments, a result without text, trainable flags and names."""
    logprobs = [-0.1, -1e-8, -12.345678, -0.0, -3.4e38]  # float32 values: stored, written, read back bit for bit
    return Trajectory(
        id="rl", task_id="t", model="m", instruction="Add 2 and 3.", reward=0.5, success=False, status="truncated",
        error="ran out of turns", prompt_tokens=40, completion_tokens=9, tools=TOOLS,
        messages=[Message("system", "Be exact.", name="rules"), Message("user", "Add 2 and 3.", trainable=False),
                  Message("assistant", None, reasoning="use the tool",
                          tool_calls=[ToolCall("add", '{"a":2,"b":3}', "c1"), ToolCall("echo", "not json", "c2"),
                                      ToolCall("get", '{"k": [1, 2]}', "c3")]),
                  Message("tool", "5", tool_call_id="c1", name="add"),
                  Message("tool", None, tool_call_id="c2", name="echo", trainable=False),
                  Message("tool", "[1, 2]", tool_call_id="c3", name="get"),
                  Message("assistant", "", trainable=True),
                  Message("user", "The answer was checked.")],
        turns=[Turn(0, reward=0.25, latency_s=1.5, prompt_tokens=20, completion_tokens=5,
                    info=json.dumps({"prompt_token_ids": [1, 2, 3], "finish_reason": "tool_calls"}),
                    completion_ids=[7, 8, 9, 10, 11], logprobs=logprobs),
               Turn(1, reward=0.25, done=True, latency_s=0.25, prompt_tokens=20, completion_tokens=4,
                    completion_ids=[0, 2**31 - 1, 5, 6], logprobs=[-1.0, -2.0, -0.5, -0.25])],
    ).to_row()


@pytest.fixture
def store(tmp_path) -> Store:
    s = Store.create(tmp_path / "src")
    s.append(hand_made_rows())
    return s


def view(row: dict) -> dict:
    """What a round trip must keep, in a comparable form (arguments parsed, JSON fields loaded)."""
    messages = [{"role": m["role"], "content": m["content"], "reasoning": m["reasoning"],
                 "tool_calls": [[c["id"], c["name"], arguments_value(c["arguments"])] for c in m["tool_calls"]],
                 "tool_call_id": m["tool_call_id"], "name": m["name"], "trainable": m["trainable"]}
                for m in row["messages"]]
    return {"messages": messages, "reward": row["reward"], "success": row["success"], "task_id": row["task_id"],
            "tools": json.loads(row["tools"] or "[]"), "model": row["model"], "instruction": row["instruction"],
            "tokens": [[t["completion_ids"], t["logprobs"], t["prompt_tokens"], t["completion_tokens"]]
                       for t in row["turns"] if t["completion_ids"]]}


def dropped(v: dict, fmt: str) -> dict:
    """The view `v` with exactly what `fmt` cannot carry taken out (see the module docstring)."""
    v = json.loads(json.dumps(v))  # a deep copy
    calls = {c[0]: c[1] for m in v["messages"] for c in m["tool_calls"]}
    for m in v["messages"]:
        if m["role"] == "tool" and m["name"] is None:
            m["name"] = calls.get(m["tool_call_id"])
    if fmt in ("omrl", "atif"):
        return v
    if fmt in ("openai", "sharegpt", "adp"):
        v["tokens"] = []
    if fmt in ("openai", "otel"):
        for m in v["messages"]:
            if m["role"] != "assistant":
                m["trainable"] = None
    if fmt == "adp":
        for m in v["messages"]:
            m["trainable"] = None
    if fmt == "adp":
        split = []
        for m in v["messages"]:
            if m["role"] == "system":
                continue
            if m["role"] != "assistant" or not m["tool_calls"]:
                split.append(m)
                continue
            reasoning = m["reasoning"]
            if m["content"]:
                split.append({**m, "tool_calls": []})
                reasoning = None
            for k, call in enumerate(m["tool_calls"]):
                split.append({**m, "content": None, "reasoning": reasoning if k == 0 else None, "tool_calls": [call]})
        v["messages"] = split
        v["tools"], v["model"] = [], ""
    if fmt == "adp":
        v["instruction"] = first_user_text(v["messages"])
    return v


def export_and_import(store: Store, tmp_path, fmt: str, name: str) -> list[dict]:
    out = tmp_path / f"{name}.jsonl"
    export_store(store, out, fmt)
    if fmt == "omrl":  # omrl rows go back with `store append` and keep everything, ids included
        copy = Store.create(tmp_path / f"{name}-copy")
        from omrl.store.record_files import append_files

        append_files(copy, [out])
        return copy.read().to_pylist()
    return load_trajectories(out)  # the format detected from the file, as `omrl import FILE` does


FORMATS = ("omrl", "openai", "sharegpt", "atif", "adp", "otel")


@pytest.mark.parametrize("fmt", FORMATS)
def test_store_export_import_keeps_all_but_what_the_format_drops(store, tmp_path, fmt):
    back = export_and_import(store, tmp_path, fmt, "once")
    original = store.read().to_pylist()
    assert len(back) == len(original)
    for row, again in zip(original, back, strict=True):
        assert view(again) == dropped(view(row), fmt), row["id"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_import_export_import_is_identical(store, tmp_path, fmt):
    """Once imported, a trajectory survives its format's export and re-import unchanged, field by field."""
    first = Store.create(tmp_path / "first")
    first.append(export_and_import(store, tmp_path, fmt, "a") if fmt != "omrl" else store.read().to_pylist())
    second = export_and_import(first, tmp_path, fmt, "b")
    assert [view(r) for r in second] == [view(r) for r in first.read().to_pylist()]


def test_what_the_files_hold(store, tmp_path):
    """The places each format keeps reward, success and trainability, as a reader of the file sees them."""
    rows = {fmt: [json.loads(line) for line in (export_store(store, tmp_path / f"{fmt}.jsonl", fmt).path)
                  .read_text().splitlines()] for fmt in FORMATS}
    oa = rows["openai"][0]
    assert (oa["task_id"], oa["reward"], oa["success"]) == ("repo-1", 1.0, True)
    assert [m.get("weight") for m in oa["messages"] if m["role"] == "assistant"] == [None, 0, 1]
    assert oa["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"path": "a.py"}'  # JSON text
    assert oa["messages"][2]["reasoning_content"] == "read it first"
    sg = rows["sharegpt"][0]
    assert [t["from"] for t in sg["conversations"]] == ["system", "human", "gpt", "function_call", "observation",
                                                        "function_call", "observation", "observation", "gpt"]
    assert [t.get("loss") for t in sg["conversations"]][5:] == [False, None, None, True]
    assert json.loads(sg["conversations"][5]["value"])[1] == {"id": "c3", "name": "read",
                                                               "arguments": {"path": "test_a.py"}}
    at = rows["atif"][0]
    assert at["schema_version"].startswith("ATIF") and at["extra"]["reward"] == 1.0
    agent = [s for s in at["steps"] if s["source"] == "agent"]
    assert agent[0]["metrics"]["completion_token_ids"] == [5, 6, 7]
    assert [r["source_call_id"] for r in agent[1]["observation"]["results"]] == ["c2", "c3"]
    adp = rows["adp"][0]
    assert adp["id"] == "repo-1" and adp["details"]["success"] is True
    assert [c["class_"] for c in adp["content"]][:4] == ["text_observation", "message_action", "api_action",
                                                         "text_observation"]


def test_a_sharegpt_text_turn_then_a_calls_only_turn_stay_two_messages(tmp_path):
    """ShareGPT reads a function_call turn after a gpt turn as that turn's calls: a calls-only assistant
    message after an assistant text message is written with an empty gpt turn of its own, so it stays a
    message apart; the one loss is its content, None -> ""."""
    s = Store.create(tmp_path / "s")
    s.append([Trajectory(id="x", task_id="x", messages=[
        Message("user", "go"), Message("assistant", "thinking aloud"),
        Message("assistant", None, tool_calls=[ToolCall("run", '{"cmd": "ls"}', "c1")]),
        Message("tool", "a.py", tool_call_id="c1", name="run")]).to_row()])
    back = export_and_import(s, tmp_path, "sharegpt", "sg")[0]
    assert [(m["role"], m["content"]) for m in back["messages"]] == [
        ("user", "go"), ("assistant", "thinking aloud"), ("assistant", ""), ("tool", "a.py")]
    assert back["messages"][2]["tool_calls"][0]["id"] == "c1" and back["messages"][3]["tool_call_id"] == "c1"


def test_cli_exports_each_format(store, tmp_path):
    for fmt in FORMATS:
        out = tmp_path / f"cli-{fmt}.jsonl"
        result = CliRunner().invoke(cli, ["export", str(store.path), "--out", str(out), "--format", fmt])
        assert result.exit_code == 0, result.output
        assert f"wrote 3 trajectories to {out} ({fmt})" in result.output.replace("\n", "")
        assert len(out.read_text().splitlines()) == 3


REAL_FILES = ("swe-gym_openhands_5traj.json", "eto_sharegpt_3traj.json", "swe-agent_marshmallow-1867.traj",
              "toolbench_G1_answer_10.json")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", REAL_FILES)
def test_real_files_round_trip(real_data, tmp_path, name, fmt):
    """Real public trajectories (imported from their own format) through each export format: the first
    round trip loses exactly what `dropped` says, the second nothing."""
    first = Store.create(tmp_path / "first")
    first.append(load_trajectories(real_data / name))
    back = export_and_import(first, tmp_path, fmt, "a")
    original = first.read().to_pylist()
    assert [view(r) for r in back] == [dropped(view(r), fmt) for r in original]
    again = Store.create(tmp_path / "again")
    again.append(back)
    assert [view(r) for r in export_and_import(again, tmp_path, fmt, "b")] == [view(r) for r in back]
