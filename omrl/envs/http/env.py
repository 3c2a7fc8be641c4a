"""`http`: a client for environment servers speaking the AgentGym HTTP protocol (create/reset/step/observation).

AgentGym servers differ in small ways; the defaults fit BabyAI/SciWorld/TextCraft-style servers
(`{"id": N}`, reset with `data_idx`), and `id_key="env_idx", reset_key="session_id"` fits WebShop's.
The task to play is payload["data_idx"] (or a numeric task id).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from omrl.envs.base import Action, Reset, StepResult, Task
from omrl.envs.toolenv import action_to_text
from omrl.errors import OmrlError, UsageError


class EnvServerError(OmrlError, RuntimeError):
    """The environment server is unreachable or answered with an error (stored as env_error)."""


@dataclass
class HttpOptions:
    """HttpEnv's constructor options, as `--env-option KEY=VALUE` gives them (checked by the recipe loader)."""

    base_url: str = "http://127.0.0.1:8000"
    id_key: str = "id"
    reset_key: str = "data_idx"
    timeout_s: float = 60.0
    tools: list[dict[str, Any]] | None = None


class HttpEnv:
    """Client for AgentGym-protocol environment servers (WebShop, ALFWorld, SciWorld, BabyAI, ...) over HTTP."""

    name = "http"
    options_class = HttpOptions

    def __init__(self, base_url: str = "http://127.0.0.1:8000", id_key: str = "id", reset_key: str = "data_idx",
                 timeout_s: float = 60.0, tools: list[dict[str, Any]] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.id_key, self.reset_key, self.timeout_s = id_key, reset_key, timeout_s
        self.tools = tools
        self.env_id: Any = None

    def reset(self, task: Task) -> Reset:
        if self.env_id is None:
            created = self._request("POST", "/create")
            self.env_id = created.get(self.id_key, created.get("id")) if isinstance(created, dict) else created
            if self.env_id is None:
                raise EnvServerError(f"POST {self.base_url}/create answered {created!r}: no {self.id_key!r}")
        index = data_index(task)
        response = self._request("POST", "/reset", {self.id_key: self.env_id, self.reset_key: index})
        observation = _observation(response)
        if observation is None:  # WebShop-style servers return a tuple; the page comes from /observation
            observation = _observation(self._request("GET", f"/observation?{self.id_key}={self.env_id}"))
        tools = self.tools if self.tools is not None else \
            (response.get("tools") if isinstance(response, dict) else None) or []
        return Reset(observation=str(observation or task.instruction), tools=tools)

    def step(self, action: Action) -> StepResult:
        text = action.text if action.tool is None else action_to_text(action)
        response = self._request("POST", "/step", {self.id_key: self.env_id, "action": text})
        if not isinstance(response, dict):
            raise EnvServerError(f"{self.base_url}/step returned {response!r}, expected an object")
        info = response.get("info") if isinstance(response.get("info"), dict) else {}
        return StepResult(observation=str(_observation(response) or ""), reward=float(response.get("reward") or 0.0),
                          done=bool(response.get("done")), info=info)

    def expert_action(self) -> Action:
        """The server's expert move (omrl servers only: GET /expert)."""
        return Action(text=self._request("GET", f"/expert?{self.id_key}={self.env_id}")["action"])

    def close(self) -> None:
        if self.env_id is not None:
            try:
                self._request("POST", "/close", {self.id_key: self.env_id})
            finally:
                self.env_id = None

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                return json.loads(reply.read() or b"null")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", errors="replace")[:500]
            raise EnvServerError(f"{method} {self.base_url}{path} failed with HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise EnvServerError(f"{method} {self.base_url}{path} failed: {exc}") from None
        except json.JSONDecodeError:
            raise EnvServerError(f"{method} {self.base_url}{path} did not answer JSON") from None


def data_index(task: Task) -> int:
    """The server-side task index: payload data_idx/idx/session_id, else a numeric id (or its trailing number)."""
    for key in ("data_idx", "idx", "session_id", "game"):
        if key in task.payload:
            return int(task.payload[key])
    digits = task.id.rsplit("-", 1)[-1]
    if digits.isdigit():
        return int(digits)
    raise UsageError(f"http task {task.id!r}: put the server's task index in payload['data_idx']")


def _observation(response: Any) -> Any:
    if isinstance(response, str):
        return response
    if isinstance(response, list):
        return response[0] if response else None
    if isinstance(response, dict):
        return response.get("observation", response.get("state"))
    return None
