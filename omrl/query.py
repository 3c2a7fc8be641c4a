"""The SQL layer: DuckDB views over a store, and read-only query execution.

Views: trajectories, messages (one row per message), turns, tool_calls, annotations,
latest_annotations (newest per trajectory and annotator), scores (latest ok scores pivoted, one
column per annotator), groups (per group_id: n, mean and std of reward, success rate).
"""

from __future__ import annotations

import duckdb
import pyarrow as pa

from omrl.schema import SCHEMAS
from omrl.store import Store

READ_ONLY_STATEMENTS = {"SELECT", "EXPLAIN"}


class QueryError(ValueError):
    """A query that is refused or fails; the message is meant for the user."""


def quote_literal(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _table_source(con: duckdb.DuckDBPyConnection, store: Store, table: str) -> str:
    """A SELECT over a table's readable parts with every current column (missing ones as typed NULL)."""
    schema = SCHEMAS[table]
    parts = store.parts(table)
    if not parts:
        con.register(f"_empty_{table}", schema.empty_table())
        return f"SELECT * FROM _empty_{table}"
    files = "[" + ", ".join(quote_literal(str(p)) for p in parts) + "]"
    scan = f"read_parquet({files}, union_by_name=true)"
    present = {row[0] for row in con.execute(f"DESCRIBE SELECT * FROM {scan}").fetchall()}
    columns = []
    for field in schema:
        if field.name in present:
            columns.append(_ident(field.name))
        else:  # an older part: give the column its type so queries written for schema 1 still run
            columns.append(f"CAST(NULL AS {_duck_type(con, table, field.name)}) AS {_ident(field.name)}")
    extra = sorted(present - set(schema.names))  # columns from newer writers stay visible
    columns += [_ident(c) for c in extra]
    return f"SELECT {', '.join(columns)} FROM {scan}"


def _duck_type(con: duckdb.DuckDBPyConnection, table: str, column: str) -> str:
    """The DuckDB type name of a schema column (derived from an empty Arrow table)."""
    rel = con.from_arrow(SCHEMAS[table].empty_table().select([column]))
    return str(rel.types[0])


def connect(store: Store) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the store's views defined."""
    con = duckdb.connect(":memory:")
    con.execute(f"CREATE VIEW trajectories AS {_table_source(con, store, 'trajectories')}")
    con.execute(f"CREATE VIEW annotations AS {_table_source(con, store, 'annotations')}")
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
    con.execute(
        """
        CREATE VIEW tool_calls AS
        SELECT trajectory_id, run_id, round, task_id, env, position AS message_position,
               generate_subscripts(tool_calls, 1) - 1 AS call_index,
               unnest(tool_calls, recursive := true)
        FROM messages
        WHERE len(tool_calls) > 0
        """
    )
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
    con.execute(
        """
        CREATE VIEW groups AS
        SELECT group_id, any_value(task_id) AS task_id, any_value(run_id) AS run_id,
               any_value(round) AS round, count(*) AS n,
               avg(reward) AS mean_reward, coalesce(stddev_pop(reward), 0) AS std_reward,
               min(reward) AS min_reward, max(reward) AS max_reward,
               avg(CASE WHEN success THEN 1.0 ELSE 0.0 END) AS success_rate
        FROM trajectories
        GROUP BY group_id
        """
    )
    # Queries cannot change settings after this point (no re-enabling of anything we lock down).
    con.execute("SET lock_configuration = true")
    return con


def check_read_only(con: duckdb.DuckDBPyConnection, query: str) -> None:
    """Refuse anything but SELECT/EXPLAIN (no DELETE, COPY ... TO, ATTACH, INSTALL, SET, ...)."""
    try:
        statements = con.extract_statements(query)
    except duckdb.Error as exc:
        raise QueryError(f"SQL does not parse: {exc}") from None
    if not statements:
        raise QueryError("no SQL statement given")
    for statement in statements:
        kind = statement.type.name
        if kind not in READ_ONLY_STATEMENTS:
            raise QueryError(
                f"refused: {kind} statements are not allowed; `omrl query` is read-only (SELECT only)"
            )


def run_query(store: Store, query: str, con: duckdb.DuckDBPyConnection | None = None) -> pa.Table:
    """Execute read-only SQL over a store; returns Arrow (the last statement's result)."""
    own = con is None
    con = connect(store) if own else con
    try:
        check_read_only(con, query)
        return con.sql(query).to_arrow_table()
    except duckdb.Error as exc:
        raise QueryError(str(exc).strip()) from None
    finally:
        if own:  # a connection made here is not the caller's to reuse
            con.close()
