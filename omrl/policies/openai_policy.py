"""`openai:MODEL`: any OpenAI-compatible chat endpoint (vLLM, SGLang, llama.cpp, OpenAI) via omrl.llm.LLMClient.

Retries, backoff, timeouts and connection limits are the one client's (see omrl/llm.py): 429, 5xx,
connection errors, timeouts and malformed bodies are retried with the openai client's exponential backoff;
other HTTP errors (400, 401, 404) fail at once. Every attempt is counted in `stats`. A call that still
fails raises PolicyError (PolicyTimeout when the last attempt timed out).
"""

from __future__ import annotations

import os
from typing import Any

from omrl.llm import LLMClient, LLMError, LLMStatusError, LLMTimeout
from omrl.messages import to_openai
from omrl.policies.base import EpisodeContext, PolicyError, PolicyReply, PolicyTimeout
from omrl.policies.parsing import parse_tool_calls, split_reasoning


class OpenAIPolicy:
    """A chat model behind an OpenAI-compatible HTTP endpoint."""

    def __init__(self, model: str, base_url: str | None = None, api_key: str | None = None,
                 timeout: float = 120.0, retries: int = 4, max_tokens: int | None = None,
                 max_connections: int = 256, logprobs: bool = False, native_tools: bool = True,
                 extra_body: dict[str, Any] | None = None, backoff: float | None = None,
                 max_backoff: float | None = None):
        # backoff, max_backoff: accepted and ignored, for call sites written before the one client; the
        # schedule is the openai client's own (omrl/llm.py).
        if not model:
            raise ValueError("openai policy needs a model name: openai:MODEL")
        if retries < 0:
            raise ValueError(f"openai policy retries must be at least 0, got {retries}")
        self.model = model
        self.name = model
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL")
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self.timeout = timeout
        self.retries = retries
        self.max_tokens = max_tokens
        self.max_connections = max_connections
        self.logprobs = logprobs
        self.native_tools = native_tools  # False: tools are described to the model but not sent as `tools`
        self.extra_body = extra_body
        self.client = LLMClient(self.base_url, self.api_key, timeout=timeout, max_retries=retries,
                                max_connections=max_connections)
        self.stats = self.client.stats  # calls, requests, retries, http_error, and attempts by outcome

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
        request = self._request(messages, tools, context)
        timeout = getattr(context, "model_call_timeout", None) or self.timeout
        try:
            response = await self.client.chat(**request, timeout=timeout)
        except LLMTimeout as exc:
            raise PolicyTimeout(f"{self.model}: no reply within {timeout}s ({exc.attempts} attempts)") from None
        except LLMStatusError as exc:
            if not exc.retried:
                self.stats["http_error"] += 1
                raise PolicyError(f"{self.model}: {exc}") from None
            raise PolicyError(f"{self.model}: failed after {exc.attempts} attempts: {exc}") from None
        except LLMError as exc:
            raise PolicyError(f"{self.model}: failed after {exc.attempts} attempts: {exc}") from None
        return self._reply(response, tools)

    def _reply(self, response: Any, tools: list[dict[str, Any]]) -> PolicyReply:
        choice = response.choices[0]  # the client raised LLMMalformed for a reply without choices
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
        """Close the HTTP clients of the running loop."""
        await self.client.aclose()
