"""A stdlib HTTP server speaking the AgentGym environment protocol around any omrl environment.

    POST /create                      -> {"id": N}
    POST /reset {"id", "data_idx"}    -> {"observation", "reward", "score", "done", "tools"}
    POST /step  {"id", "action"}      -> {"observation", "reward", "score", "done", "info"}
    GET  /observation?id=N            -> the current observation (a JSON string)
    POST /close {"id"}                -> {"closed": true}
    GET  /expert?id=N                 -> {"action": "<text>"}  (omrl extension: the wrapped env's expert move)

`data_idx` indexes the server's task list; actions are text (`name[argument]` or a JSON tool call).
Used by the tests of the `http` client and by `omrl envs serve`.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from omrl.envs.base import Action, Task
from omrl.envs.toolenv import action_to_text


class EnvServer:
    """Environment instances by id, all made from one spec and sharing one task list."""

    def __init__(self, env_spec: str, tasks: list[Task], **env_options: Any) -> None:
        self.env_spec, self.tasks, self.env_options = env_spec, tasks, env_options
        self.envs: dict[int, Any] = {}
        self.state: dict[int, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.next_id = 0

    def create(self) -> dict[str, Any]:
        from omrl.envs import make_env

        with self.lock:
            env_id = self.next_id
            self.next_id += 1
        self.envs[env_id] = make_env(self.env_spec, **self.env_options)
        self.state[env_id] = {"observation": "", "score": 0.0, "done": False}
        return {"id": env_id}

    def reset(self, env_id: int, data_idx: int) -> dict[str, Any]:
        if not 0 <= data_idx < len(self.tasks):
            raise KeyError(f"data_idx {data_idx} out of range (0..{len(self.tasks) - 1})")
        first = self._env(env_id).reset(self.tasks[data_idx])
        self.state[env_id] = {"observation": first.observation, "score": 0.0, "done": False}
        return {"observation": first.observation, "reward": 0.0, "score": 0.0, "done": False, "tools": first.tools}

    def step(self, env_id: int, action: str) -> dict[str, Any]:
        result = self._env(env_id).step(Action(text=str(action)))
        state = self.state[env_id]
        state["score"] += result.reward
        state.update(observation=result.observation, done=result.done)
        return {"observation": result.observation, "reward": result.reward, "score": state["score"],
                "done": result.done, "info": result.info}

    def expert(self, env_id: int) -> dict[str, Any]:
        return {"action": action_to_text(self._env(env_id).expert_action())}

    def observation(self, env_id: int) -> str:
        self._env(env_id)
        return self.state[env_id]["observation"]

    def close(self, env_id: int) -> dict[str, Any]:
        env = self.envs.pop(env_id, None)
        self.state.pop(env_id, None)
        if env is not None:
            env.close()
        return {"closed": env is not None}

    def close_all(self) -> None:
        """Close every environment still open (clients that never sent /close); the first failure is raised."""
        errors = []
        for env_id in list(self.envs):
            try:
                self.close(env_id)
            except Exception as exc:  # close the others first, then report
                errors.append(exc)
        if errors:
            raise errors[0]

    def _env(self, env_id: int) -> Any:
        if env_id not in self.envs:
            raise KeyError(f"no environment with id {env_id}")
        return self.envs[env_id]


def make_handler(server_state: EnvServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
            return

        def _reply(self, status: int, body: Any) -> None:
            data = json.dumps(body, default=str).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _handle(self, work) -> None:
            try:
                self._reply(200, work())
            except KeyError as exc:
                self._reply(404, {"error": str(exc.args[0] if exc.args else exc)})
            except (ValueError, TypeError) as exc:
                self._reply(400, {"error": str(exc)})
            except Exception as exc:  # the wrapped env failed: report it as a server error, keep serving
                self._reply(500, {"error": f"{type(exc).__name__}: {exc}"})

        def do_GET(self) -> None:
            url = urlparse(self.path)
            query = parse_qs(url.query)
            env_id = lambda: int(query.get("id", query.get("env_idx", ["-1"]))[0])  # noqa: E731
            routes = {"/": lambda: "ok",
                      "/observation": lambda: server_state.observation(env_id()),
                      "/expert": lambda: server_state.expert(env_id())}
            if url.path not in routes:
                return self._reply(404, {"error": f"no route {url.path}"})
            self._handle(routes[url.path])

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except json.JSONDecodeError:
                return self._reply(400, {"error": "body is not JSON"})
            env_id = lambda: int(body.get("id", body.get("env_idx", -1)))  # noqa: E731
            routes = {"/create": server_state.create,
                      "/reset": lambda: server_state.reset(env_id(), int(body.get("data_idx", 0))),
                      "/step": lambda: server_state.step(env_id(), body["action"]),
                      "/close": lambda: server_state.close(env_id())}
            if self.path not in routes:
                return self._reply(404, {"error": f"no route {self.path}"})
            self._handle(routes[self.path])

    return Handler


class EnvHTTPServer(ThreadingHTTPServer):
    """The HTTP server; server_close() also closes the environments clients left open."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], env_server: EnvServer) -> None:
        self.env_server = env_server  # before binding: a failed bind calls server_close()
        super().__init__(address, make_handler(env_server))

    def server_close(self) -> None:
        super().server_close()
        self.env_server.close_all()


def start_server(env_spec: str, tasks: list[Task], host: str = "127.0.0.1", port: int = 0,
                 **env_options: Any) -> tuple[EnvHTTPServer, str]:
    """Serve in a background thread; returns the server (call .shutdown(), then .server_close()) and its base URL."""
    httpd = EnvHTTPServer((host, port), EnvServer(env_spec, tasks, **env_options))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://{host}:{httpd.server_address[1]}"
