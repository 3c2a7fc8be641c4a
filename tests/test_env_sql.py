from __future__ import annotations

from pathlib import Path

import pytest

from omrl.envs import make_env
from omrl.envs.base import Action, Task
from omrl.envs.sql.env import answers_match
from omrl.envs.toolenv import play_episode
from omrl.tasks import import_tasks, load_tasks

REAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "real"

TABLE = {"table_name": "Team Scores", "table_info": {
    "columns": [{"name": "Team", "type": "TEXT"}, {"name": "Points", "type": "INT"}],
    "rows": [["Reds", "12"], ["Blues", "7"], ["Greens", "12"]]}}


def query_task(label):
    return Task(id="q", instruction="Which teams have 12 points?", answer=None, env="sql",
                payload={"table": TABLE, "label": label, "kind": "query"})


def test_answer_matching_is_order_insensitive_and_numeric():
    assert answers_match('["Greens", "Reds"]', ["Reds", "Greens"])
    assert answers_match("2011", ["2011.0"]) and answers_match("21,000", ["21000.0"])
    assert answers_match("none", ["none"]) and answers_match("[]", ["none"])
    assert not answers_match('["Reds"]', ["Reds", "Greens"])


def test_query_task_reward_by_label():
    env = make_env("sql")
    env.reset(query_task(["Reds", "Greens"]))
    seen = env.step(Action(tool="execute_sql", arguments={"query": 'SELECT Team FROM "Team Scores" WHERE Points = 12'}))
    assert "Reds" in seen.observation and "Greens" in seen.observation and "Blues" not in seen.observation
    result = env.step(Action(tool="answer", arguments={"value": '["Greens", "Reds"]'}))
    assert result.done and result.reward == 1.0
    env.reset(query_task(["Reds", "Greens"]))
    assert env.step(Action(tool="answer", arguments={"value": "Reds"})).reward == 0.0


def test_sql_errors_and_invalid_actions_are_observations():
    env = make_env("sql")
    env.reset(query_task(["Reds"]))
    error = env.step(Action(tool="execute_sql", arguments={"query": "SELEC nonsense"}))
    assert error.observation.startswith("Error:") and error.info["sql_error"] and not error.done
    bad = env.step(Action(tool="drop_everything"))
    assert bad.info["invalid_action"] and "Unknown tool" in bad.observation
    assert env.step(Action(text="just chatting")).info["invalid_action"]


def test_sql_cannot_write_files_or_build_huge_values(tmp_path):
    env = make_env("sql")
    env.reset(query_task(["Reds"]))
    for query in [f"ATTACH DATABASE '{tmp_path / 'a.db'}' AS a", f"VACUUM INTO '{tmp_path / 'v.db'}'",
                  "SELECT length(randomblob(100000000))"]:
        result = env.step(Action(tool="execute_sql", arguments={"query": query}))
        assert result.info["sql_error"] and not result.done, (query, result.observation)
    assert list(tmp_path.iterdir()) == []
    env.close()


def test_row_cap_limits_results():
    big = {"table_name": "n", "table_info": {"columns": [{"name": "x", "type": "INT"}],
                                             "rows": [[i] for i in range(500)]}}
    env = make_env("sql", max_rows=20)
    env.reset(Task(id="big", instruction="?", payload={"table": big, "label": ["1"]}))
    text = env.step(Action(tool="execute_sql", arguments={"query": "SELECT * FROM n"})).observation
    assert len(text.splitlines()) == 1 + 20 + 1 and "limit 20" in text


def test_episodes_are_isolated():
    task = query_task(["Reds", "Greens"])
    first, second = make_env("sql"), make_env("sql")
    first.reset(task)
    second.reset(task)
    first.step(Action(tool="execute_sql", arguments={"query": "INSERT INTO \"Team Scores\" VALUES ('Ghosts', 12)"}))
    count = 'SELECT COUNT(*) FROM "Team Scores"'
    assert first.step(Action(tool="execute_sql", arguments={"query": count})).observation.splitlines()[1] == "4"
    assert second.step(Action(tool="execute_sql", arguments={"query": count})).observation.splitlines()[1] == "3"
    first.reset(task)  # a new episode of the same instance starts from the original table too
    assert first.step(Action(tool="execute_sql", arguments={"query": count})).observation.splitlines()[1] == "3"


def test_mutation_task_rewards_the_resulting_table():
    task = Task(id="m", instruction="Add Ghosts with 3 points.", env="sql", payload={
        "table": TABLE, "kind": "mutation",
        "label": ["INSERT INTO `Team Scores` (Team, Points) VALUES ('Ghosts', 3)"]})
    env = make_env("sql")
    env.reset(task)
    assert env.step(Action(tool="answer", arguments={"value": "done"})).reward == 0.0  # nothing changed
    env.reset(task)
    env.step(Action(tool="execute_sql", arguments={"query": "INSERT INTO \"Team Scores\" VALUES ('Ghosts', '3')"}))
    assert env.step(Action(tool="answer", arguments={"value": "done"})).reward == 1.0


@pytest.mark.skipif(not (REAL / "agentbench_dbbench_dev.jsonl").exists(), reason="shared real data absent")
def test_expert_solves_all_60_dbbench_tasks(tmp_path):
    out = tmp_path / "dbbench.parquet"
    table = import_tasks(REAL / "agentbench_dbbench_dev.jsonl", out)
    tasks = load_tasks(out)
    assert table.num_rows == 60 and len(tasks) == 60 and {t.env for t in tasks} == {"sql"}
    kinds = {t.payload["kind"] for t in tasks}
    assert kinds == {"query", "mutation"}
    env = make_env("sql")
    for task in tasks:
        total, last, _ = play_episode(env, task)
        assert total == 1.0 and last.info["success"], task.id
    env.close()


def test_memory_and_database_size_caps_fail_cleanly():
    env = make_env("sql", max_db_mb=8)
    env.reset(query_task(["Reds"]))
    rows = "WITH RECURSIVE c(x) AS (VALUES(1) UNION ALL SELECT x + 1 FROM c WHERE x < {n}) "
    attempts = {
        # about 1 GB of sort data: past SQLite's heap cap (256 MB by default, temp data kept in that heap)
        "memory": rows.format(n=1_000_000) + "SELECT count(*) FROM (SELECT randomblob(1000) AS b FROM c ORDER BY b)",
        # about 500 MB of rows into the database, and into a temp table: past the 8 MB database cap
        "full": rows.format(n=1_000_000) + "SELECT x, randomblob(500) FROM c",
        "big value": "SELECT length(zeroblob(100000000))",
    }
    memory = env.step(Action(tool="execute_sql", arguments={"query": attempts["memory"]}))
    assert memory.info["sql_error"] and "out of memory" in memory.observation and not memory.done
    for table in ["CREATE TABLE big AS ", "CREATE TEMP TABLE big AS "]:
        full = env.step(Action(tool="execute_sql", arguments={"query": table + attempts["full"]}))
        assert full.info["sql_error"] and "database is full" in full.observation and "8 MB" in full.observation
    huge = env.step(Action(tool="execute_sql", arguments={"query": attempts["big value"]}))
    assert huge.info["sql_error"] and "too big" in huge.observation
    # The caps cannot be lifted from SQL; schema PRAGMAs still work; the episode goes on normally.
    for pragma in ["PRAGMA max_page_count = 1000000000", "PRAGMA temp.max_page_count = 1000000000",
                   "PRAGMA hard_heap_limit = 0", "PRAGMA temp_store = FILE"]:
        refused = env.step(Action(tool="execute_sql", arguments={"query": pragma}))
        assert refused.info["sql_error"] and "not authorized" in refused.observation, pragma
    info = env.step(Action(tool="execute_sql", arguments={"query": 'PRAGMA table_info("Team Scores")'}))
    assert "Points" in info.observation and not info.info["sql_error"]
    again = env.step(Action(tool="execute_sql", arguments={"query": "INSERT INTO \"Team Scores\" VALUES ('X', 1)"}))
    assert again.observation == "OK. 1 row(s) affected."
    assert env.step(Action(tool="answer", arguments={"value": "Reds"})).reward == 1.0
    env.close()
