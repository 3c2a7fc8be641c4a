"""What an OpenAI-compatible endpoint sustains: its stated slots and context length, and an adaptive limit
on the requests omrl keeps in flight to it (used by omrl.llm.client's transport; one Throttle per client and
event loop).

    info = await probe(base_url, api_key)    # omrl.llm.server_info: what the server says about itself
    throttle = Throttle(ceiling=16, info=info)
    async with throttle.slot() as ticket: ...; ticket.done(outcome, units)

What the server says about itself (its slots, its context, vLLM's queue): omrl.llm.server_info.

The limit (`Throttle.limit`) starts at the stated slots, else at START, and moves by what replies show:
- a timeout, a 429 or a 503 halves it (at most once per COOL_S): the server is past what it sustains,
  and a retry then waits here for a slot instead of joining the server's queue;
- a reply that waited in the server's queue lowers it in proportion. Where the server does not say
  (vLLM's waiting count is the better signal, and llama.cpp's slots cap the limit already), a reply that
  overlapped another request counts as queued when it took more than QUEUED times its service time
  (QUEUE_SLACK_S of noise allowed). The service time of a reply of u units of work (completion tokens +
  prompt tokens / 16) is read off the lower envelope of the (units, latency) points of the last WINDOW
  replies: the fastest the server has been for work of that size, a fixed cost per request included
  (below the smallest size seen, never under that reply's latency scaled by size). A one-slot server
  serves requests in turn, so with three in flight the last waits two others' time, while a batching
  server keeps to its envelope. The limit is then multiplied by QUEUED / that ratio: on one slot about
  two requests stay in flight, the next one queued while one is served, so the server never idles and
  none waits more than one other's time. A reply more than BUSY times slower than its own work and that
  of the requests in flight before it (each sized by its own units, so a short reply behind a long one
  is a signal) explains is no signal (a busy machine, other clients);
- a reply within GROW_BELOW times its service time that had work left ahead of it and did not wait for
  it (or a reply alone in flight, or any good reply where the server says what it has), when the whole
  limit was in use, raises it by its square root (fast while far below the ceiling), never above
  `ceiling` (the caller's max_connections) nor the stated slots;
- where vLLM's queue is polled, the limit grows between two polls to at most twice the requests in
  flight at the last poll that found the queue empty, and not at all after one that found it waiting:
  replies come back faster than any poll, and growing on each of them alone ran the limit to 4 times
  what vLLM schedules between two polls.
Requests waiting for a slot here are not on the wire: their time does not count towards the timeout.
A freed slot goes to the request that has waited longest.

Cost: a reply weighs the requests ahead of it only until their work passes what its own latency could
have waited for, and the envelope is drawn once per reply, so the work per request does not grow with the
requests in flight (summing them all took 35 ms of CPU a reply at 256 in flight, 120 ms at 1024).

Memory: a client's next event loop (a training step's rollouts) and the next client of the same endpoint
in this process within MEMORY_S (the next shard's judge, the next benchmark level) go on from the limit
and replies the last one saw (`Throttle.resume`), and do not probe again (`learned`, `remember`).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from omrl.llm.server_info import ServerInfo

START = 1  # requests in flight before the first reply shows what the server sustains (its time alone)
COOL_S = 1.0  # at most one halving per this long: a burst of timeouts is one signal
QUEUED = 2.0  # a reply that took more than this many times its service time (plus the slack) waited too long
GROW_BELOW = 1.2  # ... and one that took at most this many times shows room for more (between: hold)
QUEUE_SLACK_S = 0.05  # latency noise (HTTP, scheduling) allowed before a reply counts as queued
BUSY = 2.0  # a reply this many times slower than its own and the earlier requests' work explains is no signal
POLL_S = 1.0  # vLLM's /metrics at most this often
WINDOW = 64  # replies the service envelope is drawn over
MEMORY_S = 60.0  # a new client of an endpoint goes on from what one active this recently learned


@dataclass
class _Learned:
    """What the clients of one endpoint in this process learned: what it said, the latest adaptive limit."""

    info: ServerInfo | None = None
    throttle: Throttle | None = None
    at: float = 0.0  # when a client last recorded something here


_LEARNED: dict[str, _Learned] = {}


def learned(base_url: str | None) -> tuple[ServerInfo | None, Throttle | None]:
    """What a client of `base_url` in this process learned (see `remember`), if it was active within
    MEMORY_S; else (None, None)."""
    entry = _LEARNED.get(base_url or "")
    if entry is None:
        return None, None
    active = max(entry.at, entry.throttle.last_reply if entry.throttle is not None else 0.0)
    if time.monotonic() - active >= MEMORY_S:
        return None, None
    return entry.info, entry.throttle


def remember(base_url: str | None, *, info: ServerInfo | None = None, throttle: Throttle | None = None) -> None:
    """Record what a client of `base_url` learned (what the endpoint said, its adaptive limit), so the next
    client of it in this process (the next shard's judge, the next benchmark level) does not probe again
    nor start again at START."""
    entry = _LEARNED.setdefault(base_url or "", _Learned())
    entry.info = info or entry.info
    entry.throttle = throttle or entry.throttle
    entry.at = time.monotonic()


def forget() -> None:
    """Forget what every endpoint's clients learned (tests start servers on ports other servers used)."""
    _LEARNED.clear()


def service_time(points: Any, units: float) -> float:
    """The lower envelope of (units, latency) points at `units`: the fastest the server has served that much
    work (see `envelope` and `envelope_time`)."""
    return envelope_time(envelope(points), units)


def envelope(points: Any) -> list[tuple[float, float]]:
    """The lower convex hull of (units, latency) points, by units: computed once per reply, read per request."""
    hull: list[tuple[float, float]] = []
    for point in sorted(set(points)):
        if hull and point[0] == hull[-1][0]:
            continue  # the same size again: the faster one came first in sorted order
        while len(hull) >= 2 and _cross(hull[-2], hull[-1], point) <= 0:
            hull.pop()
        hull.append(point)
    return hull


def envelope_time(hull: list[tuple[float, float]], units: float) -> float:
    """The hull's latency at `units`, extended along its end segments (through the origin for one point).
    Below the smallest size seen it is never under that point's latency scaled by size: a fixed cost per
    request only adds to that, and two noisy points close in size make a steep first segment that would
    reach zero (every small reply then looked queued)."""
    first = hull[0]
    proportional = first[1] * units / first[0] if first[0] > 0 else first[1]
    if len(hull) == 1:
        return proportional
    segment = bisect.bisect_left(hull, (units, -math.inf), 1, len(hull) - 1)
    left, right = hull[segment - 1], hull[segment]  # the segment holding `units`, or an end one beyond
    slope = (right[1] - left[1]) / (right[0] - left[0])
    estimate = left[1] + max(0.0, slope) * (units - left[0])
    if units < first[0]:
        estimate = max(estimate, proportional)
    return max(1e-6, estimate)


def _cross(o: tuple[float, float], a: tuple[float, float], b: tuple[float, float]) -> float:
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


class Ticket:
    """One request's slot: when it started, the requests in flight before it, its work once it came back."""

    def __init__(self, throttle: Throttle, ahead: list[Ticket], index: int):
        self.throttle = throttle
        self.started = time.monotonic()
        self.index = index  # the throttle's count of requests let in, this one included
        self.ahead = ahead  # in the order they started: on one slot it waits for them all
        self.units: float | None = None  # its work, once it came back ok

    @property
    def overlapped(self) -> bool:
        """Another request was in flight at some moment of its life: one ahead of it, or one let in after."""
        return bool(self.ahead) or self.throttle.admitted > self.index

    def done(self, outcome: str, units: float | None = None) -> None:
        """Report how the request went: "ok" (with its units of work), "timeout", "http_<status>", ..."""
        self.throttle._finished(self, outcome, units)


class Throttle:
    """The adaptive limit on requests in flight to one endpoint (see the module docstring). Its work per
    request does not grow with the requests in flight: a reply weighs only as many requests ahead of it as
    its own latency could have waited for, and a freed slot wakes one waiting request, not all."""

    def __init__(self, ceiling: int, info: ServerInfo | None = None, adaptive: bool = True,
                 on_busy_check: Any = None):
        self.ceiling = max(1, int(ceiling))
        self.adaptive = adaptive
        self.info = info or ServerInfo()
        self.limit = float(self._cap() if self.info.slots else min(self._cap(), START)) if adaptive \
            else float(self.ceiling)
        self.in_flight: dict[Ticket, None] = {}  # in the order they started
        self.admitted = 0  # requests let in so far
        self.samples: deque[tuple[float, float]] = deque(maxlen=WINDOW)  # (units, latency) of recent replies
        self._hull: list[tuple[float, float]] | None = None  # envelope(samples), until the next sample
        self.last_cut = -COOL_S
        self.last_reply = time.monotonic()  # when a request last came back ok (or when it was made)
        self.cuts = 0  # halvings (timeouts, 429, 503, vLLM's queue)
        self.queued = 0  # replies that showed they had waited in the server's queue
        self.peak = 0
        self._waiters: deque[asyncio.Future] = deque()  # requests waiting for a slot, first come first served
        self._on_busy_check = on_busy_check  # async () -> waiting count (vLLM), polled every POLL_S
        self._last_poll = 0.0
        self._poll_task: asyncio.Task | None = None
        # With vLLM's queue polled: the most the limit may grow to before the next poll (None: no poll).
        self._polled_cap: float | None = max(2.0, 2 * self.limit) if on_busy_check is not None else None

    def resume(self, earlier: Throttle) -> None:
        """Go on from what `earlier` learned (the same client's limit in a finished event loop, or a recent
        client's of the same endpoint): its limit and recent replies, so a new loop (a training step's
        rollouts) or client (the next shard's judge) does not start again at START."""
        if self.adaptive and earlier.adaptive:
            self.samples.extend(earlier.samples)
            self._hull = None
            # Not capped by this client's ceiling (`allowed` is): a client with a lower one (a judge at
            # concurrency 1) passes on what the endpoint sustains, not its own ceiling.
            self.limit = max(self.limit, earlier.limit)
            self.last_cut = earlier.last_cut
            if self._polled_cap is not None:
                self._polled_cap = max(self._polled_cap, 2.0 * self.limit)

    def set_info(self, info: ServerInfo) -> None:
        """What the server said (probed after the throttle was made): its slots cap the limit."""
        self.info = info
        if self.adaptive and info.slots:
            self.limit = float(self._cap())
            self._wake()

    def _cap(self) -> int:
        return min(self.ceiling, self.info.slots) if self.info.slots else self.ceiling

    @property
    def allowed(self) -> int:
        return max(1, min(int(self.limit), self._cap()))

    @contextlib.asynccontextmanager
    async def slot(self):
        """Hold one of the `allowed` slots for a request (waiting here, not on the wire, in arrival order)."""
        free = not self._waiters and len(self.in_flight) < self.allowed
        ticket = self._admit() if free else await self._wait_turn()
        try:
            yield ticket
        finally:
            self._release(ticket)

    async def _wait_turn(self) -> Ticket:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)  # a cancelled one stays until _wake passes it
        self._wake()  # those ahead may all have been cancelled, with room left
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release(waiter.result())  # let in as it was cancelled: the slot goes to the next
            raise

    def _admit(self) -> Ticket:
        self.admitted += 1
        ticket = Ticket(self, list(self.in_flight), self.admitted)
        self.in_flight[ticket] = None
        self.peak = max(self.peak, len(self.in_flight))
        return ticket

    def _release(self, ticket: Ticket) -> None:
        ticket.ahead = []  # the tickets it waited for are not kept alive by it (nor theirs by them)
        self.in_flight.pop(ticket, None)
        self._wake()

    def _wake(self) -> None:
        """Let waiting requests in, oldest first, while the limit has room."""
        while self._waiters and len(self.in_flight) < self.allowed:
            waiter = self._waiters.popleft()
            if not waiter.done():  # done: cancelled while it waited
                waiter.set_result(self._admit())

    # ------------------------------------------------------------ adapting

    def _cut(self, factor: float, now: float) -> None:
        self.limit = max(1.0, self._effective() * factor)
        self.last_cut = now
        self.cuts += 1

    def _effective(self) -> float:
        """The limit as this client applies it: one carried over above its ceiling shrinks from the ceiling."""
        return min(self.limit, float(self._cap()))

    def _envelope(self) -> list[tuple[float, float]]:
        if self._hull is None:
            self._hull = envelope(self.samples)
        return self._hull

    def _finished(self, ticket: Ticket, outcome: str, units: float | None) -> None:
        if not self.adaptive:
            return
        now = time.monotonic()
        latency = now - ticket.started
        if outcome in ("timeout", "http_429", "http_503"):
            if now - self.last_cut >= COOL_S:
                self._cut(0.5, now)
            return
        if outcome != "ok":
            return
        self.last_reply = now
        if units and units > 0:
            ticket.units = units
            guess = self.info.kind is None and ticket.overlapped  # the server does not say: replies tell
            hull = self._envelope() if guess and self.samples else None
            self.samples.append((units, latency))
            self._hull = None
            if guess and not self._shows_room(ticket, hull, latency):
                return
        if len(self.in_flight) >= self.allowed and self.limit < self._growth_cap():  # the whole limit in use
            self.limit = min(self._growth_cap(), self.limit + math.sqrt(self.limit))
        self._maybe_poll(now)

    def _growth_cap(self) -> float:
        """The most the limit may grow to now: the ceiling and stated slots, and with vLLM's queue polled,
        what the last poll allowed."""
        cap = float(self._cap())
        if self._polled_cap is not None and self.info.kind == "vllm":
            cap = min(cap, self._polled_cap)
        return cap

    def _shows_room(self, ticket: Ticket, hull: list[tuple[float, float]] | None, latency: float) -> bool:
        """Whether a reply that overlapped others lets the limit grow; one that waited in the server's queue
        lowers it here (see the module docstring)."""
        service = envelope_time(hull, ticket.units) if hull else max(latency, 1e-6)
        waited = max(0.0, latency - QUEUE_SLACK_S)
        ratio = waited / service
        # Work ahead beyond what either test below compares it with changes neither answer: stop there.
        span = ticket.started - ticket.ahead[0].started if ticket.ahead else 0.0
        enough = max(waited / BUSY - service, span + max((GROW_BELOW - 1) * service, 2 * (waited - service)))
        ahead_s = self._work_ahead(ticket, hull, service, enough)
        if ratio > BUSY * (service + ahead_s) / service:
            return False  # far slower than waiting behind all of ours explains (a busy machine): no signal
        if ratio > QUEUED:
            self.limit = max(1.0, self._effective() * QUEUED / ratio)  # it waited behind others: fewer at once
            self.queued += 1
            return False
        if ratio > GROW_BELOW:
            return False  # neither clearly queued nor clearly not: the limit stays
        # Room shows only where one slot would have made it wait: work was left ahead of it (a request at
        # the head of the line, or behind one almost done, shows nothing), and it did not wait for that (a
        # long reply that waited for short ones shows no room either).
        left = ahead_s - span
        return left > (GROW_BELOW - 1) * service and waited - service <= left / 2

    def _work_ahead(self, ticket: Ticket, hull: list[tuple[float, float]] | None, service: float,
                    enough: float) -> float:
        """The service time of the requests in flight when `ticket` started (each by its own units once
        known, else by the ticket's), summed oldest first until it passes `enough`: O(1) per reply on a
        server that batches hundreds, where the whole sum cost O(requests in flight) envelope reads."""
        total = 0.0
        for other in ticket.ahead:
            total += envelope_time(hull, other.units) if other.units and hull else service
            if total > enough:
                break
        return total

    def _maybe_poll(self, now: float) -> None:
        if self._on_busy_check is None or self.info.kind != "vllm" or now - self._last_poll < POLL_S:
            return
        if self._poll_task is not None and not self._poll_task.done():
            return
        self._last_poll = now

        async def poll() -> None:
            waiting = await self._on_busy_check()
            if waiting is None:
                self._polled_cap = None  # unreadable: the limit grows on replies alone until a poll reads it
                return
            if waiting:
                self._polled_cap = self._effective()  # hold until a poll finds the queue empty
                if time.monotonic() - self.last_cut >= COOL_S:
                    self._cut(0.75, time.monotonic())  # vLLM's own queue: more in flight would only wait there
                    self._polled_cap = self.limit
            else:
                self._polled_cap = max(2.0, 2.0 * len(self.in_flight))  # all it held ran: room for as many more

        self._poll_task = asyncio.get_running_loop().create_task(poll())
