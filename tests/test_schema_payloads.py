"""The JSON-text columns read as values (omrl.schema.payloads): stored text parsed, decoded values as they are."""

from __future__ import annotations

import json

import pytest

from omrl.schema.payloads import decoded, info_of, metadata_of, task_of, tools_of


def test_decoded_parses_text_and_keeps_values():
    assert decoded('{"a": 1}', {}) == {"a": 1}
    assert decoded(None, []) == [] and decoded("", {}) == {}
    value = {"b": 2}
    assert decoded(value, {}) is value
    with pytest.raises(json.JSONDecodeError):
        decoded("{oops", {})


def test_object_columns_are_objects_whatever_they_hold():
    assert metadata_of({"metadata": '{"k": "v"}'}) == {"k": "v"}
    assert metadata_of({"metadata": None}) == {} and metadata_of({}) == {}
    assert metadata_of({"metadata": "[1, 2]"}) == {} and metadata_of({"metadata": "{oops"}) == {}
    assert info_of({"info": '{"finish_reason": "stop"}'})["finish_reason"] == "stop"
    assert info_of({"info": {"note": "x"}}) == {"note": "x"}


def test_tools_and_task():
    assert tools_of({"tools": '[{"type": "function"}]'}) == [{"type": "function"}]
    assert tools_of({"tools": None}) == []
    twice = json.dumps({"id": "t", "payload": json.dumps({"x": 1})})  # an old row's payload, encoded twice
    assert task_of({"task": twice}) == {"id": "t", "payload": {"x": 1}}
    assert task_of({"task": {"id": "t", "payload": '{"x": 1}'}}) == {"id": "t", "payload": {"x": 1}}
    assert task_of({"task": None}) == {}
