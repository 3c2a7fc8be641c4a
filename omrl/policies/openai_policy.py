"""`openai:MODEL`: any OpenAI-compatible chat endpoint (vLLM, SGLang, llama.cpp, OpenAI) via `openai.AsyncOpenAI`.

Retries are ours, not the client's (its max_retries is 0), so every attempt is counted in `stats` and
the schedule is testable: exponential backoff with full jitter for 429, 5xx, connection errors,
timeouts and malformed response bodies; other HTTP errors (400, 401, 404) fail at once. A call that
still fails raises PolicyError (PolicyTimeout when the last failure was a timeout).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
from collections import Counter
from typing import Any

from omrl.messages import to_openai
from omrl.policies.base import EpisodeContext, PolicyError, PolicyReply, PolicyTimeout
from omrl.policies.parsing import parse_tool_calls, split_reasoning

POOL_SHARD = 32  # connections per HTTP client; see _client

class OpenAIPolicy:
    """A chat model behind an OpenAI-compatible HTTP endpoint."""

    def __init__(self, model: str, base_url: str | None = None, api_key: str | None = None,
                 timeout: float = 120.0, retries: int = 4, backoff: float = 1.0, max_backoff: float = 30.0,
                 max_tokens: int | None = None, max_connections: int = 256, logprobs: bool = False,
                 native_tools: bool = True, extra_body: dict[str, Any] | None = None):
        if not model:
            raise ValueError("openai policy needs a model name: openai:MODEL")
        if retries < 0:
            raise ValueError(f"openai policy retries must be at least 0, got {retries}")
        self.model = model
        self.name = model
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL")
        # Local servers (vLLM, llama.cpp) accept any key; the client refuses to start without one.
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_tokens = max_tokens
        self.max_connections = max_connections
        self.logprobs = logprobs
        self.native_tools = native_tools  # False: tools are described to the model but not sent as `tools`
        self.extra_body = extra_body
        self.stats: Counter[str] = Counter()  # requests, retries, errors by kind
        self._clients: dict[int, list[Any]] = {}  # event loop id -> clients (see _clients_here)
        self._inflight: list[int] = []

    def _clients_here(self) -> list[Any]:
        """The HTTP clients of the running event loop (httpx pools cannot cross loops), made on first use.

        The connections are split over several clients of at most POOL_SHARD each, because httpcore scans
        its whole pool on every request: one pool of 1024 connections costs O(concurrency) CPU per call."""
        import openai

        loop = id(asyncio.get_running_loop())
        clients = self._clients.get(loop)
        if clients is None:
            shards = max(1, math.ceil(self.max_connections / POOL_SHARD))
            per_shard = math.ceil(self.max_connections / shards)
            clients = []
            for _ in range(shards):
                limits = _limits(per_shard)
                http_client = openai.DefaultAsyncHttpxClient(limits=limits) if limits is not None else None
                clients.append(openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, max_retries=0,
                                                  timeout=self.timeout, http_client=http_client))
            self._clients = {loop: clients}  # a finished loop's clients are dropped with their pools
            self._inflight = [0] * len(clients)
        return clients

    def _request(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                 context: EpisodeContext) -> dict[str, Any]:
        # Messages and tools travel in extra_body: the client's per-request type transform walks every
        # message of the growing conversation (milliseconds of CPU per call at long contexts) and has
        # nothing to change in plain chat dicts. The JSON sent is the same.
        body: dict[str, Any] = {"messages": to_openai(messages)}
        request: dict[str, Any] = {"model": self.model, "messages": [], "temperature": context.temperature}
        if tools and self.native_tools:
            body["tools"] = tools
        max_tokens = context.max_tokens or self.max_tokens
        if max_tokens:
            request["max_tokens"] = max_tokens
        if context.seed is not None:
            request["seed"] = context.seed
        if self.logprobs:
            request["logprobs"] = True
        request["extra_body"] = {**(self.extra_body or {}), **body}
        return request

    async def act(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                  context: EpisodeContext) -> PolicyReply:
        import openai

        request = self._request(messages, tools, context)
        timeout = getattr(context, "model_call_timeout", None) or self.timeout
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                self.stats["retries"] += 1
                delay = min(self.max_backoff, self.backoff * 2 ** (attempt - 1))
                await asyncio.sleep(random.uniform(0, delay))  # full jitter: retries of many episodes spread out
            self.stats["requests"] += 1
            try:
                clients = self._clients_here()
                # The least busy client: no pool ever has to queue while another has room.
                shard = min(range(len(clients)), key=self._inflight.__getitem__)
                self._inflight[shard] += 1
                try:
                    response = await clients[shard].chat.completions.create(**request, timeout=timeout)
                finally:
                    self._inflight[shard] -= 1
                return self._reply(response, tools)
            except openai.APITimeoutError as exc:
                kind, last = "timeout", exc
            except openai.APIConnectionError as exc:
                kind, last = "connection", exc
            except openai.APIStatusError as exc:
                if exc.status_code != 429 and exc.status_code < 500:
                    self.stats["http_error"] += 1
                    raise PolicyError(f"{self.model}: HTTP {exc.status_code}: {_message(exc)}") from exc
                kind, last = f"http_{exc.status_code}", exc
            except (ValueError, openai.APIResponseValidationError, _MalformedReply) as exc:
                kind, last = "malformed", exc  # the body was not a chat completion (JSON errors are ValueErrors)
            self.stats[kind] += 1
        tries = self.retries + 1
        if isinstance(last, openai.APITimeoutError):
            raise PolicyTimeout(f"{self.model}: no reply within {timeout}s ({tries} attempts)")
        detail = f"HTTP {last.status_code}: {_message(last)}" if isinstance(last, openai.APIStatusError) else (
            f"{type(last).__name__}: {last}")
        raise PolicyError(f"{self.model}: failed after {tries} attempts: {detail}")

    def _reply(self, response: Any, tools: list[dict[str, Any]]) -> PolicyReply:
        choices = getattr(response, "choices", None)
        if not choices:
            raise _MalformedReply(f"response has no choices: {str(response)[:200]}")
        choice = choices[0]
        message = choice.message
        text = message.content
        # vLLM and SGLang put separated reasoning in `reasoning_content` (newer: `reasoning`).
        extra = getattr(message, "model_extra", None) or {}
        reasoning = extra.get("reasoning_content") or extra.get("reasoning")
        content, think = split_reasoning(text)
        reasoning = reasoning or think
        calls = [
            {"id": c.id, "name": c.function.name, "arguments": c.function.arguments or "{}"}
            for c in (message.tool_calls or []) if getattr(c, "function", None) is not None
        ]
        if not calls:
            content, calls = parse_tool_calls(content, tools)
        usage = getattr(response, "usage", None)
        logprobs: list[float] = []
        if choice.logprobs is not None and choice.logprobs.content:
            logprobs = [t.logprob for t in choice.logprobs.content]
        return PolicyReply(
            content=content, tool_calls=calls, reasoning=reasoning, raw_text=text,
            finish_reason=choice.finish_reason,
            prompt_tokens=getattr(usage, "prompt_tokens", None),
            completion_tokens=getattr(usage, "completion_tokens", None),
            logprobs=logprobs,
        )

    async def aclose(self) -> None:
        """Close the HTTP client of the running loop."""
        for client in self._clients.pop(id(asyncio.get_running_loop()), []):
            await client.close()


class _MalformedReply(ValueError):
    pass


def _message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
        return json.dumps(body)[:300]
    return str(getattr(exc, "message", exc))[:300]


def _limits(max_connections: int):
    """Connection-pool limits so that `concurrency` requests can be in flight at once."""
    try:
        import httpx2 as httpx  # the openai client of this environment is built on httpx2
    except ImportError:  # pragma: no cover - older openai releases use httpx
        try:
            import httpx
        except ImportError:
            return None
    return httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
