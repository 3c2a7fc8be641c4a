"""`omrl import` through click: real files into a store, counts checked with `omrl query`, idempotence, errors."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
from click.testing import CliRunner

from omrl.cli.main import cli
from omrl.store import Store

REAL_FILES = ["eto_sharegpt_3traj.json", "openmanus-rl_webshop_val.parquet", "swe-gym_openhands_5traj.json",
              "swe-agent_marshmallow-1867.traj", "toolbench_G1_answer_10.json"]


def _source_counts(real) -> dict[str, tuple[int, int, int]]:
    """(trajectories, messages, tool calls) per env, counted from the raw files without omrl."""
    eto = json.loads((real / "eto_sharegpt_3traj.json").read_text())
    manus = pq.read_table(real / "openmanus-rl_webshop_val.parquet").to_pylist()
    gym = json.loads((real / "swe-gym_openhands_5traj.json").read_text())
    swe = json.loads((real / "swe-agent_marshmallow-1867.traj").read_text())
    tb = max(json.loads((real / "toolbench_G1_answer_10.json").read_text())["answer_generation"]["train_messages"],
             key=len)
    return {
        "import:sharegpt": (len(eto), sum(len(r["conversations"]) for r in eto), 0),
        "import:openmanus": (len(manus), sum(len(r["conversations"]) for r in manus), 0),
        "import:openai": (len(gym), sum(len(r["messages"]) for r in gym),
                          sum(len(m["tool_calls"] or []) for r in gym for m in r["messages"])),
        "import:swe_agent": (1, len(swe["history"]), sum(len(m.get("tool_calls") or []) for m in swe["history"])),
        "import:toolbench": (1, len(tb), sum(1 for m in tb if m.get("function_call"))),
    }


def _query(runner, store, sql) -> list[dict]:
    result = runner.invoke(cli, ["query", str(store), sql, "--format", "json"])
    assert result.exit_code == 0, result.output
    text = result.output.strip()
    return json.loads(text) if text.startswith("[") else [json.loads(line) for line in text.splitlines()]


def test_import_real_files_counts_match_source_and_reimport_adds_nothing(real_data, tmp_path):
    runner = CliRunner()
    store = tmp_path / "store"
    files = [str(real_data / name) for name in REAL_FILES]
    result = runner.invoke(cli, ["import", *files, "--store", str(store)])
    assert result.exit_code == 0, result.output
    assert "openmanus" in result.output and "swe_agent" in result.output

    got = _query(runner, store, """
        SELECT t.env, count(DISTINCT t.id) AS n,
               (SELECT count(*) FROM messages m WHERE m.env = t.env) AS messages,
               (SELECT count(*) FROM tool_calls c JOIN trajectories u ON c.trajectory_id = u.id
                WHERE u.env = t.env) AS calls
        FROM trajectories t GROUP BY t.env ORDER BY t.env""")
    assert {r["env"]: (r["n"], r["messages"], r["calls"]) for r in got} == _source_counts(real_data)

    before = Store(store).count()
    again = runner.invoke(cli, ["import", *files, "--store", str(store)])
    assert again.exit_code == 0, again.output
    assert Store(store).count() == before == 30


def test_import_stops_on_bad_record_and_names_it(tmp_path):
    src = tmp_path / "chats.jsonl"
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    src.write_text(json.dumps(good) + "\n" + json.dumps({"messages": [{"role": "user"}], "reward": "lots"}) + "\n")
    runner = CliRunner()
    result = runner.invoke(cli, ["import", str(src), "--store", str(tmp_path / "s")])
    assert result.exit_code != 0
    assert "chats.jsonl record 1" in result.output and "reward" in result.output
    assert not (tmp_path / "s").exists()  # nothing of a failing file is written, not even an empty store

    result = runner.invoke(cli, ["import", str(src), "--store", str(tmp_path / "s"), "--skip-errors"])
    assert result.exit_code == 0, result.output
    assert "bad reward: 1" in result.output and "chats.jsonl record 1" in result.output
    assert Store(tmp_path / "s").count() == 1


def test_import_explicit_format_and_unknown_file(tmp_path):
    src = tmp_path / "plain.json"
    src.write_text(json.dumps([{"question": "1+1", "answer": "2"}]))
    runner = CliRunner()
    result = runner.invoke(cli, ["import", str(src), "--store", str(tmp_path / "s")])
    assert result.exit_code != 0 and "cannot tell the format" in result.output
    result = runner.invoke(cli, ["import", str(src), "--store", str(tmp_path / "s"), "--format", "sharegpt"])
    assert result.exit_code != 0 and "plain.json record 0" in result.output
