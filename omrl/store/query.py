"""The SQL layer: confined, read-only query execution over a store's views (omrl.store.views).

The pieces below it: omrl.store.views (the views), omrl.store.sql_check (the statement check and the
--where checker), omrl.store.query_limits (memory, threads, time limit; QueryError).

Confinement is a property of the connection, not of the statement check: `connect` is the one
factory (for `omrl query`, `Store.sql`, `Store.connect` and every `--where`). DuckDB itself opens no
file: the parts are handed to it as pyarrow datasets, and external access is then switched off with
no allowed path, extension install/load off and the configuration locked. So no statement, whatever
wraps it (`EXPLAIN ANALYZE` runs what it wraps), can read a file, reach the network, load an
extension or write anywhere but the connection's own temporary folder (for spilling), which omrl makes
and removes. The statement check (SELECT and EXPLAIN of a SELECT only) is a second line of defence.

Limits: every connection gets DuckDB's `memory_limit` and `threads` (QueryLimits: a quarter of the
machine's memory and all its CPUs unless the command's --query-memory / --query-threads or OMRL_QUERY_MEMORY
/ OMRL_QUERY_THREADS say otherwise), a result is streamed and refused once it outgrows the same memory cap,
and every query stops at its time limit.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

import duckdb
import pyarrow as pa

from omrl.schema import SCHEMAS, conform
from omrl.store.parts import retry_vanished
from omrl.store.query_limits import QueryError, QueryLimits, check_timeout, query_limits
from omrl.store.sql_check import check_read_only, one_line, where_select
from omrl.store.views import VIEWS, define_views, quote_ident, quote_literal

if TYPE_CHECKING:  # a type only: any store; a query needs only the reading half of Store
    from omrl.store.parts import StoreReader as Store

__all__ = ["QueryError", "QueryLimits", "close", "connect", "quote_literal", "run_query", "select", "select_ids",
           "select_where", "stream_query"]  # QueryError, QueryLimits and quote_literal: from the modules below

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 60.0
TEMP_PREFIX = "omrl-duckdb-"  # a connection's own temporary folder (spilling): a host path no query may show
REINTERRUPT_S = 0.2  # a stopped query is interrupted again this often until it has ended
RESULT_BATCH_ROWS = 10_000  # rows a result is streamed in: the memory cap is checked after each batch

# Set when the database starts, before any statement can run.
_START_CONFIG = {
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "allow_unsigned_extensions": False,
    "allow_persistent_secrets": False,
    "python_enable_replacements": False,  # a query cannot scan the caller's Python variables by name
}


# ------------------------------------------------------------------------------------ the connection


def _remove_temp_dir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


# connection -> the finalizer removing its temporary folder (run by `close`, or when it is collected)
_TEMP_DIRS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Connections `connect` confined (or _check_confined verified): their configuration is locked, so they stay
# confined and are not asked again (asking costs a duckdb_settings() query, ~10 ms, on every user query).
_CONFINED: weakref.WeakSet = weakref.WeakSet()
_LIMITS_OF: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # connection -> its QueryLimits


def close(con: duckdb.DuckDBPyConnection) -> None:
    """Close a connection from `connect` and remove its temporary folder now."""
    con.close()
    finalizer = _TEMP_DIRS.pop(con, None)
    if finalizer is not None:
        finalizer()


def connect(store: Store, limits: QueryLimits | None = None, isolated: bool = False) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the store's views, confined: no file, network or extension
    access, locked configuration, spilling only into its own temporary folder (removed with it), at most
    `limits` (None: query_limits()) of memory and threads. `isolated` (a server's connections): its scans
    decode Parquet in its own query threads, not in pyarrow's pool that every connection of the process
    shares, so one slow query cannot hold up the scans of the others (at the cost of parallel decoding)."""
    limits = limits or query_limits()
    temp_dir = tempfile.mkdtemp(prefix=TEMP_PREFIX)
    try:
        con = duckdb.connect(":memory:", config={**_START_CONFIG, "temp_directory": temp_dir,
                                                 "memory_limit": f"{limits.memory_mb}MB",
                                                 "threads": limits.threads})
    except BaseException:
        _remove_temp_dir(temp_dir)
        raise
    _TEMP_DIRS[con] = weakref.finalize(con, _remove_temp_dir, temp_dir)
    try:
        con.execute("SET enable_progress_bar = false")  # no slow query (the views' own included) draws on a terminal
        define_views(con, store, isolated)
        # Order matters: access is switched off after the start (switched off at the start, DuckDB
        # would allow the in-memory database's own `:memory:*` paths relative to the working folder),
        # allowed_paths is empty and allowed_directories is only the temporary folder.
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")  # nothing above can be switched back on
    except BaseException:
        close(con)
        raise
    _CONFINED.add(con)
    _LIMITS_OF[con] = limits
    return con


def _check_confined(con: duckdb.DuckDBPyConnection) -> None:
    """Refuse a caller's connection that did not come from `connect` (user SQL runs only on confined ones)."""
    if con in _CONFINED:
        return
    settings = dict(con.execute(
        "SELECT name, value FROM duckdb_settings() "
        "WHERE name IN ('enable_external_access', 'lock_configuration')").fetchall())
    if settings != {"enable_external_access": "false", "lock_configuration": "true"}:
        raise QueryError("refused: this DuckDB connection is not confined; make it with omrl.store.query.connect")
    _CONFINED.add(con)  # locked as confined: it cannot be switched back


# ----------------------------------------------------------------------------------------- running


def _vanished(exc: BaseException) -> bool:
    """A part that a compaction removed while a query ran (listing again finds its rows)."""
    return isinstance(exc, FileNotFoundError) or (
        isinstance(exc, duckdb.Error) and any(m in str(exc) for m in _VANISHED_MESSAGES))


# How a removed part fails inside a scan: the OS's message (local parts), pyarrow's S3 client's (omrl.store.s3),
# and a GET cut off mid-body (moto's server does that when a compaction deletes the object being read; a
# fresh listing reads the merged part instead, and a failure that persists still surfaces after the retries).
_VANISHED_MESSAGES = ("No such file or directory", "The specified key does not exist", "Path does not exist",
                      "AWS Error RESOURCE_NOT_FOUND", "AWS Error NO_SUCH_KEY",
                      "AWS Error INTERNAL_FAILURE during GetObject")


_MEMORY_HINT = "raise the cap with --query-memory or OMRL_QUERY_MEMORY"


def _user_error(exc: duckdb.Error, store: Store) -> QueryError:
    message = one_line(exc)
    if isinstance(exc, duckdb.PermissionException):
        return QueryError("refused: queries read only the store's views (no files, network or extensions) "
                          f"and write nothing; DuckDB said: {message}")
    if isinstance(exc, duckdb.OutOfMemoryException) or message.startswith("Out of Memory Error"):
        first = str(exc).strip().splitlines()[0]  # the rest is DuckDB's advice on settings that are locked
        return QueryError(f"the query needs more memory than its cap: {first}; {_MEMORY_HINT}")
    if _READ_FAILED in message:  # a part's bytes did not decode: say which file (DuckDB cannot)
        from omrl.store.check import damaged_files

        damaged = damaged_files(store)
        if damaged:
            named = "; ".join(f"{p.path}: {p.error}" for p in damaged[:3])
            return QueryError(f"the store has damaged files: {named} (DuckDB said: {message}); "
                              f"`omrl store check {store.path}` lists every problem")
    return QueryError(message)


# How DuckDB reports a failure of the Arrow streams the views read (a page that does not decode).
_READ_FAILED = "reading the stream registered as '_omrl_"


class _Gathered:
    """A result gathered whole from its batches, refused once it outgrows `cap_mb`."""

    def __init__(self, cap_mb: int):
        self.cap_mb, self.bytes, self.rows = cap_mb, 0, 0
        self.batches: list[pa.RecordBatch] = []

    def __call__(self, batch: pa.RecordBatch) -> None:
        self.batches.append(batch)
        self.bytes += batch.nbytes
        self.rows += batch.num_rows
        if self.bytes > self.cap_mb << 20:
            raise QueryError(f"the result passed the query memory cap ({self.cap_mb} MB) after {self.rows:,} "
                             f"rows; select fewer rows or columns (LIMIT, aggregates) or {_MEMORY_HINT}")


def _next_batch(reader: pa.RecordBatchReader, fired: threading.Event, sent: bool) -> pa.RecordBatch | None:
    """The next batch of a streamed result (None at its end). A DuckDB error raised while streaming
    arrives as Arrow's OSError: it is raised as the DuckDB error it was."""
    try:
        return reader.read_next_batch()
    except StopIteration:
        return None
    except OSError as exc:
        if isinstance(exc, FileNotFoundError) and not sent:
            raise
        if fired.is_set():
            raise duckdb.InterruptException(str(exc)) from None
        if sent and _vanished(exc):  # rows went out already: running again would repeat them
            raise QueryError(f"a part of the store was removed (compacted) while the query ran: "
                             f"{one_line(exc)}; run it again") from None
        raise duckdb.Error(str(exc)) from None


class _QueryClock:
    """Interrupts a connection once its query has run `limit` seconds, not counting the time a streamed
    result's batches spend in the caller's sink (writing a big result out is not the query running)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, limit: float):
        self.con, self.limit, self.fired = con, limit, threading.Event()
        self._paused_s = 0.0
        self._paused_at: float | None = None  # when the running pause began
        self._lock = threading.Lock()  # the watch thread reads the two pause fields together
        self._started = time.monotonic()
        self._done = threading.Event()
        self._watch = threading.Thread(target=self._run, name="omrl-query-clock", daemon=True)
        self._watch.start()

    def ran_s(self) -> float:
        now = time.monotonic()
        with self._lock:
            paused = self._paused_s + (now - self._paused_at if self._paused_at is not None else 0.0)
        return now - self._started - paused

    def _run(self) -> None:
        while not self._done.wait(max(0.01, self.limit - self.ran_s())):
            if self.ran_s() >= self.limit:
                self.fired.set()
                break
        # DuckDB drops an interrupt that lands while no query runs (between making the relation and
        # running it, or while a batch is in the sink): it is repeated until the query has ended.
        while not self._done.is_set():
            self.con.interrupt()
            self._done.wait(REINTERRUPT_S)


    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        with self._lock:
            self._paused_at = began = time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                self._paused_s += time.monotonic() - began
                self._paused_at = None

    def stop(self) -> None:
        """Stop watching; once it returns no interrupt reaches the connection's next query."""
        self._done.set()
        self._watch.join()


def _execute(con: duckdb.DuckDBPyConnection, query: str, timeout: float | None,
             sink: Callable[[pa.RecordBatch], None] | None = None) -> pa.Table | None:
    """Run `query`, stopped by `con.interrupt()` once it has run `timeout` seconds (None: DEFAULT_TIMEOUT_S;
    _QueryClock). Its result streams in batches to `sink` (the first one empty when there are no rows), or
    without a sink is returned whole, refused past the connection's memory cap."""
    limit = check_timeout(DEFAULT_TIMEOUT_S if timeout is None else timeout)
    gathered = None
    if sink is None:
        gathered = sink = _Gathered((_LIMITS_OF.get(con) or query_limits()).memory_mb)
    clock = _QueryClock(con, limit)
    reader = None
    try:
        reader = con.sql(query).to_arrow_reader(RESULT_BATCH_ROWS)
        sent = False
        while (batch := _next_batch(reader, clock.fired, sent)) is not None:
            with clock.paused():
                sink(batch)
            sent = True
        if not sent and gathered is None:
            schema = reader.schema
            sink(pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema))
    except duckdb.InterruptException:
        if clock.fired.is_set():
            raise QueryError(f"query ran past {limit:g} s and was stopped (raise the limit with --timeout)"
                             ) from None
        raise
    finally:
        clock.stop()
        if reader is not None:
            reader.close()
    return None if gathered is None else pa.Table.from_batches(gathered.batches, schema=reader.schema)


def _with_connection(store: Store, con: duckdb.DuckDBPyConnection | None,
                     work: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
    """`work` on the caller's confined connection, or on a fresh one that is built again (parts listed
    again) when a compaction removed a part under it."""
    if con is not None:
        _check_confined(con)
        try:
            return work(con)
        except duckdb.Error as exc:
            raise _user_error(exc, store) from None

    def attempt() -> T:
        own = connect(store)
        try:
            return work(own)
        finally:
            close(own)  # a connection made here is not the caller's to reuse

    try:
        return retry_vanished(attempt, _vanished)
    except duckdb.Error as exc:
        raise _user_error(exc, store) from None


def run_query(store: Store, query: str, con: duckdb.DuckDBPyConnection | None = None,
              timeout: float | None = None) -> pa.Table:
    """Execute read-only SQL over a store; returns Arrow (the last statement's result).

    Runs on a confined connection (`con`, which must come from `connect`, or a fresh one) and is
    stopped with a QueryError once it runs past `timeout` seconds (None: DEFAULT_TIMEOUT_S) or its result
    outgrows the connection's memory cap.
    """
    def work(c: duckdb.DuckDBPyConnection) -> pa.Table:
        check_read_only(c, query)
        return _execute(c, query, timeout)

    return _with_connection(store, con, work)


def stream_query(store: Store, query: str, sink: Callable[[pa.RecordBatch], None],
                 con: duckdb.DuckDBPyConnection | None = None, timeout: float | None = None) -> None:
    """`run_query` with the result handed to `sink` batch by batch as it comes (the one batch is empty
    when there are no rows), so a result of any size passes in little memory."""
    def work(c: duckdb.DuckDBPyConnection) -> None:
        check_read_only(c, query)
        _execute(c, query, timeout, sink)

    _with_connection(store, con, work)


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


def select(store: Store, where: str | None = None, columns: list[str] | None = None, *,
           table: str = "trajectories") -> pa.Table:
    """The rows of `table` matching the user's `where` (one checked SQL condition; None or "": every row) as
    `Store.read` returns them: in the store's order, in the table's schema, only `columns` when given.
    DuckDB runs the condition and reads only the rows and columns it needs; with no condition the parts
    are read directly."""
    if table not in SCHEMAS:
        raise QueryError(f"unknown table {table!r}; tables are {', '.join(SCHEMAS)}")
    names = list(columns) if columns else SCHEMAS[table].names
    unknown = [name for name in names if name not in SCHEMAS[table].names]
    if unknown:
        raise QueryError(f"unknown {table} column(s): {', '.join(unknown)}")
    if where is None or where == "":
        return store.read(table, names)
    data = select_where(store, where, view=table, columns=", ".join(quote_ident(name) for name in names))
    return conform(data, table).select(names)


def select_ids(store: Store, where: str, con: duckdb.DuckDBPyConnection | None = None, *,
               view: str = "trajectories", column: str = "id",
               timeout: float | None = None) -> list:
    """The `column` values (ids) of the rows of `view` matching the user's `where` (one checked condition)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", column):
        raise QueryError(f"not a column name: {column!r}")
    if where is None or not where.strip():
        raise QueryError("--where is empty; give one SQL condition, e.g. \"success AND reward > 0.5\"")
    table = select_where(store, where, view=view, columns=quote_ident(column), con=con, timeout=timeout)
    return table.column(0).to_pylist()
