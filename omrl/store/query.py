"""The SQL layer: DuckDB views over a store, and confined, read-only query execution.

Views: trajectories, messages (one row per message), turns, tool_calls (read from each part's flat side
file where it has one: omrl.store.layout), annotations,
latest_annotations (newest per trajectory and annotator), scores (latest ok scores pivoted, one
column per annotator), groups (per group_id: n, mean and std of reward, success rate).

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
import json
import math
import os
import re
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from omrl.errors import OmrlError
from omrl.schema import SCHEMAS, conform
from omrl.store.layout import TOOL_CALLS_SCHEMA
from omrl.store.parts import retry_vanished

if TYPE_CHECKING:  # a type only: any store; a query needs only the reading half of Store
    from omrl.store.parts import StoreReader as Store

T = TypeVar("T")

READ_ONLY_STATEMENTS = {"SELECT", "EXPLAIN"}
VIEWS = ("trajectories", "messages", "turns", "tool_calls", "annotations", "latest_annotations", "scores",
         "groups")
DEFAULT_TIMEOUT_S = 60.0
MAX_TIMEOUT_S = 1e6  # past this a timer cannot wait (threading's clock overflows); refused like inf and nan
TEMP_PREFIX = "omrl-duckdb-"  # a connection's own temporary folder (spilling): a host path no query may show

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


# ---------------------------------------------------------------------------------------- limits

MEMORY_ENV = "OMRL_QUERY_MEMORY"
THREADS_ENV = "OMRL_QUERY_THREADS"
DEFAULT_MEMORY_SHARE = 0.25  # of the machine's (or its cgroup's) memory; DuckDB alone would take 80%
MIN_MEMORY_MB = 64
REINTERRUPT_S = 0.2  # a stopped query is interrupted again this often until it has ended
RESULT_BATCH_ROWS = 10_000  # rows a result is streamed in: the memory cap is checked after each batch
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(%|[kmgt]i?b?|b)?\s*", re.IGNORECASE)
_MB_PER_UNIT = {"b": 1 / 2**20, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024**2}


@dataclass(frozen=True)
class QueryLimits:
    """What one confined connection may use: memory (DuckDB's memory_limit, and separately its result) and
    worker threads."""

    memory_mb: int
    threads: int

    def share(self, connections: int) -> QueryLimits:
        """Each connection's part when `connections` of them share these limits (the viewer's)."""
        n = max(1, connections)
        return QueryLimits(max(MIN_MEMORY_MB, self.memory_mb // n), max(1, self.threads // n))


def machine_memory_mb() -> int:
    """The memory this process can have: the machine's, or less where its cgroup (v2) sets memory.max."""
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            group = next((line.split(":", 2)[2].strip() for line in f if line.startswith("0::")), "/")
        with open(f"/sys/fs/cgroup{group.rstrip('/')}/memory.max", encoding="utf-8") as f:
            total = min(total, int(f.read().strip()))  # "max": no limit (ValueError, the machine's)
    return total >> 20


def machine_threads() -> int:
    """The CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def parse_memory(text: str | int | float, source: str = "--query-memory") -> int:
    """A memory size in MB from "2GB", "512MB", "1.5G", "25%" (of machine_memory_mb) or a plain number (MB)."""
    match = _SIZE.fullmatch(str(text))
    if not match:
        raise QueryError(f"{source}: {text!r} is not a memory size; give e.g. 2GB, 512MB or 25% (of this "
                         "machine's memory)")
    number, unit = float(match.group(1)), (match.group(2) or "m").lower()
    mb = machine_memory_mb() * number / 100 if unit == "%" else number * _MB_PER_UNIT[unit[0]]
    if not MIN_MEMORY_MB <= mb <= machine_memory_mb():
        raise QueryError(f"{source}: {text!r} is {mb:.0f} MB; give between {MIN_MEMORY_MB} MB and this "
                         f"machine's {machine_memory_mb()} MB")
    return int(mb)


def parse_threads(text: str | int, source: str = "--query-threads") -> int:
    """A positive number of threads."""
    try:
        threads = int(str(text).strip())
    except ValueError:
        threads = 0
    if threads < 1:
        raise QueryError(f"{source}: {text!r} is not a positive number of threads")
    return threads


_LIMITS: QueryLimits | None = None  # a command's --query-memory / --query-threads while it runs


def query_limits() -> QueryLimits:
    """The limits of a new connection: the running command's flags, else OMRL_QUERY_MEMORY and
    OMRL_QUERY_THREADS, else DEFAULT_MEMORY_SHARE of the memory and every CPU."""
    if _LIMITS is not None:
        return _LIMITS
    memory, threads = os.environ.get(MEMORY_ENV, "").strip(), os.environ.get(THREADS_ENV, "").strip()
    return QueryLimits(
        parse_memory(memory, MEMORY_ENV) if memory else max(MIN_MEMORY_MB,
                                                             int(machine_memory_mb() * DEFAULT_MEMORY_SHARE)),
        parse_threads(threads, THREADS_ENV) if threads else machine_threads())


@contextlib.contextmanager
def limits_in_force(memory_mb: int | None = None, threads: int | None = None) -> Iterator[QueryLimits]:
    """Every connection made meanwhile gets these limits (None: as before); restored afterwards."""
    global _LIMITS
    saved = _LIMITS
    base = query_limits()
    _LIMITS = QueryLimits(memory_mb or base.memory_mb, threads or base.threads)
    try:
        yield _LIMITS
    finally:
        _LIMITS = saved


# ------------------------------------------------------------------------------------ the connection


class _OwnThreadScans(ds.FileSystemDataset):
    """A dataset whose scans decode Parquet in the thread that reads them, not in pyarrow's process-wide
    thread pool (DuckDB asks a dataset for its scanner through its class, so this reaches every scan)."""

    def scanner(self, *args, **kwargs):
        return super().scanner(*args, **{**kwargs, "use_threads": False})


def _parts_dataset(store: Store, files: list, schema: pa.Schema, isolated: bool = False) -> ds.Dataset:
    """Parquet files of the store as one pyarrow dataset, opened through the store's storage (local disk or
    S3: omrl.store.storage), so that DuckDB scans Arrow and never opens a path itself. `isolated`: its scans
    decode in the query's own threads (_OwnThreadScans)."""
    dataset = ds.dataset([store.storage.arrow_path(p) for p in files], schema=schema, format=_PARQUET,
                         filesystem=store.storage.filesystem)
    if not isolated:
        return dataset
    return _OwnThreadScans(list(dataset.get_fragments()), schema=dataset.schema, format=dataset.format,
                           filesystem=dataset.filesystem)


# Page checksums verified (omrl writes them: layout.write_parquet), so a flipped bit in a page fails
# the query (naming the file: _user_error) instead of changing an answer.
_PARQUET = ds.ParquetFileFormat(
    default_fragment_scan_options=ds.ParquetFragmentScanOptions(page_checksum_verification=True))


def _register_table(con: duckdb.DuckDBPyConnection, store: Store, table: str, isolated: bool = False) -> str:
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
        con.register(name, _parts_dataset(store, parts, full, isolated))
    return f"SELECT * FROM {name}"


def _register_tool_calls(con: duckdb.DuckDBPyConnection, store: Store, isolated: bool = False) -> str:
    """The `tool_calls` rows: read flat from the parts' side files; parts without one (v1 parts, a side
    file lost) are unnested as before, with the same columns and values."""
    sides, lacking = store.side_files("tool_calls")
    con.register("_omrl_tool_calls_side", _parts_dataset(store, sides, TOOL_CALLS_SCHEMA, isolated)
                 if sides else TOOL_CALLS_SCHEMA.empty_table())
    schema = SCHEMAS["trajectories"]
    con.register("_omrl_trajectories_unflattened", _parts_dataset(store, lacking, schema, isolated)
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
        _define_views(con, store, isolated)
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


def _define_views(con: duckdb.DuckDBPyConnection, store: Store, isolated: bool = False) -> None:
    con.execute(f"CREATE VIEW trajectories AS {_register_table(con, store, 'trajectories', isolated)}")
    con.execute(f"CREATE VIEW annotations AS {_register_table(con, store, 'annotations', isolated)}")
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
    con.execute(f"CREATE VIEW tool_calls AS {_register_tool_calls(con, store, isolated)}")
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
        raise QueryError("refused: this DuckDB connection is not confined; make it with omrl.store.query.connect")
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


# How a removed part fails inside a scan: the OS's message (local parts), pyarrow's S3 client's (omrl.store.storage),
# and a GET cut off mid-body (moto's server does that when a compaction deletes the object being read; a
# fresh listing reads the merged part instead, and a failure that persists still surfaces after the retries).
_VANISHED_MESSAGES = ("No such file or directory", "The specified key does not exist", "Path does not exist",
                      "AWS Error RESOURCE_NOT_FOUND", "AWS Error NO_SUCH_KEY",
                      "AWS Error INTERNAL_FAILURE during GetObject")


_MEMORY_HINT = "raise the cap with --query-memory or OMRL_QUERY_MEMORY"


def _user_error(exc: duckdb.Error, store: Store) -> QueryError:
    message = _one_line(exc)
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


def check_timeout(limit: float) -> float:
    """A query time limit in seconds: finite, positive and at most MAX_TIMEOUT_S (QueryError otherwise)."""
    if not (isinstance(limit, int | float) and math.isfinite(limit) and 0 < limit <= MAX_TIMEOUT_S):
        raise QueryError(f"the query time limit must be a positive number of seconds up to {MAX_TIMEOUT_S:g}, "
                         f"not {limit}")
    return float(limit)


class _Gathered:
    """A result gathered whole from its batches, refused once it outgrows `cap_mb`."""

    def __init__(self, cap_mb: int):
        self.cap_mb, self.batches, self.bytes, self.rows = cap_mb, [], 0, 0

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
                             f"{_one_line(exc)}; run it again") from None
        raise duckdb.Error(str(exc)) from None


class _QueryClock:
    """Interrupts a connection once its query has run `limit` seconds, not counting the time a streamed
    result's batches spend in the caller's sink (writing a big result out is not the query running)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, limit: float):
        self.con, self.limit, self.fired = con, limit, threading.Event()
        self._paused_s, self._paused_at = 0.0, None
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
            self._paused_at = time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                self._paused_s += time.monotonic() - self._paused_at
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
            _check_sources(value, allowed | {node.get("cte_name")})
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
    _check_sources(condition, frozenset(VIEWS))
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
    data = select_where(store, where, view=table, columns=", ".join(_ident(name) for name in names))
    return conform(data, table).select(names)


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
