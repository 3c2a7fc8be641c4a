"""The task payload is JSON-encoded once: SQL reaches its keys, and stores written before the fix still read right."""

from __future__ import annotations

import asyncio
import json

import pyarrow as pa
import pytest
from click.testing import CliRunner

from omrl.annotate.inputs import metric_inputs
from omrl.envs.base import Task
from omrl.envs.math import generate_tasks
from omrl.policies import make_policy
from omrl.rollout import collect
from omrl.schema import (
    TASK_PAYLOAD_SQL,
    TRAJECTORY_SCHEMA,
    SchemaError,
    normalize_trajectory,
    parse_task,
    task_payload_sql,
)
from omrl.store import Store


@pytest.fixture
def collected(tmp_path):
    store = Store.create(tmp_path / "s")
    tasks = generate_tasks(3, seed=5)
    asyncio.run(collect("math", tasks, make_policy("scripted"), store, run_id="p"))
    return store, {t.id: t for t in tasks}


def test_payload_keys_reach_sql_on_collected_rows(collected):
    store, tasks = collected
    rows = store.sql("SELECT task_id, json_extract_string(task, '$.payload.expression') AS expression, "
                     "json_type(task, '$.payload') AS kind FROM trajectories ORDER BY task_id").to_pylist()
    assert len(rows) == 3
    for row in rows:
        assert row["kind"] == "OBJECT" and row["expression"] == tasks[row["task_id"]].payload["expression"]
    from omrl.cli.main import cli

    result = CliRunner().invoke(cli, ["query", str(store.path), "--format", "json",
                                      "SELECT json_extract_string(task, '$.payload.expression') AS e "
                                      "FROM trajectories"])
    assert result.exit_code == 0, result.output
    assert "null" not in result.output and next(iter(tasks.values())).payload["expression"] in result.output


def _old_row(task: Task, index: int, answer_in_payload: bool = False) -> dict:
    """A row as collect wrote it before the fix: the task column is json.dumps of a tasks-file row."""
    task_row = task.to_row()  # payload is JSON text here
    if answer_in_payload:
        task_row = {**task_row, "answer": None,
                    "payload": json.dumps({**task.payload, "answer": task.answer})}
    row = normalize_trajectory({"id": f"old-{index}", "task_id": task.id, "env": "math",
                                "messages": [{"role": "user", "content": task.instruction}]})
    row["task"] = json.dumps(task_row)  # encoded twice, exactly the old bytes
    return row


@pytest.fixture
def old_store(tmp_path):
    """A store holding rows with the double-encoded payload (written as an Arrow table: no re-normalising)."""
    store = Store.create(tmp_path / "old")
    tasks = generate_tasks(2, seed=7)
    rows = [_old_row(tasks[0], 0), _old_row(tasks[1], 1, answer_in_payload=True)]
    store.append(pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA))
    assert isinstance(json.loads(json.loads(store.read().to_pylist()[0]["task"])["payload"]), dict)  # really old
    return store, tasks


def test_old_store_still_reads_right(old_store):
    store, tasks = old_store
    rows = {r["id"]: r for r in store.read().to_pylist()}
    first, second = metric_inputs(rows["old-0"]), metric_inputs(rows["old-1"])
    assert first["task"]["payload"]["expression"] == tasks[0].payload["expression"]
    assert second["answer"] == tasks[1].answer  # the gold-answer fallback to payload["answer"] matches
    assert parse_task(rows["old-1"]["task"])["payload"]["answer"] == tasks[1].answer
    sql = f"SELECT id, {task_payload_sql('expression')} AS e, {TASK_PAYLOAD_SQL} AS p FROM trajectories ORDER BY id"
    found = store.sql(sql).to_pylist()
    assert [r["e"] for r in found] == [t.payload["expression"] for t in tasks]
    assert all(json.loads(r["p"])["expression"] for r in found)


def test_the_same_helper_reads_new_rows(collected):
    store, tasks = collected
    found = store.sql(f"SELECT task_id, {task_payload_sql('expression')} AS e FROM trajectories").to_pylist()
    assert {r["task_id"]: r["e"] for r in found} == {k: t.payload["expression"] for k, t in tasks.items()}
    with pytest.raises(SchemaError, match="dotted name"):
        task_payload_sql("x') OR 1=1 --")


def test_normaliser_writes_the_payload_once():
    task = generate_tasks(1, seed=1)[0]
    for given in (task.to_row(), json.dumps(task.to_row()), {**task.to_row(), "payload": task.payload}):
        row = normalize_trajectory({"id": "x", "task_id": task.id, "task": given})
        assert json.loads(row["task"])["payload"] == task.payload
    odd = json.dumps({"payload": "not an object"})  # text that is not an encoded object stays as it is
    assert normalize_trajectory({"id": "x", "task_id": "t", "task": odd})["task"] == odd
