"""What an OpenAI-compatible endpoint says about itself: its slots, its context length, vLLM's queue.

What a server says (read once, the three GETs at once, two seconds at most, failures ignored):
- llama.cpp's server: GET /props gives `total_slots` (requests served at once) and the context `n_ctx`.
- vLLM (and SGLang): GET /v1/models gives each model's `max_model_len`; vLLM's GET /metrics has no slot
  count but `vllm:num_requests_waiting`, the requests its scheduler could not take yet, polled while
  requests are in flight (omrl.llm.endpoint's Throttle, every POLL_S at most): a queue there means more in flight would only wait.
- api.openai.com is not probed.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

_WAITING = re.compile(r"^vllm:num_requests_waiting(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$", re.MULTILINE)


@dataclass
class ServerInfo:
    """What an endpoint says about itself; None where it says nothing."""

    kind: str | None = None  # "llama.cpp", "vllm", "openai" (api.openai.com), or None
    slots: int | None = None  # requests it serves at once
    context_length: int | None = None  # tokens of prompt and completion together


def is_openai_com(base_url: str | None) -> bool:
    """api.openai.com (also the client's default when no base URL is set)."""
    if not base_url:
        return True
    host = urlparse(base_url).hostname or ""
    return host == "openai.com" or host.endswith(".openai.com")


def server_root(base_url: str) -> str:
    """The server's root URL: the base URL without its /v1."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


async def _get_json(client: Any, url: str) -> Any:
    try:
        response = await client.get(url)
        return response.json() if response.status_code == 200 else None
    except Exception:  # a server that does not have this endpoint, or says it in a way we cannot read
        return None


async def _get_text(client: Any, url: str) -> str | None:
    try:
        response = await client.get(url)
    except Exception:  # no such endpoint (no metrics): nothing more to learn
        return None
    return response.text if response.status_code == 200 else None


async def probe(base_url: str | None, api_key: str | None, model: str | None = None,
                timeout: float = 2.0) -> ServerInfo:
    """Ask the endpoint for its slots and context length (see the module docstring); never raises. The three
    GETs go at once: a server that is slow to answer paths it does not serve delays the first request once."""
    if is_openai_com(base_url):
        return ServerInfo(kind="openai")  # a hosted service: its rate limits answer 429, its latency varies
    info = ServerInfo()
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    root = server_root(base_url)
    async with httpx.AsyncClient(timeout=timeout, headers=headers) as client:
        props, models, metrics = await asyncio.gather(
            _get_json(client, f"{root}/props"), _get_json(client, f"{base_url.rstrip('/')}/models"),
            _get_text(client, f"{root}/metrics"))
    if isinstance(props, dict) and _positive_int(props.get("total_slots")):
        info.kind, info.slots = "llama.cpp", props["total_slots"]
        settings = props.get("default_generation_settings")
        n_ctx = (settings.get("n_ctx") if isinstance(settings, dict) else None) or props.get("n_ctx")
        info.context_length = _positive_int(n_ctx)
    entries = models.get("data") if isinstance(models, dict) else None
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and (model is None or entry.get("id") == model or len(entries) == 1):
            info.context_length = info.context_length or _positive_int(entry.get("max_model_len"))
            if entry.get("owned_by") == "vllm":
                info.kind = info.kind or "vllm"
    if info.kind is None and metrics is not None and "vllm:" in metrics:
        info.kind = "vllm"
    return info


async def vllm_waiting(base_url: str, api_key: str | None, timeout: float = 2.0) -> int | None:
    """Requests vLLM's scheduler holds waiting (its /metrics), or None when it cannot be read."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with httpx.AsyncClient(timeout=timeout, headers=headers) as client:
            response = await client.get(f"{server_root(base_url)}/metrics")
    except Exception:
        return None
    found = _WAITING.findall(response.text) if response.status_code == 200 else []
    return int(sum(float(v) for v in found)) if found else None
