"""Collection against a slow one-slot server: requests in flight adapt to what it sustains, every turn sends
max_tokens, a turn past the model's context ends the episode as truncated (omrl.llm.endpoint, omrl.llm.client)."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
from pathlib import Path

from click.testing import CliRunner
from test_agent import CountEnv, count_tasks
from test_collect import counting_expert

from omrl.cli.main import cli
from omrl.llm.client import LLMClient, LLMTimeout
from omrl.llm.endpoint import Throttle
from omrl.llm.server_info import ServerInfo, probe, vllm_waiting
from omrl.policies.openai_policy import DEFAULT_MAX_TOKENS, OpenAIPolicy
from omrl.rollout import collect
from omrl.store import Store
from omrl.testing.openai_server import FakeOpenAIServer
from omrl.testing.slow_server import SlowServer

MESSAGES = [{"role": "user", "content": "hi"}]


def _calls(client: LLMClient, n: int) -> list:
    async def main():
        try:
            return await asyncio.gather(*[client.chat(model="m", messages=MESSAGES) for _ in range(n)],
                                        return_exceptions=True)
        finally:
            await client.aclose()

    return asyncio.run(main())


def test_a_one_slot_server_that_says_nothing_is_not_flooded_with_requests_that_time_out():
    # 1 s a reply through one slot; a client timeout of 4 s. Eight at once queue 8 s: the last ones time
    # out, their retries queue again behind the abandoned ones, which this server (like llama-cpp-python)
    # goes on generating.
    reply = {"content": "x" * 400}  # 100 tokens at 100 tokens/s
    outcomes = {}
    for adaptive in (False, True):
        with SlowServer(slots=1, tokens_per_s=100, default=reply, cancel_on_disconnect=False) as server:
            client = LLMClient(server.base_url, max_connections=8, timeout=4.0, max_retries=2, adaptive=adaptive)
            results = _calls(client, 10)
            outcomes[adaptive] = (sum(isinstance(r, Exception) for r in results), client.stats["timeout"],
                                  server.abandoned, server.peak_waiting)
    errors, timeouts, abandoned, flooded = outcomes[False]
    assert timeouts > 0 and abandoned > 0, outcomes  # what happened before the limit adapted
    errors, timeouts, abandoned, peak_waiting = outcomes[True]
    assert (errors, timeouts, abandoned) == (0, 0, 0), outcomes
    assert peak_waiting <= 3 < flooded  # the server's queue stayed short: requests waited in the client


def test_replies_of_mixed_lengths_on_one_slot_keep_about_two_in_flight(monkeypatch):
    """Small models reason for 40 to 400 tokens: a short reply that waited behind a long one is a sign of
    queueing (it was taken for a busy machine: ignored), and a long reply that waited for short ones shows no
    room (it raised the limit). Past the first replies, about 2 are let in flight (it climbed to 5-7, 4.2-4.5 on
    average; now 1.5-1.7 at a load of 33)."""
    from omrl.llm.endpoint import Throttle

    lengths = itertools.cycle([200, 20, 20])  # tokens: 1 s and 0.1 s at 200 tokens/s

    def mixed(request):
        return {"content": "x" * (4 * next(lengths))}

    allowed, finished = [], Throttle._finished

    def watched(self, ticket, outcome, units):
        finished(self, ticket, outcome, units)
        allowed.append(self.allowed)

    monkeypatch.setattr(Throttle, "_finished", watched)
    with SlowServer(slots=1, tokens_per_s=200, responder=mixed, cancel_on_disconnect=False) as server:
        client = LLMClient(server.base_url, max_connections=16, timeout=60, max_retries=0)
        results = _calls(client, 30)
    assert not any(isinstance(r, Exception) for r in results)
    later = allowed[8:]
    assert len(allowed) == 30 and sum(later) / len(later) <= 2.5 and max(later) <= 5, allowed


def test_the_slots_llama_cpp_states_cap_the_requests_in_flight():
    with SlowServer(slots=2, tokens_per_s=400, context_length=2048, advertise=True,
                    default={"content": "y" * 80}) as server:
        client = LLMClient(server.base_url, max_connections=16, timeout=30)
        results = _calls(client, 10)
        info = asyncio.run(probe(server.base_url, None))
    assert not any(isinstance(r, Exception) for r in results)
    assert info == ServerInfo(kind="llama.cpp", slots=2, context_length=2048)
    assert client.throttle.peak <= 2 and server.peak_waiting == 0


def test_a_request_given_up_on_is_closed_so_the_server_stops_generating():
    with SlowServer(slots=1, tokens_per_s=100, default={"content": "z" * 2000}) as server:  # 5 s to generate
        client = LLMClient(server.base_url, max_connections=1, timeout=0.5, max_retries=0)
        (result,) = _calls(client, 1)
        deadline = time.monotonic() + 3
        while not server.abandoned and time.monotonic() < deadline:
            time.sleep(0.05)
    assert isinstance(result, LLMTimeout)
    assert server.abandoned == 1 and server.wasted_tokens < 250  # stopped within a second of the hang-up


def test_timeouts_429_and_503_halve_the_limit_and_good_replies_raise_it():
    throttle = Throttle(ceiling=16, info=ServerInfo(kind="vllm"))  # a server that says what it has: no guessing

    async def go():
        assert throttle.limit == 1
        async with throttle.slot() as ticket:
            ticket.done("ok", 10)  # the whole limit was in use: it grows by its square root
        assert throttle.limit == 2
        async with throttle.slot() as ticket:
            ticket.done("ok", 10)  # one of two in use: it stays
        assert throttle.limit == 2
        async with throttle.slot() as first, throttle.slot():
            first.done("ok", 10)
        assert throttle.limit == 2 + 2 ** 0.5
        for outcome in ("timeout", "http_429", "http_503"):
            before = throttle.limit
            throttle.last_cut = -10.0  # past the cool-down
            async with throttle.slot() as ticket:
                ticket.done(outcome)
            assert throttle.limit == max(1.0, before / 2)
        assert throttle.cuts == 3 and throttle.allowed == 1

    asyncio.run(go())


class VLLMLike(FakeOpenAIServer):
    """Says what vLLM says: max_model_len on /v1/models, its scheduler's queue on /metrics."""

    waiting = 3

    def get_body(self, path):
        if path.rstrip("/").endswith("/models"):
            return {"object": "list", "data": [{"id": self.model, "owned_by": "vllm", "max_model_len": 4096}]}
        return None

    def _handler_class(self):
        base, server = super()._handler_class(), self

        class Handler(base):
            def do_GET(self):
                if self.path.rstrip("/").endswith("/metrics"):
                    text = f'vllm:num_requests_running{{model_name="m"}} 2.0\n' \
                           f'vllm:num_requests_waiting{{model_name="m"}} {server.waiting}.0\n'
                    self._send(200, text.encode(), content_type="text/plain")
                else:
                    super().do_GET()

        return Handler


def test_vllm_context_and_queue_are_read():
    with VLLMLike(default={"content": "ok"}) as server:
        info = asyncio.run(probe(server.base_url, None))
        assert info == ServerInfo(kind="vllm", slots=None, context_length=4096)
        assert asyncio.run(vllm_waiting(server.base_url, None)) == 3
        server.waiting = 0
        assert asyncio.run(vllm_waiting(server.base_url, None)) == 0


def test_every_turn_sends_max_tokens_by_default(tmp_path: Path):
    store = Store.create(tmp_path / "s")
    with FakeOpenAIServer(responder=counting_expert) as server:
        policy = OpenAIPolicy("m", base_url=server.base_url)
        asyncio.run(collect(CountEnv, count_tasks(1), policy, store, run_id="r"))
        asyncio.run(collect(CountEnv, count_tasks(1), policy, store, run_id="r2", max_new_tokens=7))
        sent = [r.get("max_tokens") for r in server.requests]
    assert sent == [DEFAULT_MAX_TOKENS] * 3 + [7] * 3


def test_a_turn_past_the_context_ends_the_episode_as_truncated(tmp_path: Path):
    tasks = count_tasks(2, target=40)  # the conversation grows by a tool call and a result each turn
    store = Store.create(tmp_path / "s")
    with SlowServer(slots=1, tokens_per_s=10_000, context_length=400, advertise=True,
                    responder=counting_expert) as server:
        policy = OpenAIPolicy("m", base_url=server.base_url)
        result = asyncio.run(collect(CountEnv, tasks, policy, store, run_id="r", max_turns=60))
        budgets = [r["max_tokens"] for r in server.requests]
    assert dict(result.statuses) == {"truncated": 2}
    for row in store.read().to_pylist():
        assert row["status"] == "truncated" and row["success"] is False and row["reward"] is not None
        assert re.search(r"leaves \d+ of the model's 400-token context", row["error"])
        assert 2 < row["num_turns"] < 40
    assert all(b <= 400 for b in budgets) and budgets[-1] < budgets[0] <= DEFAULT_MAX_TOKENS


def test_a_server_refusing_a_long_prompt_ends_the_episode_as_truncated(tmp_path: Path):
    """The server says nothing about its context; its 400 ("exceeds the available context size") is not a
    policy_error but the end of the conversation. With --context-length the budget is kept first."""
    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text("".join(json.dumps(t.to_row()) + "\n" for t in count_tasks(1, target=40)))
    with SlowServer(slots=1, tokens_per_s=10_000, context_length=1500, responder=counting_expert) as server:
        policy = OpenAIPolicy("m", base_url=server.base_url, max_tokens=64)
        store = Store.create(tmp_path / "s")
        asyncio.run(collect(CountEnv, count_tasks(1, target=40), policy, store, run_id="r",
                            max_turns=60))
        (row,) = store.read().to_pylist()
        assert row["status"] == "truncated" and "exceeds the available context size" in row["error"]
        out = CliRunner().invoke(cli, ["collect", "--env", "test_agent:CountEnv", "--tasks", str(tasks_file),
                                       "--policy", "openai:m", "--base-url", server.base_url, "--max-turns", "60",
                                       "--context-length", "600", "--store", str(tmp_path / "cli"), "--no-progress"])
    assert out.exit_code == 0, out.output
    (row,) = Store(tmp_path / "cli").read().to_pylist()
    assert row["status"] == "truncated" and "600-token context" in row["error"]


def test_a_used_policy_still_pickles_for_ray_workers():
    import pickle

    with FakeOpenAIServer(default={"content": "hi"}) as server:
        policy = OpenAIPolicy("m", base_url=server.base_url)
        _calls(policy.client, 2)
        copy = pickle.loads(pickle.dumps(policy))  # the limit and clients stay behind; the copy makes its own
        assert [r.choices[0].message.content for r in _calls(copy.client, 2)] == ["hi", "hi"]
