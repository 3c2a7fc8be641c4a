"""Token-faithful collection: the openai policy asks servers for token ids and logprobs and stores them in turns."""

from __future__ import annotations

import asyncio
import re
import warnings
from pathlib import Path

import pytest
from test_agent import CountEnv, count_tasks

from omrl.policies import EpisodeContext
from omrl.policies.openai_policy import OpenAIPolicy
from omrl.rollout import collect
from omrl.store import Store
from omrl.testing.openai_server import FakeOpenAIServer


def tokens_for(target: int, done: int) -> tuple[list[int], list[float]]:
    """The ids and logprobs the server sends for turn `done` of a task: distinct per task and turn.
    Logprobs are multiples of 1/8 so float32 storage keeps them exactly."""
    ids = [1000 * target + 10 * done + k for k in range(3)]
    return ids, [-(done + 1) / 8, -0.25, -0.5]


def expert_with_tokens(style: str):
    def responder(request: dict) -> dict:
        target = int(re.search(r"Count to (\d+)", request["messages"][1]["content"]).group(1))
        done = sum(1 for m in request["messages"] if m["role"] == "tool")
        ids, logprobs = tokens_for(target, done)
        call = ({"name": "add", "arguments": {"amount": 1}} if done < target else {"name": "submit", "arguments": {}})
        return {"content": None, "tool_calls": [call], "completion_ids": ids, "logprobs": logprobs,
                "prompt_ids": list(range(7)), "token_style": style}
    return responder


def collect_count(tmp_path: Path, responder, reshape=None, **policy_options):
    store = Store.create(tmp_path / "s")
    tasks = count_tasks(3, target=2)
    with FakeOpenAIServer(responder=responder) as server:
        if reshape is not None:
            reshape(server)
        policy = OpenAIPolicy("fake-model", base_url=server.base_url, retries=1, **policy_options)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = asyncio.run(collect(CountEnv, tasks, policy, store, samples=2, concurrency=4, run_id="r"))
        requests = list(server.requests)
    assert result.played == 6 and result.errors == 0
    return store, requests, [w for w in caught if "token ids" in str(w.message)]


@pytest.mark.parametrize("style", ["vllm", "vllm-0.9", "llamacpp", "sglang"])
def test_stored_ids_and_logprobs_equal_what_the_server_sent(tmp_path: Path, style: str):
    store, requests, warned = collect_count(tmp_path, expert_with_tokens(style))
    assert warned == []
    assert all(r["logprobs"] is True and r["top_logprobs"] == 1 for r in requests)
    assert all(r["return_token_ids"] is True and r["return_tokens_as_token_ids"] is True for r in requests)
    assert all(r["return_meta_info"] is True for r in requests)
    assert_turn_tokens(store)


def assert_turn_tokens(store: Store) -> None:
    """Every stored turn holds the ids and logprobs tokens_for() made the server send for it."""
    rows = store.read().to_pylist()
    assert len(rows) == 6
    for row in rows:
        target = int(re.search(r"Count to (\d+)", row["messages"][1]["content"]).group(1))
        assert len(row["turns"]) == 3
        for done, turn in enumerate(row["turns"]):
            ids, logprobs = tokens_for(target, done)
            assert turn["completion_ids"] == ids
            assert turn["logprobs"] == logprobs
            assert turn["completion_tokens"] == 3 and turn["prompt_tokens"] == 7
    assert store.check() == []


def as_sglang_meta_info(keep_content: bool):
    """Reshape the fake's "sglang" replies as SGLang's chat endpoint answers `return_meta_info`
    (sglang/srt/entrypoints/openai: protocol.py ChatCompletionResponseChoice.meta_info, serving_chat.py
    _build_chat_response): no choices[0].token_ids; meta_info.output_token_logprobs holds one
    [logprob, token_id, text] per token. Without `keep_content` the logprobs.content list is gone too."""
    def reshape(server: FakeOpenAIServer) -> None:
        original = server.completion_body

        def body(request, reply):
            out = original(request, reply)
            choice = out["choices"][0]
            ids = choice.pop("token_ids", None)
            choice.pop("prompt_token_ids", None)
            if ids is not None and request.get("return_meta_info"):
                texts = [f"<{i}>" for i in ids]
                choice["meta_info"] = {"id": out["id"], "finish_reason": {"type": "stop"},
                                       "output_token_logprobs": [[lp, i, t] for lp, i, t in
                                                                 zip(reply["logprobs"], ids, texts, strict=True)],
                                       "completion_tokens": len(ids)}
            if not keep_content:
                choice["logprobs"] = None
            return out

        server.completion_body = body
    return reshape


@pytest.mark.parametrize("keep_content", [True, False])
def test_sglang_meta_info_ids_and_logprobs_are_stored(tmp_path: Path, keep_content: bool):
    store, requests, warned = collect_count(tmp_path, expert_with_tokens("sglang"),
                                            reshape=as_sglang_meta_info(keep_content))
    assert warned == [] and all(r["return_meta_info"] is True for r in requests)
    assert_turn_tokens(store)


@pytest.mark.parametrize(("entries", "ids", "logprobs"), [
    ([[-0.5, "x", None]], [], [-0.5]),  # a garbage id: no ids, the logprob is still one
    ([[-0.5]], [], []),  # not [logprob, id, text]
    ([["-0.5", 3, None]], [3], []),  # a string is not a logprob
    ([[True, 3, None]], [3], []),
    ({}, [], []),
])
def test_malformed_sglang_meta_info_is_not_trusted(entries, ids, logprobs):
    from types import SimpleNamespace

    from omrl.policies.openai_policy import completion_tokens

    choice = SimpleNamespace(logprobs=None, model_extra={"meta_info": {"output_token_logprobs": entries}})
    assert completion_tokens(choice) == (ids, logprobs)


def test_a_plain_server_leaves_the_columns_empty_and_warns_once(tmp_path: Path):
    from test_collect import counting_expert

    store, requests, warned = collect_count(tmp_path, counting_expert)
    assert len(requests) == 18 and len(warned) == 1  # 18 replies without ids, one warning for the run
    assert "returned no token ids" in str(warned[0].message)
    for row in store.read().to_pylist():
        assert all(t["completion_ids"] == [] and t["logprobs"] == [] for t in row["turns"])


def test_tokens_off_asks_for_nothing_and_does_not_warn(tmp_path: Path):
    from test_collect import counting_expert

    _, requests, warned = collect_count(tmp_path, counting_expert, tokens="off")
    assert warned == []
    assert not any(key in r for r in requests for key in ("logprobs", "top_logprobs", "return_token_ids"))


def ctx() -> EpisodeContext:
    from omrl.envs.base import Task

    return EpisodeContext(env=None, task=Task(id="t", instruction="i"))


def test_extension_fields_are_not_sent_to_api_openai_com():
    messages = [{"role": "user", "content": "hi"}]
    for base_url in ("https://api.openai.com/v1", None):
        request = OpenAIPolicy("gpt", base_url=base_url, api_key="k")._request(messages, [], ctx())
        assert request["logprobs"] is True and request["top_logprobs"] == 1
        assert "return_token_ids" not in request["extra_body"]
    request = OpenAIPolicy("m", base_url="http://127.0.0.1:1/v1", tokens="standard")._request(messages, [], ctx())
    assert request["logprobs"] is True and "return_token_ids" not in request["extra_body"]
    with pytest.raises(ValueError, match="tokens must be one of"):
        OpenAIPolicy("m", tokens="all")


@pytest.mark.parametrize("bad", [["x", 1, 2], [1, -1, 2], [1, 2**40, 2], [True, 1, 2], "123"])
def test_garbage_token_ids_are_not_stored(bad):
    def responder(request: dict) -> dict:
        return {"content": "ok", "completion_ids": [1, 2, 3], "logprobs": [-0.5, -0.25, -1.0],
                "token_style": "sglang"}

    with FakeOpenAIServer(responder=responder) as server:
        # The server's token_ids are replaced with garbage on the way out: the policy must not trust them.
        original = server.completion_body

        def corrupt(request, reply):
            body = original(request, reply)
            body["choices"][0]["token_ids"] = bad
            return body

        server.completion_body = corrupt
        policy = OpenAIPolicy("m", base_url=server.base_url, retries=0)
        with pytest.warns(UserWarning, match="returned no token ids"):
            reply = asyncio.run(policy.act([{"role": "user", "content": "hi"}], [], ctx()))
    assert reply.completion_ids == [] and reply.logprobs == [-0.5, -0.25, -1.0]


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_cli_collect_stores_server_tokens_unless_off(tmp_path: Path, mode: str):
    import json

    from click.testing import CliRunner

    from omrl.cli.main import cli
    from omrl.envs.math import generate_tasks

    tasks = generate_tasks(3, seed=2)
    tasks_file = tmp_path / "math.jsonl"
    tasks_file.write_text("".join(json.dumps(t.to_row()) + "\n" for t in tasks))
    reply = {"content": "The answer is 3.", "completion_ids": [11, 12, 13], "logprobs": [-0.5, -0.25, -0.125]}
    with FakeOpenAIServer(default=reply) as server:
        out = CliRunner().invoke(cli, ["collect", "--env", "math", "--tasks", str(tasks_file), "--policy",
                                       "openai:fake", "--base-url", server.base_url, "--server-tokens", mode,
                                       "--no-progress", "--store", str(tmp_path / "s"), "--max-turns", "1"])
    assert out.exit_code == 0, out.output
    turns = [t for r in Store(tmp_path / "s").read().to_pylist() for t in r["turns"]]
    assert len(turns) == 3
    if mode == "auto":
        assert all(t["completion_ids"] == [11, 12, 13] and t["logprobs"] == [-0.5, -0.25, -0.125] for t in turns)
    else:
        assert all(t["completion_ids"] == [] and t["logprobs"] == [] for t in turns)
    bad = CliRunner().invoke(cli, ["collect", "--env", "math", "--tasks", str(tasks_file), "--policy", "scripted",
                                   "--server-tokens", "off", "--store", str(tmp_path / "s2")])
    assert bad.exit_code != 0 and "only applies to openai" in bad.output
