"""Escape attempts against omrl's two confinements, as importable cases and runners that count escapes.

- The read-only SQL layer (`omrl query`, `Store.sql`, `Store.connect`, every `--where`): `attacks()` (by
  kind in `attack_groups()`) and `where_attacks()` are the statements and conditions, `where_paths()` the
  library entry points that take a user's --where (each CLI verb's --where goes through one of them).
  `run_query_escapes(workdir)` runs every statement through Store.sql, `omrl query` (click's CliRunner),
  run_query on a caller's connection and a raw Store.connect() connection, every --where trick through
  every --where path, and the long queries under a short limit, against a real store with secret files
  outside it, a secret in the environment and a local HTTP server. A case is an escape when it had an
  effect: the store or any file outside it changed, the secret file's content, the env secret or this
  process's /proc/self/environ came back (in rows, an error message or a derived output), an accepted
  statement returned host paths (a file listing), the server saw a request, something was installed
  (HOME/.duckdb), a setting of a caller's connection changed, or a long query was not stopped within
  SLOW_GRACE_S of its limit. Being refused (QueryError / ValueError, a one-line `Error:` from the CLI, a
  DuckDB error on a raw connection) without such an effect is not.
- The bubblewrap sandbox for agent-written code (omrl/sandbox/, the code env): `SANDBOX_ATTEMPTS`, each
  a test file body the agent writes, run through CodeEnv.run_tests, and a judge of what it got.
  `run_sandbox_escapes(workdir)` runs them all and counts the attempts that succeeded (a secret seen, a
  host file read, listed or written, a connection made, more processes or disk than the limit, a late
  return, a process left behind). Without a sandbox it reports 0 cases and why. MEMORY_ATTEMPTS (forked
  children, memfds, tmpfs writes) are escapes when the attempt itself saw more memory held at once than
  memory_mb (the total cap); the code env's own inputs are cases too: task payloads naming host folders
  (`task_attacks`, each must be an InvalidTask) and tool calls with lone surrogates or control characters
  in names (`ACTION_ATTACKS`, each must be an invalid action that changes no file).

- The viewer (omrl view, omrl/view/): `run_viewer_escapes(workdir)` serves a real store over HTTP (uvicorn)
  and counts what a hostile page or URL gets through: requests from other sites (Sec-Fetch-Site, Origin)
  that are not refused, a slow WHERE that is not stopped or that holds up the other pages VIEWER_BLOCKED_S
  longer than they take without it (figures `blocked_s_max`: the longest another page waited meanwhile,
  and `unblocked_s_max`: the longest without it), a
  WHERE past the memory cap that is not refused, a 20 MB message served as a 20 MB page (or its whole
  text not escaped), and an export written into a store or over a non-empty folder.

A report's `cases` are the cases that ran to a verdict; a case that could not run is left out of it and
gets a detail line. Used by tests/test_query_confinement.py, tests/test_sandbox.py, tests/test_view.py and
benchmarks/chaos.py.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import shutil
import signal
import socket
import stat
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omrl.errors import UsageError

# ============================================================================================== reports


@dataclass
class EscapeReport:
    """One suite's result: cases run to a verdict, escapes among them, and details: one line per escape
    ("ESCAPE <case>: <what leaked>") or per case that could not run ("COULD NOT RUN ..."; not in `cases`),
    and for the query suite a note per attack that leaked nothing but was not cleanly refused ("NOT CLEAN":
    a traceback; "NOT REFUSED": accepted). A healthy run has no details at all."""

    suite: str
    cases: int = 0
    escapes: int = 0
    details: list[str] = field(default_factory=list)
    escaped: list[str] = field(default_factory=list)  # the names of the cases that escaped
    figures: dict[str, float] = field(default_factory=dict)  # measured along (the viewer's waits)

    def to_dict(self) -> dict[str, Any]:
        out = {"suite": self.suite, "cases": self.cases, "escapes": self.escapes, "details": list(self.details),
               "escaped": list(self.escaped)}
        return {**out, "figures": dict(self.figures)} if self.figures else out

    def judge(self, name: str, leaks: list[str]) -> None:
        """Count one case that ran to a verdict: an escape when anything leaked."""
        self.cases += 1
        if leaks:
            self.escapes += 1
            self.escaped.append(name)
            self.details.append(f"ESCAPE {name}: {'; '.join(leaks)}")


def _short(text: str, root: Path | None = None, limit: int = 160) -> str:
    if root is not None:
        text = text.replace(str(root), "<work>")
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under `root` with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(Path(root).rglob("*")) if p.is_file()}


class _Watched:
    """The files and folders under `root` (folders in `skip` left out): their bytes as a baseline, a cheap
    check against it (sizes and modification times, then bytes), what changed, and a restore."""

    def __init__(self, root: Path, skip: tuple[Path, ...] = ()) -> None:
        self.root, self.skip = root, tuple(skip)
        self.files = {name: (root / name).read_bytes() for name, st in self._walk() if stat.S_ISREG(st.st_mode)}
        self.signature = self._signature()

    def _walk(self) -> Iterator[tuple[str, os.stat_result]]:
        for folder, dirs, files in os.walk(self.root):
            here = Path(folder)
            dirs[:] = [d for d in dirs if here / d not in self.skip]
            for name in dirs + files:
                with contextlib.suppress(OSError):
                    yield str((here / name).relative_to(self.root)), (here / name).lstat()

    def _signature(self) -> dict[str, tuple[int, int]]:
        return {name: (st.st_size, st.st_mtime_ns) if stat.S_ISREG(st.st_mode) else (-1, st.st_mode)
                for name, st in self._walk()}

    def changes(self) -> str:
        """'added a, changed b, removed c' (a few names each), or '' when all is as in the baseline."""
        now = self._signature()
        if now == self.signature:
            return ""
        changed = []
        for name in set(now) & set(self.signature):
            if now[name] != self.signature[name]:
                try:
                    same = name in self.files and (self.root / name).read_bytes() == self.files[name]
                except OSError:
                    same = False
                if not same:
                    changed.append(name)
        parts = []
        for verb, names in (("added", sorted(set(now) - set(self.signature))), ("changed", sorted(changed)),
                            ("removed", sorted(set(self.signature) - set(now)))):
            if names:
                more = f" (+{len(names) - 3})" if len(names) > 3 else ""
                parts.append(f"{verb} {', '.join(names[:3])}{more}")
        if not parts:
            self.signature = now  # rewritten with the same bytes
        return ", ".join(parts)

    def restore(self) -> None:
        """Put everything back as in the baseline (after an escape changed it)."""
        for name in sorted(set(self._signature()) - set(self.signature), key=len):
            path = self.root / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()
        for name, data in self.files.items():
            path = self.root / name
            with contextlib.suppress(OSError):
                if not path.is_file() or path.read_bytes() != data:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(data)
        self.signature = self._signature()


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    """Set environment variables for the duration; restore (or remove) them afterwards."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# ============================================================================================ query layer

SECRET = "TOPSECRET-7d1f0a"  # in files outside the store
ENV_SECRET = "sk-ENVSECRET-93b2c"  # in the environment, as SECRET_ENV_VAR
SECRET_ENV_VAR = "OMRL_TEST_SECRET"
# A long query: a cross join of 10^16 rows, far past any small limit.
SLOW_SQL = "SELECT sum(a.range * b.range) AS s FROM range(100000000) a, range(100000000) b"
# A long --where (one condition over the views only): the messages joined with themselves 8 times.
SLOW_WHERE = ("(SELECT count(*) FROM messages a, messages b, messages c, messages d, messages e, messages f, "
              "messages g, messages h) > 0")
SLOW_LIMIT_S = 0.15  # the time limit the long queries run under in the report
SLOW_GRACE_S = 5.0   # how long past its limit a long query may take to stop before it counts as an escape
NO_SERVER_URL = "http://127.0.0.1:9/secret.csv"  # a URL for the network attacks when no server listens
# A Python variable a query could find through DuckDB's replacement scan (the raw entry point's frame holds it).
PYTHON_VARIABLE = "omrl_secret_table"


def write_secret_files(folder: Path) -> Path:
    """A folder outside the store with the secret in every format DuckDB reads."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "secret.txt").write_text(SECRET + "\n")
    (folder / "secret.csv").write_text(f"key\n{SECRET}\n")
    (folder / "secret.json").write_text(json.dumps({"key": SECRET}) + "\n")
    pq.write_table(pa.table({"key": [SECRET]}), folder / "secret.parquet")
    return folder


def build_store(path: Path):
    """A small real store: six trajectories and one judge score (one part each: every query opens them all)."""
    from omrl.schema import Annotation
    from omrl.store import Store
    from omrl.testing.synthetic import synthetic_trajectories

    store = Store.create(path)
    rows = list(synthetic_trajectories(6, seed=7, samples_per_task=2, tool_bytes=(20, 80)))
    store.append(rows)
    store.append([Annotation(rows[0]["id"], "judge", score=0.9).to_row()], table="annotations")
    return store


def attack_groups(store: Path, outside: Path, url: str = NO_SERVER_URL) -> dict[str, list[str]]:
    """The statement attacks by kind; `store` is the store's folder, `outside` holds the secret files,
    `url` is where the network attacks point (a local server's, to see whether a request arrives)."""
    data = store / "data" / "trajectories"
    forged = "SELECT * REPLACE (1.0 AS reward, true AS success, id || '-x' AS id) FROM trajectories"
    return {
        "writes": [  # a forged part in the store, omrl.json overwritten, files anywhere
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
        ],
        "extensions": ["INSTALL httpfs", "LOAD httpfs", "EXPLAIN ANALYZE INSTALL httpfs", "EXPLAIN ANALYZE LOAD httpfs"],
        "reads": [  # outside the store, and even the store's own files (only the views are readable)
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
            f"SELECT * FROM read_blob('{data}/*.parquet')",
            f"SELECT CAST(content AS INTEGER) FROM read_text('{outside}/secret.txt')",  # out through an error
            f"SELECT getenv('{SECRET_ENV_VAR}')",
        ],
        "settings": [
            "SET enable_external_access = true",
            "RESET lock_configuration",
            "SET lock_configuration = false",
            "PRAGMA threads = 1",
            "SET threads = 1",
            "RESET threads",
            "SET memory_limit = '1GB'",
            "RESET ALL",
            f"SET temp_directory = '{outside}'",
            "SET autoinstall_known_extensions = true",
            "PRAGMA enable_profiling",
            f"PRAGMA profiling_output = '{store}/p.txt'",
            "SET allowed_directories = ['/']",
            "SET allowed_paths = ['/proc/self/environ']",
            "SET python_enable_replacements = true",
        ],
        "network": [
            f"SELECT * FROM read_csv('{url}')",
            f"SELECT * FROM '{url}'",
            "SELECT * FROM read_parquet('s3://omrl-test-bucket/x.parquet')",
            "SELECT * FROM 'https://example.com/x.parquet'",
            "SELECT * FROM read_text('hf://datasets/x/y')",
        ],
        "python": [f"SELECT * FROM {PYTHON_VARIABLE}"],  # a caller's variable, by DuckDB's replacement scan
    }


def attacks(store: Path, outside: Path, url: str = NO_SERVER_URL) -> list[str]:
    """Every statement attack, all kinds in one list."""
    return [sql for group in attack_groups(store, outside, url).values() for sql in group]


def where_attacks(store: Path, outside: Path, url: str = NO_SERVER_URL) -> list[str]:
    """--where tricks: a closed parenthesis, UNION, `;`, comments, clauses, other sources, nothing."""
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
        f"id IN (SELECT key FROM read_csv('{url}'))",
        f"id IN (SELECT key FROM {PYTHON_VARIABLE})",
        f"CAST((SELECT content FROM read_text('{outside}/secret.txt')) AS INTEGER) > 0",
        # a CTE named after a system view, read outside its WITH (or inside its own body) reaches the real one
        "id IN (WITH duckdb_views AS (SELECT 'x' AS v) SELECT v FROM duckdb_views) OR EXISTS (SELECT * FROM duckdb_views)",
        "id IN (WITH pg_settings AS (SELECT 'x' AS v) SELECT v FROM pg_settings) OR "
        "CAST((SELECT setting FROM pg_settings WHERE name = 'temp_directory') AS INTEGER) > 0",
        "id IN (WITH duckdb_views AS (SELECT * FROM duckdb_views) SELECT sql FROM duckdb_views)",
        "id IN (WITH RECURSIVE duckdb_tables AS (SELECT * FROM duckdb_tables UNION ALL SELECT * FROM duckdb_tables) "
        "SELECT table_name FROM duckdb_tables)",
    ]


# The paths on which an empty --where is itself refused; elsewhere it means "no condition".
WHERE_REQUIRED = ("select_ids", "groups", "WhereFilter")


def where_paths(folder: Path) -> list[tuple[str, Callable[[Any, str], Any]]]:
    """Every library entry that takes a user's --where, as (name, call(store, where)); derived outputs
    go to fresh folders `folder`/out-N."""
    from omrl.annotate.runner import annotate
    from omrl.curate.augment import augment_store
    from omrl.curate.filters import FilterOptions, WhereFilter, filter_store
    from omrl.formats.exporters import export_store
    from omrl.store.query import select_ids
    from omrl.train.data.bridge import load_rows

    counter = iter(range(10**9))

    def fresh() -> Path:
        return folder / f"out-{next(counter)}"

    return [
        ("select_ids", lambda s, w: select_ids(s, w)),
        ("groups", lambda s, w: select_ids(s, w, view="groups", column="group_id")),
        ("WhereFilter", lambda s, w: WhereFilter(s, w).ids),
        ("filter_store", lambda s, w: filter_store(s, fresh(), FilterOptions(where=w)).kept),
        ("Store.select", lambda s, w: s.select(w).num_rows),
        ("annotate", lambda s, w: annotate(s, ["num_turns"], where=w).written),
        ("augment", lambda s, w: augment_store(s, fresh(), ["tool_rename"], where=w).source_rows),
        ("export jsonl", lambda s, w: export_store(s, fresh().with_suffix(".jsonl"), where=w).rows),
        ("export parquet", lambda s, w: export_store(s, fresh(), fmt="parquet", where=w).rows),
        ("load_rows", lambda s, w: load_rows(s, w)),
    ]


class Refused(Exception):
    """An entry point's clean refusal (the CLI's one-line Error:, a DuckDB error on a raw connection)."""


def _cli(args: list[str]) -> str:
    """`omrl ARGS` in this process; its output, or Refused(output) on a clean error exit."""
    from click.testing import CliRunner

    from omrl.cli.main import cli

    result = CliRunner().invoke(cli, args)
    if result.exit_code == 0:
        return result.output
    if result.exception is None or isinstance(result.exception, SystemExit):
        raise Refused(result.output)
    raise result.exception  # a traceback, not a clean refusal


def _raw(con, sql: str, watchdog_s: float = 30.0) -> str:
    """A statement straight on a DuckDB connection; the rows, or Refused on any DuckDB error."""
    import duckdb

    # Bait: DuckDB's replacement scan (off on omrl's connections) reads the calling frame's variables.
    omrl_secret_table = _secret_table()  # noqa: F841
    timer = threading.Timer(watchdog_s, con.interrupt)  # raw connections have no time limit of their own
    timer.daemon = True
    timer.start()
    try:
        relation = con.sql(sql)
        return repr(relation.fetchall() if relation is not None else None)
    except duckdb.InterruptException:
        raise RuntimeError(f"still running after {watchdog_s:g} s on a raw connection") from None
    except duckdb.Error as exc:
        raise Refused(str(exc)) from None
    finally:
        timer.cancel()


def _text(value: Any) -> str:
    """What an entry point returned, as text to look for secrets in."""
    if hasattr(value, "to_pylist"):
        value = value.to_pylist()
    return repr(value)


def _settings(con) -> dict[str, str]:
    return dict(con.execute("SELECT name, value FROM duckdb_settings()").fetchall())


class QueryWorld:
    """A real store, a secret folder outside it, a local HTTP server, HOME moved to a folder that must not
    appear, a working folder of its own; `check` runs one case and records its verdict in `report`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = build_store(root / "store")
        self.outside = write_secret_files(root / "outside")
        self.cwd = root / "cwd"
        self.cwd.mkdir()
        self.home = root / "home"  # never created: an extension install would land in HOME/.duckdb
        self.out = root / "out"    # derived outputs of --where paths (looked at, then removed)
        self.out.mkdir()
        self.hits: list[str] = []  # requests the HTTP server saw (set by query_world)
        self.report = EscapeReport("query")
        self._environ = _environ_entries()
        self._settings: dict[int, dict[str, str]] = {}  # a caller's connection -> its settings before the cases
        self._store_files = _Watched(self.store.path)
        self._rest_files = _Watched(root, skip=(self.store.path, self.out))
        self.url = NO_SERVER_URL

    # ---------------------------------------------------------------- one case

    def check(self, entry: str, attack: str, call: Callable[[], Any], con=None,
              limit: float | None = None) -> None:
        """Run `call` (one attack through one entry point) and judge it; `con`: a caller's connection whose
        settings must stay; `limit`: the time limit the call runs under (a long query)."""
        from omrl.store.query import TEMP_PREFIX

        hits_before = len(self.hits)
        if con is not None and id(con) not in self._settings:
            self._settings[id(con)] = _settings(con)
        settings_before = self._settings.get(id(con)) if con is not None else None
        label = f"{entry}: {_short(attack if attack.strip() else repr(attack), self.root)}"
        start = time.monotonic()
        outcome, text = self._call(call, limit)
        elapsed = time.monotonic() - start

        leaks = []
        if changed := self._store_files.changes():
            leaks.append(f"changed the store ({changed})")
        if self.home.exists():
            leaks.append("installed something (HOME/.duckdb was created)")
        if changed := self._rest_files.changes():
            leaks.append(f"wrote outside the store ({changed})")
        derived = b"".join(snapshot(self.out).values()).decode("utf-8", "replace") if any(self.out.iterdir()) else ""
        for what, secret in (("the secret file's content", SECRET), ("the env secret", ENV_SECRET)):
            if secret in text or secret in derived:
                leaks.append(f"returned {what}")
        if any(entry in text or entry in derived for entry in self._environ):
            leaks.append("returned the process environment (/proc/self/environ)")
        if outcome == "accepted" and str(self.root) in text:
            leaks.append("returned host paths (a file listing or file read outside the views)")
        if TEMP_PREFIX in text:
            leaks.append("returned a host path (the connection's temporary folder)")
        if len(self.hits) > hits_before:
            leaks.append(f"the HTTP server saw {', '.join(self.hits[hits_before:][:3])}")
        if settings_before is not None and outcome != "hung":
            after = _settings(con)
            if changed := [k for k in sorted(set(after) | set(settings_before)) if after.get(k) != settings_before.get(k)]:
                leaks.append(f"changed setting {', '.join(changed[:3])}")
                self._settings[id(con)] = after  # the next case is judged against what it found
        if limit is not None and (outcome == "hung" or elapsed > limit + SLOW_GRACE_S):
            leaks.append(f"a {limit:g} s query was not stopped within {SLOW_GRACE_S:g} s of its limit "
                         f"({'still running' if outcome == 'hung' else f'{elapsed:.1f} s'})")

        if leaks:
            self.report.cases += 1
            self.report.escapes += 1
            self.report.details.append(f"ESCAPE {label}: {'; '.join(leaks)}")
            self._store_files.restore()
            self._rest_files.restore()
        elif limit is not None and not (outcome == "refused" and "ran past" in text):
            self.report.details.append(f"COULD NOT RUN {label}: the long query ended otherwise than by its time "
                                       f"limit ({outcome}: {_short(text, self.root)})")
        else:
            self.report.cases += 1
            if outcome == "error":
                self.report.details.append(f"NOT CLEAN {label}: raised {_short(text, self.root)} instead of a "
                                           "clean refusal (nothing leaked; not counted as an escape)")
            elif outcome == "accepted" and limit is None:
                self.report.details.append(f"NOT REFUSED {label}: accepted, returned {_short(text, self.root, 80)} "
                                           "(nothing leaked; not counted as an escape)")
        for entry_path in self.out.iterdir():
            if entry_path.is_dir():
                shutil.rmtree(entry_path, ignore_errors=True)
            else:
                entry_path.unlink()

    def _call(self, call: Callable[[], Any], limit: float | None) -> tuple[str, str]:
        """('accepted' | 'refused' | 'error' | 'hung', the text it returned or its message)."""
        from omrl.store.query import QueryError

        def run() -> tuple[str, str]:
            try:
                return "accepted", _text(call())
            except (QueryError, ValueError, Refused) as exc:
                return "refused", str(exc)
            except Exception as exc:  # anything else is not a clean refusal
                return "error", f"{type(exc).__name__}: {exc}"

        if limit is None:
            return run()
        box: list[tuple[str, str]] = []
        thread = threading.Thread(target=lambda: box.append(run()), name="omrl-escapes-slow", daemon=True)
        thread.start()
        thread.join(limit + SLOW_GRACE_S)
        return box[0] if box else ("hung", "")


@contextlib.contextmanager
def secret_http_server() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on 127.0.0.1 for the duration, serving the secret as CSV at any path:
    (a URL of it, the requests it saw)."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            hits.append(f"GET {self.path}")
            body = f"key\n{SECRET}\n".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_HEAD(self):  # noqa: N802
            hits.append(f"HEAD {self.path}")
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="omrl-escapes-http", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/secret.csv", hits
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _environ_entries() -> list[str]:
    """A few entries of this process's /proc/self/environ (which shows the environment it started with, not
    SECRET_ENV_VAR set since): output holding one has read it."""
    try:
        entries = Path("/proc/self/environ").read_bytes().decode("utf-8", "replace").split("\0")
    except OSError:
        return []
    plain = [e for e in entries if "=" in e and len(e) >= 12 and e.isprintable() and not set(e) & set("'\"\\")]
    return sorted(plain, key=len, reverse=True)[:3]


def _secret_table():
    import pyarrow as pa

    return pa.table({"key": [SECRET]})


@contextlib.contextmanager
def query_world(workdir: Path) -> Iterator[QueryWorld]:
    """A QueryWorld in a fresh folder under `workdir`, with the env secret set, HOME moved and the working
    folder changed for the duration; all of it undone and removed afterwards."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="query-escapes-", dir=workdir)).resolve()
    cwd = os.getcwd()
    try:
        world = QueryWorld(root)
        with _environment(**{SECRET_ENV_VAR: ENV_SECRET, "HOME": str(world.home)}), \
                secret_http_server() as (world.url, world.hits):
            os.chdir(world.cwd)  # DuckDB's relative default paths (':memory:.wal') would land here
            try:
                yield world
            finally:
                os.chdir(cwd)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_query_escapes(workdir: Path) -> EscapeReport:
    """Every attack through every entry point of the SQL layer, counted; see the module docstring."""
    import omrl.store.query as query_module
    from omrl.store.query import close, connect, run_query

    with query_world(workdir) as world:
        store, path, outside = world.store, world.store.path, world.outside
        statements = attacks(path, outside, world.url)
        caller_con, raw_con = connect(store), store.connect()
        try:
            entries: list[tuple[str, Callable[[str], Any], Any]] = [
                ("Store.sql", lambda sql: store.sql(sql), None),
                ("omrl query", lambda sql: _cli(["query", str(path), sql, "--format", "json"]), None),
                ("run_query(con=)", lambda sql: run_query(store, sql, con=caller_con), caller_con),
                ("Store.connect raw", lambda sql: _raw(raw_con, sql), raw_con),
            ]
            for entry, run, con in entries:
                for sql in statements:
                    world.check(entry, sql, lambda run=run, sql=sql: run(sql), con=con)

            paths = where_paths(world.out)
            wheres = where_attacks(path, outside, world.url)
            for where in wheres:
                for name, call in paths:
                    if where.strip() or name in WHERE_REQUIRED:
                        world.check(f"--where {name}", where, lambda call=call, where=where: call(store, where))

            limit = SLOW_LIMIT_S
            saved, query_module.DEFAULT_TIMEOUT_S = query_module.DEFAULT_TIMEOUT_S, limit
            try:  # the time limit: Store.sql and every --where run under the default one
                world.check("Store.sql (default limit)", SLOW_SQL, lambda: store.sql(SLOW_SQL), limit=limit)
                world.check("run_query(timeout=)", SLOW_SQL, lambda: run_query(store, SLOW_SQL, timeout=limit),
                            limit=limit)
                world.check("run_query(con=, timeout=)", SLOW_SQL,
                            lambda: run_query(store, SLOW_SQL, con=caller_con, timeout=limit), limit=limit)
                world.check("omrl query --timeout", SLOW_SQL,
                            lambda: _cli(["query", str(path), SLOW_SQL, "--timeout", str(limit)]), limit=limit)
                for name, call in paths:
                    world.check(f"--where {name} (default limit)", SLOW_WHERE,
                                lambda call=call: call(store, SLOW_WHERE), limit=limit)
            finally:
                query_module.DEFAULT_TIMEOUT_S = saved
        finally:
            close(caller_con)
            close(raw_con)
    return world.report


# ================================================================================================ viewer

VIEWER_TIMEOUT_S = 6.0  # the viewer's time limit for a request's queries in the viewer suite
VIEWER_BLOCKED_S = 2.0  # the longest another page may wait while a hostile query runs
BIG_MESSAGE_MB = 20
BIG_PAGE_MB = 1.0  # a page showing the big message must stay below this
BIG_ID = "big-message"
# A WHERE needing ~300 MB (one string aggregate over the 146 small messages squared), under a 64 MB
# per-connection cap.
MEMORY_WHERE = (f"(SELECT length(string_agg(repeat('x', 15000), '')) FROM messages a, messages b "
                f"WHERE a.trajectory_id <> '{BIG_ID}' AND b.trajectory_id <> '{BIG_ID}') > 0")
VIEWER_MEMORY_MB = 256  # the viewer's memory cap in the suite, shared by its connections
FOREIGN_HEADERS = [{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"},
                   {"Sec-Fetch-Site": "same-site"}, {"Origin": "http://evil.example"}, {"Origin": "null"}]


@contextlib.contextmanager
def serve_app(app: Any) -> Iterator[str]:
    """An ASGI app served by uvicorn on a free 127.0.0.1 port for the duration: its base URL."""
    import uvicorn

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="omrl-serve-app", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def _get(url: str, headers: dict[str, str] | None = None, timeout: float = 120.0) -> tuple[int, bytes, float]:
    """(status, body, seconds) of one GET."""
    import urllib.error
    import urllib.request

    start = time.monotonic()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=timeout) as reply:
            return reply.status, reply.read(), time.monotonic() - start
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), time.monotonic() - start


def _page_error(body: bytes) -> str:
    """The error a viewer page shows (its role="alert" text), or the page's start."""
    import html
    import re

    text = body.decode("utf-8", "replace")
    found = re.search(r'role="alert"[^>]*>(.*?)<', text, re.S)
    return html.unescape(found.group(1)) if found else text[:200]


def build_viewer_store(path: Path, big_mb: float = BIG_MESSAGE_MB):
    """build_store's rows plus one trajectory whose tool message is `big_mb` MB of text ending in a script
    tag (past any cut)."""
    from omrl.testing.synthetic import synthetic_trajectories

    store = build_store(path)
    big = dict(next(iter(synthetic_trajectories(1, seed=99))), id=BIG_ID, group_id="big-group")
    text = "0123456789 " * int(big_mb * 2**20 // 11) + "<script>window.__omrl_xss = 3</script>"
    big["messages"] = [{"role": "user", "content": "show me"}, {"role": "tool", "content": text}]
    store.append([big])
    return store


def _other_pages(store) -> list[str]:
    """Pages a user opens meanwhile: the list, a trajectory, its group, the runs, a filtered list."""
    from urllib.parse import quote

    row = store.sql(f"SELECT id, group_id FROM trajectories WHERE id <> '{BIG_ID}' ORDER BY id LIMIT 1").to_pylist()[0]
    return ["/", f"/t/{quote(row['id'], safe='')}", f"/g/{quote(row['group_id'], safe='')}", "/runs",
            "/?where=success", "/?sort=reward&dir=asc"]


def _foreign_cases(report: EscapeReport, url: str, pages: list[str]) -> None:
    from urllib.parse import quote

    for headers in FOREIGN_HEADERS:
        for page in pages[:2] + ["/static/view.js", "/?where=" + quote(SLOW_WHERE)]:
            status, _, _ = _get(url + page, headers)
            report.judge(f"foreign request {page} {headers}",
                         [] if status == 403 else [f"answered {status}, not 403"])
    own = {"Sec-Fetch-Site": "same-origin", "Origin": url}
    for page in pages:
        for headers in (own, {"Sec-Fetch-Site": "none"}, {}):
            status, _, _ = _get(url + page, headers)
            if status != 200:
                report.details.append(f"NOT SERVED {page} {headers}: {status} (the viewer's own page)")


def _fetch_round(report: EscapeReport, url: str, pages: list[str], waits: dict[str, float],
                 until: Callable[[], bool] = lambda: True) -> None:
    """Each page fetched once (while `until()` holds), its longest wait kept in `waits`."""
    for page in pages:
        if not until():
            return
        status, body, seconds = _get(url + page)
        waits[page] = max(waits.get(page, 0.0), seconds)
        if status != 200:
            report.details.append(f"NOT SERVED {page}: {status} {_short(_page_error(body))}")


def _blocking_case(report: EscapeReport, url: str, pages: list[str], timeout_s: float,
                   allowed_s: float) -> tuple[float, float]:
    """The other pages fetched again and again, first alone, then while a hostile WHERE runs: (the longest
    wait alone, the longest wait meanwhile)."""
    from urllib.parse import quote

    _fetch_round(report, url, pages, {})  # warm: the caches are built before the clock matters
    alone: dict[str, float] = {}
    for _ in range(3):
        _fetch_round(report, url, pages, alone)
    box: list[tuple[int, bytes, float]] = []
    hostile = threading.Thread(target=lambda: box.append(_get(url + "/?where=" + quote(SLOW_WHERE))),
                               name="omrl-viewer-hostile", daemon=True)
    hostile.start()
    time.sleep(0.5)  # the hostile query is running
    meanwhile: dict[str, float] = {}
    while hostile.is_alive():
        _fetch_round(report, url, pages, meanwhile, until=hostile.is_alive)
    hostile.join(timeout_s + SLOW_GRACE_S + 60)
    leaks = []
    if not box:
        leaks.append("the hostile WHERE's page never came back")
    elif box[0][2] > timeout_s + SLOW_GRACE_S:
        leaks.append(f"the hostile WHERE ran {box[0][2]:.1f} s, limit {timeout_s:g} s")
    elif b"ran past" not in box[0][1]:
        leaks.append(f"the hostile WHERE's page ended otherwise than by its time limit ({box[0][0]})")
    base, blocked = max(alone.values(), default=0.0), max(meanwhile.values(), default=0.0)
    if blocked > base + allowed_s:
        slowest = max(meanwhile, key=meanwhile.get)
        leaks.append(f"{slowest} waited {blocked:.1f} s while it ran, {base:.1f} s at most without it "
                     f"(at most {allowed_s:g} s more allowed)")
    report.judge(f"slow WHERE {_short(SLOW_WHERE)}", leaks)
    return base, blocked


def _memory_case(report: EscapeReport, url: str) -> None:
    from urllib.parse import quote

    status, body, _ = _get(url + "/?where=" + quote(MEMORY_WHERE))
    capped = status == 400 and b"more memory than its cap" in body
    report.judge(f"WHERE past the memory cap {MEMORY_WHERE}",
                 [] if capped else [f"a ~300 MB query under a {VIEWER_MEMORY_MB} MB viewer cap answered {status} "
                                    f"without the memory error ({_short(_page_error(body))})"])


def _big_message_case(report: EscapeReport, url: str, big_mb: float) -> None:
    import html
    import re

    status, body, seconds = _get(url + f"/t/{BIG_ID}")
    page = body.decode("utf-8", "replace")
    leaks = [] if status == 200 else [f"the page answered {status}"]
    if len(body) > BIG_PAGE_MB * 2**20:
        leaks.append(f"a {big_mb:g} MB message made a {len(body) / 2**20:.1f} MB page ({seconds:.1f} s)")
    links = re.findall(r'class="full-text" href="([^"]+)"', page)
    if not links:
        leaks.append("no link to the whole message")
    else:
        status, full, _ = _get(url + html.unescape(links[0]))
        text = full.decode("utf-8", "replace")
        if status != 200 or len(full) < big_mb * 2**20:
            leaks.append(f"the whole message's page answered {status} with {len(full)} bytes")
        if "<script>window" in text or "&lt;script&gt;window.__omrl_xss = 3&lt;/script&gt;" not in text:
            leaks.append("the whole message is not served escaped")
    report.judge(f"a {big_mb:g} MB message", leaks)
    report.figures["big_message_page_kb"] = round(len(body) / 1024, 1)


def _export_cases(report: EscapeReport, store, root: Path) -> None:
    from omrl.view.export import export_site

    watched = _Watched(store.path)
    other = root / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("mine\n")
    holder = store.path.parent
    targets = [(store.path, False), (store.path / "data", True), (store.path / "new-site", False),
               (holder, True), (other, False)]
    for target, overwrite in targets:
        refused = ""
        try:
            export_site(store, target, limit=3, overwrite=overwrite)
        except (UsageError, OSError) as exc:
            refused = str(exc)
        leaks = []
        if changed := watched.changes():
            leaks.append(f"changed the store ({changed})")
            watched.restore()
        if (other / "notes.txt").read_text() != "mine\n" or len(list(other.iterdir())) != 1:
            leaks.append("wrote over a non-empty folder without --overwrite")
        if not refused:
            leaks.append("not refused")
        report.judge(f"export into {target.relative_to(root)} (overwrite={overwrite})", leaks)
    site = root / "site"  # a new folder: written, the big message cut with its whole text on a page of its own
    from omrl.view.pages import file_key, full_text_key

    export_site(store, site, where=f"id = '{BIG_ID}'")
    page, whole = site / "t" / f"{file_key(BIG_ID)}.html", site / "t" / f"{full_text_key(BIG_ID, 'content', 1)}.html"
    leaks = [] if page.is_file() and page.stat().st_size < BIG_PAGE_MB * 2**20 else ["the exported page is not cut"]
    if not whole.is_file() or whole.name not in page.read_text(encoding="utf-8"):
        leaks.append("the export has no linked page with the whole message")
    report.judge("export of a big message", leaks)


def run_viewer_escapes(workdir: Path, timeout_s: float = VIEWER_TIMEOUT_S, allowed_s: float = VIEWER_BLOCKED_S,
                       big_mb: float = BIG_MESSAGE_MB) -> EscapeReport:
    """The viewer's cases (module docstring) against a real store served on 127.0.0.1 (a slow WHERE under
    a `timeout_s` limit may hold up other pages `allowed_s` at most, the big message has `big_mb`); figures:
    blocked_s_max (the longest another page waited while the slow WHERE ran), unblocked_s_max (the longest
    the same pages took without it, the baseline) and big_message_page_kb."""
    from omrl.store.query import QueryLimits
    from omrl.view.app import make_app

    report = EscapeReport("viewer")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="viewer-escapes-", dir=workdir)).resolve()
    try:
        store = build_viewer_store(root / "holder" / "store", big_mb)
        pages = _other_pages(store)
        app = make_app(store, timeout=timeout_s, limits=QueryLimits(VIEWER_MEMORY_MB, 2))
        with serve_app(app) as url:
            _foreign_cases(report, url, pages)
            alone, blocked = _blocking_case(report, url, pages, timeout_s, allowed_s)
            report.figures.update(blocked_s_max=round(blocked, 2), unblocked_s_max=round(alone, 2))
            _memory_case(report, url)
            _big_message_case(report, url, big_mb)
        _export_cases(report, store, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return report


# =============================================================================================== sandbox

SANDBOX_SECRET = "sk-omrl-test-secret-4f1c9a"
SANDBOX_SECRET_VARS = ("OPENAI_API_KEY", "OMRL_SANDBOX_SECRET")  # set in the parent while the attempts run
RETURN_GRACE_S = 3.0  # a run must return within its time limit plus this


def agent_test(body: str) -> str:
    """A unittest file whose one test runs `body` (indented into the method) and always passes."""
    return ("import os, socket, subprocess, sys, time, unittest\n\n"
            "class T(unittest.TestCase):\n    def test_probe(self):\n"
            + textwrap.indent(textwrap.dedent(body).strip() + "\n", " " * 8))


def marked_command(marker: str) -> list[str]:
    """The code env's unittest run with `marker` on its command line, which every process it forks keeps:
    a host process whose command line holds the marker afterwards was left behind."""
    return [sys.executable, "-c", "import unittest; unittest.main(module=None, argv=['python -m unittest', "
            "'discover', '-s', '.', '-t', '.'])", marker]


def run_agent_test(body: str, marker: str | None = None, **options) -> tuple[str, dict, Any]:
    """Write the test with the agent's write_file tool, run it with run_tests; (observation, info, env).
    With `marker`, the tests run under marked_command(marker). The caller closes the env."""
    from omrl.envs import make_env
    from omrl.envs.base import Action, Task

    if marker is not None:
        options = {"test_command": marked_command(marker), **options}
    env = make_env("code", **options)
    try:
        env.reset(Task(id="probe", instruction="probe", env="code", payload={"files": {"README": "x\n"}}))
        wrote = env.step(Action(tool="write_file", arguments={"path": "test_probe.py", "content": agent_test(body)}))
        if wrote.info.get("invalid_action"):
            raise UsageError(f"the agent's test file was refused: {wrote.observation}")
        result = env.step(Action(tool="run_tests"))
    except BaseException:
        env.close()
        raise
    return result.observation, result.info, env


def processes_with(marker: str) -> list[int]:
    """Pids of host processes (not this one) whose command line contains `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@contextlib.contextmanager
def loopback_server() -> Iterator[tuple[int, list[Any]]]:
    """A TCP server on 127.0.0.1 for the duration: (its port, the connections it accepted)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.2)
    accepted: list[Any] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(server.accept())
            except OSError:
                continue

    thread = threading.Thread(target=accept, name="omrl-escapes-tcp", daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], accepted
    finally:
        stop.set()
        thread.join()
        for connection, _ in accepted:
            connection.close()
        server.close()


@dataclass
class SandboxProbe:
    """What one attempt is aimed at on the host: a folder outside the project holding a secret file, a
    loopback port a server listens on, a unique token (file names) and marker (the command line)."""

    host_dir: Path
    port: int = 9
    token: str = ""
    marker: str = ""

    @classmethod
    def make(cls, folder: Path, port: int = 9, name: str = "probe") -> SandboxProbe:
        token = uuid.uuid4().hex[:10]
        host_dir = Path(folder) / f"host-{name}-{token}"
        host_dir.mkdir(parents=True)
        (host_dir / "secret.txt").write_text(SANDBOX_SECRET + "\n")
        return cls(host_dir.resolve(), port, token, f"omrl-escape-{name}-{token}")

    def read_targets(self) -> list[str]:
        """Host files the sandbox must not read: system files, root's and the host home's dotfiles, a source
        file of this project, the secret file."""
        import omrl.sandbox

        return list(dict.fromkeys(["/etc/passwd", "/etc/shadow", "/etc/hostname",
                                   os.path.expanduser("~root") + "/.bashrc", str(Path.home() / ".bashrc"),
                                   os.path.realpath(omrl.sandbox.__file__), str(self.host_dir / "secret.txt")]))

    def list_targets(self) -> list[str]:
        """Host folders the sandbox must not list (beyond what it binds on purpose)."""
        return list(dict.fromkeys(["/", str(Path.home()), os.getcwd(), str(self.host_dir), "/tmp"]))

    def write_targets(self) -> list[str]:
        """Host paths the sandbox must not create files at."""
        name = f"omrl-escaped-{self.token}.txt"
        return list(dict.fromkeys([str(self.host_dir / name), f"/{name}", f"/usr/{name}", f"/dev/shm/{name}",
                                   str(Path.home() / name), os.path.join(os.getcwd(), name)]))


@dataclass
class SandboxRun:
    """What one attempt's run showed: the observation, run_tests's info, how long it took against its limit,
    the host project copy's size after, connections the server accepted, processes left behind."""

    seen: str
    info: dict
    elapsed_s: float
    limit_s: float
    project_bytes: int = 0
    project_files: tuple[str, ...] = ()
    accepted: int = 0
    left_behind: tuple[int, ...] = ()


def _host_files_body(probe: SandboxProbe) -> str:
    return f"""
        import json
        for path in {probe.read_targets()!r}:
            try:
                print("READ", path, open(path).read()[:200])
            except OSError as exc:
                print("DENIED", path, type(exc).__name__)
        for folder in {probe.list_targets()!r}:
            try:
                print("LISTED", json.dumps([folder, sorted(os.listdir(folder))]))
            except OSError as exc:
                print("UNLISTED", folder, type(exc).__name__)
        print("ROOT", sorted(os.listdir("/")))
        print("ID", os.getuid(), os.getgid())
    """


def _visible_on_purpose(folder: str) -> set[str] | None:
    """Names the sandbox shows in host folder `folder` by design (None: all of them, a folder it binds)."""
    from omrl import sandbox

    prefix = os.path.realpath(sys.base_prefix)
    bound = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", prefix)
    if any(folder == b or folder.startswith(b.rstrip("/") + "/") for b in bound):
        return None
    names: set[str] = set()
    if folder == "/":
        names = {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "proc", "dev", "tmp"}
    elif folder == "/tmp":
        names = {Path(sandbox.PROJECT_DIR).name}
    base = folder.rstrip("/") + "/"
    if prefix.startswith(base):  # the folders on the way to the Python installation
        names.add(prefix[len(base):].split("/")[0])
    return names


def _judge_host_files(probe: SandboxProbe, run: SandboxRun) -> list[str]:
    if "ROOT " not in run.seen:
        raise CouldNotRun("the probe printed no listing of /")
    leaks = []
    read = [path for path in probe.read_targets() if f"READ {path} " in run.seen]
    if read:
        leaks.append(f"read host files {', '.join(read[:4])}")
    if SANDBOX_SECRET in run.seen or "root:x:" in run.seen:
        leaks.append("host file content in the output")
    for line in run.seen.splitlines():
        if not line.startswith("LISTED "):
            continue
        try:
            folder, listing = json.loads(line[len("LISTED "):])
        except ValueError:
            continue
        allowed = _visible_on_purpose(folder)
        try:
            host = set(os.listdir(folder))
        except OSError:
            continue
        shown = (host & set(listing)) - allowed if allowed is not None else set()
        if shown:
            leaks.append(f"listed host folder {folder}: {', '.join(sorted(shown)[:4])}")
    return leaks


def _env_body(probe: SandboxProbe) -> str:
    # What to look for is written hex-encoded, so that no traceback quoting this source can show it.
    watch = [word.encode().hex() for word in (SANDBOX_SECRET, *SANDBOX_SECRET_VARS)]
    return f"""
        texts = {{"os.environ": repr(dict(os.environ))}}
        print("ENV", texts["os.environ"])
        for pid in sorted({{str(os.getppid()), "1", "self"}} | {{p for p in os.listdir("/proc") if p.isdigit()}}):
            try:
                texts[pid] = open(f"/proc/{{pid}}/environ").read().replace("\\0", " ")
                print("PROC", pid, texts[pid])
            except OSError as exc:
                print("PROC", pid, "denied", exc)
        watch = [bytes.fromhex(word).decode() for word in {watch!r}]
        print("SOURCES", len(texts), "WITH THE SECRET", sorted(k for k, v in texts.items() if any(w in v for w in watch)))
    """


def _judge_env(probe: SandboxProbe, run: SandboxRun) -> list[str]:
    if "SOURCES " not in run.seen:
        raise CouldNotRun("the probe printed no environment")
    leaks = ["the parent's secret in the output"] if SANDBOX_SECRET in run.seen else []
    named = [name for name in SANDBOX_SECRET_VARS if name in run.seen]
    if named:
        leaks.append(f"the parent's variables {', '.join(named)} visible")
    found = run.seen.rsplit("WITH THE SECRET ", 1)[-1].splitlines()[0] if "WITH THE SECRET " in run.seen else ""
    if found.strip() not in ("", "[]"):
        leaks.append(f"the parent's secret in {found.strip()}")
    return leaks


def _host_writes_body(probe: SandboxProbe) -> str:
    return f"""
        for path in {probe.write_targets()!r}:
            try:
                open(path, "w").write("x")
                print("WROTE", path)
            except OSError as exc:
                print("REFUSED", path, type(exc).__name__)
        open("inside.txt", "w").write("only in the sandbox's copy")
    """


def _judge_host_writes(probe: SandboxProbe, run: SandboxRun) -> list[str]:
    leaks = []
    for target in probe.write_targets():
        if os.path.lexists(target):
            leaks.append(f"created host file {target}")
            with contextlib.suppress(OSError):
                os.unlink(target)
    if "inside.txt" in run.project_files:
        leaks.append("wrote into the host's project folder (not the sandbox's copy)")
    if "REFUSED" not in run.seen and "WROTE" not in run.seen:
        raise CouldNotRun("the probe printed nothing")
    return leaks


def _network_body(probe: SandboxProbe) -> str:
    return f"""
        try:
            socket.create_connection(("127.0.0.1", {probe.port}), timeout=3)
            print("CONNECTED")
        except OSError as exc:
            print("NO CONNECTION", type(exc).__name__)
        try:
            socket.getaddrinfo("example.com", 80)
            print("RESOLVED")
        except OSError as exc:
            print("NO DNS", type(exc).__name__)
    """


def _judge_network(probe: SandboxProbe, run: SandboxRun) -> list[str]:
    if "CONNECTED" not in run.seen and "NO CONNECTION" not in run.seen:
        raise CouldNotRun("the probe printed nothing")
    leaks = [f"the host's loopback server accepted {run.accepted} connection(s)"] if run.accepted else []
    if "CONNECTED" in run.seen:
        leaks.append("connected to 127.0.0.1")
    if "RESOLVED" in run.seen:
        leaks.append("resolved a host name")
    return leaks


FORKS = 150
FORK_LIMIT = 64  # the attempt's max_processes


def _fork_body(probe: SandboxProbe) -> str:
    return f"""
        children = 0
        try:
            for _ in range({FORKS}):
                pid = os.fork()
                if pid == 0:
                    time.sleep(3)
                    os._exit(0)
                children += 1
        except OSError as exc:
            print("FORK REFUSED", exc.errno)
        print("CHILDREN", children)
    """


def _judge_fork(probe: SandboxProbe, run: SandboxRun) -> list[str]:
    if "CHILDREN " not in run.seen:
        raise CouldNotRun("the probe printed no count")
    children = int(run.seen.split("CHILDREN ")[1].split()[0])
    return [f"forked {children} processes, limit {FORK_LIMIT}"] if children >= FORK_LIMIT else []


DISK_MB = 64


def _disk_body(probe: SandboxProbe) -> str:
    return """
        written = 0
        try:
            for name in [f"big{i}.bin" for i in range(4)] + [f"/tmp/big{i}.bin" for i in range(4)]:
                with open(name, "wb") as out:
                    for _ in range(20):  # 20 MB each, 160 MB in all
                        out.write(b"x" * (1 << 20))
                        out.flush()
                        written += 1
        except OSError as exc:
            print("WRITE REFUSED", exc.strerror)
        print("MB", written)
    """


def _judge_disk(probe: SandboxProbe, run: SandboxRun) -> list[str]:
    if "MB " not in run.seen:
        raise CouldNotRun("the probe printed no count")
    written = int(run.seen.split("MB ")[-1].split()[0])
    leaks = [f"wrote {written} MB inside, limit {DISK_MB} MB"] if written >= DISK_MB else []
    if run.project_bytes >= 1 << 20:
        leaks.append(f"the host's project folder grew to {run.project_bytes >> 20} MB")
    return leaks


DETACHED_TIMEOUT_S = 2.0


def _detached_body(probe: SandboxProbe) -> str:
    # The child is a new program: the marker goes on its own command line.
    return f"""
        subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(0.1)", {probe.marker!r}],
                         start_new_session=True)
        print("child started", flush=True)
        time.sleep(60)
    """


def _judge_detached(probe: SandboxProbe, run: SandboxRun) -> list[str]:
    if "child started" not in run.seen:
        raise CouldNotRun("the detached child did not start")
    return [] if run.info.get("timed_out") else ["the run was not killed at its time limit"]


MEMORY_CASES = {  # attempt name -> (what, memory_mb, the body's sizes): the issue's figures
    "memory_forks": ("4 forked children of 800 MB each", 1024, {"children": 4, "mb": 800}),
    "memory_memfd": ("30 memfds of 49 MB (memfd_create pages are not in any process's address space)", 256,
                     {"count": 30, "mb": 49}),
    "memory_tmpfs": ("400 MB written to /tmp (a tmpfs) with disk_mb above memory_mb", 128,
                     {"count": 8, "mb": 49}),
}


def forks_body(children: int, mb: int) -> str:
    """Fork `children` processes that each fill `mb` MB, then say how many held it at the same moment."""
    return f"""
        import select
        reports, report_w = os.pipe()
        pids = []
        for i in range({children}):
            pid = os.fork()
            if pid == 0:
                os.close(reports)
                try:
                    held = b"\\1" * ({mb} << 20)  # written, so every page is really there
                    os.write(report_w, b"%d," % i)
                    time.sleep(30)
                except MemoryError:
                    os.write(report_w, b"m,")
                os._exit(0)
            pids.append(pid)
        os.close(report_w)
        got, ended = b"", set()

        def reap():
            for i, pid in enumerate(pids):
                if i not in ended and os.waitpid(pid, os.WNOHANG)[0]:
                    ended.add(i)

        def reported():
            return {{int(x) for x in got.decode().split(",") if x.isdigit()}}

        deadline = time.monotonic() + 20  # until each child has either filled its memory or ended
        while len(reported() | ended) < {children} and time.monotonic() < deadline:
            if select.select([reports], [], [], 0.2)[0]:
                chunk = os.read(reports, 64)
                if not chunk:
                    break  # every child has ended
                got += chunk
            reap()
        time.sleep(0.5)  # a child that filled its memory last may still cost another its life
        reap()
        holding = reported() - ended
        print("HELD AT ONCE MB", len(holding) * {mb}, "CHILDREN", sorted(holding), flush=True)
        for pid in pids:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
    """


def memfd_body(count: int, mb: int) -> str:
    """Fill `count` memfds of `mb` MB each through write() (never mapped), printing the total held."""
    return f"""
        chunk = b"\\1" * (1 << 20)
        fds, held = [], 0
        try:
            for i in range({count}):
                fd = os.memfd_create("m%d" % i)
                for _ in range({mb}):
                    os.write(fd, chunk)
                fds.append(fd)
                held += {mb}
                print("MEMFD MB", held, flush=True)
        except OSError as exc:
            print("MEMFD REFUSED", exc.errno, flush=True)
        print("HELD AT ONCE MB", held, flush=True)
    """


def tmpfs_body(count: int, mb: int) -> str:
    """Write `count` files of `mb` MB to /tmp (the sandbox's tmpfs), printing the total written."""
    return f"""
        chunk = b"\\1" * (1 << 20)
        held = 0
        try:
            for i in range({count}):
                with open("/tmp/fill%d.bin" % i, "wb") as out:
                    for _ in range({mb}):
                        out.write(chunk)
                        out.flush()
                held += {mb}
                print("TMPFS MB", held, flush=True)
        except OSError as exc:
            print("TMPFS REFUSED", exc.errno, flush=True)
        print("HELD AT ONCE MB", held, flush=True)
    """


def held_at_once_mb(seen: str) -> int | None:
    """The most memory a memory attempt reported holding at one moment (None: it reported nothing)."""
    values = [int(line.split()[-1]) for line in seen.splitlines() if line.startswith(("MEMFD MB ", "TMPFS MB "))]
    for line in seen.splitlines():
        if line.startswith("HELD AT ONCE MB "):
            values.append(int(line.split()[4]))
    return max(values) if values else None


def _judge_memory(limit_mb: int) -> Callable[[SandboxProbe, SandboxRun], list[str]]:
    def judge(probe: SandboxProbe, run: SandboxRun) -> list[str]:
        held = held_at_once_mb(run.seen)
        if held is None:
            if run.info.get("out_of_memory"):  # killed for its memory before it could report anything
                return []
            raise CouldNotRun("the probe reported no memory held")
        return [f"held {held} MB at once, limit {limit_mb} MB in total"] if held > limit_mb else []
    return judge


class CouldNotRun(Exception):
    pass


@dataclass(frozen=True)
class SandboxAttempt:
    """One escape attempt: the agent's test body for a probe, the CodeEnv options, a judge of the run
    (a list of what leaked; raises CouldNotRun when the run shows the attempt did not happen)."""

    name: str
    what: str
    body: Callable[[SandboxProbe], str]
    judge: Callable[[SandboxProbe, SandboxRun], list[str]]
    options: dict = field(default_factory=dict)


HOST_FILES = SandboxAttempt("host_files", "read host files (/etc/passwd, /etc/shadow, home, project) and list "
                            "host folders", _host_files_body, _judge_host_files)
ENV_SECRETS = SandboxAttempt("env_secrets", "the parent's secrets via os.environ, /proc/<ppid>/environ, "
                             "/proc/1/environ and every /proc/*/environ", _env_body, _judge_env)
HOST_WRITES = SandboxAttempt("host_writes", "write files outside the project (host folder, /, /usr, /dev/shm, "
                             "home, the working folder)", _host_writes_body, _judge_host_writes)
NETWORK = SandboxAttempt("network", "connect to a server on the host's 127.0.0.1, resolve a name",
                         _network_body, _judge_network)
FORK_BOMB = SandboxAttempt("fork_bomb", f"fork {FORKS} sleeping processes", _fork_body, _judge_fork,
                           {"max_processes": FORK_LIMIT})
DISK_FILL = SandboxAttempt("disk_fill", "write 160 MB in the project and /tmp", _disk_body, _judge_disk,
                           {"disk_mb": DISK_MB})
DETACHED_CHILD = SandboxAttempt("detached_child", "a setsid child holding the output pipe open past the time "
                                "limit", _detached_body, _judge_detached, {"test_timeout_s": DETACHED_TIMEOUT_S})


def _memory_attempt(name: str, body: Callable[..., str], **options: Any) -> SandboxAttempt:
    what, limit_mb, sizes = MEMORY_CASES[name]
    return SandboxAttempt(name, f"{what} under memory_mb={limit_mb}", lambda probe: body(**sizes),
                          _judge_memory(limit_mb), {"memory_mb": limit_mb, "test_timeout_s": 30.0, **options})


MEMORY_FORKS = _memory_attempt("memory_forks", forks_body)
MEMORY_MEMFD = _memory_attempt("memory_memfd", memfd_body)
MEMORY_TMPFS = _memory_attempt("memory_tmpfs", tmpfs_body, disk_mb=512)
MEMORY_ATTEMPTS = (MEMORY_FORKS, MEMORY_MEMFD, MEMORY_TMPFS)
SANDBOX_ATTEMPTS = (HOST_FILES, ENV_SECRETS, HOST_WRITES, NETWORK, FORK_BOMB, DISK_FILL, DETACHED_CHILD,
                    *MEMORY_ATTEMPTS)


def _left_behind(marker: str, wait_s: float = 2.0) -> list[int]:
    """Processes still holding `marker` after a short wait (the sandbox's teardown), killed once found."""
    deadline = time.monotonic() + wait_s
    found = processes_with(marker)
    while found and time.monotonic() < deadline:
        time.sleep(0.1)
        found = processes_with(marker)
    for pid in found:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return found


def run_attempt(attempt: SandboxAttempt, probe: SandboxProbe,
                accepted: list[Any] | None = None) -> tuple[SandboxRun, list[str]]:
    """Run one attempt through CodeEnv.run_tests; (what the run showed, what leaked). Raises CouldNotRun
    when the attempt did not happen."""
    options = dict(attempt.options)
    limit = float(options.get("test_timeout_s", 10.0))
    before = len(accepted) if accepted is not None else 0
    start = time.monotonic()
    seen, info, env = run_agent_test(attempt.body(probe), marker=probe.marker, **options)
    elapsed = time.monotonic() - start
    try:
        files = [p for p in env.root.rglob("*") if p.is_file()]
        run = SandboxRun(seen, info, elapsed, limit, project_bytes=sum(p.stat().st_size for p in files),
                         project_files=tuple(str(p.relative_to(env.root)) for p in files))
    finally:
        env.close()
    run.left_behind = tuple(_left_behind(probe.marker))
    run.accepted = (len(accepted) - before) if accepted is not None else 0
    if not info.get("sandboxed"):
        raise CouldNotRun("the tests did not run in the sandbox")
    leaks = list(attempt.judge(probe, run))
    if elapsed > limit + RETURN_GRACE_S:
        leaks.append(f"returned after {elapsed:.1f} s, limit {limit:g} s")
    if run.left_behind:
        leaks.append(f"left {len(run.left_behind)} process(es) behind")
    return run, leaks


def run_sandbox_escapes(workdir: Path) -> EscapeReport:
    """Every escape attempt of SANDBOX_ATTEMPTS through the code env, counted; without a sandbox 0 cases
    and one line saying why."""
    from omrl import sandbox

    report = EscapeReport("sandbox")
    ok, why = sandbox.sandbox_status()
    if not ok:
        report.details.append(f"sandbox unavailable, no attempt ran: {why}")
        return report
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="sandbox-escapes-", dir=workdir))
    try:
        with _environment(**dict.fromkeys(SANDBOX_SECRET_VARS, SANDBOX_SECRET)), loopback_server() as (port, accepted):
            for attempt in SANDBOX_ATTEMPTS:
                probe = SandboxProbe.make(root, port=port, name=attempt.name)
                try:
                    _, leaks = run_attempt(attempt, probe, accepted)
                except (CouldNotRun, sandbox.SandboxError, OSError, ValueError) as exc:
                    report.details.append(f"COULD NOT RUN {attempt.name} ({attempt.what}): {_short(str(exc))}")
                    continue
                report.cases += 1
                if leaks:
                    report.escapes += 1
                    report.escaped.append(attempt.name)
                    report.details.append(f"ESCAPE {attempt.name} ({attempt.what}): {'; '.join(leaks)}")
            for name, what, leaks in run_code_input_cases(root):
                report.cases += 1
                if leaks:
                    report.escapes += 1
                    report.escaped.append(name)
                    report.details.append(f"ESCAPE {name} ({what}): {'; '.join(leaks)}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return report


# ------------------------------------------------------------------- the code env's own inputs (tasks, actions)

def task_attacks(root: Path, create: bool = True) -> dict[str, tuple[dict, dict]]:
    """Task payloads that try to pull a host folder into an episode: name -> (payload, env options). With
    `create`, `root` gets the host folder (holding the secret file) and a projects root with links to it."""
    host = Path(root) / "host-project"
    projects = Path(root) / "projects"
    if create:
        host.mkdir(parents=True, exist_ok=True)
        (host / "secret.txt").write_text(SANDBOX_SECRET + "\n")
        (projects / "inner").mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            (projects / "link").symlink_to(host)
        with contextlib.suppress(FileExistsError):
            (projects / "inner" / "secret.txt").symlink_to(host / "secret.txt")
    climb = "../" * (len(host.resolve().parts) + 2)
    return {
        "project_dotdot": ({"project": climb + str(host.resolve()).lstrip("/")}, {}),
        "project_absolute": ({"project": str(host.resolve())}, {}),
        "project_dir_absolute": ({"project_dir": str(host.resolve())}, {}),
        "project_dir_outside_root": ({"project_dir": str(host.resolve())}, {"projects_root": str(projects)}),
        "project_dotdot_in_root": ({"project": "inner/../../host-project"}, {"projects_root": str(projects)}),
        "project_link_out_of_root": ({"project": "link"}, {"projects_root": str(projects)}),
        "project_file_link": ({"project": "inner"}, {"projects_root": str(projects)}),
    }


ACTION_ATTACKS = {  # name -> the tool call; each must be an invalid action that leaves the project as it was
    "write_lone_surrogate": ("write_file", {"path": "new.py", "content": "x = '\udc00'\n"}),
    "overwrite_lone_surrogate": ("write_file", {"path": "a.py", "content": "\udc00"}),
    "replace_lone_surrogate": ("replace_in_file", {"path": "a.py", "old": "a = 1", "new": "a = '\ud800'"}),
    "name_newline": ("write_file", {"path": "a.py\nb.py", "content": "x = 1\n"}),
    "name_escape_sequence": ("write_file", {"path": "\x1b[31mred.py", "content": "x = 1\n"}),
    "name_line_separator": ("write_file", {"path": "a\u2028b.py", "content": "x = 1\n"}),
    "name_lone_surrogate": ("write_file", {"path": "\udc80.py", "content": "x = 1\n"}),
    "name_bidi_override": ("write_file", {"path": "test_\u202eyp.py", "content": "x = 1\n"}),
}


def run_code_input_cases(workdir: Path) -> list[tuple[str, str, list[str]]]:
    """Each task attack (must raise InvalidTask, showing nothing of the host) and action attack (must be an
    invalid action, never an exception out of step, never a file written) through the code env:
    (name, what, leaks)."""
    from omrl.envs import make_env
    from omrl.envs.base import Action, InvalidTask, Task

    results = []
    for name, (payload, options) in task_attacks(Path(workdir)).items():
        what = f"task payload {json.dumps(payload)}"
        env = make_env("code", **options)
        leaks = []
        try:
            env.reset(Task(id=name, instruction="x", env="code", payload=payload))
            leaks.append("the task was accepted: a host folder became the project")
        except InvalidTask as exc:
            if SANDBOX_SECRET in str(exc):
                leaks.append("the refusal showed the host file's content")
        except Exception as exc:  # noqa: BLE001 - any other error is the failure being counted
            leaks.append(f"not refused as an invalid task: {type(exc).__name__}: {_short(str(exc))}")
        finally:
            env.close()
        results.append((name, what, leaks))
    for name, (tool, arguments) in ACTION_ATTACKS.items():
        what = f"{tool}({json.dumps(arguments)})"
        env = make_env("code")
        leaks = []
        try:
            env.reset(Task(id=name, instruction="x", env="code", payload={"files": {"a.py": "a = 1\n"}}))
            before = snapshot(env.root)
            try:
                result = env.step(Action(tool=tool, arguments=arguments))
                if not result.info.get("invalid_action"):
                    leaks.append(f"accepted: {_short(result.observation)}")
            except Exception as exc:  # noqa: BLE001
                leaks.append(f"raised out of env.step: {type(exc).__name__}: {_short(str(exc))}")
            if snapshot(env.root) != before:
                leaks.append("the project's files changed")
        finally:
            env.close()
        results.append((name, what, leaks))
    return results
