"""`omrl query`, `Store.sql` and every `--where` are confined by construction: no statement, however it is
wrapped (`EXPLAIN ANALYZE` runs what it wraps, `;` chains), writes anything, reads a file outside the
store's views, reaches the network, loads an extension, changes a setting or runs past its time limit."""

from __future__ import annotations

import http.server
import json
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from conftest import make_trajectory

import omrl.query as query_module
from omrl.cli.main import cli
from omrl.query import QueryError, connect, run_query, select_ids, select_where
from omrl.schema import Annotation
from omrl.store import Store

SECRET = "TOPSECRET-7d1f0a"
ENV_SECRET = "sk-ENVSECRET-93b2c"
# A long query: a cross join of 10^16 rows, far past any small limit.
SLOW_SQL = "SELECT sum(a.range * b.range) AS s FROM range(100000000) a, range(100000000) b"
# A long --where (one condition over the views only): 36 messages joined with themselves 8 times.
SLOW_WHERE = ("(SELECT count(*) FROM messages a, messages b, messages c, messages d, messages e, messages f, "
              "messages g, messages h) > 0")


# ------------------------------------------------------------------------------------------- fixtures


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """Six trajectories in two parts (tasks task-0..2, sample 1 of each failing) and one judge score."""
    s = Store.create(tmp_path / "store")
    rows = [make_trajectory(i * 2 + k, task_id=f"task-{i}", sample=k, reward=1.0 - k, success=k == 0).to_row()
            for i in range(3) for k in range(2)]
    s.append(rows[:3])
    s.append(rows[3:])
    s.append([Annotation("traj-0", "judge", score=0.9).to_row()], table="annotations")
    return s


@pytest.fixture
def outside(tmp_path: Path, monkeypatch) -> Path:
    """A folder outside the store with secret files in every format DuckDB reads, the secret in the
    environment too, and HOME moved here (an extension install would land in HOME/.duckdb)."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.txt").write_text(SECRET + "\n")
    (folder / "secret.csv").write_text(f"key\n{SECRET}\n")
    (folder / "secret.json").write_text(json.dumps({"key": SECRET}) + "\n")
    pq.write_table(pa.table({"key": [SECRET]}), folder / "secret.parquet")
    monkeypatch.setenv("OMRL_TEST_SECRET", ENV_SECRET)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return folder


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under `root` with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def run_cli(*args: str):
    return CliRunner().invoke(cli, list(args))


def assert_clean(store: Store, outside: Path, before: dict[str, bytes], outside_before: dict[str, bytes],
                 text: str = "") -> None:
    """Nothing written in the store or outside it, no extension installed, no secret in `text`."""
    assert snapshot(store.path) == before
    assert snapshot(outside) == outside_before
    assert not (outside.parent / "home").exists()  # no ~/.duckdb: nothing installed, no secret saved
    assert SECRET not in text and ENV_SECRET not in text


# ------------------------------------------------------------------------------ the attack statements


def attacks(store: Path, outside: Path) -> list[str]:
    data = store / "data" / "trajectories"
    forged = ("SELECT * REPLACE (1.0 AS reward, true AS success, id || '-x' AS id) FROM trajectories")
    return [
        # writes: a forged part in the store, omrl.json overwritten, files anywhere
        f"EXPLAIN ANALYZE COPY ({forged}) TO '{data}/part-9.parquet' (FORMAT parquet)",
        f"EXPLAIN ANALYZE COPY (SELECT 1 AS x) TO '{store}/omrl.json' (FORMAT csv, USE_TMP_FILE false)",
        f"EXPLAIN (ANALYZE) COPY (SELECT 1 AS x) TO '{store}/omrl.json' (FORMAT csv)",
        f"COPY (SELECT * FROM trajectories) TO '{outside}/leak.csv'",
        f"EXPLAIN ANALYZE COPY (SELECT * FROM trajectories) TO '{outside}/leak.csv'",
        f"SELECT 1; EXPLAIN ANALYZE COPY (SELECT 1 AS x) TO '{outside}/chained.csv'",
        f"SELECT 1; COPY (SELECT 1 AS x) TO '{outside}/chained.csv'",
        f"EXPLAIN ANALYZE ATTACH '{outside}/new.db' AS x",
        f"EXPORT DATABASE '{outside}/export'",
        f"EXPLAIN ANALYZE EXPORT DATABASE '{outside}/export'",
        "EXPLAIN ANALYZE COPY (SELECT 1 AS x) TO ':memory:.wal' (FORMAT csv)",  # DuckDB's own default paths
        # extensions
        "INSTALL httpfs",
        "LOAD httpfs",
        "EXPLAIN ANALYZE INSTALL httpfs",
        "EXPLAIN ANALYZE LOAD httpfs",
        # reads outside the store
        f"SELECT * FROM read_text('{outside}/secret.txt')",
        f"SELECT * FROM read_blob('{outside}/secret.txt')",
        f"SELECT * FROM read_csv('{outside}/secret.csv')",
        f"SELECT * FROM read_json('{outside}/secret.json')",
        f"SELECT * FROM read_parquet('{outside}/secret.parquet')",
        f"SELECT * FROM '{outside}/secret.csv'",
        f"SELECT 1; SELECT * FROM read_text('{outside}/secret.txt')",
        f"EXPLAIN ANALYZE SELECT * FROM read_text('{outside}/secret.txt')",
        "SELECT * FROM read_text('/proc/self/environ')",
        f"SELECT * FROM glob('{outside}/*')",
        "SELECT * FROM glob('~/*')",
        # even the store's own files are not readable as files (only through the views)
        f"SELECT * FROM read_blob('{data}/*.parquet')",
        # settings
        "SET enable_external_access = true",
        "RESET lock_configuration",
        "SET lock_configuration = false",
        "PRAGMA threads = 1",
        "SET threads = 1",
        f"SET temp_directory = '{outside}'",
        "SET autoinstall_known_extensions = true",
    ]


def test_attacks_through_store_sql_write_nothing_and_read_nothing(store, outside):
    before, outside_before = snapshot(store.path), snapshot(outside)
    for sql in attacks(store.path, outside):
        with pytest.raises(QueryError) as info:
            store.sql(sql)
        message = str(info.value)
        assert "\n" not in message, sql  # one clear line
        assert_clean(store, outside, before, outside_before, message)
    assert store.sql("SELECT count(*) AS n FROM trajectories").to_pylist() == [{"n": 6}]


def test_attacks_through_the_cli_write_nothing_and_read_nothing(store, outside):
    before, outside_before = snapshot(store.path), snapshot(outside)
    for sql in attacks(store.path, outside):
        result = run_cli("query", str(store.path), sql, "--format", "json")
        assert result.exit_code == 1, (sql, result.output)
        assert result.output.startswith("Error: "), (sql, result.output)
        assert len(result.output.strip().splitlines()) == 1, (sql, result.output)
        assert_clean(store, outside, before, outside_before, result.output)


def test_confinement_holds_without_the_statement_check(store, outside, monkeypatch):
    """The statement check is a second line: with it switched off, the connection alone still refuses."""
    monkeypatch.setattr(query_module, "check_read_only", lambda con, sql: None)
    before, outside_before = snapshot(store.path), snapshot(outside)
    for sql in attacks(store.path, outside):
        with pytest.raises(QueryError):
            run_query(store, sql)
        assert_clean(store, outside, before, outside_before)


def test_raw_connection_from_store_connect_is_confined(store, outside):
    """Store.connect hands out the same confined connection: even raw DuckDB calls cannot escape."""
    import duckdb

    before, outside_before = snapshot(store.path), snapshot(outside)
    con = store.connect()
    for sql in [f"COPY (SELECT 1) TO '{outside}/raw.csv'",
                f"EXPLAIN ANALYZE COPY (SELECT 1) TO '{store.path}/data/trajectories/part-9.parquet' (FORMAT parquet)",
                f"SELECT * FROM read_text('{outside}/secret.txt')", "SELECT * FROM read_text('/proc/self/environ')",
                "INSTALL httpfs", "LOAD httpfs", "SET enable_external_access = true", "RESET lock_configuration",
                "SET allowed_directories = ['/']", "SET allowed_paths = ['/proc/self/environ']",
                "SET python_enable_replacements = true"]:
        with pytest.raises(duckdb.Error):
            con.sql(sql).fetchall()
    settings = dict(con.sql("SELECT name, value FROM duckdb_settings() WHERE name IN ('enable_external_access', "
                            "'lock_configuration', 'autoload_known_extensions', 'autoinstall_known_extensions', "
                            "'allowed_paths', 'python_enable_replacements')").fetchall())
    assert settings == {"enable_external_access": "false", "lock_configuration": "true",
                        "autoload_known_extensions": "false", "autoinstall_known_extensions": "false",
                        "allowed_paths": "[]", "python_enable_replacements": "false"}
    con.close()
    assert_clean(store, outside, before, outside_before)


def test_a_query_cannot_scan_the_callers_python_variables(store):
    import duckdb

    secret_table = pa.table({"key": [SECRET]})  # noqa: F841 - DuckDB's replacement scan would find it by name
    con = store.connect()
    with pytest.raises(duckdb.CatalogException):
        con.sql("SELECT * FROM secret_table").fetchall()
    con.close()
    with pytest.raises(QueryError) as info:
        run_query(store, "SELECT * FROM secret_table")
    assert SECRET not in str(info.value)


def test_settings_stay_as_they_were_after_set_reset_pragma(store):
    con = store.connect()
    before = con.sql("SELECT name, value FROM duckdb_settings() ORDER BY name").fetchall()
    for sql in ["SET threads = 1", "RESET threads", "PRAGMA threads = 1", "SET memory_limit = '1GB'",
                "RESET ALL", "PRAGMA enable_profiling", f"PRAGMA profiling_output = '{store.path}/p.txt'"]:
        with pytest.raises(QueryError):
            run_query(store, sql, con=con)
    assert con.sql("SELECT name, value FROM duckdb_settings() ORDER BY name").fetchall() == before
    con.close()


def test_a_connection_not_made_by_connect_is_refused(store):
    import duckdb

    with pytest.raises(QueryError, match="not confined"):
        run_query(store, "SELECT 1", con=duckdb.connect())


def test_network_urls_are_refused_without_a_request_or_an_install(store, outside):
    hits = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            hits.append(self.path)
            body = f"key\n{SECRET}\n".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_HEAD(self):  # noqa: N802
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/secret.csv"
    before, outside_before = snapshot(store.path), snapshot(outside)
    try:
        for sql in [f"SELECT * FROM read_csv('{url}')", f"SELECT * FROM '{url}'",
                    "SELECT * FROM read_parquet('s3://omrl-test-bucket/x.parquet')",
                    "SELECT * FROM 'https://example.com/x.parquet'", "SELECT * FROM read_text('hf://datasets/x/y')"]:
            with pytest.raises(QueryError, match="no files, network or extensions") as info:
                store.sql(sql)
            result = run_cli("query", str(store.path), sql)
            assert result.exit_code == 1 and "no files, network or extensions" in result.output
            assert_clean(store, outside, before, outside_before, str(info.value) + result.output)
    finally:
        server.shutdown()
        server.server_close()
    assert hits == []


# ------------------------------------------------------------------------------------------- time limit


def test_store_sql_and_run_query_stop_a_long_query(store, monkeypatch):
    start = time.monotonic()
    with pytest.raises(QueryError, match="ran past 1 s"):
        run_query(store, SLOW_SQL, timeout=1)
    assert time.monotonic() - start < 15
    monkeypatch.setattr(query_module, "DEFAULT_TIMEOUT_S", 0.5)  # Store.sql runs under the default limit
    start = time.monotonic()
    with pytest.raises(QueryError, match="ran past 0.5 s"):
        store.sql(SLOW_SQL)
    assert time.monotonic() - start < 15
    assert store.sql("SELECT count(*) AS n FROM trajectories").to_pylist() == [{"n": 6}]


def test_a_timed_out_query_leaves_a_callers_connection_usable(store):
    con = connect(store)
    with pytest.raises(QueryError, match="ran past"):
        run_query(store, SLOW_SQL, con=con, timeout=0.5)
    assert run_query(store, "SELECT count(*) AS n FROM trajectories", con=con).to_pylist() == [{"n": 6}]
    con.close()


def test_cli_timeout_option(store):
    start = time.monotonic()
    result = run_cli("query", str(store.path), SLOW_SQL, "--timeout", "1")
    assert result.exit_code == 1
    assert "ran past 1 s" in result.output and len(result.output.strip().splitlines()) == 1
    assert time.monotonic() - start < 15
    assert run_cli("query", str(store.path), "SELECT 1", "--timeout", "0").exit_code == 2  # must be positive
    assert "--timeout" in run_cli("query", "--help").output


def test_a_long_where_is_stopped(store, tmp_path, monkeypatch):
    from omrl.curate.filters import FilterOptions, filter_store

    monkeypatch.setattr(query_module, "DEFAULT_TIMEOUT_S", 0.5)
    start = time.monotonic()
    with pytest.raises(QueryError, match="ran past 0.5 s"):
        filter_store(store, tmp_path / "f", FilterOptions(where=SLOW_WHERE))
    with pytest.raises(QueryError, match="ran past 0.5 s"):
        select_ids(store, SLOW_WHERE)
    assert time.monotonic() - start < 30


# ------------------------------------------------------------------------------------------- --where


def where_attacks(store: Path, outside: Path) -> list[str]:
    return [
        "1=1) UNION (SELECT 'forged'",
        "1=1 UNION SELECT 'forged'",
        "1=1 UNION ALL SELECT content FROM read_text('/proc/self/environ')",
        f"true; COPY (SELECT 1) TO '{outside}/w.csv'",
        f"true; COPY (SELECT 1) TO '{store}/data/trajectories/part-9.parquet' (FORMAT parquet)",
        "success -- and the rest is a comment",
        "success /* a comment */",
        "success ORDER BY id LIMIT 1",
        "success LIMIT 1",
        "success GROUP BY id",
        "true) OR (false",
        f"id IN (SELECT content FROM read_text('{outside}/secret.txt'))",
        "EXISTS (SELECT * FROM read_text('/proc/self/environ'))",
        f"id IN (SELECT key FROM '{outside}/secret.csv')",
        f"id IN (SELECT key FROM read_parquet('{outside}/secret.parquet'))",
        f"(SELECT count(*) FROM glob('{outside}/*')) > 0",
        "id IN (SELECT 'x' FROM information_schema.tables)",
        "id IN (SELECT * FROM query('SELECT 1'))",
        "",
        "   ",
    ]


def where_paths(tmp_path: Path):
    """Every library entry that takes a user's --where, as (name, call(store, where))."""
    from omrl.annotate.runner import annotate
    from omrl.annotate.runner import select_rows as annotate_rows
    from omrl.curate.augment import augment_store
    from omrl.curate.filters import FilterOptions, WhereFilter, filter_store
    from omrl.hub import export_store
    from omrl.hub import select_rows as hub_rows
    from omrl.train.bridge import load_rows

    counter = iter(range(10**6))

    def fresh() -> Path:
        return tmp_path / f"out-{next(counter)}"

    return [
        ("select_ids", lambda s, w: select_ids(s, w)),
        ("groups", lambda s, w: select_ids(s, w, view="groups", column="group_id")),
        ("WhereFilter", lambda s, w: WhereFilter(s, w).ids),
        ("filter_store", lambda s, w: filter_store(s, fresh(), FilterOptions(where=w)).kept),
        ("annotate select_rows", lambda s, w: annotate_rows(s, w)),
        ("annotate", lambda s, w: annotate(s, ["num_turns"], where=w).written),
        ("augment", lambda s, w: augment_store(s, fresh(), ["tool_rename"], where=w).source_rows),
        ("hub select_rows", lambda s, w: hub_rows(s, w).num_rows),
        ("export jsonl", lambda s, w: export_store(s, fresh().with_suffix(".jsonl"), where=w).rows),
        ("export parquet", lambda s, w: export_store(s, fresh(), fmt="parquet", where=w).rows),
        ("load_rows", lambda s, w: load_rows(s, w)),
    ]


def test_where_tricks_are_refused_on_every_path(store, outside, tmp_path):
    before, outside_before = snapshot(store.path), snapshot(outside)
    paths = where_paths(tmp_path)
    every = where_attacks(store.path, outside)
    sample = [every[i] for i in (0, 1, 3, 5, 7, 11, 12, 18)]  # one of each kind, through every caller
    for where in every:
        for name, call in paths:
            if name not in ("select_ids", "groups", "WhereFilter") and where not in sample:
                continue
            if not where.strip() and name not in ("select_ids", "groups", "WhereFilter"):
                continue  # elsewhere an empty --where means "no condition"
            with pytest.raises(QueryError) as info:
                call(store, where)
            message = str(info.value)
            assert "\n" not in message, (name, where, message)
            assert SECRET not in message and ENV_SECRET not in message, (name, where)
        assert_clean(store, outside, before, outside_before)
    assert not any(p.name.startswith("out-") for p in tmp_path.iterdir())  # no derived store was made


@pytest.mark.parametrize("verb", ["filter", "export", "augment", "annotate"])
def test_where_tricks_are_refused_by_the_cli(store, outside, tmp_path, verb):
    before, outside_before = snapshot(store.path), snapshot(outside)
    for where in ["1=1 UNION SELECT 'forged'", f"true; COPY (SELECT 1) TO '{outside}/w.csv'", "success -- x",
                  f"id IN (SELECT content FROM read_text('{outside}/secret.txt'))"]:
        args = {"filter": ["filter", str(store.path), "--out", str(tmp_path / "f")],
                "export": ["export", str(store.path), "--out", str(tmp_path / "e.jsonl")],
                "augment": ["augment", str(store.path), "--out", str(tmp_path / "a"), "--op", "tool_rename"],
                "annotate": ["annotate", str(store.path), "--metric", "num_turns"]}[verb]
        result = run_cli(*args, "--where", where)
        assert result.exit_code == 1, (verb, where, result.output)
        assert "refused" in result.output and len(result.output.strip().splitlines()) == 1, result.output
        assert_clean(store, outside, before, outside_before, result.output)


LEGIT_WHERES = {
    "success": ["traj-0", "traj-2", "traj-4"],
    "success AND env = 'math' AND reward > 0.5": ["traj-0", "traj-2", "traj-4"],
    "id IN (SELECT trajectory_id FROM scores WHERE judge > 0.5)": ["traj-0"],
    "json_extract_string(task, '$.answer') = '3'": ["traj-2"],
    "list_contains(list_transform(messages, lambda m: m.role), 'tool') AND NOT success": ["traj-1", "traj-3", "traj-5"],
    "task_id IN ('task-0', 'task-1') AND sample = 1": ["traj-1", "traj-3"],
    "instruction LIKE '%; --%' OR id = 'traj-5'": ["traj-5"],  # ';' and '--' inside a string are just text
    "EXISTS (SELECT 1 FROM tool_calls t WHERE t.trajectory_id = trajectories.id AND t.name = 'answer') AND sample = 0":
        ["traj-0", "traj-2", "traj-4"],
    "id IN (WITH best AS (SELECT trajectory_id FROM latest_annotations) SELECT * FROM best)": ["traj-0"],
}


def test_legit_wheres_select_the_right_rows_on_every_path(store, tmp_path):
    from omrl.annotate.runner import select_rows as annotate_rows
    from omrl.curate.filters import FilterOptions, filter_store
    from omrl.hub import select_rows as hub_rows
    from omrl.train.bridge import load_rows

    for where, ids in LEGIT_WHERES.items():
        assert sorted(select_ids(store, where)) == ids, where
        assert sorted(r["id"] for r in annotate_rows(store, where)) == ids, where
        assert sorted(hub_rows(store, where).column("id").to_pylist()) == ids, where
        assert [r["id"] for r in load_rows(store, where, skip_broken=False)] == ids, where
    result = filter_store(store, tmp_path / "f", FilterOptions(where="success"))
    assert sorted(result.ids["train"]) == LEGIT_WHERES["success"]
    assert [r["id"] for r in load_rows(store)] == [f"traj-{i}" for i in range(6)]  # no where: every row, by id
    assert sorted(select_ids(store, "n = 2 AND task_id <> 'task-2'", view="groups", column="group_id")) == sorted(
        r["group_id"] for r in store.sql("SELECT group_id FROM groups WHERE task_id <> 'task-2'").to_pylist())
    assert select_where(store, "success", columns="count(*) AS n").to_pylist() == [{"n": 3}]


# ----------------------------------------------------------------------------------- legit queries work


def test_legit_queries_still_work(store):
    counts = {"trajectories": 6, "messages": 36, "turns": 12, "tool_calls": 12, "annotations": 1,
              "latest_annotations": 1, "scores": 1, "groups": 3}
    for view, n in counts.items():
        assert store.sql(f"SELECT count(*) AS n FROM {view}").to_pylist() == [{"n": n}], view
    assert store.sql("SELECT json_extract_string(task, '$.answer') AS a FROM trajectories WHERE id = 'traj-0'"
                     ).to_pylist() == [{"a": "1"}]
    assert store.sql("SELECT env, avg(reward) AS r, count(*) FILTER (WHERE success) AS ok FROM trajectories "
                     "GROUP BY env").to_pylist() == [{"env": "math", "r": 0.5, "ok": 3}]
    assert store.sql("SELECT judge FROM scores").to_pylist() == [{"judge": 0.9}]
    assert store.sql("SELECT 1 AS a; SELECT 2 AS b").to_pylist() == [{"b": 2}]
    assert store.sql("WITH t AS (SELECT id FROM trajectories) SELECT count(*) AS n FROM t").to_pylist() == [{"n": 6}]
    for sql in ["EXPLAIN SELECT * FROM trajectories", "EXPLAIN ANALYZE SELECT count(*) FROM messages",
                "EXPLAIN (SELECT 1)", "DESCRIBE trajectories", "SUMMARIZE SELECT reward FROM trajectories"]:
        assert store.sql(sql).num_rows > 0, sql
    result = run_cli("query", str(store.path), "SELECT count(*) AS n FROM trajectories", "--format", "json",
                     "--timeout", "30")
    assert result.exit_code == 0 and json.loads(result.output) == {"n": 6}


def test_newer_and_older_parts_share_one_view(store):
    """A part from a newer writer (an extra column) and parts without it read as one table."""
    row = make_trajectory(9).to_row()
    from omrl.schema import to_table

    table = to_table([row]).append_column("novel", pa.array(["x"], pa.string()))
    store._write_part(table, "trajectories")
    rows = store.sql("SELECT id, novel FROM trajectories WHERE novel IS NOT NULL OR id = 'traj-0' ORDER BY id")
    assert rows.to_pylist() == [{"id": "traj-0", "novel": None}, {"id": "traj-9", "novel": "x"}]


def test_a_query_racing_a_compaction_is_retried(store, monkeypatch):
    """A part that vanishes under a query (a compaction removed it) makes the query run again on a fresh
    connection, which lists the parts again and sees every row."""
    real_connect = query_module.connect
    calls = []

    def connect_then_compact(s):
        con = real_connect(s)
        calls.append(1)
        if len(calls) == 1:
            assert s.compact() is not None  # removes the parts this connection was handed
        return con

    monkeypatch.setattr(query_module, "connect", connect_then_compact)
    assert store.sql("SELECT count(*) AS n, sum(reward) AS r FROM trajectories").to_pylist() == [{"n": 6, "r": 3.0}]
    assert len(calls) == 2
    store.append([make_trajectory(6).to_row()])  # two parts again, for a second compaction
    calls.clear()
    assert sorted(select_ids(store, "success")) == ["traj-0", "traj-2", "traj-4", "traj-6"]
    assert len(calls) == 2


def test_temporary_folder_is_the_connections_own_and_is_removed(store, monkeypatch):
    con = connect(store)
    temp = Path(con.sql("SELECT current_setting('temp_directory')").fetchall()[0][0])
    assert temp.is_dir() and temp.name.startswith("omrl-duckdb-")
    allowed = con.sql("SELECT value FROM duckdb_settings() WHERE name = 'allowed_directories'").fetchall()[0][0]
    assert allowed.strip("[]").rstrip("/") == str(temp)  # the only place DuckDB may touch
    con.close()
    del con
    import gc

    gc.collect()
    assert not temp.exists()
    made = []
    real_connect = query_module.connect

    def spy(s):
        con = real_connect(s)
        made.append(Path(con.sql("SELECT current_setting('temp_directory')").fetchall()[0][0]))
        return con

    monkeypatch.setattr(query_module, "connect", spy)
    run_query(store, "SELECT 1")
    assert len(made) == 1 and not made[0].exists()  # a connection run_query made is removed at once
