"""to_table's column-by-column path (omrl.schema.arrow) against the row-by-row normaliser: the same table for
every batch it takes, and the normaliser's own error for every batch it gives up on."""

from __future__ import annotations

import copy
import json
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest

from omrl.schema import TRAJECTORY_SCHEMA, SchemaError, normalize_trajectory
from omrl.schema.arrow import to_table, trajectories_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from store_bench import make_corpus  # noqa: E402

WHEN = "2026-01-01T00:00:00+00:00"


def _row(**fields):
    return {"id": "r1", "task_id": "t", "created_at": WHEN, **fields}


def _by_normaliser(rows):
    return pa.Table.from_pylist([normalize_trajectory(r) for r in copy.deepcopy(rows)], schema=TRAJECTORY_SCHEMA)


TAKEN = {
    "minimal": [_row()],
    "messages with defaults and unknown keys": [_row(messages=[
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [{"name": "f"}], "trainable": False, "reasoning": "r"},
        {"role": "tool", "content": "x", "extra": 3}])],
    "turns: missing index, null done, NaN latency, ids and logprobs": [_row(turns=[
        {"reward": 1}, {"index": 5, "done": None, "latency_s": float("nan"), "info": '{"a": 1}',
                        "completion_ids": [1, 2], "logprobs": [0.5, 1]}, {}])],
    "ints where floats belong": [_row(reward=1, duration_s=2), _row(id="r2", reward=0.5)],
    "whole floats where ints belong": [_row(round=2.0, sample=3)],
    "times: naive, aware, other zone": [
        _row(created_at=datetime(2020, 1, 1, 3)), _row(id="r2", created_at=datetime(2020, 1, 1, tzinfo=timezone.utc)),
        _row(id="r4", created_at=datetime(2020, 1, 1, tzinfo=timezone(timedelta(hours=2))))],
    "times as text": [_row(created_at="2020-01-01T00:00:00Z"), _row(id="r2", created_at="2020-01-01T05:00:00+02:00")],
    "secrets in error and metadata": [_row(error="Authorization: Bearer sk-abcdefghijklmnopqrstuvwxyz123456",
                                           metadata=json.dumps({"key": "Bearer abcdefghijklmnopqrstuvwx"}))],
    "derived num_turns and group_id, given ones kept": [
        _row(messages=[{"role": "assistant"}, {"role": "user"}, {"role": "assistant"}]),
        _row(id="r2", num_turns=7, group_id="g", messages=[{"role": "assistant"}])],
    "empty and missing lists": [_row(turns=[], messages=[]), _row(id="r2", turns=None, messages=None)],
    "defaults for null and empty text": [_row(run_id=None, status="", env=None, source="", tools=None, task=None)],
}

GIVES_UP = {
    "unknown field": [_row(bogus=1)],
    "a bool among floats": [_row(reward=0.5), _row(id="r2", reward=True)],
    "a bool in a turn's floats": [_row(turns=[{"latency_s": 0.5}, {"latency_s": True}])],
    "an int task id (the normaliser turns it into text)": [_row(task_id=3)],
    "unknown role": [_row(messages=[{"role": "robot"}])],
    "OpenAI's nested tool call": [_row(messages=[{"role": "assistant", "tool_calls": [
        {"id": "c", "function": {"name": "f", "arguments": "{}"}}]}])],
    "a null message": [_row(messages=[None])],
    "broken JSON": [_row(metadata="{")],
    "an empty tools text": [_row(tools="")],
    "an object where JSON text belongs": [_row(metadata={"a": 1})],
    "a payload given as JSON text": [_row(task={"payload": '{"a": 1}'})],
    "unknown status": [_row(status="weird")],
    "a token id beyond int32": [_row(turns=[{"completion_ids": [2**40]}])],
    "an empty tool name": [_row(messages=[{"role": "assistant", "tool_calls": [{"name": ""}]}])],
    "a fractional round": [_row(round=2.5)],
    "bytes for text": [_row(instruction=b"x")],
    "a row that is not an object": [_row(), None],
    "no id": [_row(id="")],
}


@pytest.mark.parametrize("name", list(TAKEN))
def test_taken_batches_equal_the_normalisers_table(name):
    rows = TAKEN[name]
    built = trajectories_table(copy.deepcopy(rows))
    assert built is not None, "the column path gave up on rows it should take"
    expected = _by_normaliser(rows)
    assert built.schema == expected.schema
    for column in expected.column_names:
        assert built.column(column).to_pylist() == expected.column(column).to_pylist(), column
    assert to_table(copy.deepcopy(rows)).equals(expected)


@pytest.mark.parametrize("name", list(GIVES_UP))
def test_doubtful_batches_go_to_the_normaliser(name):
    rows = GIVES_UP[name]
    assert trajectories_table(copy.deepcopy(rows)) is None
    try:
        expected = _by_normaliser(rows)
    except SchemaError as exc:
        with pytest.raises(SchemaError, match="^" + __import__("re").escape(str(exc)) + "$"):
            to_table(copy.deepcopy(rows))
    else:  # the normaliser converts what the column path leaves to it
        assert to_table(copy.deepcopy(rows)).equals(expected)


def test_benchmark_corpus_takes_the_column_path_unchanged():
    rows = list(make_corpus(60, seed=3))
    built = trajectories_table(copy.deepcopy(rows))
    assert built is not None
    assert built.equals(_by_normaliser(rows))


def test_missing_times_are_now():
    before = datetime.now(timezone.utc)
    built = trajectories_table([{"id": "a", "task_id": "t"}, {"id": "b", "task_id": "t"}])
    stamps = built.column("created_at").to_pylist()
    assert all(before <= stamp <= datetime.now(timezone.utc) for stamp in stamps)
