"""Declarative mappings (--map, --messages-key, ...), detection that explains itself, tools and models kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from omrl.cli.main import cli
from omrl.formats.detect import detect_format
from omrl.formats.importer import load_trajectories
from omrl.formats.mapping import load_mapping
from omrl.formats.records import FormatError
from omrl.store import Store

RECIPES = Path(__file__).resolve().parents[1] / "recipes" / "imports"
TOOLS = [{"type": "function", "function": {"name": "get_order", "parameters": {"type": "object"}}}]


def _tau(i: int) -> dict:
    """A tau-bench-like result: OpenAI messages with tool calls under `traj`, the real task under info.task."""
    return {"task_id": i, "trial": 0, "reward": float(i % 2),
            "info": {"task": {"user_id": f"u{i}", "instruction": f"You are user {i}; cancel order #{i}."},
                     "reward_info": {"r": i % 2}},
            "traj": [{"role": "system", "content": "You are a retail agent."},
                     {"role": "user", "content": "Hi, I need help."},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": f"c{i}", "type": "function",
                          "function": {"name": "get_order", "arguments": json.dumps({"id": i})}}]},
                     {"role": "tool", "tool_call_id": f"c{i}", "name": "get_order", "content": "pending"},
                     {"role": "assistant", "content": "Cancelled."}]}


def _jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _parts(store: Path) -> list[str]:
    return sorted(p.name for p in (store / "data").rglob("*") if p.is_file()) if store.exists() else []


def test_records_under_another_key_are_refused_with_the_fix_named(tmp_path):
    path = _jsonl(tmp_path / "results.jsonl", [_tau(i) for i in range(3)])
    with pytest.raises(FormatError) as info:
        detect_format(path)
    text = str(info.value)
    assert "cannot tell the format from keys ['info', 'reward', 'task_id', 'traj', 'trial']" in text
    assert "closest format: openai, which needs 'messages'" in text
    assert "--messages-key traj" in text and "--map" in text
    with pytest.raises(FormatError, match=r"results\.jsonl record 0: no 'messages' key .*'traj'.*--messages-key traj"):
        load_trajectories(path, fmt="openai")


def test_messages_key_maps_every_field(tmp_path):
    records = [_tau(i) for i in range(3)]
    path = _jsonl(tmp_path / "results.jsonl", records)
    rows = load_trajectories(path, mapping=load_mapping(messages="traj", instruction="info.task.instruction"))
    assert len(rows) == 3
    for row, rec in zip(rows, records, strict=True):
        assert row["task_id"] == str(rec["task_id"])  # id key guessed: task_id
        assert row["reward"] == rec["reward"] and row["success"] is None
        assert row["instruction"] == rec["info"]["task"]["instruction"]  # not the simulated user's opening line
        assert [m["role"] for m in row["messages"]] == [m["role"] for m in rec["traj"]]
        assert [m["content"] for m in row["messages"]] == [m["content"] for m in rec["traj"]]
        [call] = [c for m in row["messages"] for c in m["tool_calls"]]
        assert call == {"id": f"c{rec['task_id']}", "name": "get_order", "arguments": json.dumps({"id": rec["task_id"]})}
        assert row["messages"][3]["tool_call_id"] == call["id"]
        meta = json.loads(row["metadata"])
        assert meta["trial"] == 0 and meta["info"] == rec["info"]  # unmapped keys kept
        assert row["env"] == "import:mapped" and row["source"] == "imported:mapped"


def test_cli_with_flags_and_with_the_shipped_tau_bench_map(tmp_path):
    path = _jsonl(tmp_path / "results.jsonl", [_tau(i) for i in range(4)])
    runner = CliRunner()
    result = runner.invoke(cli, ["import", str(path), "--store", str(tmp_path / "a"), "--messages-key", "traj",
                                 "--reward-key", "reward", "--id-key", "task_id"])
    assert result.exit_code == 0, result.output
    assert Store(tmp_path / "a").count() == 4
    result = runner.invoke(cli, ["import", str(path), "--store", str(tmp_path / "b"),
                                 "--map", str(RECIPES / "tau_bench.yaml")])
    assert result.exit_code == 0, result.output
    rows = Store(tmp_path / "b").read().to_pylist()
    assert {r["env"] for r in rows} == {"import:tau_bench"}
    assert sorted(r["instruction"] for r in rows)[0] == "You are user 0; cancel order #0."
    assert json.loads(rows[0]["task"])["info.task"]["user_id"].startswith("u")
    # same data, other mapping: the ids come from the records, so nothing is added twice
    again = runner.invoke(cli, ["import", str(path), "--store", str(tmp_path / "b"), "--messages-key", "traj"])
    assert again.exit_code == 0 and Store(tmp_path / "b").count() == 4


def test_shipped_generic_map_with_dotted_paths_and_available_tools(tmp_path):
    record = {"conversation": [{"role": "user", "content": "Where is my order?"},
                               {"role": "assistant", "content": "Shipped."}],
              "available_tools": TOOLS, "result": {"score": 0.75, "solved": True},
              "meta": {"task": "order-7", "model": "gpt-x"}, "extra": 1}
    path = _jsonl(tmp_path / "logs.jsonl", [record])
    [row] = load_trajectories(path, mapping=load_mapping(RECIPES / "chat_with_tools.yaml"))
    assert row["reward"] == 0.75 and row["success"] is True and row["task_id"] == "order-7"
    assert row["model"] == "gpt-x" and json.loads(row["tools"]) == TOOLS
    assert json.loads(row["metadata"])["extra"] == 1


def test_mapping_of_sharegpt_style_messages(tmp_path):
    record = {"sample": {"turns": [{"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"}]}, "score": 1}
    path = _jsonl(tmp_path / "sg.jsonl", [record])
    [row] = load_trajectories(path, mapping=load_mapping(messages="sample.turns", reward="score"))
    assert [m["role"] for m in row["messages"]] == ["user", "assistant"] and row["reward"] == 1.0


def test_available_tools_and_sharegpt_model_in_built_in_formats(tmp_path):
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
            "available_tools": TOOLS}
    [row] = load_trajectories(_jsonl(tmp_path / "chat.jsonl", [chat]))
    assert json.loads(row["tools"]) == TOOLS
    sg = {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}], "model": "llama-3"}
    [row] = load_trajectories(_jsonl(tmp_path / "sg.jsonl", [sg]))
    assert row["model"] == "llama-3" and "model" not in json.loads(row["metadata"])


@pytest.mark.parametrize("mapping, message", [
    ({"messages": "traj", "rewrd": "reward"}, r"m\.yaml: unknown key rewrd; known keys: .*reward"),
    ({"reward": "reward"}, r"m\.yaml: missing required key messages"),
    ({"messages": {"a": 1}}, r"m\.yaml: messages must be "),
    ({"messages": "traj", "id": [""]}, r"m\.yaml: id must be a dotted path or a list of them"),
    ({"messages": "traj", "style": "xml"}, r"m\.yaml: style must be one of auto, openai, sharegpt"),
    (["traj"], r"m\.yaml: the top level must be a mapping"),
])
def test_bad_mapping_files_are_refused_naming_the_file(tmp_path, mapping, message):
    from omrl.config import RecipeError

    (tmp_path / "m.yaml").write_text(json.dumps(mapping))
    with pytest.raises(RecipeError, match=message):
        load_mapping(tmp_path / "m.yaml")


def test_mapping_to_a_missing_field_names_record_and_leaves_the_store_unchanged(tmp_path):
    store = tmp_path / "s"
    path = _jsonl(tmp_path / "results.jsonl", [_tau(0)])
    runner = CliRunner()
    assert runner.invoke(cli, ["import", str(path), "--store", str(store), "--messages-key", "traj"]).exit_code == 0
    before = (_parts(store), Store(store).count())
    other = _jsonl(tmp_path / "more.jsonl", [_tau(1), {**_tau(2), "score": None}])
    result = runner.invoke(cli, ["import", str(other), "--store", str(store), "--messages-key", "traj",
                                 "--reward-key", "info.reward_info.missing"])
    assert result.exit_code == 1
    assert "more.jsonl record 0: the mapping's 'info.reward_info.missing' is not in the record" in result.output
    assert (_parts(store), Store(store).count()) == before
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("messages: [unclosed\n")
    result = runner.invoke(cli, ["import", str(other), "--store", str(store), "--map", str(bad_yaml)])
    assert result.exit_code == 1 and "bad.yaml line" in result.output and "not valid YAML" in result.output
    assert (_parts(store), Store(store).count()) == before


def test_format_openai_with_messages_key_follows_the_hint_and_task_files_are_told_apart(tmp_path, real_data):
    path = _jsonl(tmp_path / "results.jsonl", [_tau(0)])
    result = CliRunner().invoke(cli, ["import", str(path), "--store", str(tmp_path / "s"), "--format", "openai",
                                      "--messages-key", "traj"])
    assert result.exit_code == 0, result.output
    with pytest.raises(FormatError, match=r"gsm8k_test\.jsonl: .*no format's keys are there.*omrl tasks import"):
        detect_format(real_data / "gsm8k_test.jsonl")


def test_instruction_skips_only_acknowledged_preambles(tmp_path):
    chat = {"messages": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"},
                         {"role": "user", "content": "And 3+3?"}, {"role": "assistant", "content": "6"}]}
    preamble = {"messages": [{"role": "user", "content": "You play a text game. Answer with actions."},
                             {"role": "assistant", "content": "Understood."},
                             {"role": "user", "content": "You are in a room. Find the key."},
                             {"role": "assistant", "content": "look"}]}
    tools = {"messages": [{"role": "user", "content": "You have access to the following tools: search(q)"},
                          {"role": "user", "content": "Find the capital of Peru."},
                          {"role": "assistant", "content": "Lima"}]}
    rows = load_trajectories(_jsonl(tmp_path / "c.jsonl", [chat, preamble, tools]))
    assert [r["instruction"] for r in rows] == ["What is 2+2?", "You are in a room. Find the key.",
                                                "Find the capital of Peru."]


def test_candidate_paths_and_a_system_prompt_kept_apart(tmp_path):
    (tmp_path / "m.yaml").write_text("messages: [dialog, turns]\nid: [uid, meta.uid]\nsystem: [sys]\nstyle: sharegpt\n")
    mapping = load_mapping(tmp_path / "m.yaml")
    records = [{"turns": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}], "meta": {"uid": "u1"},
                "sys": "Be brief."},
               {"dialog": [{"from": "human", "value": "q2"}, {"from": "gpt", "value": "a2"}], "uid": None}]
    rows = load_trajectories(_jsonl(tmp_path / "d.jsonl", records), mapping=mapping)
    assert [m["role"] for m in rows[0]["messages"]] == ["system", "user", "assistant"]
    assert rows[0]["messages"][0]["content"] == "Be brief." and rows[0]["task_id"] == "u1"
    assert rows[1]["task_id"] == "d:1"  # a null id is no id: none of the candidates holds one


def test_built_in_formats_are_mappings():
    from omrl.formats import openai, sharegpt

    assert openai.MAPPING.messages == "messages" and "available_tools" in openai.MAPPING.tools
    assert sharegpt.MAPPING.messages == ("conversations", "messages") and sharegpt.MAPPING.style == "sharegpt"


def test_a_field_flag_alone_keeps_the_usual_message_keys(tmp_path):
    record = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
              "eval": {"score": 0.5}}
    path = _jsonl(tmp_path / "e.jsonl", [record])
    result = CliRunner().invoke(cli, ["import", str(path), "--store", str(tmp_path / "s"), "--reward-key", "eval.score"])
    assert result.exit_code == 0, result.output
    [row] = Store(tmp_path / "s").read().to_pylist()
    assert row["reward"] == 0.5 and [m["content"] for m in row["messages"]] == ["q", "a"]
