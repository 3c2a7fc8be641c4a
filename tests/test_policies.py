"""Policies: text tool-call parsing, the openai backend (real client, local fake server), make_policy."""

from __future__ import annotations

import asyncio
import json

import pytest

from omrl.envs.base import Task, tool_schema
from omrl.errors import UsageError
from omrl.policies import EpisodeContext, PolicyError, PolicyTimeout, make_policy
from omrl.policies.openai_policy import OpenAIPolicy
from omrl.policies.parsing import parse_tool_calls, split_reasoning
from omrl.schema.messages import to_openai
from omrl.testing.openai_server import FakeOpenAIServer

TOOLS = [tool_schema("search", "Search.", {"query": {"type": "string"}}),
         tool_schema("calculator", "Calc.", {"expression": {"type": "string"}})]
MESSAGES = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]


# ---------------------------------------------------------------- parsing


def test_parse_hermes_tool_calls_keeps_surrounding_text():
    text = ('Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n'
            '</tool_call>\n<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"x\\"}"}</tool_call>')
    rest, calls = parse_tool_calls(text, TOOLS)
    assert rest == "Let me compute."
    assert [c["name"] for c in calls] == ["calculator", "search"]
    assert json.loads(calls[0]["arguments"]) == {"expression": "2+3"}
    assert json.loads(calls[1]["arguments"]) == {"query": "x"}
    assert calls[0]["id"] != calls[1]["id"]


def test_parse_hermes_broken_json_keeps_the_call_for_an_error_observation():
    rest, calls = parse_tool_calls('<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>')
    assert calls[0]["name"] == "calculator"
    with pytest.raises(json.JSONDecodeError):
        json.loads(calls[0]["arguments"])


def test_parse_react_bracket_maps_to_first_parameter():
    rest, calls = parse_tool_calls("Thought: look it up\nAction: search[red shoes]", TOOLS)
    assert rest == "Thought: look it up"
    assert calls[0]["name"] == "search" and json.loads(calls[0]["arguments"]) == {"query": "red shoes"}
    _, calls = parse_tool_calls("Action: click[Buy Now]")  # no schemas: a generic parameter
    assert json.loads(calls[0]["arguments"]) == {"input": "Buy Now"}


def test_parse_react_action_input():
    text = 'Thought: add\nAction: calculator\nAction Input: {"expression": "1+1"}\nObservation: 2'
    rest, calls = parse_tool_calls(text, TOOLS)
    assert calls[0]["name"] == "calculator" and json.loads(calls[0]["arguments"]) == {"expression": "1+1"}
    _, calls = parse_tool_calls("Action: search\nAction Input: blue hat", TOOLS)
    assert json.loads(calls[0]["arguments"]) == {"query": "blue hat"}
    _, calls = parse_tool_calls("Action: finish", TOOLS)
    assert calls[0]["name"] == "finish" and calls[0]["arguments"] == "{}"


def test_parse_plain_text_and_reasoning():
    assert parse_tool_calls("just talking", TOOLS) == ("just talking", [])
    assert split_reasoning("<think>hmm</think>The answer is 4") == ("The answer is 4", "hmm")
    assert split_reasoning("no thinking") == ("no thinking", None)


def test_api_messages_nest_tool_calls_and_drop_extra_keys():
    out = to_openai([{"role": "assistant", "content": None, "reasoning": "r",
                         "tool_calls": [{"id": "c", "name": "f", "arguments": "{}"}]},
                        {"role": "tool", "tool_call_id": "c", "name": "f", "content": "ok", "trainable": None}])
    assert out[0] == {"role": "assistant", "content": None,
                      "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    assert out[1] == {"role": "tool", "tool_call_id": "c", "name": "f", "content": "ok"}


# ---------------------------------------------------------------- openai backend


def ctx(**kw) -> EpisodeContext:
    return EpisodeContext(env=None, task=Task(id="t", instruction="i"), **kw)


def act(policy, context=None, tools=TOOLS):
    return asyncio.run(policy.act(MESSAGES, tools, context or ctx()))


def fast_policy(server, **kw) -> OpenAIPolicy:
    kw.setdefault("retries", 2)
    return OpenAIPolicy("m", base_url=server.base_url, api_key="k", **kw)


def test_openai_native_tool_calls_and_request():
    with FakeOpenAIServer() as server:
        server.enqueue({"content": None, "tool_calls": [{"id": "c9", "name": "search", "arguments": {"query": "q"}}],
                        "usage": {"prompt_tokens": 11, "completion_tokens": 5}})
        reply = act(fast_policy(server), ctx(temperature=0.3, seed=5, max_tokens=40))
        request = server.requests[0]
    assert reply.tool_calls == [{"id": "c9", "name": "search", "arguments": '{"query": "q"}'}]
    assert reply.prompt_tokens == 11 and reply.completion_tokens == 5 and reply.finish_reason == "tool_calls"
    assert request["temperature"] == 0.3 and request["seed"] == 5 and request["max_tokens"] == 40
    assert request["tools"][0]["function"]["name"] == "search" and request["messages"] == MESSAGES


def test_openai_text_tool_calls_are_parsed_and_raw_text_kept():
    text = '<think>plan</think>ok <tool_call>{"name": "calculator", "arguments": {"expression": "3*3"}}</tool_call>'
    with FakeOpenAIServer() as server:
        server.enqueue({"content": text})
        reply = act(fast_policy(server))
    assert reply.raw_text == text and reply.reasoning == "plan" and reply.content == "ok"
    assert reply.tool_calls[0]["name"] == "calculator"


@pytest.mark.parametrize("failure", [{"status": 429}, {"status": 500}, {"raw": "not json"}, {"raw": "{}"}])
def test_openai_retries_transient_failures_then_succeeds(failure):
    with FakeOpenAIServer() as server:
        server.enqueue(failure, failure, {"content": "fine"})
        policy = fast_policy(server)
        reply = act(policy)
        assert server.calls == 3
    assert reply.content == "fine" and policy.stats["retries"] == 2 and policy.stats["requests"] == 3


def test_openai_gives_up_with_policy_error_after_retries():
    with FakeOpenAIServer(default={"status": 503, "message": "overloaded"}) as server:
        policy = fast_policy(server, retries=3)
        with pytest.raises(PolicyError, match="4 attempts.*503.*overloaded"):
            act(policy)
        assert server.calls == 4
    with FakeOpenAIServer(default={"raw": "<html>oops"}) as server:
        with pytest.raises(PolicyError, match="3 attempts"):
            act(fast_policy(server))
        assert server.calls == 3


def test_openai_client_errors_are_not_retried():
    with FakeOpenAIServer(default={"status": 400, "message": "bad tools"}) as server:
        with pytest.raises(PolicyError, match="HTTP 400: bad tools"):
            act(fast_policy(server))
        assert server.calls == 1


def test_openai_hanging_server_times_out_per_call():
    with FakeOpenAIServer(default={"hang": 2}) as server:
        policy = fast_policy(server, retries=1)
        with pytest.raises(PolicyTimeout, match="0.3s"):
            act(policy, ctx(model_call_timeout=0.3))
        assert server.calls == 2 and policy.stats["timeout"] == 2


def test_openai_connection_refused_is_retried_then_fails():
    with FakeOpenAIServer() as server:
        url = server.base_url
    policy = OpenAIPolicy("m", base_url=url, retries=2)
    with pytest.raises(PolicyError, match="3 attempts.*Connection"):
        act(policy)
    assert policy.stats["connection"] == 3


def test_openai_policy_works_across_event_loops(monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/v1")
    with FakeOpenAIServer(default={"content": "hi"}) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        policy = make_policy("openai:m", retries=0)
        assert policy.base_url == server.base_url and policy.api_key
        assert act(policy).content == "hi" and act(policy).content == "hi"  # two asyncio.run loops


# ---------------------------------------------------------------- the one LLM client (omrl/llm/client.py)


def test_llm_client_caps_requests_in_flight():
    import threading
    import time

    from omrl.llm.client import LLMClient

    lock, now, peak = threading.Lock(), [0], [0]

    def responder(request):
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        time.sleep(0.05)
        with lock:
            now[0] -= 1
        return {"content": "ok"}

    async def main(client):
        try:
            return await asyncio.gather(*[client.chat(model="m", messages=MESSAGES) for _ in range(24)])
        finally:
            await client.aclose()

    with FakeOpenAIServer(responder=responder) as server:
        client = LLMClient(server.base_url, max_connections=4)
        replies = asyncio.run(main(client))
    assert [r.choices[0].message.content for r in replies] == ["ok"] * 24
    assert 1 < peak[0] <= 4 and client.stats["requests"] == client.stats["calls"] == 24


def test_llm_client_classifies_what_failed():
    from omrl.llm.client import LLMClient, LLMMalformed, LLMStatusError

    def call(client):
        async def once():
            try:
                return await client.chat(model="m", messages=MESSAGES)
            finally:
                await client.aclose()
        return asyncio.run(once())

    with FakeOpenAIServer() as server:
        client = LLMClient(server.base_url, max_retries=1)
        server.enqueue({"raw": '{"choices": []}'}, {"raw": "<html>"})
        with pytest.raises(LLMMalformed, match="not JSON") as malformed:
            call(client)
        server.enqueue({"status": 404, "message": "no such model"})
        with pytest.raises(LLMStatusError, match="HTTP 404: no such model") as refused:
            call(client)
    assert malformed.value.attempts == 2 and refused.value.attempts == 1 and not refused.value.retried
    assert client.stats["malformed"] == 2 and client.stats["http_404"] == 1 and client.stats["retries"] == 1


# ---------------------------------------------------------------- make_policy


def test_make_policy_specs():
    assert make_policy("scripted").name == "scripted"
    assert make_policy("random", seed=3).seed == 3
    assert make_policy("openai:qwen", base_url="http://x/v1", max_connections=512).max_connections == 512
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("bogus")
    with pytest.raises(ValueError, match="needs a model"):
        make_policy("openai:")
    with pytest.raises(ValueError, match="retries must be at least 0"):
        make_policy("openai:qwen", retries=-1)
    with pytest.raises(ValueError, match="takes no option"):
        make_policy("scripted", base_url="http://x")


# ---------------------------------------------------------------- vllm: TRL's VLLMGeneration faked at its API
# VLLMPolicy (omrl/policies/vllm.py) on CPU: the generator is answered by a real tiny model (greedy), so the
# traces must equal HFPolicy's exactly.

from omrl.envs.grid import GridEnv, grid_tasks  # noqa: E402
from omrl.policies.hf import HFPolicy, token_trace  # noqa: E402
from omrl.policies.vllm import VLLMPolicy  # noqa: E402
from omrl.rollout.agent import run_episode  # noqa: E402


class FakeVLLMGeneration:
    """trl.generation.vllm_generation.VLLMGeneration's generate(), answered by a real model (greedy):
    the same signature, sampling settings read from the attributes at each call, the same return shapes."""

    def __init__(self, hf: HFPolicy, top_k: int = 0):
        self.hf, self.top_k = hf, top_k
        self.temperature, self.max_completion_length = 1.0, 256
        self.calls: list[dict] = []

    def generate(self, prompts, images, num_generations, profiler=None):
        assert images is None and num_generations == 1
        self.calls.append({"n": len(prompts), "temperature": self.temperature, "max": self.max_completion_length})
        outs = self.hf._generate([list(p) for p in prompts], 0.0, self.max_completion_length, [0] * len(prompts))
        completions = [ids for ids, _, _ in outs]
        # logprobs=top_k: the sampled token's logprob plus top_k others ranked before it (vLLM's shape),
        # so the policy must pick the sampled one by id, not take the first.
        logprobs = [[[-9.0] * self.top_k + [lp] for lp in lps] for _, lps, _ in outs]
        logprob_ids = [[[(i + 1 + k) for k in range(self.top_k)] + [i] for i in ids] for ids in completions]
        return [list(p) for p in prompts], completions, logprobs, logprob_ids


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    pytest.importorskip("torch")
    from omrl.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny"), hidden=64, layers=2)


def play_grid(policy, tasks, max_turns=3):
    async def main():
        return await asyncio.gather(*[run_episode(GridEnv(), t, policy, run_id="v", max_turns=max_turns,
                                                  temperature=0.0, max_tokens=5) for t in tasks])

    return asyncio.run(main())


@pytest.mark.slow
@pytest.mark.parametrize("top_k", [0, 2])
def test_traces_equal_hf_policy_traces(tiny, top_k):
    hf = HFPolicy(str(tiny), max_new_tokens=5)
    tasks = grid_tasks(4, seed=1, split="eval")
    generator = FakeVLLMGeneration(HFPolicy(str(tiny)), top_k=top_k)
    vllm = VLLMPolicy(generator, hf.tokenizer, max_new_tokens=5)
    expected = play_grid(hf, tasks)
    got = play_grid(vllm, tasks)
    for a, b in zip(expected, got, strict=True):
        trace_a, trace_b = token_trace(a.context), token_trace(b.context)
        assert trace_b["prompt_ids"] == trace_a["prompt_ids"] and trace_b["env_mask"] == trace_a["env_mask"]
        assert trace_b["completion_ids"] == trace_a["completion_ids"]
        assert trace_b["logprobs"] == pytest.approx(trace_a["logprobs"], abs=1e-6)
        assert [t["completion_ids"] for t in b.row["turns"]] == [t["completion_ids"] for t in a.row["turns"]]
        assert [m["content"] for m in b.row["messages"]] == [m["content"] for m in a.row["messages"]]
    assert any(0 in token_trace(e.context)["env_mask"] for e in got)  # multi-turn: environment tokens masked
    # One generator call per batch of concurrent turns, with the turn's settings set and then put back.
    assert generator.calls[0] == {"n": 4, "temperature": 0.0, "max": 5}
    assert (generator.temperature, generator.max_completion_length) == (1.0, 256)


def test_bad_generator_replies_are_policy_errors(tiny):
    hf = HFPolicy(str(tiny))

    class NoLogprobs(FakeVLLMGeneration):
        def generate(self, prompts, images, num_generations, profiler=None):
            out = super().generate(prompts, images, num_generations, profiler)
            return out[0], out[1], None, None

    episode = play_grid(VLLMPolicy(NoLogprobs(hf), hf.tokenizer, max_new_tokens=3), grid_tasks(1, seed=0), max_turns=1)[0]
    assert episode.row["status"] == "policy_error" and "logprob" in episode.row["error"]
    with pytest.raises(TypeError, match="VLLMGeneration-like"):
        VLLMPolicy(object(), hf.tokenizer)


def test_from_trainer_reads_trls_attributes(tiny):
    from types import SimpleNamespace

    hf = HFPolicy(str(tiny))
    generator = FakeVLLMGeneration(hf)
    trainer = SimpleNamespace(vllm_generation=generator, processing_class=hf.tokenizer,
                              args=SimpleNamespace(max_completion_length=7), model=hf.model)
    policy = VLLMPolicy.from_trainer(trainer)
    assert policy.generator is generator and policy.max_new_tokens == 7 and policy.tokenizer is hf.tokenizer
    with pytest.raises(PolicyError, match="use_vllm=True"):
        VLLMPolicy.from_trainer(SimpleNamespace(vllm_generation=None))


def load_gpu_check():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_imports_without_a_gpu_and_parses_its_arguments():
    gpu_check = load_gpu_check()
    args = gpu_check.parse_args([])
    assert (args.backends, args.device, args.vllm_mode, args.grpo_steps) == (["hf", "vllm"], "cuda", "colocate", 30)
    args = gpu_check.parse_args(["--backend", "hf", "--device", "cpu", "--grpo-steps", "2", "--out", "/tmp/x"])
    assert (args.backends, args.device, args.grpo_steps, args.out) == (["hf"], "cpu", 2, "/tmp/x")
    assert gpu_check.parse_args(["--backend", "vllm", "--vllm-mode", "server"]).vllm_mode == "server"
    for bad in (["--device", "cpu"], ["--grpo-steps", "0"], ["--backend", "sglang"], ["--vllm-mode", "remote"]):
        with pytest.raises(SystemExit):
            gpu_check.parse_args(bad)


def test_gpu_check_counts_the_completion_tokens_of_one_backend(tmp_path):
    from omrl.schema import Trajectory
    from omrl.store import Store

    gpu_check = load_gpu_check()
    store = Store.create(tmp_path / "s")
    store.append([Trajectory(id=f"{run}-{i}", run_id=f"{run}/step-0000{i}", task_id="t", completion_tokens=n).to_row()
                  for run, n in (("grpo-hf", 5), ("grpo-vllm", 7)) for i in range(3)])
    assert gpu_check.completion_tokens(store, "grpo-hf") == 15
    assert gpu_check.completion_tokens(store, "grpo-vllm") == 21
    assert gpu_check.completion_tokens(store, "grpo-none") == 0


# ---------------------------------------------------------------- tools for servers without tool support

_VLLM_NO_PARSER = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'


def test_a_server_that_refuses_tools_gets_them_as_text_said_once():
    """vLLM started without a tool parser answers 400 to `tools`: the policy switches to tools described in the
    system prompt, sends the turn again, reads the <tool_call> block, and warns once; later turns go as text."""
    call = '<tool_call>\n{"name": "search", "arguments": {"query": "q"}}\n</tool_call>'
    with FakeOpenAIServer() as server:
        server.enqueue({"status": 400, "message": _VLLM_NO_PARSER}, {"content": call}, {"content": "done"})
        policy = fast_policy(server, tokens="off")
        with pytest.warns(UserWarning, match="does not take tools") as caught:
            first = act(policy)
        history = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": first.tool_calls},
                   {"role": "tool", "tool_call_id": "call_0", "name": "search", "content": "found it"}]
        second = asyncio.run(policy.act(history, TOOLS, ctx()))
        refused, retried, later = server.requests
    assert len(caught) == 1 and first.tool_calls == [{"id": "call_0", "name": "search", "arguments": '{"query": "q"}'}]
    assert "tools" in refused and "tools" not in retried and "tools" not in later and second.content == "done"
    system = retried["messages"][0]
    assert system["role"] == "system" and system["content"].startswith("s\n\n") and '"name": "search"' in system["content"]
    assert later["messages"][2] == {"role": "assistant", "content": call}  # the call as the model wrote it
    assert later["messages"][3] == {"role": "user", "content": "<tool_response>\nfound it\n</tool_response>"}


@pytest.mark.parametrize("tool_format", ["native", "text"])
def test_tool_format_native_fails_and_text_never_sends_tools(tool_format):
    with FakeOpenAIServer() as server:
        server.enqueue({"status": 400, "message": _VLLM_NO_PARSER} if tool_format == "native" else {"content": "hi"})
        policy = fast_policy(server, tool_format=tool_format)
        if tool_format == "native":
            with pytest.raises(PolicyError, match="tool-call-parser"):
                act(policy)
        else:
            assert act(policy).content == "hi" and "tools" not in server.requests[0]
    with pytest.raises(UsageError, match="tool_format"):
        OpenAIPolicy("m", tool_format="xml")
