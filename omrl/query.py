"""The SQL layer: DuckDB views over a store, and confined, read-only query execution.

Views: trajectories, messages (one row per message), turns, tool_calls (read from each part's flat side
file where it has one: omrl.store_layout), annotations,
latest_annotations (newest per trajectory and annotator), scores (latest ok scores pivoted, one
column per annotator), groups (per group_id: n, mean and std of reward, success rate).

Confinement is a property of the connection, not of the statement check: `connect` is the one
factory (for `omrl query`, `Store.sql`, `Store.connect` and every `--where`). DuckDB itself opens no
file: the parts are handed to it as pyarrow datasets, and external access is then switched off with
no allowed path, extension install/load off and the configuration locked. So no statement, whatever
wraps it (`EXPLAIN ANALYZE` runs what it wraps), can read a file, reach the network, load an
extension or write anywhere but the connection's own temporary folder (for spilling), which omrl makes
and removes. The statement check (SELECT and EXPLAIN of a SELECT only) is a second line of defence.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from omrl.errors import OmrlError
from omrl.schema import SCHEMAS
from omrl.store_layout import TOOL_CALLS_SCHEMA

if TYPE_CHECKING:  # a type only: store.py imports this module (Store.sql, Store.connect)
    from omrl.store import Store

T = TypeVar("T")

READ_ONLY_STATEMENTS = {"SELECT", "EXPLAIN"}
VIEWS = ("trajectories", "messages", "turns", "tool_calls", "annotations", "latest_annotations", "scores",
         "groups")
DEFAULT_TIMEOUT_S = 60.0
VANISHED_RETRIES = 4  # connections rebuilt when a compaction removes a part under a query

# Set when the database starts, before any statement can run.
_START_CONFIG = {
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "allow_unsigned_extensions": False,
    "allow_persistent_secrets": False,
    "python_enable_replacements": False,  # a query cannot scan the caller's Python variables by name
}


class QueryError(OmrlError, ValueError):
    """A query that is refused or fails; the message is meant for the user (one line)."""


def quote_literal(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


# ------------------------------------------------------------------------------------ the connection


def _parts_dataset(store: Store, files: list, schema: pa.Schema) -> ds.Dataset:
    """Parquet files of the store as one pyarrow dataset, opened through the store's storage (local disk or
    S3: omrl.storage), so that DuckDB scans Arrow and never opens a path itself."""
    return ds.dataset([store.storage.arrow_path(p) for p in files], schema=schema, format="parquet",
                      filesystem=store.storage.filesystem)


def _register_table(con: duckdb.DuckDBPyConnection, store: Store, table: str) -> str:
    """Hand a table's live parts to DuckDB as a pyarrow dataset (so DuckDB opens no file itself) and
    return a SELECT of every current column; older parts get missing columns as typed NULL, columns
    from newer writers stay visible after them."""
    schema = SCHEMAS[table]
    parts = store.parts(table)
    name = f"_omrl_{table}"
    if not parts:
        con.register(name, schema.empty_table())
    else:
        extra: dict[str, pa.Field] = {}
        for part in parts:  # FileNotFoundError when a compaction removed it: the caller builds anew
            for f in pq.read_schema(store.storage.arrow_path(part), filesystem=store.storage.filesystem):
                if f.name not in schema.names:
                    extra.setdefault(f.name, f)
        full = pa.schema(list(schema) + [extra[n] for n in sorted(extra)])
        con.register(name, _parts_dataset(store, parts, full))
    return f"SELECT * FROM {name}"


def _register_tool_calls(con: duckdb.DuckDBPyConnection, store: Store) -> str:
    """The `tool_calls` rows: read flat from the parts' side files; parts without one (v1 parts, a side
    file lost) are unnested as before, with the same columns and values."""
    sides, lacking = store.side_files("tool_calls")
    con.register("_omrl_tool_calls_side", _parts_dataset(store, sides, TOOL_CALLS_SCHEMA)
                 if sides else TOOL_CALLS_SCHEMA.empty_table())
    schema = SCHEMAS["trajectories"]
    con.register("_omrl_trajectories_unflattened", _parts_dataset(store, lacking, schema)
                 if lacking else schema.empty_table())
    columns = ", ".join(_ident(f.name) for f in TOOL_CALLS_SCHEMA)
    return f"""
        SELECT {columns} FROM _omrl_tool_calls_side
        UNION ALL
        SELECT trajectory_id, run_id, round, task_id, env, position AS message_position,
               generate_subscripts(tool_calls, 1) - 1 AS call_index,
               unnest(tool_calls, recursive := true)
        FROM (SELECT id AS trajectory_id, run_id, round, task_id, env,
                     generate_subscripts(messages, 1) - 1 AS position,
                     unnest(messages, recursive := true)
              FROM _omrl_trajectories_unflattened)
        WHERE len(tool_calls) > 0
    """


def _remove_temp_dir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


# connection -> the finalizer removing its temporary folder (run by `close`, or when it is collected)
_TEMP_DIRS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Connections `connect` confined (or _check_confined verified): their configuration is locked, so they stay
# confined and are not asked again (asking costs a duckdb_settings() query, ~10 ms, on every user query).
_CONFINED: weakref.WeakSet = weakref.WeakSet()


def close(con: duckdb.DuckDBPyConnection) -> None:
    """Close a connection from `connect` and remove its temporary folder now."""
    con.close()
    finalizer = _TEMP_DIRS.pop(con, None)
    if finalizer is not None:
        finalizer()


def connect(store: Store) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the store's views, confined: no file, network or extension
    access, locked configuration, spilling only into its own temporary folder (removed with it)."""
    temp_dir = tempfile.mkdtemp(prefix="omrl-duckdb-")
    try:
        con = duckdb.connect(":memory:", config={**_START_CONFIG, "temp_directory": temp_dir})
    except BaseException:
        _remove_temp_dir(temp_dir)
        raise
    _TEMP_DIRS[con] = weakref.finalize(con, _remove_temp_dir, temp_dir)
    try:
        _define_views(con, store)
        # Order matters: access is switched off after the start (switched off at the start, DuckDB
        # would allow the in-memory database's own `:memory:*` paths relative to the working folder),
        # allowed_paths is empty and allowed_directories is only the temporary folder.
        con.execute("SET enable_external_access = false")
        con.execute("SET enable_progress_bar = false")  # a slow query must not draw on a server's terminal
        con.execute("SET lock_configuration = true")  # nothing above can be switched back on
    except BaseException:
        close(con)
        raise
    _CONFINED.add(con)
    return con


def _define_views(con: duckdb.DuckDBPyConnection, store: Store) -> None:
    con.execute(f"CREATE VIEW trajectories AS {_register_table(con, store, 'trajectories')}")
    con.execute(f"CREATE VIEW annotations AS {_register_table(con, store, 'annotations')}")
    con.execute(
        """
        CREATE VIEW messages AS
        SELECT id AS trajectory_id, run_id, round, task_id, env,
               generate_subscripts(messages, 1) - 1 AS position,
               unnest(messages, recursive := true)
        FROM trajectories
        """
    )
    con.execute(
        """
        CREATE VIEW turns AS
        SELECT id AS trajectory_id, run_id, round, task_id, env,
               unnest(turns, recursive := true)
        FROM trajectories
        """
    )
    con.execute(f"CREATE VIEW tool_calls AS {_register_tool_calls(con, store)}")
    con.execute(
        """
        CREATE VIEW latest_annotations AS
        SELECT * EXCLUDE (_rank) FROM (
            SELECT *, row_number() OVER (
                PARTITION BY trajectory_id, annotator ORDER BY created_at DESC, id DESC) AS _rank
            FROM annotations)
        WHERE _rank = 1
        """
    )
    annotators = [r[0] for r in con.execute(
        "SELECT DISTINCT annotator FROM latest_annotations WHERE status = 'ok' ORDER BY 1").fetchall()]
    pivot = "".join(
        f", max(score) FILTER (WHERE annotator = {quote_literal(a)}) AS {_ident(a)}" for a in annotators
    )
    con.execute(
        f"""
        CREATE VIEW scores AS
        SELECT trajectory_id, count(*) AS n_annotations{pivot}
        FROM latest_annotations WHERE status = 'ok'
        GROUP BY trajectory_id
        """
    )
    # The one success rate (omrl.schema): solved / known outcomes; failed and unknown success beside it.
    from omrl.schema import SUCCESS_SQL

    con.execute(
        f"""
        CREATE VIEW groups AS
        SELECT group_id, any_value(task_id) AS task_id, any_value(run_id) AS run_id,
               any_value(round) AS round, count(*) AS n,
               avg(reward) AS mean_reward, coalesce(stddev_pop(reward), 0) AS std_reward,
               min(reward) AS min_reward, max(reward) AS max_reward,
               {SUCCESS_SQL}
        FROM trajectories
        GROUP BY group_id
        """
    )


def _check_confined(con: duckdb.DuckDBPyConnection) -> None:
    """Refuse a caller's connection that did not come from `connect` (user SQL runs only on confined ones)."""
    if con in _CONFINED:
        return
    settings = dict(con.execute(
        "SELECT name, value FROM duckdb_settings() "
        "WHERE name IN ('enable_external_access', 'lock_configuration')").fetchall())
    if settings != {"enable_external_access": "false", "lock_configuration": "true"}:
        raise QueryError("refused: this DuckDB connection is not confined; make it with omrl.query.connect")
    _CONFINED.add(con)  # locked as confined: it cannot be switched back


# ------------------------------------------------------------------------------ the statement check


def _tokens(sql: str) -> list[tuple[int, str, str]]:
    """(offset, kind, text) of each token, comments included."""
    raw = duckdb.tokenize(sql)
    ends = [pos for pos, _ in raw[1:]] + [len(sql)]
    return [(pos, kind.name, sql[pos:end].strip()) for (pos, kind), end in zip(raw, ends, strict=True)]


def _explained(con: duckdb.DuckDBPyConnection, sql: str) -> str:
    """The statement an EXPLAIN wraps: what follows EXPLAIN, ANALYZE and an option list."""
    tokens = [t for t in _tokens(sql) if t[1] != "comment"]
    i = 1  # tokens[0] is EXPLAIN
    if i < len(tokens) and tokens[i][2].upper() in ("ANALYZE", "ANALYSE"):
        i += 1
    if i < len(tokens) and tokens[i][2] == "(":  # `EXPLAIN (SELECT ...)` or `EXPLAIN (ANALYZE, ...) stmt`
        if _single_select(con, sql[tokens[i][0]:]):
            return sql[tokens[i][0]:]
        depth = 0
        for j in range(i, len(tokens)):
            depth += {"(": 1, ")": -1}.get(tokens[j][2], 0)
            if depth == 0:
                i = j + 1
                break
    return sql[tokens[i][0]:] if i < len(tokens) else ""


def _single_select(con: duckdb.DuckDBPyConnection, sql: str) -> bool:
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error:
        return False
    return len(statements) == 1 and statements[0].type.name == "SELECT"


def check_read_only(con: duckdb.DuckDBPyConnection, query: str) -> None:
    """Refuse anything but SELECT and EXPLAIN [ANALYZE] of a SELECT (no COPY, ATTACH, INSTALL, SET, ...).

    A second line of defence: the connection from `connect` cannot read or write files either way.
    """
    try:
        statements = con.extract_statements(query)
    except duckdb.Error as exc:
        raise QueryError(f"SQL does not parse: {_one_line(exc)}") from None
    if not statements:
        raise QueryError("no SQL statement given")
    for statement in statements:
        kind = statement.type.name
        if kind not in READ_ONLY_STATEMENTS:
            raise QueryError(
                f"refused: {kind} statements are not allowed; `omrl query` is read-only (SELECT only)"
            )
        if kind == "EXPLAIN" and not _single_select(con, _explained(con, statement.query)):
            raise QueryError("refused: EXPLAIN of anything but a SELECT is not allowed (EXPLAIN ANALYZE runs "
                             "what it wraps); `omrl query` is read-only (SELECT only)")


# ----------------------------------------------------------------------------------------- running


def _one_line(exc: BaseException) -> str:
    """DuckDB's message without the caret picture of the query under it."""
    lines = [line.strip() for line in str(exc).strip().splitlines()]
    kept = [line for line in lines if line and not line.startswith("LINE ") and set(line) != {"^"}]
    return " ".join(kept) or type(exc).__name__


def _vanished(exc: BaseException) -> bool:
    """A part that a compaction removed while a query ran (listing again finds its rows)."""
    return isinstance(exc, FileNotFoundError) or (
        isinstance(exc, duckdb.Error) and any(m in str(exc) for m in _VANISHED_MESSAGES))


# How a removed part fails inside a scan: the OS's message (local parts), pyarrow's S3 client's (omrl.storage),
# and a GET cut off mid-body (moto's server does that when a compaction deletes the object being read; a
# fresh listing reads the merged part instead, and a failure that persists still surfaces after the retries).
_VANISHED_MESSAGES = ("No such file or directory", "The specified key does not exist", "Path does not exist",
                      "AWS Error RESOURCE_NOT_FOUND", "AWS Error NO_SUCH_KEY",
                      "AWS Error INTERNAL_FAILURE during GetObject")


def _user_error(exc: duckdb.Error) -> QueryError:
    message = _one_line(exc)
    if isinstance(exc, duckdb.PermissionException):
        return QueryError("refused: queries read only the store's views (no files, network or extensions) "
                          f"and write nothing; DuckDB said: {message}")
    return QueryError(message)


def _execute(con: duckdb.DuckDBPyConnection, query: str, timeout: float | None) -> pa.Table:
    """Run `query`, stopped by `con.interrupt()` from a timer thread once it runs past `timeout` seconds
    (None: DEFAULT_TIMEOUT_S)."""
    limit = DEFAULT_TIMEOUT_S if timeout is None else timeout
    if not limit > 0:
        raise QueryError(f"the query time limit must be a positive number of seconds, not {limit}")
    fired = threading.Event()

    def stop() -> None:
        fired.set()
        con.interrupt()

    timer = threading.Timer(limit, stop)
    timer.daemon = True
    timer.start()
    try:
        return con.sql(query).to_arrow_table()
    except duckdb.InterruptException:
        if fired.is_set():
            raise QueryError(f"query ran past {limit:g} s and was stopped (raise the limit with --timeout)"
                             ) from None
        raise
    finally:
        timer.cancel()


def _with_connection(store: Store, con: duckdb.DuckDBPyConnection | None,
                     work: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
    """`work` on the caller's confined connection, or on a fresh one that is built again (parts listed
    again) when a compaction removed a part under it."""
    if con is not None:
        _check_confined(con)
        try:
            return work(con)
        except duckdb.Error as exc:
            raise _user_error(exc) from None
    for attempt in range(VANISHED_RETRIES + 1):
        own = None
        try:
            own = connect(store)
            return work(own)
        except (duckdb.Error, FileNotFoundError) as exc:
            if _vanished(exc) and attempt < VANISHED_RETRIES:
                continue
            if isinstance(exc, duckdb.Error):
                raise _user_error(exc) from None
            raise
        finally:
            if own is not None:  # a connection made here is not the caller's to reuse
                close(own)
    raise AssertionError("unreachable")


def run_query(store: Store, query: str, con: duckdb.DuckDBPyConnection | None = None,
              timeout: float | None = None) -> pa.Table:
    """Execute read-only SQL over a store; returns Arrow (the last statement's result).

    Runs on a confined connection (`con`, which must come from `connect`, or a fresh one) and is
    stopped with a QueryError once it runs past `timeout` seconds (None: DEFAULT_TIMEOUT_S).
    """
    def work(c: duckdb.DuckDBPyConnection) -> pa.Table:
        check_read_only(c, query)
        return _execute(c, query, timeout)

    return _with_connection(store, con, work)


# --------------------------------------------------------------------------------------- --where


def _parse_tree(con: duckdb.DuckDBPyConnection, sql: str) -> dict:
    tree = json.loads(con.execute("SELECT json_serialize_sql(?::VARCHAR)", [sql]).fetchall()[0][0])
    if tree.get("error"):
        raise QueryError(f"--where does not parse: {tree.get('error_message', 'syntax error')}")
    return tree


def _without_locations(node):
    if isinstance(node, dict):
        return {k: _without_locations(v) for k, v in node.items() if not k.startswith("query_location")}
    if isinstance(node, list):
        return [_without_locations(v) for v in node]
    return node


_SAFE_SOURCES = {"BASE_TABLE", "JOIN", "SUBQUERY", "EMPTY", "EXPRESSION_LIST"}


def _check_sources(node, allowed: set[str]) -> None:
    """Every table a --where's subqueries read is one of the store's views (or a CTE of its own)."""
    if isinstance(node, list):
        for item in node:
            _check_sources(item, allowed)
        return
    if not isinstance(node, dict):
        return
    if "class" not in node and "alias" in node and "sample" in node:  # a table reference
        kind = node.get("type")
        if kind not in _SAFE_SOURCES:
            what = (node.get("function") or {}).get("function_name") or kind
            raise QueryError(f"refused: a --where may read only the store's views ({', '.join(VIEWS)}), "
                             f"not {what}")
        if kind == "BASE_TABLE" and (node.get("catalog_name") or node.get("schema_name")
                                     or node.get("table_name") not in allowed):
            name = ".".join(p for p in (node.get("catalog_name"), node.get("schema_name"),
                                        node.get("table_name")) if p)
            raise QueryError(f"refused: a --where may read only the store's views ({', '.join(VIEWS)}), "
                             f"not {name!r}")
    for value in node.values():
        _check_sources(value, allowed)


def _cte_names(tree) -> set[str]:
    """The names of the CTEs defined anywhere in a parse tree."""
    names: set[str] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            cte_map = node.get("cte_map")
            if isinstance(cte_map, dict):
                names.update(entry.get("key") for entry in cte_map.get("map", []))
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return names


def where_select(con: duckdb.DuckDBPyConnection, where: str, head: str, tail: str = "") -> str:
    """`{head} WHERE {where}{tail}`, checked with DuckDB's own parser to be exactly that query with one
    condition in its WHERE (no second statement, set operation, comment, clause or other source).

    `head` is code's "SELECT ... FROM view"; `where` is the user's. Raises QueryError otherwise.
    """
    if not where or not where.strip():
        raise QueryError("--where is empty; give one SQL condition, e.g. \"success AND reward > 0.5\"")
    try:
        tokens = _tokens(where)
    except duckdb.Error as exc:
        raise QueryError(f"--where does not parse: {_one_line(exc)}") from None
    if any(kind == "comment" for _, kind, _ in tokens):
        raise QueryError("refused: a --where may not hold SQL comments (-- or /* */); give one condition")
    if any(kind == "operator" and ";" in text for _, kind, text in tokens):
        raise QueryError("refused: a --where is one SQL condition, not statements (no ';')")
    sql = f"{head} WHERE {where}{tail}"
    tree = _parse_tree(con, sql)
    template = _parse_tree(con, f"{head} WHERE true{tail}")
    statements, expected = tree["statements"], template["statements"]
    shape_error = QueryError(
        f"refused: --where must be one SQL condition over the view (got {where!r}, which changes the query "
        "around it: a parenthesis closed, a UNION, ORDER BY, LIMIT or other clause)")
    if len(statements) != 1 or statements[0]["node"].get("type") != "SELECT_NODE":
        raise shape_error
    node = _without_locations(statements[0]["node"])
    condition = node.pop("where_clause", None)
    model = _without_locations(expected[0]["node"])
    model.pop("where_clause", None)
    if condition is None or node != model or statements[0].get("named_param_map"):
        raise shape_error
    _check_sources(condition, set(VIEWS) | _cte_names(condition))
    return sql


def select_where(store: Store, where: str | None, *, view: str = "trajectories", columns: str = "*",
                 order_by: str | None = None, con: duckdb.DuckDBPyConnection | None = None,
                 timeout: float | None = None) -> pa.Table:
    """Rows of `view` matching the user's `where` (one SQL condition, checked; None or "": every row).

    `columns` and `order_by` are code's SQL, never a user's.
    """
    if view not in VIEWS:
        raise QueryError(f"unknown view {view!r}; views are {', '.join(VIEWS)}")
    head = f"SELECT {columns} FROM {view}"
    tail = f"\nORDER BY {order_by}" if order_by else ""

    def work(c: duckdb.DuckDBPyConnection) -> pa.Table:
        sql = where_select(c, where, head, tail) if where is not None and where != "" else head + tail
        return _execute(c, sql, timeout)

    return _with_connection(store, con, work)


def select_ids(store: Store, where: str, con: duckdb.DuckDBPyConnection | None = None, *,
               view: str = "trajectories", column: str = "id",
               timeout: float | None = None) -> list:
    """The `column` values (ids) of the rows of `view` matching the user's `where` (one checked condition)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", column):
        raise QueryError(f"not a column name: {column!r}")
    if where is None or not where.strip():
        raise QueryError("--where is empty; give one SQL condition, e.g. \"success AND reward > 0.5\"")
    table = select_where(store, where, view=view, columns=_ident(column), con=con, timeout=timeout)
    return table.column(0).to_pylist()
