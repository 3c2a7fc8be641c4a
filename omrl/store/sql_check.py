"""The statement checks of the SQL layer: `check_read_only` (SELECT and EXPLAIN of a SELECT only, a second line
of defence behind the confined connection) and `where_select`, the checker of a user's --where (exactly one
condition over a view, reading only the store's views), both with DuckDB's own tokenizer and parser.
"""

from __future__ import annotations

import json

import duckdb

from omrl.store.query_limits import QueryError
from omrl.store.views import VIEWS

READ_ONLY_STATEMENTS = {"SELECT", "EXPLAIN"}


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
        raise QueryError(f"SQL does not parse: {one_line(exc)}") from None
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


def one_line(exc: BaseException) -> str:
    """DuckDB's message without the caret picture of the query under it."""
    lines = [line.strip() for line in str(exc).strip().splitlines()]
    kept = [line for line in lines if line and not line.startswith("LINE ") and set(line) != {"^"}]
    return " ".join(kept) or type(exc).__name__


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


def _check_sources(node, allowed: frozenset[str]) -> None:
    """Every table a --where's subqueries read is one of the store's views or a CTE in scope there: a
    CTE's name reaches the rest of its query and the CTEs after it (a recursive one also its own recursive
    part), never a sibling subquery, so a CTE named after a system table cannot unlock that table."""
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
    cte_map = node.get("cte_map")
    for entry in cte_map.get("map", []) if isinstance(cte_map, dict) else []:
        _check_sources(entry.get("value"), allowed)  # a CTE's body sees only the CTEs before it
        allowed = allowed | {entry.get("key")}
    for key, value in node.items():
        if key == "cte_map":
            continue
        if key == "right" and node.get("type") == "RECURSIVE_CTE_NODE":  # its recursive part reads itself
            _check_sources(value, allowed | {node.get("cte_name", "")})
        else:
            _check_sources(value, allowed)


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
        raise QueryError(f"--where does not parse: {one_line(exc)}") from None
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
    _check_sources(condition, frozenset(VIEWS))
    return sql
