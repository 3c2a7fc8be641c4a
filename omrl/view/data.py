"""What the viewer's pages read from a store: every query through omrl.store.query's confined connection.

The user's WHERE goes only through `select_where` (its checker); everything else here is code's SQL with
values as quoted literals. Sort columns come from a whitelist and LIMIT/OFFSET are integers.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypedDict, TypeVar

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from omrl.errors import UsageError
from omrl.report import AGREEMENT_SQL, STEP_AGREEMENT_SQL, STEPS_SQL, flag_agreement, flag_step_agreement
from omrl.schema import success_sql
from omrl.schema.rows import TrajectoryRow
from omrl.store import Store
from omrl.store.query import close, connect, run_query, select_where
from omrl.store.query_limits import QueryError, QueryLimits, check_timeout, query_limits
from omrl.store.views import quote_literal
from omrl.train.rl.advantages import group_advantages
from omrl.view.pool import ConnectionPool
from omrl.view.rows import Location, RowGroups, scan_keys

T = TypeVar("T")

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
# Up to this many trajectories the unfiltered list is served from an in-memory table of the list columns
# (sorted once per sort key) and rows are found by an id -> (part, row group, row) index (annotations by a
# trajectory_id index, up to as many); above it every page is a DuckDB query (slower, memory stays flat).
CACHE_MAX_ROWS = 2_000_000
ROW_GROUP_CACHE = 2
SEARCHES_KEPT = 4  # (search, sort) orders of the cached list kept for paging
QUERY_CONNECTIONS = 3  # lent one per query: a slow one (a user's WHERE) leaves the others to other pages

# No message bodies: the list reads only these small columns (DuckDB projects them from the parts).
LIST_COLUMNS = ("id, task_id, group_id, env, round, model, reward, success, status, num_turns, "
                "coalesce(prompt_tokens, 0) + coalesce(completion_tokens, 0) AS tokens, duration_s, "
                "source, parent_id, created_at")


class ShownAnnotation(TypedDict):
    """An annotation as a trajectory's page shows it: these columns of its AnnotationRow."""

    annotator: str
    kind: str | None
    score: float | None
    label: str | None
    rationale: str | None
    status: str | None
    error: str | None
    judge_model: str | None
    rubric: str | None
    created_at: datetime | None


class ShownTrajectory(TrajectoryRow):
    """A trajectory row as its page shows it: with its annotations (newest first), the rows derived from it
    (id, source, reward, success) and whether its parent is in the store."""

    annotations: list[ShownAnnotation]
    children: list[dict[str, Any]]
    parent_exists: bool


ANNOTATION_FIELDS = list(ShownAnnotation.__annotations__)
ANNOTATION_COLUMNS = ", ".join(ANNOTATION_FIELDS)
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
    search: str = ""  # the text search the rows also match (omrl.store.search), "" for none
    error_in: str = "where"  # the box `error` is about: where or search
    matched: int | None = None  # an export's whole selection when its row cap left some out


def search_available() -> bool:
    """Whether this omrl has the store's text search (omrl.store.search): the list offers a search box then."""
    import importlib.util

    return importlib.util.find_spec("omrl.store.search") is not None


def _sort_indices(table: pa.Table, sort: str, desc: bool) -> pa.Array:
    """Row order of `table` by a whitelisted sort key (nulls last, then id), as the SQL path orders."""
    column, direction = SORTS[sort], "descending" if desc else "ascending"
    try:  # pyarrow >= 25 takes null placement per key
        return pc.sort_indices(table, sort_keys=[(column, direction, "at_end"), ("id", "ascending", "at_end")])
    except (TypeError, ValueError, pa.ArrowInvalid):
        return pc.sort_indices(table, sort_keys=[(column, direction), ("id", "ascending")],
                               null_placement="at_end")


@dataclass
class Group:
    group_id: str
    rows: list[dict[str, Any]]
    mean: float | None
    std: float | None
    flat: bool = field(default=False)


def _group_sample(row: TrajectoryRow) -> dict[str, Any]:
    """A full row cut to what the group page shows (GROUP_COLUMNS, computed in Python)."""
    keep = ("id", "sample", "model", "reward", "success", "status", "error", "num_turns", "duration_s",
            "task_id", "run_id", "round", "instruction")
    out = {k: row.get(k) for k in keep}
    out["tokens"] = (row.get("prompt_tokens") or 0) + (row.get("completion_tokens") or 0)
    assistant = [m for m in row.get("messages") or [] if m.get("role") == "assistant"]
    out["final"] = assistant[-1] if assistant else None
    return out


def _sort(sort: str | None) -> str:
    return sort if sort in SORTS else DEFAULT_SORT


@dataclass
class _Snapshot:
    """What one listing of the parts knows: the list columns of every row and where each row lives."""

    table: pa.Table
    where: dict[str, Location]  # id -> (part path, row group, row in the group)
    groups: dict[str, list[str]]  # group_id -> ids
    orders: dict[tuple[str, bool], pa.Array] = field(default_factory=dict)  # (sort, desc) -> row order
    # (id of a search's hits, sort, desc) -> (the hits, the rows matching them in that order)
    searched: dict[tuple[int, str, bool], tuple[pa.Array, pa.Array]] = field(default_factory=dict)
    _children: dict[str, list[int]] | None = None  # parent_id -> rows of `table` derived from it

    def children(self, trajectory_id: str) -> list[dict[str, Any]]:
        """The rows derived from this trajectory (id, source, reward, success), by id."""
        if self._children is None:  # built on the first trajectory page: most rows have no parent
            self._children = {}
            for at, parent in enumerate(self.table.column("parent_id").to_pylist()):
                if parent is not None:
                    self._children.setdefault(parent, []).append(at)
        rows = self.table.take(pa.array(self._children.get(trajectory_id, []), type=pa.int64()))
        return sorted(rows.select(["id", "source", "reward", "success"]).to_pylist(), key=lambda r: r["id"])


def _locate(parts: tuple) -> tuple[dict[str, Location], dict[str, list[str]]]:
    where: dict[str, Location] = {}
    groups: dict[str, list[str]] = {}
    for at, (tid, gid) in scan_keys(parts, ["id", "group_id"]):
        where.setdefault(tid, at)  # an id stored twice (refused since store v2) shows its first copy
        if gid is not None:
            groups.setdefault(gid, []).append(tid)
    return where, groups


def _newest_first(notes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Annotations as `ORDER BY created_at DESC, annotator` orders them (DuckDB puts NULLs last)."""
    notes = sorted(notes, key=lambda a: a["annotator"] or "")
    dated = sorted((a for a in notes if a["created_at"] is not None), key=lambda a: a["created_at"],
                   reverse=True)
    return dated + [a for a in notes if a["created_at"] is None]


# The scripted expert's episodes: the demos stage's run (omrl.train.iterate.run: run_id 'demos', round 0) and any
# run of the scripted policy (model 'scripted', omrl.policies.scripted). They are a ceiling to compare with, so the
# runs page shows them apart instead of as round 0 of the policy's rounds (where a GRPO round looked like a regression).
EXPERT_SQL = "coalesce(run_id = 'demos' OR model = 'scripted', false)"


class StoreReader:
    """What the viewer reads, two ways: the cached list and indexes of the current parts, under one lock and
    built on a connection of their own (short, in-memory work once built); and SQL (a user's WHERE, the runs
    page, lists of big stores) on a few confined connections lent one per query (ConnectionPool), so one
    slow query holds up only itself. Each connection gets its share of the memory cap (`limits`: the
    command's, omrl.store.query_limits.query_limits), and a request's queries together stop at `timeout` seconds
    (`request`)."""

    def __init__(self, store: Store, timeout: float = 20.0, limits: QueryLimits | None = None,
                 connections: int = QUERY_CONNECTIONS, serving: bool = False):
        self.store = store
        self.timeout = check_timeout(timeout)
        share = (limits or query_limits()).share(connections + 1)  # the pool's and the cache's own
        self._lock = threading.Lock()
        self._limits = share
        # serving (the web app): the connections are made ahead of need, not while a page waits
        self._pool = ConnectionPool(store, share, connections, keep_filled=serving)
        self._request = threading.local()  # this thread's request deadline (monotonic seconds)
        self._con: duckdb.DuckDBPyConnection | None = None  # the cache's own, used under the lock
        self._parts: tuple | None = None
        self._snapshot: _Snapshot | None = None
        self._too_big = False
        self._runs: tuple | None = None
        self._hits: tuple | None = None  # ((parts, search text), matching trajectory ids)
        self._row_groups = RowGroups("trajectories", keep=ROW_GROUP_CACHE)
        self._notes: dict[str, list[Location]] | None = None  # trajectory_id -> its annotations' rows
        self._notes_too_big = False
        self._note_rows = RowGroups("annotations", keep=ROW_GROUP_CACHE)

    def start(self) -> None:
        """Serving: the query connections are made now, in the background, before the first pages ask."""
        self._pool.fill()

    def close(self) -> None:
        self._pool.close()
        with self._lock:
            if self._con is not None:
                close(self._con)
                self._con = None
            self._row_groups.clear()  # the open parts
            self._note_rows.clear()

    # ------------------------------------------------------------------------- time and connections

    @contextmanager
    def request(self) -> Iterator[None]:
        """The queries of one request (this thread) within `timeout` seconds in all."""
        self._request.deadline = time.monotonic() + self.timeout
        try:
            yield
        finally:
            self._request.deadline = None

    def _time_left(self) -> float:
        """Seconds the current request's queries may still run (`timeout` outside a request)."""
        deadline = getattr(self._request, "deadline", None)
        if deadline is None:
            return self.timeout
        left = deadline - time.monotonic()
        if left <= 0:
            raise QueryError(self._past_limit())
        return left

    def _past_limit(self) -> str:
        return (f"this page's queries ran past the viewer's time limit of {self.timeout:g} s and were stopped "
                "(omrl view --timeout sets it)")

    def _current(self, refresh: bool = False) -> None:
        """Under the lock: the caches (and the pool's connections) follow the store's current parts."""
        parts = (tuple(self.store.parts("trajectories", warn=False)),
                 tuple(self.store.parts("annotations", warn=False)))
        if refresh or parts != self._parts:
            if self._con is not None:
                close(self._con)
            self._pool.renew()
            self._con, self._parts, self._snapshot, self._too_big = None, parts, None, False
            self._notes, self._notes_too_big = None, False
            self._row_groups.clear()
            self._note_rows.clear()

    def _cache_connection(self) -> duckdb.DuckDBPyConnection:
        """Under the lock: the connection the caches are built on (for the current parts)."""
        if self._con is None:
            self._con = connect(self.store, self._limits, isolated=True)
        return self._con

    def _query(self, work: Callable[[duckdb.DuckDBPyConnection, float], T]) -> T:
        """`work(connection, seconds left)` on a lent connection of the current parts; once more on new
        connections when a compaction removed a part under it."""
        for attempt in (0, 1):
            with self._lock:
                self._current(refresh=attempt == 1)
            try:
                with self._pool.lend(self._time_left()) as con:
                    return work(con, self._time_left())
            except (QueryError, FileNotFoundError) as exc:
                if "ran past" in str(exc) and getattr(self._request, "deadline", None) is not None:
                    raise QueryError(self._past_limit()) from None
                if attempt or ("No such file" not in str(exc) and not isinstance(exc, FileNotFoundError)):
                    raise
        raise AssertionError("unreachable")

    def _snap(self) -> _Snapshot | None:
        """Under the lock: the cached list table and row index of the current parts (None above
        CACHE_MAX_ROWS)."""
        self._current()
        if self._snapshot is None and not self._too_big:
            con = self._cache_connection()
            n = run_query(self.store, "SELECT count(*) FROM trajectories", con=con,
                          timeout=self._time_left()).column(0)[0].as_py()
            if n > CACHE_MAX_ROWS:
                self._too_big = True  # until the parts change
                return None
            table = run_query(self.store, f"SELECT {LIST_COLUMNS} FROM trajectories", con=con,
                              timeout=self._time_left())
            where, groups = _locate(self._parts[0])
            self._snapshot = _Snapshot(table, where, groups)
        return self._snapshot

    def _order(self, snap: _Snapshot, sort: str, desc: bool) -> pa.Array:
        key = (sort, desc)
        if key not in snap.orders:
            snap.orders[key] = _sort_indices(snap.table, sort, desc)
        return snap.orders[key]

    def _searched_order(self, snap: _Snapshot, hits: pa.Array, sort: str, desc: bool) -> pa.Array:
        """Rows of the cached list matching the search `hits` in the (sort, desc) order: the full order
        filtered (ids are unique, so this is the order of the hits alone), kept for the last few searches
        so paging through a common word's 100,000 hits does not sort them again."""
        key = (id(hits), sort, desc)
        kept = snap.searched.get(key)
        if kept is None or kept[0] is not hits:
            order = self._order(snap, sort, desc)
            mask = pc.is_in(snap.table.column("id"), value_set=hits)
            kept = (hits, order.filter(mask.take(order)))
            snap.searched[key] = kept
            while len(snap.searched) > SEARCHES_KEPT:
                snap.searched.pop(next(iter(snap.searched)))
        return kept[1]

    def _search_ids(self, text: str) -> pa.Array:
        """Ids of the trajectories with a message matching `text` (omrl.store.search), kept for the current parts
        so paging through one search searches once. UsageError for a query it refuses.

        Called outside the connection's lock: the search reads the parts itself, and a slow one (a common
        word on a big store) must not hold up the other pages."""
        from omrl.store.search import search_ids

        key = (tuple(self.store.parts("trajectories", warn=False)), text)
        hits = self._hits  # one read: another request may replace it meanwhile
        if hits is None or hits[0] != key:
            hits = (key, search_ids(self.store, text))  # ids from the index alone: no text, no snippets
            self._hits = hits
        return hits[1]

    def _rows(self, ids: list[str]) -> list[TrajectoryRow] | None:
        """Under the lock: full rows of these ids read straight from their row groups (None: no index;
        unknown ids dropped). A part that a compaction removed raises FileNotFoundError."""
        snap = self._snap()
        if snap is None:
            return None
        return self._row_groups.read([snap.where[tid] for tid in ids if tid in snap.where])

    def _note_index(self) -> dict[str, list[Location]] | None:
        """Under the lock: trajectory_id -> where its annotations lie, for the current parts (None above
        CACHE_MAX_ROWS annotations: those are found by a query)."""
        self._current()
        if self._notes is None and not self._notes_too_big:
            parts = self._parts[1]
            if sum(pq.ParquetFile(p).metadata.num_rows for p in parts) > CACHE_MAX_ROWS:
                self._notes_too_big = True  # until the parts change
                return None
            notes: dict[str, list[Location]] = {}
            for at, (tid,) in scan_keys(parts, ["trajectory_id"]):
                notes.setdefault(tid, []).append(at)
            self._notes = notes
        return self._notes

    def _cached(self, work: Callable[[], T]) -> T:
        """`work()` under the lock; once more with the caches built anew when a part vanished under it."""
        with self._lock:
            try:
                return work()
            except (QueryError, FileNotFoundError) as exc:
                if "No such file" not in str(exc) and not isinstance(exc, FileNotFoundError):
                    raise
                self._current(refresh=True)
                return work()

    def sql(self, query: str) -> list[dict[str, Any]]:
        """Code's read-only SQL (never a user's) as rows."""
        return self._query(lambda con, left: run_query(self.store, query, con=con, timeout=left).to_pylist())

    # ------------------------------------------------------------------------------------ pages

    def _window(self, where: str, hits: pa.Array | None, sort: str, desc: bool, offset: int, limit: int
                ) -> tuple[list[dict[str, Any]], int]:
        """Rows [offset, offset + limit) of the list matching `where` and the search `hits` (None: no
        search) in the (sort, desc) order, and how many match in all. The one selection of the list:
        the served pages and the export both read it. Without a WHERE it is the cached list's (under the
        lock); with one, or above CACHE_MAX_ROWS, queries on a lent connection."""
        if not where:
            def cached() -> tuple[list[dict[str, Any]], int] | None:
                snap = self._snap()
                if snap is None:
                    return None
                if hits is not None:  # the cached list's order for this sort, kept to the hits (once per search)
                    order = self._searched_order(snap, hits, sort, desc)
                    return snap.table.take(order[offset: offset + limit]).to_pylist(), len(order)
                order = self._order(snap, sort, desc)[offset: offset + limit]
                return snap.table.take(order).to_pylist(), snap.table.num_rows

            done = self._cached(cached)
            if done is not None:
                return done
        return self._query(lambda con, left: self._window_sql(con, left, where, hits, sort, desc, offset, limit))

    def _window_sql(self, con: duckdb.DuckDBPyConnection, left: float, where: str, hits: pa.Array | None,
                    sort: str, desc: bool, offset: int, limit: int) -> tuple[list[dict[str, Any]], int]:
        """`_window` by queries on `con` within `left` seconds."""
        deadline = time.monotonic() + left

        def select(columns: str, order_by: str | None = None) -> pa.Table:
            return select_where(self.store, where or None, columns=columns, order_by=order_by, con=con,
                                timeout=max(0.001, deadline - time.monotonic()))

        if hits is not None:
            # The hits are an id set from the search index: the WHERE's rows are narrowed to them and
            # sorted and paged here; the SQL checker admits no outside table.
            table = select(LIST_COLUMNS)
            table = table.filter(pc.is_in(table.column("id"), value_set=hits))
            order = _sort_indices(table, sort, desc)[offset: offset + limit]
            return table.take(order).to_pylist(), table.num_rows
        # one scan: the window's rows, each carrying the count of all matching rows
        direction = "DESC" if desc else "ASC"
        order_by = f"{SORTS[sort]} {direction} NULLS LAST, id ASC LIMIT {int(limit)} OFFSET {int(offset)}"
        rows = select(LIST_COLUMNS + ", count(*) OVER () AS _n", order_by).to_pylist()
        if rows:
            total = rows[0]["_n"]
            for row in rows:
                del row["_n"]
            return rows, total
        # past the end (or nothing matches): the count alone
        return [], select("count(*) AS n").column(0)[0].as_py()

    def list_page(self, where: str = "", sort: str | None = None, desc: bool = True, page: int = 1,
                  per_page: int = PER_PAGE, search: str = "") -> ListPage:
        """One page of the trajectory list, sorted by a whitelisted column and filtered by the user's
        WHERE (through omrl.store.sql_check's checker) and text `search` (omrl.store.search: a message matches it); a
        refused or failing filter comes back as `error`. A page past the last shows the last."""
        sort = _sort(sort)
        where = (where or "").strip()
        search = (search or "").strip()
        per_page = max(1, min(int(per_page), MAX_PER_PAGE))
        page = max(1, int(page))
        try:
            hits = self._search_ids(search) if search else None
            rows, total = self._window(where, hits, sort, desc, (page - 1) * per_page, per_page)
            pages = max(1, math.ceil(total / per_page))
            current = min(page, pages)
            if current != page and total:
                rows, total = self._window(where, hits, sort, desc, (current - 1) * per_page, per_page)
        except (QueryError, UsageError) as exc:  # a refused WHERE or search query, shown beside its box
            source = "where" if isinstance(exc, QueryError) else "search"
            return ListPage([], 0, 1, 1, sort, desc, where, error=str(exc), search=search, error_in=source)
        return ListPage(rows, total, current, max(1, math.ceil(total / per_page)), sort, desc, where,
                        search=search)

    def selection(self, where: str | None = None, search: str | None = None, limit: int = 1000
                  ) -> tuple[list[dict[str, Any]], int]:
        """The first `limit` rows of the list the viewer shows for this WHERE and search in its default
        order (newest first), and how many match in all (for --export). Refused filters raise."""
        where, search = (where or "").strip(), (search or "").strip()
        hits = self._search_ids(search) if search else None
        return self._window(where, hits, DEFAULT_SORT, True, 0, int(limit))

    def annotations(self, ids: list[str]) -> dict[str, list[ShownAnnotation]]:
        """The annotations of these trajectories, newest first, by trajectory id (read from their row
        groups through the index; one query when there is none)."""
        if not ids:
            return {}
        out: dict[str, list[ShownAnnotation]] = {i: [] for i in ids}

        def indexed() -> bool:
            index = self._note_index()
            if index is None:
                return False
            for tid in out:
                out[tid] = _newest_first(self._note_rows.read(index.get(tid, []), ANNOTATION_FIELDS))
            return True

        if self._cached(indexed):
            return out
        values = ", ".join(quote_literal(i) for i in ids)
        for a in self.sql(f"SELECT trajectory_id, {ANNOTATION_COLUMNS} FROM annotations "
                          f"WHERE trajectory_id IN ({values}) ORDER BY created_at DESC, annotator"):
            out[a.pop("trajectory_id")].append(a)
        return out

    def trajectory(self, trajectory_id: str, annotations: list[ShownAnnotation] | None = None
                   ) -> ShownTrajectory | None:
        """One trajectory row, with `annotations` (read unless given), `children` (rows derived from it)
        and `parent_exists`."""
        tid = quote_literal(trajectory_id)
        rows = self._indexed([trajectory_id])
        if rows is None:
            rows = self.sql(f"SELECT * FROM trajectories WHERE id = {tid} LIMIT 1")
        if not rows:
            return None
        row = rows[0]
        row["annotations"] = annotations if annotations is not None else self.annotations([trajectory_id])[
            trajectory_id]
        parent = row.get("parent_id")
        snap = self._snapshot
        if snap is not None:
            with self._lock:
                row["children"] = snap.children(trajectory_id)
            row["parent_exists"] = bool(parent) and parent in snap.where
            return row
        row["children"] = self.sql(
            f"SELECT id, source, reward, success FROM trajectories WHERE parent_id = {tid} ORDER BY id")
        row["parent_exists"] = bool(parent) and bool(self.sql(
            f"SELECT 1 AS x FROM trajectories WHERE id = {quote_literal(parent)} LIMIT 1"))
        return row

    def storage_order(self, ids: list[str]) -> list[str]:
        """`ids` in the order their rows lie in the parts (so a pass reads each row group once)."""
        snap = self._cached(self._snap)
        if snap is None:
            return list(ids)
        far = ("\uffff", 0, 0)
        return sorted(ids, key=lambda i: snap.where.get(i, far))

    def _indexed(self, ids: list[str]) -> list[TrajectoryRow] | None:
        """`_rows` under the lock, with the index built again once when a part vanished."""
        return self._cached(lambda: self._rows(ids))

    def _group_ids(self, group_id: str) -> list[str] | None:
        def ids() -> list[str] | None:
            snap = self._snap()
            return None if snap is None else list(snap.groups.get(group_id, []))

        return self._cached(ids)

    def group(self, group_id: str) -> Group | None:
        """The samples of one GRPO group with their group-relative advantages, as GRPO computes them."""
        ids = self._group_ids(group_id)
        full = self._indexed(ids) if ids is not None else None
        if full is not None:
            rows = sorted((_group_sample(r) for r in full),
                          key=lambda r: (r["sample"] is None, r["sample"] or 0, r["id"]))
        else:
            rows = self.sql(f"SELECT {GROUP_COLUMNS} FROM trajectories "
                            f"WHERE group_id = {quote_literal(group_id)} ORDER BY sample, id")
        if not rows:
            return None
        for row in rows:
            row["advantage"] = None  # no reward: GRPO cannot use the sample
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
        """Counts by env, status and model; episodes, success and mean reward per run and round (kept
        until the parts change)."""
        with self._lock:
            self._current()
            parts = self._parts
        if self._runs is not None and self._runs[0] == parts:
            return self._runs[1]
        figures = self._runs_figures()
        self._runs = (parts, figures)
        return figures

    def _runs_figures(self) -> dict[str, Any]:
        rate = success_sql(4)
        counts = {
            key: self.sql(f"SELECT coalesce(CAST({key} AS VARCHAR), '(none)') AS name, count(*) AS n "
                          f"FROM trajectories GROUP BY 1 ORDER BY n DESC, name LIMIT 50")
            for key in ("env", "status", "model", "source")
        }
        rounds = self.sql(
            f"SELECT run_id, round, {EXPERT_SQL} AS expert, count(*) AS n, avg(reward) AS mean_reward, {rate} "
            "FROM trajectories GROUP BY run_id, round, expert ORDER BY expert DESC, run_id, round")
        by_round = self.sql(  # the policy's rounds only: the expert's episodes are its own series (`expert`)
            f"SELECT round, count(*) AS n, avg(reward) AS mean_reward, {rate} "
            f"FROM trajectories WHERE NOT {EXPERT_SQL} GROUP BY round ORDER BY round")
        expert = self.sql(f"SELECT 'expert' AS round, true AS expert, count(*) AS n, avg(reward) AS mean_reward, "
                          f"{rate} FROM trajectories WHERE {EXPERT_SQL} HAVING count(*) > 0")
        total = self.sql("SELECT count(*) AS n, count(DISTINCT group_id) AS groups FROM trajectories")[0]
        annotations = self.sql(
            "SELECT annotator, count(*) FILTER (WHERE status = 'ok') AS n, "
            "count(*) FILTER (WHERE status IS DISTINCT FROM 'ok') AS errors, "
            "avg(score) FILTER (WHERE status = 'ok') AS mean_score FROM annotations "
            "GROUP BY annotator ORDER BY annotator")
        # per GRPO/PPO step of the rollouts stored by the trainers (omrl.report's one query for it)
        steps = self.sql(STEPS_SQL)
        agreement = flag_agreement(self.sql(AGREEMENT_SQL))  # judge vs environment, omrl report's rule
        step_agreement = flag_step_agreement(self.sql(STEP_AGREEMENT_SQL)) if steps else []
        return {"counts": counts, "rounds": rounds, "by_round": by_round, "expert": expert, "total": total,
                "annotations": annotations, "steps": steps, "agreement": agreement,
                "step_agreement": step_agreement}
