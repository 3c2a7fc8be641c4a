"""The adaptive limit on requests in flight (omrl.llm.endpoint.Throttle) against a server that batches: replays of
latency sequences on a fake clock, so each decision is checked without timing anything."""

from __future__ import annotations

import asyncio
import heapq
import random
import threading

import omrl.llm.endpoint as endpoint
from omrl.llm.client import LLMClient
from omrl.llm.endpoint import Throttle, envelope, envelope_time
from omrl.llm.server_info import ServerInfo, probe
from omrl.testing.openai_server import FakeOpenAIServer


class Clock:
    """Stands in for time.monotonic in omrl.llm.endpoint."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def replay(monkeypatch, *, demand: int, replies: int, one_slot: bool = False, jitter: float = 0.2,
           seed: int = 0, throttle: Throttle | None = None) -> tuple[Throttle, list[float]]:
    """`demand` requests always wanting to go; each reply of 20-180 tokens takes (0.5 + 0.01 x tokens) s
    times uniform(1 - jitter, 1 + jitter), served all at once (a batching server) or one after the other.
    Returns the throttle and its limit after each reply."""
    clock = Clock()
    monkeypatch.setattr(endpoint.time, "monotonic", clock)
    rng = random.Random(seed)
    throttle = throttle or Throttle(ceiling=demand)
    limits: list[float] = []

    async def go() -> None:
        pending, events, busy_until, order = demand, [], 0.0, 0
        while len(limits) < replies:
            while pending and len(throttle.in_flight) < throttle.allowed:
                pending -= 1
                tokens = rng.randint(20, 180)
                service = (0.5 + 0.01 * tokens) * rng.uniform(1 - jitter, 1 + jitter)
                slot = throttle.slot()
                ticket = await slot.__aenter__()
                busy_until = max(busy_until, clock.now) + service
                order += 1
                heapq.heappush(events, (busy_until if one_slot else clock.now + service, order, slot, ticket, tokens))
            clock.now, _, slot, ticket, tokens = heapq.heappop(events)
            ticket.done("ok", 1 + tokens + 50 / 16)
            await slot.__aexit__(None, None, None)
            limits.append(throttle.limit)
            pending += 1

    asyncio.run(go())
    return throttle, limits


def test_jittery_latency_on_a_batching_server_is_not_read_as_queueing(monkeypatch):
    throttle, limits = replay(monkeypatch, demand=256, replies=3000)
    assert throttle.queued == 0 and throttle.cuts == 0
    assert min(limits[len(limits) // 3:]) == 256  # up at the ceiling once ramped, and it stays there


def test_a_one_slot_server_still_gets_about_two_in_flight(monkeypatch):
    throttle, limits = replay(monkeypatch, demand=8, replies=300, one_slot=True)
    later = limits[100:]
    assert throttle.queued > 0 and sum(later) / len(later) <= 2.5


def test_a_small_reply_after_two_noisy_ones_of_about_its_size_is_not_read_as_queued(monkeypatch):
    """Two replies of 100 and 101 units, 1.5 s and 1.8 s apart by jitter, draw an envelope segment so steep
    that, extended down to 24 units, it reached zero: a 24-unit reply in 0.75 s looked queued a millionfold
    and cut the limit to one."""
    clock = Clock()
    monkeypatch.setattr(endpoint.time, "monotonic", clock)
    throttle = Throttle(ceiling=64)
    throttle.limit = 64.0
    throttle.samples.extend([(100.0, 1.5), (101.0, 1.8)])

    async def go() -> None:
        earlier = [throttle.slot() for _ in range(8)]
        for slot in earlier:
            (await slot.__aenter__()).units = 100.0
        clock.now = 0.2
        slot = throttle.slot()
        ticket = await slot.__aenter__()
        clock.now = 0.95  # 0.75 s: what 24 units take alone
        ticket.done("ok", 24.0)
        await slot.__aexit__(None, None, None)

    asyncio.run(go())
    assert envelope_time(envelope([(100.0, 1.5), (101.0, 1.8)]), 24.0) >= 1.5 * 24 / 100
    assert throttle.queued == 0 and throttle.limit == 64.0


def test_the_work_per_reply_does_not_grow_with_the_requests_in_flight(monkeypatch):
    """A reply reads the service envelope for as many requests ahead of it as its latency could have waited
    for, and draws the envelope once, however many are in flight (all 1,023 ahead of it: 1,023 envelope
    draws per reply capped a batching server's replies near 58 a second)."""
    clock = Clock()
    monkeypatch.setattr(endpoint.time, "monotonic", clock)
    built, read = [], []
    monkeypatch.setattr(endpoint, "envelope", lambda points: built.append(1) or envelope(points))
    monkeypatch.setattr(endpoint, "envelope_time", lambda hull, units: read.append(1) or envelope_time(hull, units))
    throttle = Throttle(ceiling=2048)
    throttle.limit = 1024.0
    throttle.samples.extend((24.0 + u, 0.5 + 0.01 * u) for u in range(0, 160, 10))

    async def go() -> None:
        for _ in range(1023):
            (await throttle.slot().__aenter__()).units = 100.0  # as if each had come back already
        clock.now = 0.01
        slot = throttle.slot()
        ticket = await slot.__aenter__()
        clock.now = 1.51
        ticket.done("ok", 104.0)  # on time for its size, with a thousand requests' work left ahead
        await slot.__aexit__(None, None, None)

    asyncio.run(go())
    assert len(built) == 1 and len(read) <= 4
    assert throttle.limit == 1024 + 32  # it showed room: the limit grew by its square root


def test_a_freed_slot_lets_in_one_waiting_request_the_oldest():
    async def go() -> list[int]:
        throttle = Throttle(ceiling=1, info=ServerInfo(kind="vllm"))
        order: list[int] = []

        async def request(n: int) -> None:
            async with throttle.slot():
                order.append(n)
                await asyncio.sleep(0)

        first = throttle.slot()
        await first.__aenter__()
        waiting = [asyncio.create_task(request(n)) for n in range(5)]
        await asyncio.sleep(0)
        waiting[2].cancel()  # one gives up while it waits: its turn passes to the next
        await asyncio.sleep(0)
        await first.__aexit__(None, None, None)
        await asyncio.gather(*waiting, return_exceptions=True)
        assert throttle.peak == 1 and not throttle.in_flight
        return order

    assert asyncio.run(go()) == [0, 1, 3, 4]


def test_between_two_polls_of_vllm_s_queue_the_limit_at_most_doubles_and_after_a_queue_it_holds(monkeypatch):
    """Replies come back faster than vLLM's queue is polled: growing on each reply alone ran the limit far past
    what vLLM schedules before a poll could see the queue (32 on a server of 8 in one run)."""
    clock = Clock()
    monkeypatch.setattr(endpoint.time, "monotonic", clock)
    waiting, seen_in_flight = [0], []

    async def queue() -> int:
        seen_in_flight.append(len(throttle.in_flight))
        return waiting[0]

    throttle = Throttle(ceiling=64, info=ServerInfo(kind="vllm"), on_busy_check=queue)

    async def replies(count: int) -> None:
        """`count` replies, each with the whole limit in use (a burst of requests behind them)."""
        held: list = []

        async def fill() -> None:
            while len(throttle.in_flight) < throttle.allowed:
                slot = throttle.slot()
                held.append((slot, await slot.__aenter__()))

        for _ in range(count):
            await fill()
            slot, ticket = held.pop(0)
            ticket.done("ok", 10)
            await slot.__aexit__(None, None, None)
            await fill()  # as in the client: a freed slot goes to the next request at once
            for _ in range(3):
                await asyncio.sleep(0)  # a poll started by this reply runs
        for slot, _ in held:
            await slot.__aexit__(None, None, None)

    async def go() -> None:
        periods = 0
        while throttle.allowed < 64 and periods < 10:  # the queue stays empty: it grows poll by poll
            clock.now += endpoint.POLL_S
            await replies(20)
            assert throttle.allowed <= max(2, 2 * seen_in_flight[-1]), (throttle.allowed, seen_in_flight)
            periods += 1
        assert periods <= 8 and throttle.cuts == 0
        waiting[0] = 5
        clock.now += endpoint.COOL_S + endpoint.POLL_S
        await replies(20)  # the first reply's poll finds a queue: the limit is cut, and then holds
        assert throttle.cuts == 1 and throttle.allowed == 48
        clock.now += endpoint.POLL_S / 2
        await replies(20)  # before the next poll: no growth
        assert throttle.cuts == 1 and throttle.allowed == 48
        clock.now += max(endpoint.POLL_S, endpoint.COOL_S)
        await replies(20)  # a queue still: cut again, never grown in between
        assert throttle.cuts == 2 and throttle.allowed == 36

    asyncio.run(go())


def test_the_probe_asks_its_three_questions_at_once():
    """A server slow to answer paths it does not serve delayed the first request by all three answers."""
    met = threading.Barrier(3, timeout=5)

    class Slow(FakeOpenAIServer):
        def get_body(self, path):
            met.wait()  # raises (a 500 to the client) unless all three GETs are in flight together
            return super().get_body(path)

    with Slow() as server:
        info = asyncio.run(probe(server.base_url, None, timeout=10))
    assert info == ServerInfo() and not met.broken


class Counting(FakeOpenAIServer):
    """Counts the GETs the probe sends."""

    gets = 0

    def get_body(self, path):
        self.gets += 1
        return super().get_body(path)


def _calls(client: LLMClient, n: int) -> None:
    async def main():
        try:
            await asyncio.gather(*[client.chat(model="m", messages=[{"role": "user", "content": "hi"}])
                                   for _ in range(n)])
        finally:
            await client.aclose()

    asyncio.run(main())


def test_the_next_client_of_an_endpoint_starts_where_the_last_one_got_to():
    """The next shard's judge, the next benchmark level: no second probe, no second climb from one request
    in flight; a client held to one request in flight passes on what the endpoint sustains, not its ceiling."""
    with Counting(default={"content": "ok"}) as server:
        first = LLMClient(server.base_url, max_connections=16)
        _calls(first, 20)
        probed = server.gets
        first.throttle.limit = 12.0  # as replies that showed room would have raised it
        narrow = LLMClient(server.base_url, max_connections=1)
        _calls(narrow, 2)
        wide = LLMClient(server.base_url, max_connections=16)
        _calls(wide, 1)
    assert probed == 3 and server.gets == 3
    assert narrow.throttle.peak == 1 and narrow.throttle.limit == 12.0 and wide.throttle.limit >= 12.0


def test_a_client_in_a_new_event_loop_starts_where_it_got_to():
    """Each training step's rollouts run in their own loop (asyncio.run) with the same policy."""
    with FakeOpenAIServer(default={"content": "ok"}) as server:
        client = LLMClient(server.base_url, max_connections=16)
        _calls(client, 20)
        before = client.throttle
        before.limit = 12.0  # as replies that showed room would have raised it
        endpoint.forget()  # what the client itself keeps, not what the process remembers of the endpoint
        _calls(client, 1)
    assert client.throttle is not before and client.throttle.limit >= 12.0


def test_a_new_client_s_first_requests_do_not_each_work_out_the_platform(monkeypatch):
    """openai works out the machine's platform on a client's first request, in a thread, once per request
    started before the first thread returns: a new loop's client with many calls at once held its first
    request back 0.2 s. omrl.llm.client works it out once per process and hands it to every client."""
    import openai._base_client as base

    import omrl.llm.client as client_module

    asked = []
    real = base.get_platform
    monkeypatch.setattr(base, "get_platform", lambda: asked.append(1) or real())
    client_module._platform.cache_clear()
    try:
        with FakeOpenAIServer(default={"content": "ok"}) as server:
            _calls(LLMClient(server.base_url, max_connections=16), 40)
            _calls(LLMClient(server.base_url, max_connections=16), 40)  # a second client, as in a new loop
    finally:
        client_module._platform.cache_clear()  # the next test's clients ask the real function again
    assert len(asked) == 1


def test_calls_started_at_once_wait_before_openai_builds_their_requests(monkeypatch):
    """At most PREPARED x max_connections calls are inside openai at once: 160 judge calls started together had
    all their requests built (3 ms of CPU each) while the first replies waited to be read."""
    import openai

    import omrl.llm.client as client_module

    inside, peak = [0], [0]
    real = openai.AsyncOpenAI.post

    async def counted(self, *args, **kwargs):
        inside[0] += 1
        peak[0] = max(peak[0], inside[0])
        try:
            return await real(self, *args, **kwargs)
        finally:
            inside[0] -= 1

    monkeypatch.setattr(openai.AsyncOpenAI, "post", counted)
    with FakeOpenAIServer(default={"content": "ok", "delay": 0.05}) as server:
        client = LLMClient(server.base_url, max_connections=4)
        _calls(client, 40)
    assert client.stats["calls"] == 40 and client.stats["requests"] == 40
    assert 4 <= peak[0] <= client_module.PREPARED * 4


def test_a_call_sends_its_request_as_the_body_with_extra_body_merged_and_no_create_transform(monkeypatch):
    """Calls skip chat.completions.create (its type transform walks every message of every request): the body
    the server reads is the request itself, extra_body merged in, and the reply is still a ChatCompletion."""
    from openai.resources.chat.completions import AsyncCompletions
    from openai.types.chat import ChatCompletion

    def refuse(*args, **kwargs):
        raise AssertionError("chat.completions.create was called")

    monkeypatch.setattr(AsyncCompletions, "create", refuse)
    tools = [{"type": "function", "function": {"name": "act", "parameters": {"type": "object", "properties": {}}}}]
    with FakeOpenAIServer(default={"content": "ok"}) as server:
        client = LLMClient(server.base_url, max_connections=2)
        reply = client.chat_sync(model="m", messages=[{"role": "user", "content": "hi"}], tools=tools,
                                 temperature=0.5, extra_body={"return_token_ids": True, "temperature": 0.25},
                                 extra_headers={"X-Omrl-Test": "1"}, extra_query={"trace": "on"})
    assert isinstance(reply, ChatCompletion) and reply.choices[0].message.content == "ok"
    sent = server.requests[-1]
    assert sent["messages"] == [{"role": "user", "content": "hi"}] and sent["tools"] == tools
    assert sent["return_token_ids"] is True and sent["temperature"] == 0.25  # extra_body wins, as in create
    assert not {"extra_body", "extra_headers", "extra_query"} & set(sent)
    assert server.headers[-1].get("x-omrl-test") == "1" and server.paths[-1].endswith("/chat/completions?trace=on")
