"""OpenHands XML function calls, ADP standardized trajectories, observation/action step lists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from omrl.cli.main import cli
from omrl.formats.detect import detect_format
from omrl.formats.importer import load_trajectories
from omrl.formats.records import FormatError
from omrl.store import Store

XML_TURN = ("Let me look at the file.\n<function=str_replace_editor>\n<parameter=command>view</parameter>\n"
            "<parameter=path>/repo/a.py</parameter>\n</function>")
BASH_TURN = "<function=execute_bash>\n<parameter=command>\npytest -q\n</parameter>\n</function>"


def _write(path: Path, data) -> Path:
    path.write_text(json.dumps(data))
    return path


def _parts(store: Path) -> list[str]:
    return sorted(p.name for p in (store / "data").rglob("*") if p.is_file()) if store.exists() else []


# ---------------------------------------------------------------- OpenHands XML function calls


def test_openhands_xml_calls_in_sharegpt(tmp_path):
    record = {"id": "oh-1", "conversations": [
        {"from": "system", "value": "You are OpenHands."},
        {"from": "human", "value": "Fix the failing test in /repo."},
        {"from": "gpt", "value": XML_TURN},
        {"from": "human", "value": "EXECUTION RESULT of [str_replace_editor]:\n1\tdef f(): return 2"},
        {"from": "gpt", "value": BASH_TURN},
        {"from": "human", "value": "EXECUTION RESULT of [execute_bash]:\n1 passed"},
        {"from": "gpt", "value": "Fixed."}]}
    [row] = load_trajectories(_write(tmp_path / "oh.json", [record]))
    roles = [m["role"] for m in row["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    view, bash = row["messages"][2], row["messages"][4]
    assert view["content"] == "Let me look at the file." and bash["content"] is None
    assert view["tool_calls"][0]["name"] == "str_replace_editor"
    assert json.loads(view["tool_calls"][0]["arguments"]) == {"command": "view", "path": "/repo/a.py"}
    assert json.loads(bash["tool_calls"][0]["arguments"]) == {"command": "pytest -q"}
    assert row["messages"][3]["content"] == "1\tdef f(): return 2"
    assert row["messages"][3]["tool_call_id"] == view["tool_calls"][0]["id"]
    assert row["messages"][5]["tool_call_id"] == bash["tool_calls"][0]["id"]
    assert row["instruction"] == "Fix the failing test in /repo."


def test_openhands_xml_calls_in_openai_messages_and_plain_text_left_alone(tmp_path):
    record = {"messages": [{"role": "user", "content": "Run the tests."},
                           {"role": "assistant", "content": BASH_TURN},
                           {"role": "user", "content": "EXECUTION RESULT of [execute_bash]:\nok"},
                           {"role": "assistant", "content": "The tag <function=x> alone is not a call."}]}
    [row] = load_trajectories(_write(tmp_path / "c.json", [record]))
    assert [m["role"] for m in row["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert row["messages"][3]["tool_calls"] == [] and "<function=x>" in row["messages"][3]["content"]


def test_openhands_xml_blocks_are_those_the_non_greedy_pattern_finds():
    """The one-pass scanner finds exactly the blocks `<function=NAME>(.*?)</function>` found, on text that mixes
    unclosed, nested and stray tags."""
    import random
    import re

    from omrl.formats.xml_calls import XML_FUNCTION, xml_blocks

    pattern = re.compile(r"<function=([^<>\s]+)>(.*?)</function>", re.S)
    pieces = ["<function=f>", "<function=g>", "</function>", "<parameter=p>", "</parameter>", "x", "\n", "<", ">",
              "<function=", " "]
    rng = random.Random(7)
    for _ in range(2000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(12)))
        expected = [(m.group(1), m.group(2), m.start(), m.end()) for m in pattern.finditer(text)]
        assert list(xml_blocks(text, XML_FUNCTION, "</function>")) == expected, text


def import_in_child(path: Path, seconds: int = 120) -> list[list[list]]:
    """Import `path` in a child process killed after `seconds`: per row, [role, [call names]] per message.

    The bound is generous on purpose (no test asserts time): a one-pass import of a few MB takes seconds,
    a quadratic one did not finish in minutes; a child can be killed where a thread stuck in C could not."""
    import os
    import subprocess
    import sys

    import omrl

    code = ("import json, sys\nfrom omrl.formats.importer import load_trajectories\n"
            "print(json.dumps([[[m['role'], [c['name'] for c in m['tool_calls']]] for m in row['messages']]\n"
            "                  for row in load_trajectories(sys.argv[1])]))\n")
    env = {**os.environ, "PYTHONPATH": str(Path(omrl.__file__).resolve().parents[1])}
    try:
        done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                              timeout=seconds, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"importing {path.name} ({path.stat().st_size:,} bytes) did not finish in {seconds} s")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_2mb_of_hostile_openhands_markup_is_parsed_in_one_pass(tmp_path):
    """Unclosed <function= openers, unclosed <parameter= openers inside a call, and openers nested in names:
    each used to rescan the rest of the text (200 KB: 45 s; 2 MB never finished)."""
    size = 700_000
    unclosed = ("<function=f>\n<parameter=p>x" * (size // 26))[:size]
    params = "<function=f>" + ("<parameter=p>x" * (size // 14)) + "</function>"
    nested = "<function=g>" + ("<parameter=<function=" * (size // 21)) + "</function>"
    record = {"messages": [{"role": "user", "content": "go"}, {"role": "assistant", "content": unclosed},
                           {"role": "user", "content": "and?"}, {"role": "assistant", "content": params},
                           {"role": "user", "content": "and?"}, {"role": "assistant", "content": nested}]}
    path = _write(tmp_path / "hostile.jsonl", record)
    assert path.stat().st_size > 2_000_000
    [row] = import_in_child(path)
    assert row == [["user", []], ["assistant", []], ["user", []], ["assistant", ["f"]], ["user", []],
                   ["assistant", ["g"]]]


def test_openhands_markup_past_the_limit_is_refused_naming_file_and_record(tmp_path, monkeypatch):
    from omrl.formats import xml_calls

    monkeypatch.setattr(xml_calls, "XML_TEXT_LIMIT", 1000)
    record = {"conversations": [{"from": "human", "value": "go"}, {"from": "gpt", "value": "<function=f>" * 200}]}
    path = _write(tmp_path / "big.json", [record])
    with pytest.raises(FormatError, match=r"big\.json record 0 conversations\[1\]: an assistant message of 2,400 "
                                          r"characters holds <function=\.\.\.> markup; tool calls are parsed from at "
                                          r"most 1,000"):
        load_trajectories(path)
    result = CliRunner().invoke(cli, ["import", str(path), "--store", str(tmp_path / "s")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "big.json record 0 conversations[1]" in result.output and _parts(tmp_path / "s") == []


# ---------------------------------------------------------------- ADP standardized


def _adp() -> dict:
    return {"id": "webshop_0", "details": {"split": "train"}, "content": [
        {"class_": "text_observation", "content": "You are web shopping. Reply with actions.", "source": "user"},
        {"class_": "message_action", "content": "OK", "description": ""},
        {"class_": "text_observation", "content": "WebShop [SEP] Instruction: buy a lamp [SEP] Search", "source": "user"},
        {"class_": "api_action", "function": "search", "kwargs": {"keywords": "lamp"}, "description": "search first"},
        {"class_": "text_observation", "content": "Page 1: B01 lamp $9", "source": "environment"},
        {"class_": "code_action", "language": "bash", "content": "ls /tmp", "description": "check files"},
        {"class_": "web_observation", "axtree": "[1] button 'Buy'", "url": "http://shop/item", "source": "environment"},
        {"class_": "message_action", "content": "Bought it.", "description": "done"}]}


def test_adp_standardized_field_by_field(tmp_path):
    path = _write(tmp_path / "std.json", [_adp()])
    assert detect_format(path) == "adp"
    [row] = load_trajectories(path)
    assert row["task_id"] == "webshop_0" and row["env"] == "import:adp"
    roles = [m["role"] for m in row["messages"]]
    assert roles == ["user", "assistant", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    search, code = row["messages"][3], row["messages"][5]
    assert search["reasoning"] == "search first" and search["tool_calls"][0]["name"] == "search"
    assert json.loads(search["tool_calls"][0]["arguments"]) == {"keywords": "lamp"}
    assert code["tool_calls"][0]["name"] == "execute_bash"
    assert json.loads(code["tool_calls"][0]["arguments"]) == {"code": "ls /tmp"}
    assert row["messages"][4]["tool_call_id"] == search["tool_calls"][0]["id"]
    assert row["messages"][6]["content"] == "[1] button 'Buy'"
    assert row["messages"][1]["reasoning"] is None  # an empty description is no reasoning
    assert row["instruction"] == "WebShop [SEP] Instruction: buy a lamp [SEP] Search"  # the "OK"-ed preamble skipped
    assert json.loads(row["metadata"])["details"] == {"split": "train"}


def test_adp_unknown_item_is_located(tmp_path):
    doc = _adp()
    doc["content"][2] = {"class_": "telepathy", "content": "?"}
    with pytest.raises(FormatError, match=r"std\.json record 0 content\[2\]: expected an item with class_.*'telepathy'"):
        load_trajectories(_write(tmp_path / "std.json", [doc]))


# ---------------------------------------------------------------- observation/action steps


def test_step_list_with_paired_steps(tmp_path):
    record = {"id": "alfworld-7", "task": "put a clean mug in the coffee machine", "reward": 1.0, "won": True,
              "steps": [{"observation": "You are in the kitchen.", "thought": "find a mug", "action": "go to cabinet 1"},
                        {"observation": "You see a mug.", "action": "take mug from cabinet 1", "reward": 0.0},
                        {"observation": "You take the mug.", "action": "clean mug with sinkbasin 1", "reward": 1.0,
                         "done": True}]}
    path = _write(tmp_path / "alf.json", [record])
    assert detect_format(path) == "steps"
    [row] = load_trajectories(path)
    assert row["instruction"] == record["task"] and row["task_id"] == "alfworld-7"
    assert [m["role"] for m in row["messages"]] == ["user"] + ["user", "assistant"] * 3
    assert [m["content"] for m in row["messages"] if m["role"] == "assistant"] == [s["action"] for s in record["steps"]]
    assert [m["content"] for m in row["messages"][1::2]] == [s["observation"] for s in record["steps"]]
    assert row["messages"][2]["reasoning"] == "find a mug"
    assert [t["reward"] for t in row["turns"]] == [None, 0.0, 1.0] and row["turns"][-1]["done"] is True
    assert row["reward"] == 1.0 and row["success"] is True


def test_step_list_with_alternating_items(tmp_path):
    record = {"goal": "reach the door", "trajectory": [
        {"type": "observation", "content": "A room."}, {"type": "action", "content": "walk north"},
        {"type": "observation", "content": "A door."}, {"type": "action", "content": "open door"}]}
    [row] = load_trajectories(_write(tmp_path / "alt.json", [record]))
    assert [(m["role"], m["content"]) for m in row["messages"]] == [
        ("user", "reach the door"), ("user", "A room."), ("assistant", "walk north"),
        ("user", "A door."), ("assistant", "open door")]
    assert row["instruction"] == "reach the door" and len(row["turns"]) == 2


def test_bad_step_is_located_and_the_store_unchanged(tmp_path):
    good = _write(tmp_path / "good.json", [{"task": "t", "steps": [{"observation": "o", "action": "a"}]}])
    bad = _write(tmp_path / "bad.json", [{"task": "t", "steps": [{"observation": "o", "action": "a"}, {"note": 1}]}])
    store = tmp_path / "s"
    runner = CliRunner()
    assert runner.invoke(cli, ["import", str(good), "--store", str(store)]).exit_code == 0
    before = (_parts(store), Store(store).count())
    result = runner.invoke(cli, ["import", str(good), str(bad), "--store", str(store)])
    assert result.exit_code == 1
    assert "bad.json record 0 steps[1]: a step needs an observation or an action" in result.output
    assert (_parts(store), Store(store).count()) == before


def test_role_ai_and_text_key_in_message_lists(tmp_path):
    """SWE-agent-style message lists {role: ai|user|system, text}, as some trajectory dumps store them."""
    record = {"instance_id": "astropy__astropy-12907", "messages": [
        {"role": "system", "text": "You are a programmer."}, {"role": "user", "text": "Fix the separability bug."},
        {"role": "ai", "text": "Looking at modeling/separable.py."}]}
    [row] = load_trajectories(_write(tmp_path / "m.json", [record]))
    assert [(m["role"], m["content"]) for m in row["messages"]] == [
        ("system", "You are a programmer."), ("user", "Fix the separability bug."),
        ("assistant", "Looking at modeling/separable.py.")]
    assert row["task_id"] == "astropy__astropy-12907" and row["instruction"] == "Fix the separability bug."
