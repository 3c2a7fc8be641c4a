"""`omrl query`, `Store.sql` and every `--where` are confined by construction: no statement, however it is
wrapped (`EXPLAIN ANALYZE` runs what it wraps, `;` chains), writes anything, reads a file outside the
store's views, reaches the network, loads an extension, changes a setting or runs past its time limit.

The attacks, the --where tricks and the --where entry points are defined once, in tests/cases/escapes.py,
whose report (every attack through every entry point, counted) is checked here too."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner
from conftest import make_trajectory

import omrl.store.query as query_module
import omrl.store.query_limits as limits_module
import tests.cases.escapes as escapes
from omrl.cli.main import cli
from omrl.schema import Annotation
from omrl.store import Store
from omrl.store.manifest import listing
from omrl.store.query import QueryError, connect, run_query, select_ids, select_where
from tests.cases.escapes import (
    ENV_SECRET,
    SECRET,
    SLOW_SQL,
    SLOW_WHERE,
    WHERE_REQUIRED,
    attack_groups,
    attacks,
    snapshot,
    where_attacks,
    where_paths,
)

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
    folder = escapes.write_secret_files(tmp_path / "outside")
    monkeypatch.setenv(escapes.SECRET_ENV_VAR, ENV_SECRET)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return folder


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
# attacks(), by kind in attack_groups(): writes, extensions, reads, settings, network, a caller's variable


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
    for sql in attacks(store.path, outside):
        with pytest.raises(duckdb.Error):
            relation = con.sql(sql)
            if relation is not None:
                relation.fetchall()
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
    for sql in attack_groups(store.path, store.path / "outside")["settings"]:
        with pytest.raises(QueryError):
            run_query(store, sql, con=con)
    assert con.sql("SELECT name, value FROM duckdb_settings() ORDER BY name").fetchall() == before
    con.close()


def test_a_connection_not_made_by_connect_is_refused(store):
    import duckdb

    with pytest.raises(QueryError, match="not confined"):
        run_query(store, "SELECT 1", con=duckdb.connect())


def test_network_urls_are_refused_without_a_request_or_an_install(store, outside):
    with escapes.secret_http_server() as (url, hits):
        before, outside_before = snapshot(store.path), snapshot(outside)
        for sql in attack_groups(store.path, outside, url)["network"]:
            with pytest.raises(QueryError, match="no files, network or extensions") as info:
                store.sql(sql)
            result = run_cli("query", str(store.path), sql)
            assert result.exit_code == 1 and "no files, network or extensions" in result.output
            assert_clean(store, outside, before, outside_before, str(info.value) + result.output)
        assert hits == []
        with urllib.request.urlopen(url, timeout=10) as response:  # the server does see a request
            assert SECRET in response.read().decode()
        assert len(hits) == 1


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


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "1e300", "soon"])
def test_a_time_limit_that_is_no_number_of_seconds_is_refused_in_one_line(store, value):
    result = run_cli("query", str(store.path), "SELECT 1", "--timeout", value)
    assert result.exit_code == 2 and result.exception is None or isinstance(result.exception, SystemExit)
    assert "--timeout" in result.output and "Traceback" not in result.output, result.output
    with pytest.raises(QueryError, match="positive number of seconds"):
        run_query(store, "SELECT 1", timeout=float(value) if value != "soon" else -1.0)


def test_a_time_limit_of_inf_is_refused_before_any_thread_starts(store):
    before = threading.active_count()
    with pytest.raises(QueryError, match="not inf"):
        run_query(store, "SELECT 1", timeout=float("inf"))
    assert threading.active_count() == before


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


# where_attacks(): the --where tricks; where_paths(): every library entry that takes a user's --where


def test_where_tricks_are_refused_on_every_path(store, outside, tmp_path):
    before, outside_before = snapshot(store.path), snapshot(outside)
    paths = where_paths(tmp_path)
    every = where_attacks(store.path, outside)
    sample = [every[i] for i in (0, 1, 3, 5, 7, 11, 12, 18)]  # one of each kind, through every caller
    for where in every:
        for name, call in paths:
            if name not in WHERE_REQUIRED and where not in sample:
                continue
            if not where.strip() and name not in WHERE_REQUIRED:
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
    """The CLI verbs hand --where to the library paths above (the report covers those): one of each kind."""
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
    "id IN (WITH a AS (SELECT id FROM trajectories WHERE success), b AS (SELECT * FROM a) SELECT id FROM b)":
        ["traj-0", "traj-2", "traj-4"],
    "sample IN (WITH RECURSIVE n AS (SELECT 1 AS v UNION ALL SELECT v + 1 FROM n WHERE v < 3) SELECT v FROM n)":
        ["traj-1", "traj-3", "traj-5"],
}


def test_legit_wheres_select_the_right_rows_on_every_path(store, tmp_path):
    from omrl.curate.filters import FilterOptions, filter_store
    from omrl.train.data.bridge import load_rows

    for where, ids in LEGIT_WHERES.items():
        assert sorted(select_ids(store, where)) == ids, where
        assert sorted(store.select(where).column("id").to_pylist()) == ids, where
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
    from omrl.schema.arrow import to_table

    table = to_table([row]).append_column("novel", pa.array(["x"], pa.string()))
    with store._lock("write"):  # committed as a newer writer would: the part, then the listing naming it
        manifest = store.manifest
        record = store._write_part(table, "trajectories")
        store._commit(manifest, {"trajectories": [*listing(manifest)["trajectories"], record]})
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


# ------------------------------------------------------------------------------ the whole report, counted


def test_no_attack_escapes_through_any_entry_point(tmp_path):
    """The report behind benchmarks/chaos.py's query_escapes: every attack through Store.sql, `omrl query`,
    run_query on a caller's connection and a raw Store.connect() connection, every --where trick through
    every --where path, the long queries under their limits; and it cleans up after itself."""
    home, cwd, secret = os.environ.get("HOME"), os.getcwd(), os.environ.get(escapes.SECRET_ENV_VAR)
    threads = {t.name for t in threading.enumerate()}
    report = escapes.run_query_escapes(tmp_path / "work")
    assert report.escapes == 0 and report.details == [], "\n".join(report.details)
    statements = len(attacks(Path("s"), Path("o")))
    wheres = len(where_attacks(Path("s"), Path("o")))
    assert statements >= 45 and wheres >= 20
    assert report.cases >= 4 * statements + len(where_paths(tmp_path)) * (wheres - 2)
    assert report.to_dict() == {"suite": "query", "cases": report.cases, "escapes": 0, "details": [], "escaped": []}
    assert (os.environ.get("HOME"), os.getcwd(), os.environ.get(escapes.SECRET_ENV_VAR)) == (home, cwd, secret)
    assert list((tmp_path / "work").iterdir()) == []  # its scratch folder is gone
    assert {t.name for t in threading.enumerate()} <= threads  # its HTTP server is closed


def test_the_query_report_counts_what_leaks(tmp_path, monkeypatch):
    """Each kind of leak is counted (and undone); a clean refusal is not; a traceback is noted."""
    import duckdb

    # a grace that a loaded machine's connection set-up fits in (2 cores at load 37 took over 0.3 s),
    # still shorter than "runs on"
    monkeypatch.setattr(escapes, "SLOW_GRACE_S", 2.0)
    with escapes.query_world(tmp_path) as world:
        parts = world.store.path / "data" / "trajectories"
        unconfined = duckdb.connect()  # replacement scans on: finds the variable a caller's frame holds
        cases = [
            ("writes outside", lambda: (world.outside / "leak.csv").write_text("x")),
            ("writes in the working folder", lambda: Path(":memory:.wal").write_text("x")),
            ("forges a part", lambda: (parts / "part-9.parquet").write_bytes(b"x")),
            ("returns the secret", lambda: [SECRET]),
            ("returns the env secret", lambda: os.environ[escapes.SECRET_ENV_VAR]),
            ("asks the server", lambda: urllib.request.urlopen(world.url, timeout=10).read()),
            ("installs", lambda: (world.home / ".duckdb").mkdir(parents=True)),
            ("reads a caller's variable", lambda: escapes._raw(unconfined, f"SELECT * FROM {escapes.PYTHON_VARIABLE}")),
        ]
        for name, call in cases:
            world.check("fake", name, call)
        world.check("fake", "changes a setting", lambda: unconfined.execute("SET threads = 1"), con=unconfined)
        world.check("fake", "runs on", lambda: time.sleep(4), limit=0.1)
        world.check("fake", "refused", lambda: run_query(world.store, "INSTALL httpfs"))
        world.check("fake", "crashes", lambda: 1 / 0)
        world.check("fake", "accepted", lambda: run_query(world.store, "SELECT 1 AS one"))
        world.check("fake", "stopped", lambda: run_query(world.store, SLOW_SQL, timeout=0.1), limit=0.1)
        assert sorted(snapshot(world.outside)) == ["secret.csv", "secret.json", "secret.parquet", "secret.txt"]
        assert not (world.outside / "leak.csv").exists() and not (parts / "part-9.parquet").exists()
        assert not world.home.exists() and not (world.cwd / ":memory:.wal").exists()  # each escape undone
        unconfined.close()
    report = world.report
    assert report.escapes == len(cases) + 2 and report.cases == len(cases) + 6, report.details
    escaped = [line for line in report.details if line.startswith("ESCAPE fake: ")]
    assert len(escaped) == len(cases) + 2, report.details
    for line, needle in zip(escaped, ["wrote outside the store (added outside/leak.csv)",
                                      "wrote outside the store (added cwd/:memory:.wal)",
                                      "changed the store (added data/trajectories/part-9.parquet)",
                                      "returned the secret file's content", "returned the env secret",
                                      "the HTTP server saw GET /secret.csv", "installed something",
                                      "returned the secret file's content", "changed setting threads",
                                      "was not stopped"], strict=True):
        assert needle in line, (needle, line)
    assert [line for line in report.details if not line.startswith("ESCAPE")] == [
        "NOT CLEAN fake: crashes: raised ZeroDivisionError: division by zero instead of a clean refusal "
        "(nothing leaked; not counted as an escape)",
        "NOT REFUSED fake: accepted: accepted, returned [{'one': 1}] (nothing leaked; not counted as an escape)"]


# ----------------------------------------------------------------------------- CTEs and system views


@pytest.mark.parametrize("where", [
    "id IN (WITH duckdb_views AS (SELECT 'x' AS v) SELECT v FROM duckdb_views) OR EXISTS (SELECT * FROM duckdb_views)",
    "EXISTS (WITH pg_settings AS (SELECT 1) SELECT 1) AND "
    "CAST((SELECT setting FROM pg_settings WHERE name = 'temp_directory') AS INTEGER) > 0",
    "id IN (WITH duckdb_views AS (SELECT * FROM duckdb_views) SELECT sql FROM duckdb_views)",
    "id IN (WITH a AS (SELECT * FROM duckdb_tables), duckdb_tables AS (SELECT 'x') SELECT * FROM a)",
    "id IN (WITH RECURSIVE duckdb_tables AS (SELECT * FROM duckdb_tables UNION ALL SELECT * FROM duckdb_tables) "
    "SELECT table_name FROM duckdb_tables)",
])
def test_a_cte_named_after_a_system_view_unlocks_nothing_outside_its_scope(store, where):
    with pytest.raises(QueryError, match="may read only the store's views") as info:
        select_ids(store, where)
    assert query_module.TEMP_PREFIX not in str(info.value)


# ------------------------------------------------------------------------------- memory and threads


def _limits_of(con) -> tuple[str, int]:
    return tuple(con.execute("SELECT current_setting('memory_limit'), current_setting('threads')").fetchall()[0])


def test_every_connection_gets_a_memory_cap_and_threads(store, monkeypatch):
    monkeypatch.delenv(limits_module.MEMORY_ENV, raising=False)
    monkeypatch.delenv(limits_module.THREADS_ENV, raising=False)
    default = limits_module.query_limits()
    assert default.memory_mb == int(limits_module.machine_memory_mb() * limits_module.DEFAULT_MEMORY_SHARE)
    assert default.threads == limits_module.machine_threads()
    con = connect(store)
    assert _limits_of(con)[1] == default.threads
    con.close()
    monkeypatch.setenv(limits_module.MEMORY_ENV, "300MB")
    monkeypatch.setenv(limits_module.THREADS_ENV, "1")
    con = connect(store)
    assert _limits_of(con) == ("286.1 MiB", 1)  # DuckDB shows 300 MB in MiB
    assert run_query(store, "SELECT current_setting('threads') AS t").to_pylist() == [{"t": 1}]
    con.close()
    with limits_module.limits_in_force(memory_mb=200):
        assert limits_module.query_limits() == limits_module.QueryLimits(200, 1)
    assert limits_module.query_limits() == limits_module.QueryLimits(300, 1)
    monkeypatch.setenv(limits_module.MEMORY_ENV, "lots")
    with pytest.raises(QueryError, match="OMRL_QUERY_MEMORY: 'lots' is not a memory size"):
        connect(store)


@pytest.mark.parametrize("text, mb", [("512MB", 512), ("2GB", 2048), ("1.5g", 1536), ("256", 256),
                                      ("1048576 KB", 1024)])
def test_memory_sizes(text, mb):
    assert limits_module.parse_memory(text) == mb
    assert limits_module.parse_memory("10%") == limits_module.machine_memory_mb() // 10


def test_the_settings_are_a_flag_on_every_command_that_queries(store, tmp_path, monkeypatch):
    """--query-memory / --query-threads reach the connections of omrl query and of every --where verb."""
    seen = []
    real = query_module.connect

    def spy(*args, **kwargs):
        con = real(*args, **kwargs)
        seen.append(_limits_of(con))
        return con

    monkeypatch.setattr(query_module, "connect", spy)
    flags = ["--query-memory", "200MB", "--query-threads", "1"]
    commands = {
        "query": ["query", str(store.path), "SELECT 1"],
        "filter": ["filter", str(store.path), "--out", str(tmp_path / "f"), "--where", "success"],
        "export": ["export", str(store.path), "--out", str(tmp_path / "e.jsonl"), "--where", "success"],
        "augment": ["augment", str(store.path), "--out", str(tmp_path / "a"), "--op", "tool_rename",
                    "--where", "success"],
        "annotate": ["annotate", str(store.path), "--metric", "num_turns", "--where", "success"],
    }
    for name, args in commands.items():
        seen.clear()
        result = run_cli(*args, *flags)
        assert result.exit_code == 0, (name, result.output)
        assert seen and set(seen) == {("190.7 MiB", 1)}, (name, seen)
        assert "--query-memory" in run_cli(args[0], "--help").output
    bad = run_cli("query", str(store.path), "SELECT 1", "--query-memory", "1XB")
    assert bad.exit_code == 2 and "not a memory size" in bad.output


BIG_ROWS = "SELECT range, repeat('x', 1000) AS pad FROM range(300000)"  # a 300 MB result


def test_a_result_past_the_memory_cap_is_refused_in_one_line(store):
    with limits_module.limits_in_force(memory_mb=64):
        with pytest.raises(QueryError, match=r"passed the query memory cap \(64 MB\)") as info:
            run_query(store, BIG_ROWS)
        assert "\n" not in str(info.value) and "--query-memory" in str(info.value)
        with pytest.raises(QueryError, match="needs more memory than its cap: Out of Memory Error") as info:
            run_query(store, "SELECT length(string_agg(repeat('x', 10000), '')) FROM range(100000)")
        assert "\n" not in str(info.value)
        assert run_query(store, "SELECT count(*) AS n FROM trajectories").to_pylist() == [{"n": 6}]


def test_the_cli_streams_a_result_larger_than_the_cap(store, tmp_path):
    """The table keeps only the rows it shows; json, csv and parquet write batch by batch."""
    cap = ["--query-memory", "64MB"]
    table = run_cli("query", str(store.path), BIG_ROWS, "--max-rows", "1", *cap)
    assert table.exit_code == 0, table.output
    assert "1 of 300000 rows shown" in table.output
    for fmt in ("json", "csv", "parquet"):
        out = tmp_path / f"big.{fmt}"
        result = run_cli("query", str(store.path), BIG_ROWS, "--format", fmt, "--out", str(out), *cap)
        assert result.exit_code == 0 and "wrote 300000 rows" in result.output, result.output
        if fmt == "parquet":
            import pyarrow.parquet as pq

            assert pq.read_metadata(out).num_rows == 300000
        else:
            assert sum(1 for _ in out.open()) == 300000 + (fmt == "csv")
    assert run_cli("query", str(store.path), "SELECT 1 AS x WHERE false", "--format", "csv").output == '"x"\n'
    failed = run_cli("query", str(store.path), SLOW_SQL, "--format", "json", "--out", str(tmp_path / "slow.json"),
                     "--timeout", "0.5")
    assert failed.exit_code == 1 and not list(tmp_path.glob("slow.json*"))  # no half-written file


def test_the_time_a_streamed_result_spends_being_written_is_not_the_querys(store):
    """A slow sink (a big result written out) does not count against the query's time limit; the query's
    own running does."""
    seen = []

    def slow_sink(batch):
        seen.append(batch.num_rows)
        time.sleep(0.4)

    query_module.stream_query(store, "SELECT range FROM range(30000)", slow_sink, timeout=0.5)
    assert sum(seen) == 30000 and len(seen) == 3  # 1.2 s of writing under a 0.5 s limit
    with pytest.raises(QueryError, match="ran past 0.5 s"):
        query_module.stream_query(store, SLOW_SQL, slow_sink, timeout=0.5)


def test_an_interrupt_that_lands_before_the_query_runs_is_repeated(store):
    """DuckDB drops an interrupt sent while no query runs: a limit that passed between making the relation
    and running it let an 8-way self-join run on (the escape suite's slow --where, once in ~500 cases)."""
    import duckdb

    con = connect(store)
    relation = con.sql(SLOW_SQL)
    clock = query_module._QueryClock(con, 0.01)
    assert clock.fired.wait(10)
    time.sleep(0.5)  # its interrupt has reached the connection while nothing ran
    box = []

    def run():
        try:
            relation.to_arrow_reader(1000).read_next_batch()  # as _execute runs a query
            box.append("finished")
        except (duckdb.InterruptException, OSError):  # Arrow's reader raises DuckDB's error as OSError
            box.append("interrupted")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(10)
    clock.stop()
    stopped = list(box)
    if not stopped:  # clean up before failing
        con.interrupt()
        thread.join(10)
    assert stopped == ["interrupted"]
    assert con.sql("SELECT 1").fetchall() == [(1,)]  # after stop() no interrupt reaches the next query
    con.close()


@pytest.mark.parametrize("fmt", ["table", "json", "csv", "parquet"])
def test_every_duckdb_type_prints_or_fails_in_one_line(store, tmp_path, fmt):
    """test_all_types(): dates past year 9999, infinite timestamps, intervals, unions, blobs, nested lists."""
    args = ["--out", str(tmp_path / "t.parquet")] if fmt == "parquet" else []
    result = run_cli("query", str(store.path), "SELECT * FROM test_all_types()", "--format", fmt, *args)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    if fmt == "parquet":  # Parquet has no interval type: said in one line
        assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
        assert "cannot hold this result" in result.output and not list(tmp_path.glob("t.parquet*"))
        return
    assert result.exit_code == 0, result.output
    if fmt == "json":
        rows = [json.loads(line) for line in result.output.splitlines()]
        assert len(rows) == 3 and rows[0]["date"] and rows[2]["date"] is None
    elif fmt == "csv":
        import csv
        import io

        rows = list(csv.reader(io.StringIO(result.output)))
        assert len(rows) == 4 and rows[0][0] == "bool" and len(rows[0]) == len(rows[1])
    else:
        assert "tinyint" in result.output and "9223372036854775807" in result.output
