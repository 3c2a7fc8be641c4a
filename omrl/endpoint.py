"""What an OpenAI-compatible endpoint sustains: its stated slots and context length, and an adaptive limit
on the requests omrl keeps in flight to it (used by omrl.llm's transport; one Throttle per client).

    info = await probe(base_url, api_key)    # ServerInfo(kind, slots, context_length), what the server says
    throttle = Throttle(ceiling=16, info=info)
    async with throttle.slot() as ticket: ...; ticket.done(latency_s, outcome, units)

What a server says (each read once, two seconds at most, failures ignored):
- llama.cpp's server: GET /props gives `total_slots` (requests served at once) and the context `n_ctx`.
- vLLM (and SGLang): GET /v1/models gives each model's `max_model_len`; vLLM's GET /metrics has no slot
  count but `vllm:num_requests_waiting`, the requests its scheduler could not take yet, polled while
  requests are in flight (every POLL_S at most): a queue there means more in flight would only wait.
- api.openai.com is not probed.

The limit (`Throttle.limit`) starts at the stated slots, else at START, and moves by what replies show:
- a timeout, a 429 or a 503 halves it (at most once per COOL_S): the server is past what it sustains,
  and a retry then waits here for a slot instead of joining the server's queue;
- a reply that waited in the server's queue lowers it in proportion. Where the server does not say
  (vLLM's waiting count is the better signal, and llama.cpp's slots cap the limit already), a reply that
  overlapped another request counts as queued when it took more than QUEUED times its service time
  (QUEUE_SLACK_S of noise allowed). The service time of a reply of u units of work (completion tokens +
  prompt tokens / 16) is read off the lower envelope of the (units, latency) points of the last WINDOW
  replies: the fastest the server has been for work of that size, a fixed cost per request included. A
  one-slot server serves requests in turn, so with three in flight the last waits two others' time, while
  a batching server keeps to its envelope. The limit is then multiplied by QUEUED / that ratio: on one
  slot about two requests stay in flight, the next one queued while one is served, so the server never
  idles and none waits more than one other's time. A reply more than BUSY times slower than its own work
  and that of the requests in flight before it (each sized by its own units, so a short reply behind a
  long one is a signal) explains is no signal (a busy machine, other clients);
- a reply within GROW_BELOW times its service time that had work left ahead of it and did not wait for
  it (or a reply alone in flight, or any good reply where the server says what it has), when the whole
  limit was in use, raises it by
  its square root (fast while far
  below the ceiling), never above `ceiling` (the caller's max_connections) nor the stated slots.
Requests waiting for a slot here are not on the wire: their time does not count towards the timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
from collections import deque
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

START = 1  # requests in flight before the first reply shows what the server sustains (its time alone)
COOL_S = 1.0  # at most one halving per this long: a burst of timeouts is one signal
QUEUED = 2.0  # a reply that took more than this many times its service time (plus the slack) waited too long
GROW_BELOW = 1.2  # ... and one that took at most this many times shows room for more (between: hold)
QUEUE_SLACK_S = 0.05  # latency noise (HTTP, scheduling) allowed before a reply counts as queued
BUSY = 2.0  # a reply this many times slower than its own and the earlier requests' work explains is no signal
POLL_S = 2.0  # vLLM's /metrics at most this often
WINDOW = 64  # replies the service envelope is drawn over
_WAITING = re.compile(r"^vllm:num_requests_waiting(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$", re.MULTILINE)


@dataclass
class ServerInfo:
    """What an endpoint says about itself; None where it says nothing."""

    kind: str | None = None  # "llama.cpp", "vllm", "openai" (api.openai.com), or None
    slots: int | None = None  # requests it serves at once
    context_length: int | None = None  # tokens of prompt and completion together


def is_openai_com(base_url: str | None) -> bool:
    """api.openai.com (also the client's default when no base URL is set)."""
    if not base_url:
        return True
    host = urlparse(base_url).hostname or ""
    return host == "openai.com" or host.endswith(".openai.com")


def server_root(base_url: str) -> str:
    """The server's root URL: the base URL without its /v1."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


async def _get_json(client: Any, url: str) -> Any:
    try:
        response = await client.get(url)
        return response.json() if response.status_code == 200 else None
    except Exception:  # a server that does not have this endpoint, or says it in a way we cannot read
        return None


async def probe(base_url: str | None, api_key: str | None, model: str | None = None,
                timeout: float = 2.0) -> ServerInfo:
    """Ask the endpoint for its slots and context length (see the module docstring); never raises."""
    if is_openai_com(base_url):
        return ServerInfo(kind="openai")  # a hosted service: its rate limits answer 429, its latency varies
    info = ServerInfo()
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    root = server_root(base_url)
    async with httpx.AsyncClient(timeout=timeout, headers=headers) as client:
        props = await _get_json(client, f"{root}/props")
        if isinstance(props, dict) and _positive_int(props.get("total_slots")):
            info.kind, info.slots = "llama.cpp", props["total_slots"]
            settings = props.get("default_generation_settings")
            n_ctx = (settings.get("n_ctx") if isinstance(settings, dict) else None) or props.get("n_ctx")
            info.context_length = _positive_int(n_ctx)
        models = await _get_json(client, f"{base_url.rstrip('/')}/models")
        entries = models.get("data") if isinstance(models, dict) else None
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, dict) and (model is None or entry.get("id") == model or len(entries) == 1):
                info.context_length = info.context_length or _positive_int(entry.get("max_model_len"))
                if entry.get("owned_by") == "vllm":
                    info.kind = info.kind or "vllm"
        if info.kind is None:
            try:
                response = await client.get(f"{root}/metrics")
                if response.status_code == 200 and "vllm:" in response.text:
                    info.kind = "vllm"
            except Exception:  # no metrics: nothing more to learn
                pass
    return info


async def vllm_waiting(base_url: str, api_key: str | None, timeout: float = 2.0) -> int | None:
    """Requests vLLM's scheduler holds waiting (its /metrics), or None when it cannot be read."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with httpx.AsyncClient(timeout=timeout, headers=headers) as client:
            response = await client.get(f"{server_root(base_url)}/metrics")
    except Exception:
        return None
    found = _WAITING.findall(response.text) if response.status_code == 200 else []
    return int(sum(float(v) for v in found)) if found else None


def service_time(points: Any, units: float) -> float:
    """The lower envelope of (units, latency) points at `units`: the fastest the server has served that much
    work (its lower convex hull, extended along its end segments; through the origin for a single point)."""
    hull: list[tuple[float, float]] = []
    for point in sorted(set(points)):
        if hull and point[0] == hull[-1][0]:
            continue  # the same size again: the faster one came first in sorted order
        while len(hull) >= 2 and _cross(hull[-2], hull[-1], point) <= 0:
            hull.pop()
        hull.append(point)
    if len(hull) == 1:
        return hull[0][1] * units / hull[0][0] if hull[0][0] > 0 else hull[0][1]
    segment = next((i for i in range(1, len(hull)) if units <= hull[i][0]), len(hull) - 1)
    left, right = hull[segment - 1], hull[segment]  # the segment holding `units`, or an end one beyond
    slope = (right[1] - left[1]) / (right[0] - left[0])
    return max(1e-6, left[1] + max(0.0, slope) * (units - left[0]))


def _cross(o: tuple[float, float], a: tuple[float, float], b: tuple[float, float]) -> float:
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


class Ticket:
    """One request's slot; `overlapped`: another request was in flight at some moment of its life."""

    def __init__(self, throttle: Throttle, ahead: list[Ticket]):
        self.throttle = throttle
        self.started = time.monotonic()
        self.overlapped = bool(ahead)
        self.ahead = ahead  # the requests in flight when it started: on one slot it waits for them all
        self.units: float | None = None  # its work, once it came back ok

    def done(self, outcome: str, units: float | None = None) -> None:
        """Report how the request went: "ok" (with its units of work), "timeout", "http_<status>", ..."""
        self.throttle._finished(self, outcome, units)


class Throttle:
    """The adaptive limit on requests in flight to one endpoint (see the module docstring)."""

    def __init__(self, ceiling: int, info: ServerInfo | None = None, adaptive: bool = True,
                 on_busy_check: Any = None):
        self.ceiling = max(1, int(ceiling))
        self.adaptive = adaptive
        self.info = info or ServerInfo()
        self.limit = float(self._cap() if self.info.slots else min(self._cap(), START)) if adaptive \
            else float(self.ceiling)
        self.in_flight: set[Ticket] = set()
        self.samples: deque[tuple[float, float]] = deque(maxlen=WINDOW)  # (units, latency) of recent replies
        self.last_cut = -COOL_S
        self.cuts = 0  # halvings (timeouts, 429, 503, vLLM's queue)
        self.queued = 0  # replies that showed they had waited in the server's queue
        self.peak = 0
        self._changed: asyncio.Condition | None = None
        self._on_busy_check = on_busy_check  # async () -> waiting count (vLLM), polled every POLL_S
        self._last_poll = 0.0
        self._poll_task: asyncio.Task | None = None

    def set_info(self, info: ServerInfo) -> None:
        """What the server said (probed after the throttle was made): its slots cap the limit."""
        self.info = info
        if self.adaptive and info.slots:
            self.limit = float(self._cap())

    def _cap(self) -> int:
        return min(self.ceiling, self.info.slots) if self.info.slots else self.ceiling

    @property
    def allowed(self) -> int:
        return max(1, int(self.limit))

    @contextlib.asynccontextmanager
    async def slot(self):
        """Hold one of the `allowed` slots for a request (waiting here, not on the wire)."""
        if self._changed is None:
            self._changed = asyncio.Condition()
        async with self._changed:
            await self._changed.wait_for(lambda: len(self.in_flight) < self.allowed)
            ticket = Ticket(self, list(self.in_flight))
            for other in self.in_flight:
                other.overlapped = True
            self.in_flight.add(ticket)
            self.peak = max(self.peak, len(self.in_flight))
        try:
            yield ticket
        finally:
            ticket.ahead = []  # the tickets it waited for are not kept alive by it (nor theirs by them)
            async with self._changed:
                self.in_flight.discard(ticket)
                self._changed.notify_all()

    # ------------------------------------------------------------ adapting

    def _cut(self, factor: float, now: float) -> None:
        self.limit = max(1.0, self.limit * factor)
        self.last_cut = now
        self.cuts += 1

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
        if units and units > 0:
            ticket.units = units
            service = service_time(self.samples, units) if self.samples else latency
            ahead_s = sum(service_time(self.samples, t.units) if t.units and self.samples else service
                          for t in ticket.ahead)  # the work it may have waited for, sized by each one's own
            self.samples.append((units, latency))
            ratio = max(0.0, latency - QUEUE_SLACK_S) / service if service > 0 else 0.0
            if self.info.kind is None and ticket.overlapped:
                if ratio > BUSY * (service + ahead_s) / service:
                    return  # far slower than waiting behind all of ours explains (a busy machine): no signal
                if ratio > QUEUED:
                    self.limit = max(1.0, self.limit * QUEUED / ratio)  # it waited behind others: fewer at once
                    self.queued += 1
                    return
                if ratio > GROW_BELOW:
                    return  # neither clearly queued nor clearly not: the limit stays
                # Room shows only where one slot would have made it wait: work was left ahead of it (a
                # request at the head of the line, or behind one almost done, shows nothing), and it did
                # not wait for that (a long reply that waited for short ones shows no room either).
                left = ahead_s - (ticket.started - min(t.started for t in ticket.ahead)) if ticket.ahead else 0.0
                if left <= (GROW_BELOW - 1) * service or latency - QUEUE_SLACK_S - service > left / 2:
                    return
        if len(self.in_flight) >= self.allowed:  # the whole limit was in use: it may grow
            self.limit = min(float(self._cap()), self.limit + math.sqrt(self.limit))
        self._maybe_poll(now)

    def _maybe_poll(self, now: float) -> None:
        if self._on_busy_check is None or self.info.kind != "vllm" or now - self._last_poll < POLL_S:
            return
        if self._poll_task is not None and not self._poll_task.done():
            return
        self._last_poll = now

        async def poll() -> None:
            waiting = await self._on_busy_check()
            if waiting and time.monotonic() - self.last_cut >= COOL_S:
                self._cut(0.75, time.monotonic())  # vLLM's own queue: more in flight would only wait there

        self._poll_task = asyncio.get_running_loop().create_task(poll())
