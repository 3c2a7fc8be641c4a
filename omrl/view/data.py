"""What the viewer's pages read from a store: every query through omrl.query's confined connection.

The user's WHERE goes only through `select_where` (its checker); everything else here is code's SQL with
values as quoted literals. Sort columns come from a whitelist and LIMIT/OFFSET are integers.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any

import duckdb

from omrl.query import QueryError, close, connect, quote_literal, run_query, select_where
from omrl.schema import success_sql
from omrl.store import Store
from omrl.train.advantages import group_advantages

# sort key in the URL -> the SQL it orders by (the only SQL a request's sort can choose)
SORTS: dict[str, str] = {
    "created": "created_at",
    "task": "task_id",
    "env": "env",
    "round": "round",
    "model": "model",
    "reward": "reward",
    "success": "success",
    "status": "status",
    "turns": "num_turns",
    "tokens": "tokens",
    "duration": "duration_s",
}
DEFAULT_SORT = "created"
PER_PAGE = 50
MAX_PER_PAGE = 500

# No message bodies: the list reads only these small columns (DuckDB projects them from the parts).
LIST_COLUMNS = ("id, task_id, group_id, env, round, model, reward, success, status, num_turns, "
                "coalesce(prompt_tokens, 0) + coalesce(completion_tokens, 0) AS tokens, duration_s, "
                "source, parent_id, created_at")
GROUP_COLUMNS = ("id, sample, model, reward, success, status, error, num_turns, "
                 "coalesce(prompt_tokens, 0) + coalesce(completion_tokens, 0) AS tokens, duration_s, "
                 "task_id, run_id, round, instruction, "
                 "list_filter(messages, lambda m: m.role = 'assistant')[-1] AS final")


@dataclass
class ListPage:
    rows: list[dict[str, Any]]
    total: int
    page: int
    pages: int
    sort: str
    desc: bool
    where: str
    error: str | None = None


@dataclass
class Group:
    group_id: str
    rows: list[dict[str, Any]]
    mean: float | None
    std: float | None
    flat: bool = field(default=False)


def _sort(sort: str | None) -> str:
    return sort if sort in SORTS else DEFAULT_SORT


class StoreReader:
    """One confined DuckDB connection over a store, shared by the requests under a lock (a DuckDB
    connection is not for concurrent use) and built again when the store's parts change."""

    def __init__(self, store: Store, timeout: float = 20.0):
        self.store = store
        self.timeout = timeout
        self._lock = threading.Lock()
        self._con: duckdb.DuckDBPyConnection | None = None
        self._parts: tuple | None = None

    def close(self) -> None:
        with self._lock:
            if self._con is not None:
                close(self._con)
                self._con = None

    def _connection(self, refresh: bool = False) -> duckdb.DuckDBPyConnection:
        parts = (tuple(self.store.parts("trajectories", warn=False)),
                 tuple(self.store.parts("annotations", warn=False)))
        if refresh or self._con is None or parts != self._parts:
            if self._con is not None:
                close(self._con)
            self._con, self._parts = connect(self.store), parts
        return self._con

    def _run(self, work):
        """`work(con)` under the lock; once again on a new connection when a part vanished under it."""
        with self._lock:
            try:
                return work(self._connection())
            except (QueryError, FileNotFoundError) as exc:
                if "No such file" not in str(exc) and not isinstance(exc, FileNotFoundError):
                    raise
                return work(self._connection(refresh=True))

    def sql(self, query: str) -> list[dict[str, Any]]:
        """Code's read-only SQL (never a user's) as rows."""
        return self._run(lambda con: run_query(self.store, query, con=con, timeout=self.timeout).to_pylist())

    # ------------------------------------------------------------------------------------ pages

    def list_page(self, where: str = "", sort: str | None = None, desc: bool = True, page: int = 1,
                  per_page: int = PER_PAGE) -> ListPage:
        """One page of the trajectory list, sorted by a whitelisted column and filtered by the user's
        WHERE (through omrl.query's checker; a refused or failing one comes back as `error`)."""
        sort = _sort(sort)
        where = (where or "").strip()
        per_page = max(1, min(int(per_page), MAX_PER_PAGE))
        page = max(1, int(page))
        direction = "DESC" if desc else "ASC"

        def work(con):
            total = select_where(self.store, where or None, columns="count(*) AS n", con=con,
                                 timeout=self.timeout).column(0)[0].as_py()
            pages = max(1, math.ceil(total / per_page))
            current = min(page, pages)
            order = (f"{SORTS[sort]} {direction} NULLS LAST, id ASC "
                     f"LIMIT {int(per_page)} OFFSET {int((current - 1) * per_page)}")
            rows = select_where(self.store, where or None, columns=LIST_COLUMNS, order_by=order, con=con,
                                timeout=self.timeout).to_pylist()
            return ListPage(rows, total, current, pages, sort, desc, where)

        try:
            return self._run(work)
        except QueryError as exc:
            return ListPage([], 0, 1, 1, sort, desc, where, error=str(exc))

    def selected_ids(self, where: str | None, limit: int) -> list[str]:
        """Ids of the user's selection (newest first), at most `limit` (for --export)."""
        order = f"created_at DESC NULLS LAST, id ASC LIMIT {int(limit)}"
        return self._run(lambda con: select_where(
            self.store, where or None, columns="id", order_by=order, con=con,
            timeout=self.timeout).column(0).to_pylist())

    def list_rows(self, ids: list[str]) -> list[dict[str, Any]]:
        """List-page rows of these ids, newest first."""
        if not ids:
            return []
        values = ", ".join(quote_literal(i) for i in ids)
        return self.sql(f"SELECT {LIST_COLUMNS} FROM trajectories WHERE id IN ({values}) "
                        "ORDER BY created_at DESC NULLS LAST, id")

    def trajectory(self, trajectory_id: str) -> dict[str, Any] | None:
        """One trajectory row, with `annotations`, `children` (rows derived from it) and `parent_exists`."""
        tid = quote_literal(trajectory_id)
        rows = self.sql(f"SELECT * FROM trajectories WHERE id = {tid} LIMIT 1")
        if not rows:
            return None
        row = rows[0]
        row["annotations"] = self.sql(
            "SELECT annotator, kind, score, label, rationale, status, error, judge_model, rubric, created_at "
            f"FROM annotations WHERE trajectory_id = {tid} ORDER BY created_at DESC, annotator")
        row["children"] = self.sql(
            f"SELECT id, source, reward, success FROM trajectories WHERE parent_id = {tid} ORDER BY id")
        parent = row.get("parent_id")
        row["parent_exists"] = bool(parent) and bool(self.sql(
            f"SELECT 1 AS x FROM trajectories WHERE id = {quote_literal(parent)} LIMIT 1"))
        return row

    def group(self, group_id: str) -> Group | None:
        """The samples of one GRPO group with their group-relative advantages, as GRPO computes them."""
        rows = self.sql(f"SELECT {GROUP_COLUMNS} FROM trajectories WHERE group_id = {quote_literal(group_id)} "
                        "ORDER BY sample, id")
        if not rows:
            return None
        scored = [r for r in rows if r["reward"] is not None and math.isfinite(r["reward"])]
        rewards = [r["reward"] for r in scored]
        advantages = group_advantages(rewards, [group_id] * len(rewards)) if rewards else []
        for row, advantage in zip(scored, advantages, strict=True):
            row["advantage"] = advantage
        mean = sum(rewards) / len(rewards) if rewards else None
        std = (math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
               if len(rewards) > 1 else None)
        return Group(group_id, rows, mean, std, flat=len(set(rewards)) <= 1)

    def runs(self) -> dict[str, Any]:
        """Counts by env, status and model; episodes, success and mean reward per run and round."""
        rate = success_sql(4)
        counts = {
            key: self.sql(f"SELECT coalesce(CAST({key} AS VARCHAR), '(none)') AS name, count(*) AS n "
                          f"FROM trajectories GROUP BY 1 ORDER BY n DESC, name LIMIT 50")
            for key in ("env", "status", "model", "source")
        }
        rounds = self.sql(
            f"SELECT run_id, round, count(*) AS n, avg(reward) AS mean_reward, {rate} "
            "FROM trajectories GROUP BY run_id, round ORDER BY run_id, round")
        by_round = self.sql(
            f"SELECT round, count(*) AS n, avg(reward) AS mean_reward, {rate} "
            "FROM trajectories GROUP BY round ORDER BY round")
        total = self.sql("SELECT count(*) AS n, count(DISTINCT group_id) AS groups FROM trajectories")[0]
        annotations = self.sql(
            "SELECT annotator, count(*) AS n, avg(score) AS mean_score FROM annotations "
            "GROUP BY annotator ORDER BY annotator")
        return {"counts": counts, "rounds": rounds, "by_round": by_round, "total": total,
                "annotations": annotations}
