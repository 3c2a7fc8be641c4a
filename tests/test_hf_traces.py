"""`omrl export --format traces`: Hugging Face Hub agent traces (the Session Trace Simple Format), checked
against the fields the Hub documents, and pushed with `--push` through the real huggingface_hub client.

The documented format (Hub docs, "Session Traces Format"): a JSONL file per session; the first line is
the header {type: "session" (required), harness (required, the producing harness's id), id (required,
unique), name (optional), any other key allowed and ignored}; every following line is {type: "message",
message: {role (required: user, assistant, system or tool), content (required, text, may be empty),
reasoningContent, toolCalls [{id, function: {name, arguments (a JSON string)}}], toolCallId (on a tool
message, the toolCalls[].id it answers), timestamp (epoch milliseconds), model}}.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_export import fake_hub  # noqa: F401 - the fixture
from test_roundtrip import REAL_FILES, hand_made_rows

from omrl.cli.main import cli
from omrl.formats.exporters import export_store
from omrl.formats.hf_traces import session_path
from omrl.formats.importer import load_trajectories
from omrl.store import Store

MESSAGE_FIELDS = {"role": str, "content": str, "reasoningContent": str, "toolCalls": list, "toolCallId": str,
                  "timestamp": int, "model": str}


def check_session(lines: list[dict]) -> list[str]:
    """Every way a session file departs from the documented fields (empty: it conforms)."""
    problems = []
    header, messages = lines[0], lines[1:]
    if header.get("type") != "session":
        problems.append("first line: type must be 'session'")
    for key in ("harness", "id"):
        if not isinstance(header.get(key), str) or not header[key]:
            problems.append(f"header: {key} is required text")
    if "name" in header and not isinstance(header["name"], str):
        problems.append("header: name must be text")
    calls: set[str] = set()
    for n, line in enumerate(messages, start=2):
        if set(line) != {"type", "message"} or line["type"] != "message":
            problems.append(f"line {n}: not a message envelope")
            continue
        m = line["message"]
        for key, value in m.items():
            if key not in MESSAGE_FIELDS:
                problems.append(f"line {n}: undocumented field {key!r}")
            elif not isinstance(value, MESSAGE_FIELDS[key]):
                problems.append(f"line {n}: {key} must be {MESSAGE_FIELDS[key].__name__}")
        if m.get("role") not in ("user", "assistant", "system", "tool"):
            problems.append(f"line {n}: role {m.get('role')!r}")
        if "content" not in m:
            problems.append(f"line {n}: content is required")
        for call in m.get("toolCalls", []):
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(call.get("id"), str) or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                problems.append(f"line {n}: a tool call needs id and function.name")
                continue
            try:
                json.loads(fn.get("arguments"))
            except (TypeError, ValueError):
                problems.append(f"line {n}: function.arguments must be a JSON string")
            calls.add(call["id"])
        if "toolCallId" in m and (m.get("role") != "tool" or m["toolCallId"] not in calls):
            problems.append(f"line {n}: toolCallId must answer an earlier tool call, on a tool message")
    return problems


def read_sessions(folder: Path) -> dict[str, list[dict]]:
    return {p.relative_to(folder).as_posix(): [json.loads(line) for line in p.read_text().splitlines()]
            for p in sorted(folder.glob("sessions/*/*.jsonl"))}


def test_every_session_file_has_exactly_the_documented_fields(tmp_path, real_data):
    store = Store.create(tmp_path / "s")
    store.append(hand_made_rows())
    for name in REAL_FILES:
        store.append(load_trajectories(real_data / name))
    out = tmp_path / "traces"
    result = CliRunner().invoke(cli, ["export", str(store.path), "--out", str(out), "--format", "traces"])
    assert result.exit_code == 0, result.output
    sessions = read_sessions(out)
    rows = {r["id"]: r for r in store.read().to_pylist()}
    assert len(sessions) == len(rows)
    for path, lines in sessions.items():
        assert check_session(lines) == [], path
        row = rows[lines[0]["id"]]
        assert path == session_path(row["id"])
        # One line per message, in order, with the text as stored.
        assert [(m["message"]["role"], m["message"]["content"]) for m in lines[1:]] == [
            (m["role"], m["content"] or "") for m in row["messages"]]
    fix = sessions[session_path("fix")]
    assert fix[0] == {"type": "session", "harness": "omrl", "id": "fix", "name": "Fix the failing test in a.py.",
                      "task_id": "repo-1", "model": "m-7b", "reward": 1.0, "success": True, "status": "ok"}
    assert fix[3]["message"]["toolCalls"] == [{"id": "c1", "function": {"name": "read", "arguments": '{"path": "a.py"}'}}]
    assert fix[3]["message"]["reasoningContent"] == "read it first"
    assert fix[4]["message"] == {"role": "tool", "content": "def f(): return 1", "toolCallId": "c1"}
    odd = sessions[session_path("odd")]
    assert json.loads(odd[3]["message"]["toolCalls"][0]["function"]["arguments"]) == "ls -la (not json)"
    assert (out / "README.md").read_text().startswith("---\ntags:\n- agent-traces")


def test_the_checker_sees_what_departs_from_the_format():
    """The check above can fail: each departure from the documented fields is named."""
    good = [{"type": "session", "harness": "omrl", "id": "a"},
            {"type": "message", "message": {"role": "assistant", "content": "",
                                            "toolCalls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]}},
            {"type": "message", "message": {"role": "tool", "content": "ok", "toolCallId": "c"}}]
    assert check_session(good) == []
    bad = [{"type": "session", "harness": "omrl"},
           {"type": "message", "message": {"role": "bot", "text": "hi"}},
           {"type": "message", "message": {"role": "assistant", "content": "",
                                           "toolCalls": [{"id": "c", "function": {"name": "f", "arguments": {"a": 1}}}]}},
           {"type": "message", "message": {"role": "tool", "content": "x", "toolCallId": "zz"}}]
    assert check_session(bad) == ["header: id is required text", "line 2: undocumented field 'text'",
                                  "line 2: role 'bot'", "line 2: content is required",
                                  "line 3: function.arguments must be a JSON string",
                                  "line 4: toolCallId must answer an earlier tool call, on a tool message"]


def test_ids_that_are_no_file_names_cannot_escape_the_folder():
    for rid in ("../../etc/passwd", "a/b", ".hidden", "..", "x" * 300, "ok-id_1.2"):
        path = session_path(rid)
        parts = path.split("/")
        assert parts[0] == "sessions" and len(parts) == 3 and not parts[2].startswith(".") and ".." not in parts
    assert session_path("ok-id_1.2").endswith("/ok-id_1.2.jsonl")


def test_export_push_shows_traces_to_the_hub(tmp_path, fake_hub):  # noqa: F811 - the fixture
    store = Store.create(tmp_path / "s")
    store.append(hand_made_rows())
    out = tmp_path / "traces"
    result = CliRunner().invoke(cli, ["export", str(store.path), "--out", str(out), "--format", "traces",
                                      "--push", "me/agent-traces"])
    assert result.exit_code == 0, result.output
    uploaded = fake_hub.files["me/agent-traces"]
    assert set(uploaded) == {"README.md", *read_sessions(out)}
    assert uploaded[session_path("chat")].decode().splitlines()[0].startswith('{"type": "session"')


def test_a_traces_export_is_whole_or_absent(tmp_path, monkeypatch):
    store = Store.create(tmp_path / "s")
    store.append(hand_made_rows())
    calls = []

    def fails_on_the_second(row):
        calls.append(row["id"])
        if len(calls) == 2:
            raise ValueError("disk full")
        return [{"type": "session", "harness": "omrl", "id": row["id"]}]

    monkeypatch.setattr("omrl.formats.hf_traces.session_lines", fails_on_the_second)
    with pytest.raises(ValueError, match="disk full"):
        export_store(store, tmp_path / "t", "traces")
    assert calls and list(tmp_path.iterdir()) == [tmp_path / "s"]  # no folder, no staging left behind
