"""The trajectory format: round trips through Arrow, polars and datasets; JSON Schema agreement; validation."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest

from omrl.schema import (
    ANNOTATION_SCHEMA,
    SCHEMA_FILES,
    TRAJECTORY_SCHEMA,
    SchemaError,
    json_schema,
    normalize_annotation,
    normalize_trajectory,
    trajectory_id,
)
from omrl.schema.arrow import to_table
from omrl.store import Store

SCHEMAS_DIR = Path(__file__).resolve().parents[1] / "schemas"

FULL_ROW = {
    "id": "full-1",
    "run_id": "run-x",
    "round": 2,
    "task_id": "t-9",
    "group_id": "g-1",
    "sample": 3,
    "env": "code",
    "model": "qwen-tiny",
    "instruction": "Fix the bug",
    "task": json.dumps({"answer": "42", "files": {"a.py": "x = 1"}}),
    "tools": json.dumps([{"type": "function", "function": {"name": "run_tests", "parameters": {}}}]),
    "messages": [
        {"role": "system", "content": "sys", "reasoning": None, "tool_calls": [], "tool_call_id": None,
         "name": None, "trainable": None},
        {"role": "user", "content": "Fix the bug", "reasoning": None, "tool_calls": [], "tool_call_id": None,
         "name": None, "trainable": None},
        {"role": "assistant", "content": None, "reasoning": "run the tests first",
         "tool_calls": [{"id": "c1", "name": "run_tests", "arguments": "{}"}], "tool_call_id": None,
         "name": None, "trainable": False},
        {"role": "tool", "content": "1 failed", "reasoning": None, "tool_calls": [], "tool_call_id": "c1",
         "name": "run_tests", "trainable": None},
        {"role": "assistant", "content": "done", "reasoning": None, "tool_calls": [], "tool_call_id": None,
         "name": None, "trainable": True},
    ],
    "turns": [
        {"index": 0, "reward": 0.0, "done": False, "latency_s": 0.5, "prompt_tokens": 10,
         "completion_tokens": 5, "info": "{}", "completion_ids": [1, 2, 3], "logprobs": [-0.5, -0.25, -1.0]},
        {"index": 1, "reward": 1.0, "done": True, "latency_s": 0.25, "prompt_tokens": 20,
         "completion_tokens": 2, "info": json.dumps({"tests": "pass"}), "completion_ids": [4, 5],
         "logprobs": [-0.125, -2.0]},
    ],
    "reward": 1.0,
    "success": True,
    "status": "ok",
    "error": None,
    "num_turns": 2,
    "prompt_tokens": 30,
    "completion_tokens": 7,
    "duration_s": 1.5,
    "source": "collected",
    "parent_id": "parent-0",
    "metadata": json.dumps({"seed": 7}),
    "created_at": datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc),
}

MINIMAL_ROW = {"id": "min-1", "task_id": "t-1"}


def _roundtrip_rows(tmp_path: Path, rows: list[dict]) -> Store:
    store = Store.create(tmp_path / "s")
    store.append(rows)
    return store


@pytest.mark.parametrize("row", [FULL_ROW, MINIMAL_ROW], ids=["full", "minimal"])
def test_round_trip_arrow_polars_datasets(tmp_path, row):
    expected = normalize_trajectory(row)  # fixes created_at, which defaults to now
    store = _roundtrip_rows(tmp_path, [expected])

    arrow_rows = store.read().to_pylist()
    assert arrow_rows == [expected]

    polars_rows = store.polars().to_dicts()
    assert polars_rows[0]["messages"] == expected["messages"]
    assert polars_rows[0] == expected

    ds = store.dataset()
    assert len(ds) == 1
    assert ds[0]["messages"] == expected["messages"]
    assert ds[0]["id"] == expected["id"] and ds[0]["reward"] == expected["reward"]


def test_full_row_keeps_every_value():
    out = normalize_trajectory(FULL_ROW)
    assert out == FULL_ROW
    assert normalize_trajectory(out) == out  # idempotent


def test_minimal_row_gets_defaults():
    out = normalize_trajectory(MINIMAL_ROW)
    assert out["messages"] == [] and out["turns"] == []  # empty lists, never null
    assert out["status"] == "ok" and out["task"] == "{}" and out["tools"] == "[]"
    assert out["group_id"]  # derived from run, round and task


def test_table_uses_explicit_schema():
    table = to_table([FULL_ROW, MINIMAL_ROW])
    assert table.schema.equals(TRAJECTORY_SCHEMA, check_metadata=False)
    assert table.schema.field("messages").type.value_type.field("tool_calls").type == pa.list_(
        TRAJECTORY_SCHEMA.field("messages").type.value_type.field("tool_calls").type.value_type)


@pytest.mark.parametrize("name", sorted(SCHEMA_FILES))
def test_json_schema_files_match_code(name):
    path = SCHEMAS_DIR / SCHEMA_FILES[name]
    on_disk = json.loads(path.read_text())
    assert on_disk == json_schema(name), f"{path} is stale: regenerate with `omrl schema --json --table {name}`"


def test_json_schema_covers_every_column():
    assert list(json_schema("trajectories")["properties"]) == TRAJECTORY_SCHEMA.names
    assert list(json_schema("annotations")["properties"]) == ANNOTATION_SCHEMA.names


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"reward": "high"}, "field 'reward' must be a number"),
        ({"status": "crashed"}, "field 'status' must be one of"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "field 'messages[0].role'"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"arguments": "{}"}]}]}, "field 'messages[0].tool_calls[0].name'"),
        ({"task": "{not json"}, "field 'task' must be JSON text"),
        ({"turns": [{"index": 0, "reward": "x"}]}, "field 'turns[0].reward'"),
        ({"turns": [{"completion_ids": [1, None]}]}, "field 'turns[0].completion_ids[1]' must be a number"),
        ({"turns": [{"logprobs": "-0.5"}]}, "field 'turns[0].logprobs' must be a list of numbers"),
        ({"colour": "red"}, "unknown field(s) colour"),
    ],
)
def test_validation_names_trajectory_and_field(change, message):
    with pytest.raises(SchemaError) as info:
        normalize_trajectory({**MINIMAL_ROW, **change})
    assert "trajectory 'min-1'" in str(info.value)
    assert message in str(info.value)


def test_tool_call_arguments_given_as_object_are_stored_as_json_text():
    row = {**MINIMAL_ROW, "messages": [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]}]}
    call = normalize_trajectory(row)["messages"][0]["tool_calls"][0]
    assert call == {"id": "c", "name": "f", "arguments": '{"x": 1}'}


def test_annotation_error_needs_error_text():
    with pytest.raises(SchemaError, match="needs field 'error'"):
        normalize_annotation({"trajectory_id": "t", "annotator": "judge", "status": "error"})
    ok = normalize_annotation({"trajectory_id": "t", "annotator": "judge", "status": "error", "error": "timeout"})
    assert ok["score"] is None and ok["status"] == "error"


def test_trajectory_id_is_deterministic_and_distinct():
    assert trajectory_id("r", 0, "t", 1) == trajectory_id("r", 0, "t", 1)
    assert len({trajectory_id("r", 0, "t", s) for s in range(100)}) == 100
    assert trajectory_id("r", 0, "t", 0) != trajectory_id("r", 1, "t", 0)


def test_polars_reads_parts_with_explicit_superset_schema(tmp_path):
    store = _roundtrip_rows(tmp_path, [FULL_ROW])
    frame = pl.read_parquet(store.parts()[0])
    assert frame.schema["messages"] == pl.List(pl.Struct({
        "role": pl.String, "content": pl.String, "reasoning": pl.String,
        "tool_calls": pl.List(pl.Struct({"id": pl.String, "name": pl.String, "arguments": pl.String})),
        "tool_call_id": pl.String, "name": pl.String, "trainable": pl.Boolean}))


def test_record_types_and_structs_name_the_arrow_columns():
    """The Arrow schema is the one column list: record dataclasses carry the same names."""
    from dataclasses import fields

    from omrl.schema import (
        MESSAGE_TYPE,
        TOOL_CALL_TYPE,
        TURN_TYPE,
        Annotation,
        Message,
        ToolCall,
        Trajectory,
        Turn,
    )

    pairs = [(TRAJECTORY_SCHEMA, Trajectory), (ANNOTATION_SCHEMA, Annotation), (MESSAGE_TYPE, Message),
             (TOOL_CALL_TYPE, ToolCall), (TURN_TYPE, Turn)]
    for arrow, record in pairs:
        assert sorted(f.name for f in arrow) == sorted(f.name for f in fields(record)), record.__name__
    assert list(normalize_trajectory(MINIMAL_ROW)) == TRAJECTORY_SCHEMA.names
    full = normalize_trajectory(FULL_ROW)
    assert list(full["messages"][2]) == [f.name for f in MESSAGE_TYPE]
    assert list(full["turns"][0]) == [f.name for f in TURN_TYPE]


def test_a_normalised_row_is_not_checked_again_until_changed():
    import pickle

    from omrl.schema import is_normalized

    row = normalize_trajectory(FULL_ROW)
    assert is_normalized(row) and not is_normalized(row, "annotations") and not is_normalized(dict(row))
    assert normalize_trajectory(row) is row
    assert is_normalized(pickle.loads(pickle.dumps(row)))  # rows sent to worker processes stay checked
    assert to_table([row]).equals(to_table([FULL_ROW]))
    row["reward"] = "high"  # a changed row is checked again
    assert not is_normalized(row)
    with pytest.raises(SchemaError, match="field 'reward' must be a number"):
        to_table([row])
    for change in (lambda r: r.update(reward="x"), lambda r: r.pop("reward"), lambda r: r.setdefault("x", 1)):
        changed = normalize_trajectory(FULL_ROW)
        change(changed)
        assert not is_normalized(changed)
    note = normalize_annotation({"trajectory_id": "t", "annotator": "judge", "score": 1})
    assert is_normalized(note, "annotations") and normalize_annotation(note) is note
    assert not is_normalized(note, "trajectories")
