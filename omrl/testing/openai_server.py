"""A real HTTP server on 127.0.0.1 that speaks the OpenAI chat-completions API, for tests and benchmarks.

It plays scripted replies: queue them with `enqueue(...)`, or pass `responder(request) -> reply` to
compute one per request. A reply is a dict:

    {"content": "text"}                                  an assistant message
    {"content": None, "tool_calls": [{"name": "f", "arguments": {...}}]}   native tool calls
    {"status": 429} / {"status": 500}                    an HTTP error (with an OpenAI error body and a
                                                         retry-after-ms header, 10 unless "retry_after_ms")
    {"raw": "not json"}                                  a malformed body with status 200
    {"status": 401, "echo": True}                        an HTTP error whose message repeats the request's
                                                         Authorization header and path (a careless endpoint)
    {"hang": 30}                                         sleep before answering (client timeouts)
    {"delay": 0.05, ...}                                 latency before a normal reply

A normal reply may carry the completion's tokens, returned the way an inference server does and only
when the request asks for them (so a test sees what the client asked):

    {"content": "hi", "completion_ids": [5, 6], "logprobs": [-0.1, -0.2],
     "tokens": ["h", "i"], "prompt_ids": [1, 2, 3], "token_style": "vllm"}

    token_style "vllm" (default): choices[0].token_ids and prompt_token_ids when `return_token_ids`;
        logprobs.content (token "token_id:N" when `return_tokens_as_token_ids`) when `logprobs`
    "vllm-0.9": as vLLM before 0.10.2, which has no `return_token_ids`: only the logprobs route
    "llamacpp": logprobs.content entries with the token's `id`, when `logprobs`
    "sglang": choices[0].token_ids and choices[0].prompt_token_ids when `return_token_ids`;
        logprobs.content with text tokens when `logprobs`

Every request body is kept in `requests`, so tests can count calls and read prompts.
"""

from __future__ import annotations

import collections
import contextlib
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from omrl.errors import UsageError

Reply = dict[str, Any]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 4096


class FakeOpenAIServer:
    """`with FakeOpenAIServer() as server: OpenAI(base_url=server.base_url, api_key="x")`."""

    def __init__(self, responder: Callable[[dict[str, Any]], Reply] | None = None,
                 default: Reply | None = None, model: str = "fake-model"):
        self.responder = responder
        self.default = default
        self.model = model
        self.queue: collections.deque[Reply] = collections.deque()
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []  # each chat request's HTTP headers (names in lower case), in order
        self.paths: list[str] = []  # ... and its path, query included
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ control

    def enqueue(self, *replies: Reply) -> None:
        with self._lock:
            self.queue.extend(replies)

    @property
    def calls(self) -> int:
        with self._lock:
            return len(self.requests)

    @property
    def base_url(self) -> str:
        assert self._server is not None, "server not started"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> FakeOpenAIServer:
        self._server = _Server(("127.0.0.1", 0), self._handler_class())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ serving

    def _next_reply(self, request: dict[str, Any]) -> Reply:
        with self._lock:
            self.requests.append(request)
            if self.queue:
                return self.queue.popleft()
        if self.responder is not None:
            return self.responder(request)
        if self.default is not None:
            return self.default
        return {"status": 500, "message": "fake server: no reply queued"}

    def completion_body(self, request: dict[str, Any], reply: Reply) -> dict[str, Any]:
        """The chat.completion JSON for a scripted reply."""
        message: dict[str, Any] = {"role": "assistant", "content": reply.get("content")}
        calls = reply.get("tool_calls") or []
        if calls:
            message["tool_calls"] = [
                {
                    "id": call.get("id") or f"call_{i}_{len(self.requests)}",
                    "type": "function",
                    "function": {
                        "name": call["name"],
                        "arguments": call["arguments"] if isinstance(call.get("arguments"), str)
                        else json.dumps(call.get("arguments") or {}),
                    },
                }
                for i, call in enumerate(calls)
            ]
        prompt_text = json.dumps(request.get("messages", []))
        completion_text = json.dumps(message)
        usage = dict(reply.get("usage") or {}) or {
            "prompt_tokens": max(1, len(prompt_text) // 4),
            "completion_tokens": max(1, len(completion_text) // 4),
        }
        usage.setdefault("total_tokens", usage["prompt_tokens"] + usage["completion_tokens"])
        body: dict[str, Any] = {
            "id": f"chatcmpl-fake-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.get("model") or self.model,
            "choices": [{
                "index": 0,
                "message": message,
                "finish_reason": reply.get("finish_reason") or ("tool_calls" if calls else "stop"),
                "logprobs": None,
            }],
            "usage": usage,
        }
        if "completion_ids" in reply:
            _add_tokens(body, request, reply)
        return body

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body are separate writes: avoid the 40 ms delayed-ACK stall

            def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
                pass

            def _send(self, status: int, body: bytes, content_type: str = "application/json",
                      retry_after_ms: int | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                if retry_after_ms is not None:  # honoured by the openai client's backoff: keeps retry tests fast
                    self.send_header("retry-after-ms", str(retry_after_ms))
                self.end_headers()
                # The client may have given up already (timeout tests); that is not the server's error.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(body)

            def do_GET(self) -> None:
                body = server.get_body(self.path)
                if body is not None:
                    self._send(200, json.dumps(body).encode())
                else:
                    self._send(404, b'{"error": {"message": "not found"}}')

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    request = json.loads(self.rfile.read(length) or b"{}")
                except json.JSONDecodeError:
                    self._send(400, b'{"error": {"message": "request is not JSON"}}')
                    return
                if not self.path.split("?")[0].rstrip("/").endswith("/chat/completions"):
                    self._send(404, b'{"error": {"message": "only /v1/chat/completions is served"}}')
                    return
                with server._lock:
                    server.headers.append({name.lower(): value for name, value in self.headers.items()})
                    server.paths.append(self.path)
                reply = server._next_reply(request)
                if reply.get("hang"):
                    time.sleep(float(reply["hang"]))
                if reply.get("delay"):
                    time.sleep(float(reply["delay"]))
                if "status" in reply:
                    message = reply.get("message", "scripted error")
                    if reply.get("echo"):
                        message = (f"Incorrect API key provided: {self.headers.get('Authorization')} "
                                   f"for {self.path} (host {self.headers.get('Host')})")
                    error = {"error": {"message": message,
                                       "type": "fake_error", "code": reply["status"]}}
                    self._send(int(reply["status"]), json.dumps(error).encode(),
                               retry_after_ms=int(reply.get("retry_after_ms", 10)))
                elif "raw" in reply:
                    self._send(200, str(reply["raw"]).encode())
                else:
                    server.respond(self, request, reply)

        return Handler

    def get_body(self, path: str) -> dict[str, Any] | None:
        """The JSON a GET of `path` answers, or None for a 404 (subclasses serve more)."""
        if path.rstrip("/").endswith("/models"):
            return {"object": "list", "data": [{"id": self.model, "object": "model"}]}
        return None

    def respond(self, handler: Any, request: dict[str, Any], reply: Reply) -> None:
        """Send a normal reply's completion (subclasses model generation time here)."""
        handler._send(200, json.dumps(self.completion_body(request, reply)).encode())


TOKEN_STYLES = ("vllm", "vllm-0.9", "llamacpp", "sglang")


def _add_tokens(body: dict[str, Any], request: dict[str, Any], reply: Reply) -> None:
    """Put the reply's completion tokens into `body` as the server of `token_style` does (see the docstring)."""
    style = reply.get("token_style", "vllm")
    if style not in TOKEN_STYLES:
        raise UsageError(f"unknown token_style {style!r}; use one of {', '.join(TOKEN_STYLES)}")
    ids = [int(i) for i in reply["completion_ids"]]
    logprobs = [float(v) for v in reply.get("logprobs") or [0.0] * len(ids)]
    texts = list(reply.get("tokens") or [f"<{i}>" for i in ids])
    if not len(ids) == len(logprobs) == len(texts):
        raise UsageError("completion_ids, logprobs and tokens must have the same length")
    choice = body["choices"][0]
    if "usage" not in reply:
        body["usage"]["completion_tokens"] = len(ids)
        if reply.get("prompt_ids") is not None:
            body["usage"]["prompt_tokens"] = len(reply["prompt_ids"])
        body["usage"]["total_tokens"] = body["usage"]["prompt_tokens"] + len(ids)
    as_ids = style.startswith("vllm") and bool(request.get("return_tokens_as_token_ids"))

    def entry(token_id: int, logprob: float, text: str) -> dict[str, Any]:
        token = f"token_id:{token_id}" if as_ids else text
        item: dict[str, Any] = {"token": token, "logprob": logprob, "bytes": list(text.encode())}
        if style == "llamacpp":
            item["id"] = token_id
        item["top_logprobs"] = [{"token": token, "logprob": logprob, "bytes": list(text.encode())}]
        return item

    if request.get("logprobs"):
        choice["logprobs"] = {"content": [entry(*t) for t in zip(ids, logprobs, texts, strict=True)]}
    if style == "vllm" and request.get("return_token_ids"):
        choice["token_ids"] = ids
        body["prompt_token_ids"] = [int(i) for i in reply.get("prompt_ids") or []]
    if style == "sglang" and request.get("return_token_ids"):
        choice["token_ids"] = ids
        choice["prompt_token_ids"] = [int(i) for i in reply.get("prompt_ids") or []]
