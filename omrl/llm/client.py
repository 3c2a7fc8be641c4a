"""The one LLM client: `openai.AsyncOpenAI`, as the OpenAI policy, the judge and the paraphraser use it.

    client = LLMClient(base_url, api_key, timeout=60.0, max_retries=4, max_connections=16)
    response = await client.chat(model="m", messages=[...], temperature=0.0)   # a ChatCompletion
    client.stats      # Counter: calls, requests, retries, timeout, connection, http_<status>, malformed
    await client.aclose()

Retries are the openai client's own (`max_retries`): exponential backoff with jitter (0.5 s doubling to at
most 8 s; a server's Retry-After is honoured) after connection errors, timeouts, 408, 409, 429 and 5xx;
other HTTP errors (400, 401, 404, 422) fail at once. A 200 whose body is not a chat completion (a proxy's
HTML page, `{}`, no choices) is a fault of the server like a 502, and the transport reports it as one, so
the same loop retries it. A call that still fails raises an LLMError, which each caller maps to its own
outcome (the policy to PolicyError / PolicyTimeout, the judge to an error annotation, the paraphraser to
a failed variant; never a score):

    LLMTimeout          the last attempt got no reply in time
    LLMConnectionError  the endpoint could not be reached
    LLMStatusError      an HTTP error (.status; .retried: whether it was a kind worth retrying)
    LLMMalformed        the reply was not a chat completion

Every attempt passes through the transport, which counts it (`stats`, and `LLMError.attempts` per call).

Load: the requests in flight adapt to what the endpoint sustains (omrl.llm.endpoint): its stated slots
(llama.cpp's /props) cap them, timeouts, 429 and 503 halve them, replies that waited in the server's queue
lower them, good replies raise them again, never above `max_connections` (`adaptive=False`: always
`max_connections`). A request waits for its turn here, off the wire, so a retry never joins the server's
queue; a request given up on (timeout, cancelled episode) has its connection closed, which tells the server
to stop. `server_info()` is what the endpoint said about itself (slots, context length), probed once.
The limit and what the endpoint said carry over to the client's next event loop and to the next client of
the same endpoint in this process (omrl.llm.endpoint: Memory), so neither climbs again from one request.

Connections: at most `max_connections` requests in flight. The transport holds a slot only while a request
is on the wire (not while backing off) and the httpx pool has as many connections. Large limits are split
over clients of at most POOL_SHARD connections, each call going to the least busy one: httpcore scans its
whole pool on every request, so one pool of 1024 connections costs O(concurrency) CPU per call. httpx pools
cannot cross event loops, so the clients are made per running loop, on first use.

Calls: at most PREPARED x `max_connections` calls are inside openai at once (building their request, on
the wire, backing off); the rest wait in `chat` before openai builds theirs (about 3 ms of CPU each). 160
judge calls started at once otherwise had all 160 built while the first replies waited to be read, and
those replies, read late, looked queued to the adaptive limit.

A call goes out through the openai client's `post` with the request as its JSON body, not through
`chat.completions.create`: create runs a type transform over every field and message of every request (a
quarter of the judge's CPU per call in a profile) with nothing to change in plain chat dicts. The JSON sent
is the same; retries and timeouts are the client's own.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import math
from collections import Counter
from typing import Any

from omrl.errors import OmrlError, UsageError
from omrl.llm.endpoint import Throttle, learned, remember
from omrl.llm.server_info import ServerInfo, probe, vllm_waiting
from omrl.schema.redact import redact, remember_secret, remember_url

try:
    import httpx2 as httpx  # the HTTP library of openai >= 3
except ImportError:  # pragma: no cover - older openai releases are built on httpx
    import httpx

POOL_SHARD = 32  # connections per HTTP client; see the module docstring
PREPARED = 2  # calls let into openai at once per max_connections; see the module docstring
MALFORMED = "x-omrl-malformed"  # marks the 502 the transport makes of a body that is not a chat completion
_RETRIED_STATUSES = (408, 409, 429)  # and every 5xx: what the openai client retries

_attempts: contextvars.ContextVar[Counter | None] = contextvars.ContextVar("omrl_llm_attempts", default=None)


class LLMError(OmrlError, RuntimeError):
    """A chat call that failed for good (an endpoint's fault, reported as one line); `attempts` is how many
    requests it sent."""

    def __init__(self, message: str, attempts: int = 1):
        super().__init__(redact(message))  # an endpoint may echo the key it was sent
        self.attempts = attempts


class LLMTimeout(LLMError):
    """No reply within the timeout (on the last attempt)."""


class LLMConnectionError(LLMError):
    """The endpoint could not be reached."""


class LLMStatusError(LLMError):
    """The endpoint answered with an HTTP error."""

    def __init__(self, message: str, attempts: int, status: int):
        super().__init__(message, attempts)
        self.status = status
        self.retried = status in _RETRIED_STATUSES or status >= 500


class LLMMalformed(LLMError):
    """The reply was not a chat completion."""


def _read(body: bytes) -> tuple[str | None, float]:
    """(why a 2xx chat-completions body is not a chat completion or None when it is one, its units of work:
    completion tokens + prompt tokens / 16, from its usage or else its size)."""
    try:
        data = json.loads(body)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        return f"the reply is not JSON ({type(exc).__name__}: {exc}): {body[:200]!r}", 0.0
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices:
        return f"the reply has no choices: {body[:200]!r}", 0.0
    first = choices[0]
    if not isinstance(first, dict) or not isinstance(first.get("message"), dict):
        return f"the reply's first choice has no message: {body[:200]!r}", 0.0
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    completion, prompt = usage.get("completion_tokens"), usage.get("prompt_tokens")
    if isinstance(completion, (int, float)) and completion >= 0:
        return None, 1.0 + completion + (prompt / 16 if isinstance(prompt, (int, float)) and prompt > 0 else 0.0)
    return None, 1.0 + len(body) / 4


@functools.cache
def _ssl_context() -> Any:
    """httpx's default TLS context, made once per process: making it loads the CA bundle (50 ms of CPU here,
    240 ms the first time), and every new event loop's client (a training step's rollouts, a judge shard) made
    one per pool before its first request went out."""
    return httpx.create_ssl_context()


@functools.cache
def _platform() -> Any:
    """openai's name for this machine in its request headers, worked out once per process (None: not found)."""
    try:
        from openai._base_client import get_platform
    except ImportError:  # pragma: no cover - another openai release: it works the platform out itself
        return None
    return get_platform()


def _with_platform(client: Any) -> Any:
    """`client` with openai's platform already worked out. openai does it on a client's first request, in a
    thread, once per request started before the first thread returns: a new event loop's client with 160 judge
    calls started at once ran 160 threads and held its first request back 0.2 s."""
    platform = _platform()
    if getattr(client, "_platform", False) is None and platform is not None:
        client._platform = platform
    return client


class _Transport(httpx.AsyncBaseTransport):
    """httpx's own transport, with a cap on requests in flight, a count of every attempt's outcome, and
    bodies that are not chat completions turned into retryable 502s."""

    def __init__(self, limit: int, stats: Counter, throttle: Throttle):
        self._inner = httpx.AsyncHTTPTransport(verify=_ssl_context(), limits=httpx.Limits(
            max_connections=limit, max_keepalive_connections=limit))
        self._slots = asyncio.Semaphore(limit)
        self._stats = stats
        self._throttle = throttle  # shared by the client's shards: the endpoint's one limit

    def _count(self, kind: str | None) -> None:
        per_call = _attempts.get()
        for counter in (self._stats, per_call) if per_call is not None else (self._stats,):
            counter["requests"] += 1
            if kind:
                counter[kind] += 1

    async def handle_async_request(self, request):
        if not (request.method == "POST" and request.url.path.endswith("/chat/completions")):
            async with self._slots:
                return await self._send(request, None)
        async with self._throttle.slot() as ticket, self._slots:
            return await self._send(request, ticket)

    async def _send(self, request, ticket):
        try:
            response = await self._inner.handle_async_request(request)
        except httpx.TimeoutException:
            self._count("timeout")
            if ticket is not None:
                ticket.done("timeout")
            raise  # httpcore has closed the connection: the server sees the request given up
        except httpx.TransportError:
            self._count("connection")
            if ticket is not None:
                ticket.done("connection")
            raise
        if response.status_code >= 400:
            self._count(f"http_{response.status_code}")
            if ticket is not None:
                ticket.done(f"http_{response.status_code}")
            return response
        if ticket is not None:
            await response.aread()
            problem, units = _read(response.content)
            if problem is not None:
                self._count("malformed")
                ticket.done("malformed")
                return httpx.Response(502, headers={MALFORMED: "1"}, request=request,
                                      json={"error": {"message": problem, "type": "malformed_reply"}})
            ticket.done("ok", units)
        self._count(None)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


class LLMClient:
    """Chat completions from an OpenAI-compatible endpoint, with retries, timeouts and connection limits."""

    def __init__(self, base_url: str | None = None, api_key: str | None = None, *, timeout: float = 60.0,
                 max_retries: int = 2, max_connections: int = 64, adaptive: bool = True):
        if max_retries < 0:
            raise UsageError(f"max_retries must be at least 0, got {max_retries}")
        if max_connections < 1:
            raise UsageError(f"max_connections must be at least 1, got {max_connections}")
        self.base_url = base_url
        self.api_key = api_key or "EMPTY"  # local servers accept any key; the client refuses to start without one
        remember_secret(self.api_key)  # hidden from every error, row and console line from now on (omrl.schema.redact)
        remember_url(base_url)
        self.timeout = timeout
        self.max_retries = max_retries
        self.max_connections = max_connections
        self.adaptive = adaptive
        self.stats: Counter[str] = Counter()
        self._clients: dict[int, list[Any]] = {}  # event loop id -> openai clients
        self._busy: list[int] = []
        self.throttle: Throttle | None = None  # the running (or last) loop's limit on requests in flight
        self._server: ServerInfo | None = None
        self._probes: dict[int, asyncio.Future] = {}
        self._gate: asyncio.Semaphore | None = None  # the running loop's PREPARED x max_connections calls

    def __getstate__(self) -> dict[str, Any]:
        # A copy sent to another process (a Ray worker) opens its own clients and limit there, on first use.
        state = dict(self.__dict__)
        state.update(_clients={}, _busy=[], throttle=None, _probes={}, _gate=None)
        return state

    def _clients_here(self) -> list[Any]:
        import openai

        loop = id(asyncio.get_running_loop())
        clients = self._clients.get(loop)
        if clients is None:
            shards = max(1, math.ceil(self.max_connections / POOL_SHARD))
            per_shard = math.ceil(self.max_connections / shards)
            earlier = self.throttle or learned(self.base_url)[1]
            self.throttle = Throttle(self.max_connections, self._server, adaptive=self.adaptive,
                                     on_busy_check=lambda: vllm_waiting(self.base_url, self.api_key))
            if earlier is not None:
                self.throttle.resume(earlier)  # a new loop or client starts where the last one got to
            if self.adaptive:
                remember(self.base_url, throttle=self.throttle)
            clients = [_with_platform(openai.AsyncOpenAI(
                base_url=self.base_url, api_key=self.api_key, timeout=self.timeout, max_retries=self.max_retries,
                http_client=openai.DefaultAsyncHttpxClient(transport=_Transport(per_shard, self.stats,
                                                                                self.throttle))))
                for _ in range(shards)]
            self._clients = {loop: clients}  # a finished loop's clients go with their pools
            self._busy = [0] * shards
            self._gate = asyncio.Semaphore(PREPARED * self.max_connections)
        return clients

    async def server_info(self) -> ServerInfo:
        """What the endpoint says about itself (slots, context length; omrl.llm.server_info.probe), asked once
        (and not again by the next client of it in this process, omrl.llm.endpoint.learned)."""
        if self._server is None:
            self._server = learned(self.base_url)[0] or await self._probe()
            remember(self.base_url, info=self._server)
        return self._server

    async def _probe(self) -> ServerInfo:
        """One probe per loop, however many requests wait for it."""
        loop = asyncio.get_running_loop()
        pending = self._probes.get(id(loop))
        if pending is None or pending.get_loop() is not loop:
            pending = self._probes[id(loop)] = loop.create_task(probe(self.base_url, self.api_key))
        info = await pending
        self._probes.clear()
        return info

    async def chat(self, *, timeout: float | None = None, **request: Any) -> Any:
        """One chat completion (`request`: the arguments of `chat.completions.create`, `extra_body` merged into
        the body; no streaming); raises LLMError."""
        import openai
        from openai.types.chat import ChatCompletion

        if self.adaptive and self._server is None:
            info = await self.server_info()
            self._clients_here()
            self.throttle.set_info(info)
        clients = self._clients_here()
        assert self._gate is not None  # made with the loop's clients
        async with self._gate:
            shard = min(range(len(clients)), key=self._busy.__getitem__)
            attempts: Counter[str] = Counter()
            token = _attempts.set(attempts)
            self._busy[shard] += 1
            self.stats["calls"] += 1
            try:
                response = await clients[shard].post(
                    "/chat/completions", cast_to=ChatCompletion, body=_body(request),
                    options={"timeout": timeout or self.timeout, "headers": request.get("extra_headers") or {},
                             "params": request.get("extra_query") or {}})
                if not getattr(response, "choices", None):  # e.g. JSON served as text/plain: openai hands back a str
                    raise LLMMalformed(f"the reply is not a chat completion: {str(response)[:200]!r}",
                                       _tries(attempts))
                return response
            except openai.APITimeoutError:
                raise LLMTimeout(f"no reply within {timeout or self.timeout}s", _tries(attempts)) from None
            except openai.APIConnectionError as exc:
                raise LLMConnectionError(f"{type(exc).__name__}: {exc}", _tries(attempts)) from None
            except openai.APIStatusError as exc:
                if exc.response.headers.get(MALFORMED):
                    raise LLMMalformed(_message(exc), _tries(attempts)) from None
                raise LLMStatusError(f"HTTP {exc.status_code}: {_message(exc)}", _tries(attempts),
                                     exc.status_code) from None
            except (openai.APIResponseValidationError, ValueError) as exc:  # a body the openai types cannot read
                raise LLMMalformed(f"{type(exc).__name__}: {exc}", _tries(attempts)) from None
            finally:
                self._busy[shard] -= 1
                self.stats["retries"] += max(0, attempts["requests"] - 1)
                _attempts.reset(token)

    def chat_sync(self, **request: Any) -> Any:
        """`chat` from synchronous code (no event loop running): one loop, closed with its connections."""
        async def once():
            try:
                return await self.chat(**request)
            finally:
                await self.aclose()

        return asyncio.run(once())

    async def aclose(self) -> None:
        """Close the HTTP clients of the running loop."""
        for client in self._clients.pop(id(asyncio.get_running_loop()), []):
            await client.close()


def _body(request: dict[str, Any]) -> dict[str, Any]:
    """The JSON body of a chat completion for `request` (chat.completions.create's arguments): its fields, with
    `extra_body` merged in; `extra_headers` and `extra_query` go to the request options."""
    body = {key: value for key, value in request.items() if key not in ("extra_body", "extra_headers", "extra_query")}
    body.update(request.get("extra_body") or {})
    return body


def _tries(attempts: Counter) -> int:
    return max(1, attempts["requests"])


def _message(exc: Any) -> str:
    """The server's error message (OpenAI error bodies nest it under "error")."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
        return json.dumps(body)[:300]
    return str(getattr(exc, "message", exc))[:300]
