"""The viewer's confined DuckDB connections: a few, each lent to one query at a time, so a slow query (a
user's WHERE) holds only its own connection and the other pages go on with the rest."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import duckdb

from omrl.store import Store
from omrl.store.query import close, connect
from omrl.store.query_limits import QueryError, QueryLimits


class ConnectionPool:
    """At most `size` connections from omrl.store.query.connect (each with `limits`), kept while the store's parts
    stay as they were (`renew` when they change). They are made when first needed, or with `keep_filled`
    ahead of need by a background thread (`fill`): making one takes a while (a second on a busy machine),
    which a page that finds the others busy would otherwise wait."""

    def __init__(self, store: Store, limits: QueryLimits, size: int, keep_filled: bool = False):
        self.store, self.limits, self.size, self.keep_filled = store, limits, max(1, size), keep_filled
        self._changed = threading.Condition()
        self._idle: list[tuple[duckdb.DuckDBPyConnection, int]] = []  # (connection, generation)
        self._lent = 0  # lent out, or being made by `fill`
        self._generation = 0
        self._closed = False
        self._filler: threading.Thread | None = None

    def renew(self) -> None:
        """The parts changed: connections made from now on list them again; idle ones are closed now, lent
        ones when they come back."""
        with self._changed:
            self._generation += 1
            idle, self._idle = self._idle, []
        for con, _ in idle:
            close(con)
        if self.keep_filled:
            self.fill()

    def fill(self) -> None:
        """Make the missing connections in a background thread (one at a time, until `size` exist)."""
        with self._changed:
            if self._closed or (self._filler is not None and self._filler.is_alive()):
                return
            self._filler = threading.Thread(target=self._fill, name="omrl-view-connections", daemon=True)
            self._filler.start()

    def _fill(self) -> None:
        while True:
            with self._changed:
                if self._closed or len(self._idle) + self._lent >= self.size:
                    return
                self._lent += 1  # this slot is being made: a page wanting one waits for it
                generation = self._generation
            con = None
            try:
                con = connect(self.store, self.limits, isolated=True)
            except Exception:  # noqa: BLE001 - the same failure reaches the next page that lends one
                return
            finally:
                self._returned(con, generation)

    @contextmanager
    def lend(self, timeout: float) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection for the block; waits at most `timeout` seconds for one to come back when all `size`
        are lent (QueryError then)."""
        deadline = time.monotonic() + timeout
        con = None
        with self._changed:
            while not self._idle and self._lent >= self.size:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    raise QueryError(f"the viewer is busy: its {self.size} query connections are all running "
                                     "other pages' queries; try again")
                self._changed.wait(left)
            if self._idle:
                con, generation = self._idle.pop()
            else:
                generation = self._generation
            self._lent += 1
        try:
            if con is None:
                con = connect(self.store, self.limits, isolated=True)
            yield con
        finally:
            self._returned(con, generation)

    def _returned(self, con: duckdb.DuckDBPyConnection | None, generation: int) -> None:
        """A lent slot comes back: its connection stays idle while the pool is open and of the same
        generation, else is closed; a waiting page is woken either way."""
        with self._changed:
            self._lent -= 1
            keep = con is not None and generation == self._generation and not self._closed
            if keep:
                self._idle.append((con, generation))
            self._changed.notify()
        if con is not None and not keep:
            close(con)

    def close(self) -> None:
        """Close the idle connections now and the lent ones as they come back."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
            filler = self._filler
        if filler is not None:
            filler.join()
        self.renew()
