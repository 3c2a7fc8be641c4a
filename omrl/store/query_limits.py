"""Query limits: the memory and threads of each confined connection (QueryLimits) and a query's time limit;
and QueryError, the error of the whole SQL layer (omrl.store.query, omrl.store.sql_check).

Every connection gets DuckDB's `memory_limit` and `threads`: a quarter of the machine's memory and all its
CPUs unless the command's --query-memory / --query-threads or OMRL_QUERY_MEMORY / OMRL_QUERY_THREADS say
otherwise.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

from omrl.errors import OmrlError

MAX_TIMEOUT_S = 1e6  # past this a timer cannot wait (threading's clock overflows); refused like inf and nan


class QueryError(OmrlError, ValueError):
    """A query that is refused or fails; the message is meant for the user (one line)."""


MEMORY_ENV = "OMRL_QUERY_MEMORY"
THREADS_ENV = "OMRL_QUERY_THREADS"
DEFAULT_MEMORY_SHARE = 0.25  # of the machine's (or its cgroup's) memory; DuckDB alone would take 80%
MIN_MEMORY_MB = 64
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


def check_timeout(limit: float) -> float:
    """A query time limit in seconds: finite, positive and at most MAX_TIMEOUT_S (QueryError otherwise)."""
    if not (isinstance(limit, int | float) and math.isfinite(limit) and 0 < limit <= MAX_TIMEOUT_S):
        raise QueryError(f"the query time limit must be a positive number of seconds up to {MAX_TIMEOUT_S:g}, "
                         f"not {limit}")
    return float(limit)
