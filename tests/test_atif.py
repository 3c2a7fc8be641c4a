"""ATIF: what `omrl export --format atif` writes passes the published models (PyPI `atif`), and a round trip
omrl -> ATIF -> omrl keeps token ids, logprobs and everything else; a Harbor-style document (built with
those models: multimodal messages, reasoning, tool calls and their observations, prompt and completion
token ids, copied context, a subagent embedded) imports with each piece where it belongs."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from test_roundtrip import REAL_FILES, hand_made_rows, rl_row

from omrl.cli.main import cli
from omrl.formats.exporters import export_store
from omrl.formats.importer import load_trajectories
from omrl.store import Store

atif = pytest.importorskip("atif")  # the dev extra installs it



def turns(row: dict) -> list[dict]:
    """A row's turns with their info as JSON (the order of its keys is no part of it)."""
    return [{**t, "info": json.loads(t["info"])} for t in row["turns"]]


def exported(store: Store, tmp_path, name: str = "out") -> list[dict]:
    out = tmp_path / f"{name}.jsonl"
    result = CliRunner().invoke(cli, ["export", str(store.path), "--out", str(out), "--format", "atif"])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in out.read_text().splitlines()]


def validate(records: list[dict]) -> None:
    for record in records:
        atif.Trajectory.model_validate(record)  # raises a ValidationError naming the field


def test_every_export_validates_with_the_published_models(tmp_path, real_data):
    store = Store.create(tmp_path / "s")
    store.append(hand_made_rows())
    for name in REAL_FILES:
        store.append(load_trajectories(real_data / name))
    records = exported(store, tmp_path)
    assert len(records) == 3 + sum(len(load_trajectories(real_data / n)) for n in REAL_FILES)
    validate(records)
    first = records[0]
    assert first["agent"]["version"] and first["schema_version"] == "ATIF-v1.7"
    calls_only = [s for s in first["steps"] if s["source"] == "agent" and s["message"] == ""]
    assert calls_only and all(s["extra"]["omrl"]["null_content"] for s in calls_only)  # null text, said so


def test_a_round_trip_keeps_token_ids_logprobs_and_turns_exactly(tmp_path):
    """Token ids (prompt and completion), logprobs (float32 exactly), token counts, per-turn rewards,
    latencies and info, messages and their flags: all come back equal."""
    row = rl_row()
    store = Store.create(tmp_path / "s")
    store.append([row])
    records = exported(store, tmp_path)
    validate(records)
    metrics = [s["metrics"] for s in records[0]["steps"] if s["source"] == "agent"]
    assert metrics[0]["prompt_token_ids"] == [1, 2, 3] and metrics[0]["completion_token_ids"] == [7, 8, 9, 10, 11]
    again = Store.create(tmp_path / "again")
    again.append(load_trajectories(tmp_path / "out.jsonl"))
    original, back = store.read().to_pylist()[0], again.read().to_pylist()[0]
    assert turns(back) == turns(original)  # ids, logprobs (float32), counts, rewards, latencies, info
    assert [t["logprobs"] for t in back["turns"]][0] == [t["logprobs"] for t in original["turns"]][0]
    assert back["messages"] == original["messages"]
    for key in ("task_id", "model", "instruction", "tools", "reward", "success", "status", "error", "prompt_tokens",
                "completion_tokens"):
        assert back[key] == original[key], key


def harbor_document() -> dict:
    """An ATIF trajectory of the kind Harbor's agents write, built and checked with the published models."""
    a = atif
    sub = a.Trajectory(
        schema_version="ATIF-v1.7", trajectory_id="explore-1", agent=a.Agent(name="explorer", version="0.3"),
        steps=[a.Step(step_id=1, source="user", message="Find where f is defined."),
               a.Step(step_id=2, source="agent", message="In a.py, line 3.", model_name="small-model",
                      metrics=a.Metrics(prompt_tokens=12, completion_tokens=3, completion_token_ids=[40, 41, 42],
                                        logprobs=[-0.5, -0.25, -0.125]))])
    doc = a.Trajectory(
        schema_version="ATIF-v1.7", session_id="sess-9", trajectory_id="main",
        agent=a.Agent(name="terminus-2", version="2.0.1", model_name="big-model",
                      tool_definitions=[{"type": "function", "function": {"name": "bash", "parameters": {}}}]),
        notes="converted from the agent's own log",
        steps=[
            a.Step(step_id=1, source="system", message="You are a coding agent.", timestamp="2025-10-16T14:30:00Z"),
            a.Step(step_id=2, source="user", message=[a.ContentPart(type="text", text="Fix the bug shown here: "),
                                                      a.ContentPart(type="image", source=a.ImageSource(
                                                          media_type="image/png", path="images/bug.png"))]),
            a.Step(step_id=3, source="agent", message="Summary of the earlier session.", is_copied_context=True),
            a.Step(step_id=4, source="agent", message="Let me look.", reasoning_content="check a.py first",
                   tool_calls=[a.ToolCall(tool_call_id="call_1", function_name="bash", arguments={"cmd": "cat a.py"}),
                               a.ToolCall(tool_call_id="call_2", function_name="explore",
                                          arguments={"question": "where is f?"})],
                   observation=a.Observation(results=[
                       a.ObservationResult(source_call_id="call_1", content="def f(): return 1"),
                       a.ObservationResult(source_call_id="call_2", subagent_trajectory_ref=[
                           a.SubagentTrajectoryRef(trajectory_id="explore-1")])]),
                   metrics=a.Metrics(prompt_tokens=100, completion_tokens=4, cached_tokens=80, cost_usd=0.001,
                                     prompt_token_ids=[1, 2, 3, 4], completion_token_ids=[9, 8, 7, 6],
                                     logprobs=[-0.1, -0.2, -0.3, -0.4]),
                   extra={"harness_step": "s4"}),
            a.Step(step_id=5, source="agent", message="Dispatching the tests.", llm_call_count=0,
                   observation=a.Observation(results=[a.ObservationResult(content="3 passed")])),
            a.Step(step_id=6, source="agent", message="Fixed: f returns 2.",
                   metrics=a.Metrics(prompt_tokens=130, completion_tokens=6, completion_token_ids=[5, 4, 3, 2, 1, 0],
                                     logprobs=[-1.0, -1.0, -1.0, -1.0, -1.0, -1.0])),
        ],
        final_metrics=a.FinalMetrics(total_prompt_tokens=230, total_completion_tokens=10, total_steps=6),
        extra={"task_id": "repo-7", "reward": 1.0, "success": True},
        subagent_trajectories=[sub])
    return doc.to_json_dict()


def test_a_harbor_document_imports_each_piece_where_it_belongs(tmp_path):
    path = tmp_path / "trajectory.json"
    path.write_text(json.dumps(harbor_document()))
    rows = load_trajectories(path)  # the format detected
    assert len(rows) == 2
    main, sub = rows
    roles = [(m["role"], m["content"]) for m in main["messages"]]
    assert roles[0] == ("system", "You are a coding agent.")
    assert roles[1][0] == "user" and roles[1][1].startswith("Fix the bug shown here: ") and "images/bug.png" in roles[1][1]
    assert [r for r, _ in roles] == ["system", "user", "assistant", "assistant", "tool", "tool", "assistant", "user",
                                     "assistant"]
    copied, looked, dispatched = main["messages"][2], main["messages"][3], main["messages"][6]
    assert copied["trainable"] is False and dispatched["trainable"] is False and looked["trainable"] is None
    assert looked["reasoning"] == "check a.py first"
    assert [(c["id"], c["name"], json.loads(c["arguments"])) for c in looked["tool_calls"]] == [
        ("call_1", "bash", {"cmd": "cat a.py"}), ("call_2", "explore", {"question": "where is f?"})]
    assert [(m["tool_call_id"], m["content"]) for m in main["messages"][4:6]] == [("call_1", "def f(): return 1"),
                                                                                  ("call_2", None)]
    assert main["messages"][7] == {**main["messages"][7], "role": "user", "content": "3 passed"}  # no call: the env's word
    turns = main["turns"]
    assert [t["completion_ids"] for t in turns] == [[], [9, 8, 7, 6], [], [5, 4, 3, 2, 1, 0]]
    assert turns[1]["logprobs"] == pytest.approx([-0.1, -0.2, -0.3, -0.4])
    info = json.loads(turns[1]["info"])
    assert info["prompt_token_ids"] == [1, 2, 3, 4] and info["metrics"] == {"cached_tokens": 80, "cost_usd": 0.001}
    assert info["atif"] == {"extra": {"harness_step": "s4"}}
    assert (main["task_id"], main["reward"], main["success"], main["model"]) == ("repo-7", 1.0, True, "big-model")
    assert (main["prompt_tokens"], main["completion_tokens"]) == (230, 10)
    assert json.loads(main["tools"])[0]["function"]["name"] == "bash"
    meta = json.loads(main["metadata"])
    assert meta["subagent_refs"] == [{"tool_call_id": "call_2", "refs": [{"trajectory_id": "explore-1"}]}]
    assert meta["notes"] == "converted from the agent's own log" and meta["agent"]["name"] == "terminus-2"
    assert meta["step_fields"]["1"] == {"timestamp": "2025-10-16T14:30:00Z"}
    # The subagent: a row of its own, linked to its parent, in a GRPO group of its own.
    assert sub["parent_id"] == main["id"] and sub["task_id"] == "repo-7:explore-1" and sub["group_id"] != main["group_id"]
    assert [(m["role"], m["content"]) for m in sub["messages"]] == [("user", "Find where f is defined."),
                                                                   ("assistant", "In a.py, line 3.")]
    assert sub["turns"][0]["completion_ids"] == [40, 41, 42]


def test_subagents_are_embedded_again_on_export(tmp_path):
    path = tmp_path / "trajectory.json"
    path.write_text(json.dumps(harbor_document()))
    store = Store.create(tmp_path / "s")
    store.append(load_trajectories(path))
    records = exported(store, tmp_path)
    validate(records)
    assert len(records) == 1  # the subagent's row travels inside its parent
    (sub,) = records[0]["subagent_trajectories"]
    assert sub["trajectory_id"] == "explore-1"
    refs = [r for s in records[0]["steps"] for r in (s.get("observation") or {}).get("results", [])
            if r.get("subagent_trajectory_ref")]
    assert refs == [{"source_call_id": "call_2", "subagent_trajectory_ref": [{"trajectory_id": "explore-1"}]}]
    again = Store.create(tmp_path / "again")
    again.append(load_trajectories(tmp_path / "out.jsonl"))
    keep = ("task_id", "messages", "reward", "success", "tools")
    before = sorted(store.read().to_pylist(), key=lambda r: r["task_id"])
    after = sorted(again.read().to_pylist(), key=lambda r: r["task_id"])
    for a, b in zip(before, after, strict=True):
        assert {k: b[k] for k in keep} == {k: a[k] for k in keep} and turns(b) == turns(a)
    step = next(s for s in records[0]["steps"] if s.get("metrics", {}).get("cached_tokens"))
    assert step["metrics"]["cost_usd"] == 0.001 and step["extra"] == {"harness_step": "s4"}  # back in their places
    assert after[1]["parent_id"] == after[0]["id"]


def test_a_subagent_without_a_trajectory_id_is_refused_naming_it(tmp_path):
    doc = harbor_document()
    del doc["subagent_trajectories"][0]["trajectory_id"]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(Exception, match=r"subagent_trajectories\[0\].*trajectory_id"):
        load_trajectories(path)


def test_export_store_refuses_nothing_and_writes_one_line_per_top_level_trajectory(tmp_path):
    store = Store.create(tmp_path / "s")
    store.append(hand_made_rows())
    result = export_store(store, tmp_path / "a.jsonl", "atif")
    assert result.trajectories == 3 and len((tmp_path / "a.jsonl").read_text().splitlines()) == 3
