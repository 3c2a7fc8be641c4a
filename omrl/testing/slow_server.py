"""A slow local model server: FakeOpenAIServer generating at N tokens/s through a fixed number of slots,
as a llama.cpp or llama-cpp-python server on a CPU does. For tests and benchmarks/slow_server.py.

    with SlowServer(slots=1, tokens_per_s=200, context_length=8192, responder=answer) as server: ...

- A reply's length is its `tokens` (else its content's and tool calls' length / 4), cut to the request's `max_tokens` and
  to the context left after the prompt (finish_reason "length", the content cut to match). Without
  `max_tokens` a reply with `ramble: true` runs on to the end of the context, as a small model that
  never stops does when nothing limits it.
- Generating takes tokens / tokens_per_s (plus the prompt at 16x that speed) inside one of `slots`; other
  requests wait their turn. A prompt (`prompt_tokens`) plus max_tokens beyond `context_length` is a
  400 in llama.cpp's words ("the request exceeds the available context size").
- `cancel_on_disconnect` (llama.cpp's server): a request whose client hung up stops generating and frees
  its slot. Without it (llama-cpp-python) an abandoned request runs to its end, holding the slot.
- `advertise` serves what llama.cpp and vLLM say about themselves: GET /props (total_slots, n_ctx) and
  max_model_len on GET /v1/models. Without it the server says nothing, as llama-cpp-python.
- Counted: `generated_tokens`, `abandoned` (requests whose client hung up), `wasted_tokens` (generated
  for them), `peak_waiting` (most requests waiting for a slot at once).
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from typing import Any

from omrl.testing.openai_server import FakeOpenAIServer, Reply

STEP_S = 0.01  # generation advances (and checks for a hung-up client) in steps this long


class SlowServer(FakeOpenAIServer):
    """See the module docstring."""

    def __init__(self, *, slots: int = 1, tokens_per_s: float = 100.0, context_length: int | None = None,
                 cancel_on_disconnect: bool = True, advertise: bool = False, **options: Any):
        super().__init__(**options)
        self.slots, self.tokens_per_s, self.context_length = slots, float(tokens_per_s), context_length
        self.cancel_on_disconnect, self.advertise = cancel_on_disconnect, advertise
        self._slots = threading.Semaphore(slots)
        self._count = threading.Lock()
        self.waiting = self.peak_waiting = 0
        self.generated_tokens = self.wasted_tokens = self.abandoned = 0

    def get_body(self, path: str) -> dict[str, Any] | None:
        if not self.advertise:
            return super().get_body(path)
        if path.rstrip("/").endswith("/props"):
            return {"total_slots": self.slots, "default_generation_settings": {"n_ctx": self.context_length}}
        if path.rstrip("/").endswith("/models"):
            return {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "llamacpp",
                                                 "max_model_len": self.context_length}]}
        return None

    def respond(self, handler: Any, request: dict[str, Any], reply: Reply) -> None:
        prompt = prompt_tokens(request.get("messages") or [])
        wanted = request.get("max_tokens") or request.get("max_completion_tokens")
        if self.context_length and prompt + (wanted or 0) > self.context_length:
            message = (f"the request exceeds the available context size ({prompt + (wanted or 0)} tokens, "
                       f"context {self.context_length}), try increasing it")
            handler._send(400, json.dumps({"error": {"code": 400, "message": message,
                                                     "type": "exceed_context_size_error"}}).encode())
            return
        content = str(reply.get("content") or "")
        calls = json.dumps(reply.get("tool_calls") or [])
        natural = int(reply.get("tokens") or max(1, (len(content) + len(calls)) // 4))
        room = (self.context_length - prompt) if self.context_length else None
        if reply.get("ramble") and not wanted:
            natural = max(natural, room or natural)
        tokens = min(t for t in (natural, wanted, room) if t)
        if not self._slots.acquire(blocking=False):  # every slot busy: wait in line
            with self._count:
                self.waiting += 1
                self.peak_waiting = max(self.peak_waiting, self.waiting)
            self._slots.acquire()
            with self._count:
                self.waiting -= 1
        try:
            gone, share = self._generate(handler.connection, tokens + prompt / 16)
        finally:
            self._slots.release()
        with self._count:
            self.generated_tokens += round(tokens * share)
            if gone:
                self.abandoned += 1
                self.wasted_tokens += round(tokens * share)
        if gone:
            return
        cut = dict(reply, usage={"prompt_tokens": prompt, "completion_tokens": tokens})
        if tokens < natural:
            cut["content"] = content[: max(0, len(content) * tokens // natural)]
            cut["finish_reason"] = "length"
        handler._send(200, json.dumps(self.completion_body(request, cut)).encode())

    def _generate(self, connection: socket.socket, work_tokens: float) -> tuple[bool, float]:
        """Take the time of `work_tokens`: (whether the client hung up meanwhile, the share generated)."""
        started = time.monotonic()
        duration = work_tokens / self.tokens_per_s
        gone = False
        while True:
            elapsed = time.monotonic() - started
            if elapsed >= duration:
                return gone, 1.0
            time.sleep(min(STEP_S, duration - elapsed))
            if not gone and _hung_up(connection):
                gone = True
                if self.cancel_on_disconnect:
                    return True, min(1.0, (time.monotonic() - started) / duration)


def prompt_tokens(messages: list[dict[str, Any]]) -> int:
    """The prompt's tokens as this server counts them: 4 characters of text (content, tool calls) a token,
    plus 4 a message for the chat template's markers."""
    chars = sum(len(str(m.get("content") or "")) + len(json.dumps(m.get("tool_calls") or [])) for m in messages
                if isinstance(m, dict))
    return max(1, chars // 4 + 4 * len(messages))


def _hung_up(connection: socket.socket) -> bool:
    """Whether the client closed its end (readable with nothing to read)."""
    try:
        readable, _, _ = select.select([connection], [], [], 0)
        return bool(readable) and connection.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True
