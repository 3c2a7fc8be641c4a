"""`openai:MODEL`: any OpenAI-compatible chat endpoint (vLLM, SGLang, llama.cpp, OpenAI) via omrl.llm.client.LLMClient.

Retries, backoff, timeouts and connection limits are the one client's (see omrl/llm/client.py): 429, 5xx,
connection errors, timeouts and malformed bodies are retried with the openai client's exponential backoff;
other HTTP errors (400, 401, 404) fail at once. Every attempt is counted in `stats`. A call that still
fails raises PolicyError (PolicyTimeout when the last attempt timed out).

Token-faithful replies (`tokens="auto"`, the default): each request asks for the completion's token ids
and logprobs through the servers' documented extensions, and the reply carries them as completion_ids /
logprobs (stored in turns), so data collected from a server trains without re-tokenising:

    logprobs=true, top_logprobs=1      OpenAI standard: choices[0].logprobs.content[i].logprob (all servers;
                                       llama.cpp needs top_logprobs >= 1 to collect any probabilities)
    return_token_ids=true              vLLM >= 0.10.2 and SGLang: choices[0].token_ids (and prompt_token_ids,
                                       top-level in vLLM, per choice in SGLang)
    return_tokens_as_token_ids=true    vLLM (also before 0.10.2): logprobs.content[i].token is "token_id:N"
    return_meta_info=true              SGLang: choices[0].meta_info.output_token_logprobs, a list of
                                       [logprob, token_id, text] (its native generate's meta_info; the
                                       fallback where a chat reply carries no choices[0].token_ids)
    (nothing more to ask)              llama.cpp server: logprobs.content[i].id

Per turn, `max_tokens` is sent: the episode's (`--max-tokens`), else the policy's, else DEFAULT_MAX_TOKENS,
so a model that does not stop cannot hold a slow server's slot until its context is full. Where the
context length is known (`context_length`, `--context-length`, else what the server says: llama.cpp's
/props, vLLM's /v1/models; omrl.llm.endpoint), the prompt is budgeted: from the last reply's usage plus about
CHARS_PER_TOKEN characters a token since, `max_tokens` is lowered to what is left, and a prompt that
leaves less than MIN_REPLY_TOKENS raises ContextFull, as does a server's 400 saying the context is
exceeded: the episode ends as `truncated` with that reason, not as a policy_error.

The three extension fields are not sent to api.openai.com (which refuses unknown fields) nor with tokens="standard";
tokens="off" asks for nothing. A server that returns no ids leaves completion_ids empty and the policy warns
once (per policy object, so once per run).
"""

from __future__ import annotations

import json
import os
import re
import warnings
from typing import Any

from omrl.errors import UsageError
from omrl.llm.client import LLMClient, LLMError, LLMStatusError, LLMTimeout
from omrl.llm.server_info import is_openai_com
from omrl.policies.base import ContextFull, EpisodeContext, PolicyError, PolicyReply, PolicyTimeout
from omrl.policies.parsing import TEXT_TOOLS_FORMAT, parse_tool_calls, split_reasoning, text_tool_messages
from omrl.schema.messages import to_openai
from omrl.schema.redact import display_url

DEFAULT_MAX_TOKENS = 1024  # per turn, when neither the episode nor the policy sets one
MIN_REPLY_TOKENS = 16  # a prompt leaving less of the context than this ends the episode as truncated
CHARS_PER_TOKEN = 3.0  # prompt estimate for text the server has not counted yet (conservative)
_USAGE = "omrl.openai.usage"  # context.scratch: (messages the server counted, their tokens)
# How servers say a prompt is past the context: vLLM, OpenAI, llama.cpp, SGLang, TGI.
_CONTEXT_EXCEEDED = re.compile(r"maximum context length|context_length_exceeded|exceed_context_size|"
                               r"exceeds the available context size|context window|longer than the model|"
                               r"input validation error: .*tokens", re.IGNORECASE)


class OpenAIPolicy:
    """A chat model behind an OpenAI-compatible HTTP endpoint."""

    def __init__(self, model: str, base_url: str | None = None, api_key: str | None = None,
                 timeout: float = 120.0, retries: int = 4, max_tokens: int | None = None,
                 max_connections: int = 256, logprobs: bool = False, tool_format: str = "auto",
                 extra_body: dict[str, Any] | None = None, backoff: float | None = None,
                 max_backoff: float | None = None, tokens: str = "auto", context_length: int | None = None):
        # backoff, max_backoff: accepted and ignored, for call sites written before the one client; the
        # schedule is the openai client's own (omrl/llm/client.py).
        if not model:
            raise UsageError("openai policy needs a model name: openai:MODEL")
        if retries < 0:
            raise UsageError(f"openai policy retries must be at least 0, got {retries}")
        if tool_format not in TOOL_FORMATS:
            raise UsageError(f"openai policy tool_format must be one of {', '.join(TOOL_FORMATS)}, got {tool_format!r}")
        if tokens not in TOKEN_MODES:
            raise UsageError(f"openai policy tokens must be one of {', '.join(TOKEN_MODES)}, got {tokens!r}")
        self.model = model
        self.name = model
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL")
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self.timeout = timeout
        self.retries = retries
        self.max_tokens = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens  # 0: none sent
        if context_length is not None and context_length < 1:
            raise UsageError(f"openai policy context_length must be at least 1, got {context_length}")
        self.context_length = context_length
        self.max_connections = max_connections
        self.logprobs = logprobs  # ask for logprobs also with tokens="off" (the option's older meaning)
        self.tokens = tokens
        self._warned_no_ids = False
        # native: tools go as the request's `tools`; text: described in the system prompt, calls parsed from the
        # reply; auto: native until the server refuses tools (vLLM without a tool parser), then text
        self.tool_format = tool_format
        self.text_tools = tool_format == "text"
        self.extra_body = extra_body
        self.client = LLMClient(self.base_url, self.api_key, timeout=timeout, max_retries=retries,
                                max_connections=max_connections)
        self.stats = self.client.stats  # calls, requests, retries, http_error, and attempts by outcome

    @property
    def prompt_format(self) -> str:
        """How tools reach the model: "text_tools" (text_tool_messages) or "native"; the agent loop records it in
        each episode's metadata when the episode ends, so a switch on the first refusal (auto) is seen."""
        return TEXT_TOOLS_FORMAT if self.text_tools else "native"

    async def _max_tokens(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                          context: EpisodeContext) -> int | None:
        """This turn's completion limit within the context budget; raises ContextFull when none is left."""
        wanted = context.max_tokens or self.max_tokens or None
        limit = self.context_length or (await self.client.server_info()).context_length
        if not limit:
            return wanted
        used = prompt_estimate(messages, tools, context.scratch.get(_USAGE))
        room = limit - used - used // 10  # a tenth kept free: an estimate, and chat templates add tokens
        if room < MIN_REPLY_TOKENS:
            raise ContextFull(f"{self.model}: the conversation (about {used} tokens) leaves {max(room, 0)} of the "
                              f"model's {limit}-token context for a reply")
        return min(wanted, room) if wanted else room

    def _request(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                 context: EpisodeContext, max_tokens: int | None = None) -> dict[str, Any]:
        if tools and self.text_tools:
            messages = text_tool_messages(messages, tools)
        request: dict[str, Any] = {"model": self.model, "messages": to_openai(messages),
                                   "temperature": context.temperature}
        extra: dict[str, Any] = dict(self.extra_body or {})
        if tools and not self.text_tools:
            request["tools"] = tools
        if max_tokens:
            request["max_tokens"] = max_tokens
        if context.seed is not None:
            request["seed"] = context.seed
        if self.logprobs or self.tokens != "off":
            request["logprobs"] = True
        if self.tokens != "off":
            request["top_logprobs"] = 1
            if self.tokens == "auto" and not _is_openai_com(self.base_url):
                extra.update(TOKEN_ID_FIELDS)
        request["extra_body"] = extra
        return request

    async def act(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                  context: EpisodeContext) -> PolicyReply:
        max_tokens = await self._max_tokens(messages, tools, context)
        timeout = getattr(context, "model_call_timeout", None) or self.timeout
        try:
            try:
                response = await self.client.chat(**self._request(messages, tools, context, max_tokens),
                                                  timeout=timeout)
            except LLMStatusError as exc:
                if not self._falls_back_to_text(exc, tools):
                    raise
                response = await self.client.chat(**self._request(messages, tools, context, max_tokens),
                                                  timeout=timeout)
        except LLMTimeout as exc:
            raise PolicyTimeout(f"{self.model}: no reply within {timeout}s ({exc.attempts} attempts)") from None
        except LLMStatusError as exc:
            if exc.status in (400, 413, 422) and _CONTEXT_EXCEEDED.search(str(exc)):
                raise ContextFull(f"{self.model}: the server says the prompt is past the model's context: "
                                  f"{exc}") from None
            if not exc.retried:
                self.stats["http_error"] += 1
                raise PolicyError(f"{self.model}: {exc}") from None
            raise PolicyError(f"{self.model}: failed after {exc.attempts} attempts: {exc}") from None
        except LLMError as exc:
            raise PolicyError(f"{self.model}: failed after {exc.attempts} attempts: {exc}") from None
        reply = self._reply(response, tools)
        if reply.prompt_tokens is not None:  # what the server counted, for the next turn's budget
            context.scratch[_USAGE] = (len(messages) + 1, reply.prompt_tokens + (reply.completion_tokens or 0))
        return reply

    def _falls_back_to_text(self, exc: LLMStatusError, tools: list[dict[str, Any]]) -> bool:
        """With tool_format auto, a server that refuses tools (vLLM started without a tool parser) switches this
        policy to tools as text for good, said once in one line; True when the request should be sent again."""
        if not tools or self.tool_format != "auto" or exc.status != 400 or not _NO_TOOL_SUPPORT.search(str(exc)):
            return False
        if not self.text_tools:
            self.text_tools = True
            warnings.warn(f"{display_url(self.base_url) or 'the endpoint'} ({self.model}) does not take tools "
                          "(vLLM: started without --enable-auto-tool-choice --tool-call-parser); omrl describes the "
                          "tools in the system prompt and reads <tool_call> blocks from the replies "
                          "(--tool-format text chooses this up front, native fails instead)", stacklevel=2)
        return True

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
        ids, logprobs = completion_tokens(choice)
        if not ids and self.tokens != "off":
            self._warn_no_ids()
        return PolicyReply(
            content=content, tool_calls=calls, reasoning=reasoning, raw_text=text,
            finish_reason=choice.finish_reason,
            prompt_tokens=getattr(usage, "prompt_tokens", None),
            completion_tokens=getattr(usage, "completion_tokens", None),
            completion_ids=ids, logprobs=logprobs,
        )

    def _warn_no_ids(self) -> None:
        if self._warned_no_ids:
            return
        self._warned_no_ids = True
        warnings.warn(
            f"{display_url(self.base_url) or 'the endpoint'} ({self.model}) returned no token ids for its completions: "
            "turns.completion_ids stay empty for this run, so its rows are re-tokenised for training. "
            "vLLM >= 0.10.2, SGLang and the llama.cpp server return them (see omrl/policies/openai_policy.py)",
            stacklevel=2)

    async def aclose(self) -> None:
        """Close the HTTP clients of the running loop."""
        await self.client.aclose()


TOKEN_MODES = ("auto", "standard", "off")
TOOL_FORMATS = ("auto", "native", "text")
# How a server says it takes no tools: vLLM without --enable-auto-tool-choice and --tool-call-parser.
_NO_TOOL_SUPPORT = re.compile(r"enable-auto-tool-choice|tool-call-parser|tool choice requires|"
                              r"does not support tools|tools are not supported", re.IGNORECASE)
TOKEN_ID_FIELDS = {"return_token_ids": True, "return_tokens_as_token_ids": True, "return_meta_info": True}
_TOKEN_ID_PREFIX = "token_id:"


def _is_openai_com(base_url: str | None) -> bool:
    """api.openai.com (also the client's default when no base URL is set) refuses unknown request fields."""
    return is_openai_com(base_url)


def prompt_estimate(messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                    counted: tuple[int, int] | None = None) -> int:
    """Tokens of a prompt: what the server counted for the first `counted[0]` messages (their `counted[1]`
    tokens), plus about CHARS_PER_TOKEN characters a token (and 4 a message) for the rest, tools included."""
    start, known = counted if counted and counted[0] <= len(messages) else (0, 0)
    rest = messages[start:]
    chars = sum(len(json.dumps(m, ensure_ascii=False, default=str)) for m in rest)
    if not start and tools:
        chars += len(json.dumps(tools, ensure_ascii=False))
    return known + int(chars / CHARS_PER_TOKEN) + 4 * len(rest)


def _extra(obj: Any) -> dict[str, Any]:
    """The fields of an openai response object that its type does not declare (servers' extensions)."""
    return getattr(obj, "model_extra", None) or {}


def completion_tokens(choice: Any) -> tuple[list[int], list[float]]:
    """(token ids, logprobs) of a chat completion choice, from whichever extension the server used.

    Either list is empty when the server did not send it; ids are only returned when known for every
    token (a half-known list would misalign training). Sources, first found wins for ids:
    choice.token_ids (vLLM, SGLang), meta_info.output_token_logprobs (SGLang), "token_id:N" token strings
    (vLLM), per-token `id` (llama.cpp). Logprobs come from logprobs.content, else from SGLang's meta_info."""
    extra = _extra(choice)
    entries = list(getattr(getattr(choice, "logprobs", None), "content", None) or [])
    logprobs = [float(t.logprob) for t in entries]
    meta_ids, meta_logprobs = _from_meta_info(extra.get("meta_info"))
    ids = _int_list(extra.get("token_ids"))
    if ids is None:
        ids = meta_ids
    if ids is None and entries:
        ids = _ids_from_entries(entries)
    if not logprobs and meta_logprobs is not None:
        logprobs = meta_logprobs
    return ids or [], logprobs


def _from_meta_info(meta: Any) -> tuple[list[int] | None, list[float] | None]:
    """(ids, logprobs) from SGLang's meta_info.output_token_logprobs: one [logprob, token_id, text] per
    token (sglang/srt/entrypoints/openai/utils.py reads it so); None for what is missing or malformed."""
    entries = meta.get("output_token_logprobs") if isinstance(meta, dict) else None
    if not isinstance(entries, list) or not entries:
        return None, None
    if not all(isinstance(e, list) and len(e) >= 2 for e in entries):
        return None, None
    ids = _int_list([e[1] for e in entries])
    values = [e[0] for e in entries]
    # A bool or a string is a server's garbage, not a probability.
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return ids, None
    return ids, [float(v) for v in values]


def _ids_from_entries(entries: list[Any]) -> list[int] | None:
    out: list[int] = []
    for entry in entries:
        token = getattr(entry, "token", None)
        if isinstance(token, str) and token.startswith(_TOKEN_ID_PREFIX):
            value: Any = token[len(_TOKEN_ID_PREFIX):]
        else:
            value = _extra(entry).get("id")
        number = _int_list([value])
        if number is None:
            return None
        out.extend(number)
    return out


def _int_list(values: Any) -> list[int] | None:
    """`values` as ints, or None when it is not a list of integers (a server's garbage is not an id)."""
    if not isinstance(values, list):
        return None
    out = []
    for value in values:
        if isinstance(value, bool):
            return None
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if not isinstance(value, int) or not 0 <= value < 2**31:  # ids are int32 in the schema
            return None
        out.append(value)
    return out
