"""No silent text loss on import, over every importer: each text field of a source record reaches the
stored row (its non-whitespace characters, in one stored string), or the row reports it as dropped
(metadata.import.dropped: where in the record, why, how many characters).

Real files (../shared/data/real) and crafted ones: for each format, a file that exercises its corners,
and records whose text sits under a key no mapping names (it must be taken, or the import must fail
naming the key, never become an empty message).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_atif import harbor_document
from test_import_new_formats import BASH_TURN, XML_TURN, _adp
from test_import_swe_agent import _legacy

from omrl.cli.main import cli
from omrl.formats import FORMATS, format_module
from omrl.formats.detect import detect_format
from omrl.formats.importer import load_trajectories
from omrl.formats.mapping import load_mapping
from omrl.formats.records import FormatError, read_records

# Keys whose values are enumerations an importer maps (a role, an item's class), not text; and the ids
# that link a trace's spans into a tree (the import turns the tree into the messages' order).
STRUCTURAL = {"role", "from", "type", "class_", "source", "kind", "schema_version", "message_type", "loss", "style",
              "span_id", "parent_id"}
SPACE = re.compile(r"\s+")


def strings(value, path: str = ""):
    """(path, text) of every string leaf; a string holding a JSON object or list is walked into."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key not in STRUCTURAL:
                yield from strings(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for k, item in enumerate(value):
            yield from strings(item, f"{path}[{k}]")
    elif isinstance(value, str):
        stripped = value.strip()
        if stripped[:1] in ("{", "[") and stripped[-1:] in ("}", "]"):
            try:
                yield from strings(json.loads(stripped), path)
                return
            except (json.JSONDecodeError, RecursionError):
                pass
        if SPACE.sub("", value):
            yield path, value


def stored_text(row: dict) -> str:
    """Every string of a stored row (JSON fields parsed), whitespace removed, one per \\x00-separated piece."""
    return "\x00".join(SPACE.sub("", text) for _, text in strings(row))


def dropped_at(row: dict) -> list[dict]:
    return json.loads(row["metadata"]).get("import", {}).get("dropped", [])


def lost_text(record, rows: list[dict]) -> list[str]:
    """The paths of the record's text fields that reach no row and that no row reports as dropped."""
    store = "\x00".join(stored_text(r) for r in rows)
    drops = [d["at"] for r in rows for d in dropped_at(r)]
    lost = []
    for path, text in strings(record):
        if SPACE.sub("", text) in store:
            continue
        if any(path == at or path.startswith((f"{at}.", f"{at}[")) for at in drops):
            continue
        lost.append(f"{path}: {text[:60]!r}")
    return lost


def check_file(path: Path, fmt: str = "auto", mapping=None) -> int:
    """Import a file and check every record's text; returns how many records were checked."""
    rows = load_trajectories(path, fmt, mapping=mapping)
    fmt = mapping.name if mapping is not None else detect_format(path) if fmt == "auto" else fmt
    reader = getattr(format_module(fmt), "read_records", read_records) if mapping is None else read_records
    records = dict(reader(path))
    by_record: dict[int, list[dict]] = {}
    for row in rows:
        by_record.setdefault(json.loads(row["metadata"])["import"]["index"], []).append(row)
    assert set(by_record) == set(records), "every record became a row"
    for index, record in records.items():
        assert lost_text(record, by_record[index]) == [], f"{path.name} record {index}"
    return len(records)


REAL = ["swe-gym_openhands_5traj.json", "eto_sharegpt_3traj.json", "swe-agent_marshmallow-1867.traj",
        "toolbench_G1_answer_10.json", "openmanus-rl_webshop_val.parquet"]


@pytest.mark.parametrize("name", REAL)
def test_real_files_lose_no_text(real_data, name):
    assert check_file(real_data / name) >= 1


def write(path: Path, data) -> Path:
    path.write_text(json.dumps(data))
    return path


def otel_file(tmp_path: Path) -> Path:
    from test_otel import collector_json, instrumented_agent_run, otlp_request, tracer

    t, exporter = tracer()
    instrumented_agent_run(t)
    return write(tmp_path / "spans.json", collector_json(otlp_request(exporter.get_finished_spans())))


CRAFTED = {
    "sharegpt": lambda tmp: write(tmp / "sg.json", [{"id": "oh-1", "system": "Be careful.", "conversations": [
        {"from": "human", "value": "Fix the failing test in /repo."},
        {"from": "gpt", "value": XML_TURN},
        {"from": "human", "value": "EXECUTION RESULT of [str_replace_editor]:\n1\tdef f(): return 2"},
        {"from": "function_call", "value": json.dumps({"name": "run", "arguments": {"cmd": "pytest -x"}})},
        {"from": "observation", "value": "1 passed"},
        {"from": "gpt", "value": "Fixed.", "reasoning": "it passes now"}], "label": "gold patch"}]),
    "openai": lambda tmp: write(tmp / "oa.json", [{"instance_id": "x-1", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Run the tests "}, {"type": "text", "text": "please."}]},
        {"role": "assistant", "content": BASH_TURN},
        {"role": "user", "content": "EXECUTION RESULT of [execute_bash]:\nok"},
        {"role": "assistant", "content": None, "function_call": {"name": "finish", "arguments": "{\"answer\": \"ok\"}"}},
        {"role": "function", "name": "finish", "content": "finished"},
        {"role": "assistant", "content": "Done.", "reasoning_content": "all good", "weight": 1}],
        "test_result": "PASSED", "note": "kept in metadata"}]),
    "atif": lambda tmp: write(tmp / "atif.json", harbor_document()),
    "adp": lambda tmp: write(tmp / "adp.json", [_adp()]),
    "steps": lambda tmp: write(tmp / "steps.json", [{"id": "alf-1", "task": "put a mug in the machine", "steps": [
        {"observation": "You are in the kitchen.", "thought": "find a mug", "action": "go to cabinet 1",
         "info": "cabinet seen"},
        {"observation": "You see a mug.", "action": "take mug", "done": True}], "won": True}]),
    "otel": otel_file,
    "swe_agent": lambda tmp: write(tmp / "legacy.traj", _legacy()),  # a demonstration, history rebuilt from steps
}


@pytest.mark.parametrize("fmt", sorted(CRAFTED))
def test_crafted_files_lose_no_text(tmp_path, fmt):
    path = CRAFTED[fmt](tmp_path)
    assert detect_format(path) == fmt
    assert check_file(path) >= 1


def test_every_importer_is_checked(real_data):
    covered = {detect_format(real_data / name) for name in REAL} | set(CRAFTED)
    assert covered >= set(FORMATS.builtins), sorted(set(FORMATS.builtins) - covered)


def test_what_is_left_out_on_purpose_is_said(tmp_path):
    path = CRAFTED["sharegpt"](tmp_path)
    result = CliRunner().invoke(cli, ["import", str(path), "--store", str(tmp_path / "s")])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "sg.json: left out on purpose: 38 characters (OpenHands result header)" in said
    [row] = load_trajectories(CRAFTED["swe_agent"](tmp_path))
    reasons = {d["reason"] for d in dropped_at(row)}
    assert reasons == {"demonstration (--keep-demos keeps it)", "legacy history rebuilt from the trajectory steps"}


def test_a_mapped_file_loses_no_text(tmp_path):
    path = write(tmp_path / "tau.json", [{"task_id": 3, "reward": 1.0, "info": {"task": {"instruction": "Cancel it."}},
                                           "traj": [{"role": "user", "content": "Hi, I need help."},
                                                    {"role": "assistant", "content": "Sure, what is it?"}]}])
    assert check_file(path, mapping=load_mapping("recipes/imports/tau_bench.yaml")) == 1


def test_the_check_can_fail():
    """A row that lost a message's text is caught, and a reported drop is accepted."""
    record = {"messages": [{"role": "user", "content": "where is my parcel"}, {"role": "tool", "output": "in Lyon"}]}
    row = {"messages": [{"role": "user", "content": "where is my parcel"}, {"role": "tool", "content": None}],
           "metadata": json.dumps({"import": {}})}
    assert lost_text(record, [row]) == ["messages[1].output: 'in Lyon'"]
    row["metadata"] = json.dumps({"import": {"dropped": [{"at": "messages[1]", "reason": "test", "chars": 6}]}})
    assert lost_text(record, [row]) == []


# ---------------------------------------------------------------- text under keys no mapping names


def test_content_under_another_key_for_one_role_is_taken(tmp_path):
    """Tool results under `output`, the rest under `content` (as some agent logs write them): taken, not
    left as an empty tool message."""
    path = write(tmp_path / "log.json", [{"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "function": {"name": "w", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "output": "18 C"},
        {"role": "assistant", "content": "18 C in Paris.", "timestamp": "2025-01-01T00:00:00Z"}]}])
    [row] = load_trajectories(path)
    assert [m["content"] for m in row["messages"]] == ["Weather in Paris?", None, "18 C", "18 C in Paris."]
    assert check_file(path) == 1  # the timestamp too reaches the store (metadata)


def test_text_under_several_unknown_keys_fails_naming_them(tmp_path):
    path = write(tmp_path / "log.json", [{"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "tool", "stdout": "18 C", "stderr": "warning: cached"}]}])
    with pytest.raises(FormatError, match=r"messages\[1\].*'stderr'.*'stdout'.*--content-key"):
        load_trajectories(path)


def test_a_content_key_takes_the_text_and_the_rest_is_kept(tmp_path):
    path = write(tmp_path / "log.json", [{"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "tool", "stdout": "18 C", "stderr": "warning: cached"}]}])
    mapping = load_mapping(messages="messages", content=["content", "stdout"])
    [row] = load_trajectories(path, mapping=mapping)
    assert [m["content"] for m in row["messages"]] == ["Weather in Paris?", "18 C"]
    assert check_file(path, mapping=mapping) == 1  # stderr kept in the metadata
