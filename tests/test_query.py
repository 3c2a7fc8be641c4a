"""The SQL layer: every view answers, read-only enforcement, annotations pivoted into scores."""

from __future__ import annotations

import pytest

from omrl.schema import Annotation
from omrl.store.query import QueryError


def test_every_view_answers(store):
    expected = {
        "trajectories": 6,
        "messages": 36,
        "turns": 12,
        "tool_calls": 12,
        "annotations": 0,
        "latest_annotations": 0,
        "scores": 0,
        "groups": 3,
    }
    for view, n in expected.items():
        assert store.sql(f"SELECT count(*) AS n FROM {view}").to_pylist() == [{"n": n}], view


def test_messages_view_has_positions_and_roles(store):
    rows = store.sql("SELECT position, role, tool_call_id FROM messages WHERE trajectory_id = 'traj-0' "
                     "ORDER BY position").to_pylist()
    assert [r["role"] for r in rows] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert [r["position"] for r in rows] == list(range(6))
    assert rows[3]["tool_call_id"] == "c1"


def test_tool_calls_view(store):
    rows = store.sql("SELECT name, count(*) AS n FROM tool_calls GROUP BY name ORDER BY name").to_pylist()
    assert rows == [{"name": "answer", "n": 6}, {"name": "calculator", "n": 6}]
    first = store.sql("SELECT message_position, call_index, arguments FROM tool_calls "
                      "WHERE trajectory_id = 'traj-2' AND name = 'calculator'").to_pylist()
    assert first == [{"message_position": 2, "call_index": 0, "arguments": '{"expression": "2+1"}'}]


def test_tool_calls_view_reads_the_side_file_not_the_conversations(store):
    import hashlib
    import json

    import pyarrow.parquet as pq

    from omrl.store import Store
    from omrl.store.layout import side_path

    (part,) = store.parts()
    side = side_path(part)
    table = pq.read_table(side)
    names = table.column("name").to_pylist()
    # rewrite the side file's names (stamp kept): the view must answer from it, so its change shows
    changed = table.set_column(table.schema.get_field_index("name"), "name",
                               [[f"side-{n}" for n in names]]).replace_schema_metadata(table.schema.metadata)
    pq.write_table(changed, side)
    manifest = json.loads((store.path / "omrl.json").read_text())  # and listed, as if written so
    manifest["parts"]["trajectories"][0]["sides"]["tool_calls"] = {
        "bytes": side.stat().st_size, "sha256": hashlib.sha256(side.read_bytes()).hexdigest()}
    (store.path / "omrl.json").write_text(json.dumps(manifest))
    rows = Store(store.path).sql("SELECT DISTINCT name FROM tool_calls ORDER BY name").to_pylist()
    assert rows == [{"name": "side-answer"}, {"name": "side-calculator"}]


def test_groups_view_statistics(store):
    rows = store.sql("SELECT task_id, n, mean_reward, std_reward, success_rate FROM groups ORDER BY task_id")
    assert rows.to_pylist() == [
        {"task_id": f"task-{i}", "n": 2, "mean_reward": 0.5, "std_reward": 0.5, "success_rate": 0.5}
        for i in range(3)
    ]


def test_scores_pivot_latest_ok_annotation_per_annotator(store):
    store.append([Annotation("traj-0", "judge", score=0.2).to_row()], table="annotations")
    store.append([Annotation("traj-0", "judge", score=0.9).to_row(),  # re-annotation: latest wins
                  Annotation("traj-0", "exact_match", score=1.0).to_row(),
                  Annotation("traj-1", "judge", status="error", error="reply not JSON").to_row()],
                 table="annotations")
    rows = store.sql("SELECT * FROM scores ORDER BY trajectory_id").to_pylist()
    assert rows == [{"trajectory_id": "traj-0", "n_annotations": 2, "exact_match": 1.0, "judge": 0.9}]
    history = store.sql("SELECT count(*) AS n FROM annotations WHERE trajectory_id = 'traj-0'").to_pylist()
    assert history == [{"n": 3}]


@pytest.mark.parametrize(
    "sql",
    [
        "DELETE FROM trajectories",
        "COPY (SELECT * FROM trajectories) TO '/tmp/omrl-leak.csv'",
        "ATTACH '/tmp/x.db' AS x",
        "INSTALL httpfs",
        "LOAD httpfs",
        "CREATE TABLE t AS SELECT 1",
        "SET enable_external_access = false",
        "SELECT 1; DROP VIEW trajectories",
        "INSERT INTO trajectories SELECT * FROM trajectories",
    ],
)
def test_writing_statements_are_refused(store, sql):
    with pytest.raises(QueryError, match="read-only"):
        store.sql(sql)
    assert store.sql("SELECT count(*) AS n FROM trajectories").to_pylist() == [{"n": 6}]


def test_sql_errors_are_user_errors(store):
    with pytest.raises(QueryError):
        store.sql("SELECT nope FROM trajectories")
    with pytest.raises(QueryError, match="parse"):
        store.sql("SELEC 1")


def test_polars_from_query(store):
    import polars as pl

    frame = pl.from_arrow(store.sql("SELECT env, avg(reward) AS r FROM trajectories GROUP BY env"))
    assert frame.to_dicts() == [{"env": "math", "r": 0.5}]


def test_select_returns_the_rows_read_would_filter_in_store_order(tmp_path):
    """Store.select runs the WHERE in DuckDB and returns what read() holds for those rows, in its order and
    schema, over several parts (against a filter done here in Python)."""
    from conftest import make_trajectory

    from omrl.store import Store
    from omrl.store.layout import CompactPolicy

    store = Store.create(tmp_path / "s")
    store.set_compact_policy(CompactPolicy(small_parts=100))
    order = [7, 2, 9, 4, 0, 5, 8, 1, 6, 3, 11, 10]
    for start in range(0, len(order), 4):
        store.append([make_trajectory(i, reward=i / 10, success=i % 2 == 0).to_row() for i in order[start:start + 4]])
    assert len(store.parts()) == 3
    everything = store.read().to_pylist()
    assert store.select().to_pylist() == everything
    chosen = store.select("success AND reward > 0.3")
    assert chosen.schema == store.read().schema
    assert chosen.to_pylist() == [r for r in everything if r["success"] and r["reward"] > 0.3]
    assert [r["id"] for r in chosen.to_pylist()] == ["traj-4", "traj-8", "traj-6", "traj-10"]
    assert store.select("reward < 0.35", ["id", "reward"]).to_pylist() == [
        {"id": f"traj-{i}", "reward": i / 10} for i in (2, 0, 1, 3)]
    with pytest.raises(QueryError, match="unknown trajectories column"):
        store.select("success", ["id", "no_such_column"])
    with pytest.raises(QueryError, match="refused"):
        store.select("success; DROP VIEW trajectories")
