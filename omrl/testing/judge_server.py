"""A rule-following LLM judge served in its own process on 127.0.0.1, speaking the OpenAI chat API.

    python -m omrl.testing.judge_server --port 0 --rule grid --latency 0.5
    # prints one line "ready http://127.0.0.1:PORT/v1", then serves until killed

It stands in for a hosted judge model (none can run here): it reads the judge prompt omrl.annotate.judge
builds (pointwise "Trajectory:" or group "=== TRAJECTORY i ===" renderings, and the rubric's "Scale: from
LO (worst) to HI (best)") and answers the JSON the rubric asks for, scoring each trajectory FROM ITS
TEXT by a stated rule; it never sees the environment's reward.

Rule "grid" (grid navigation, omrl/envs/grid/env.py renderings): the first observation "goal: 3 left, 2 up"
gives the shortest path (5 moves); a trajectory whose last observation is "reached the goal" scores
1 - 0.25 per move beyond the shortest path (at least 0.1: reaching beats not reaching), one that does not
reach it scores 0; the 0..1 value is mapped onto the rubric's scale.
Rule "reached": 1 if the last observation is "reached the goal", else 0 (coarser than the env's reward:
no penalty for wasted moves). Rule "length": shorter renderings score higher (1 / (1 + chars / 1000)), for any environment.

Faults, for tests: `--fault KIND=FRACTION` (repeatable) makes that fraction of prompts fail the same way
every time they are asked (chosen by a hash of the trajectory text, so retries and re-asks fail too):
500 (an HTTP 500), malformed (a 200 whose body is not JSON), badjson (a reply that is not JSON), range (a
score outside the scale). GET /v1/stats returns {"requests", "by_kind", "distinct_prompts",
"repeated_prompts"} so tests can count calls and see whether a prompt was asked twice.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import re
import subprocess
import sys
import threading
import urllib.request
from collections import Counter
from typing import Any

from omrl.errors import UsageError
from omrl.testing.openai_server import FakeOpenAIServer, _Server

_SCALE = re.compile(r"Scale: from (-?[\d.]+) \(worst\) to (-?[\d.]+) \(best\)")
_GOAL = re.compile(r"goal: ([^\n]*)")
_STEP = re.compile(r"(\d+) (?:left|right|up|down)")
FAULTS = ("500", "malformed", "badjson", "range")


def grid_rule(rendering: str) -> float:
    """The grid rule of the module docstring, in 0..1."""
    observations = re.findall(r"^USER: (.*)$", rendering, flags=re.MULTILINE)
    moves = len(re.findall(r"^ASSISTANT:", rendering, flags=re.MULTILINE))
    if not observations or "reached the goal" not in observations[-1]:
        return 0.0
    first = _GOAL.search(observations[0])
    shortest = sum(int(n) for n in _STEP.findall(first.group(1))) if first else moves
    return max(0.1, 1.0 - 0.25 * max(0, moves - shortest))


def reached_rule(rendering: str) -> float:
    """1 when the last observation says the goal was reached, else 0: no credit for a short path."""
    observations = re.findall(r"^USER: (.*)$", rendering, flags=re.MULTILINE)
    return 1.0 if observations and "reached the goal" in observations[-1] else 0.0


def length_rule(rendering: str) -> float:
    return 1.0 / (1.0 + len(rendering) / 1000.0)


RULES = {"grid": grid_rule, "reached": reached_rule, "length": length_rule}


def _renderings(messages: list[dict[str, Any]]) -> tuple[str, list[str]]:
    """("group" | "pointwise", the trajectory texts of the request's real prompt, few-shot examples aside)."""
    users = [str(m.get("content") or "") for m in messages if m.get("role") == "user"]
    for text in reversed(users):
        if "=== TRAJECTORY 1 ===" in text:
            parts = re.split(r"=== TRAJECTORY \d+ ===\n", text)
            return "group", [p.strip() for p in parts[1:]]
        if text.startswith("Trajectory:\n"):
            return "pointwise", [text[len("Trajectory:\n"):]]
    return "none", []


class JudgeServer(FakeOpenAIServer):
    """FakeOpenAIServer with a rule responder, faults, latency, a fixed port and GET /v1/stats."""

    def __init__(self, rule: str = "grid", latency: float = 0.0, faults: dict[str, float] | None = None,
                 port: int = 0, model: str = "rule-judge"):
        if rule not in RULES:
            raise UsageError(f"unknown rule {rule!r}; known: {', '.join(RULES)}")
        super().__init__(responder=self.reply, model=model)
        self.rule, self.latency, self.port = RULES[rule], latency, port
        self.faults = dict(faults or {})
        if sum(self.faults.values()) > 1.0 + 1e-9 or any(k not in FAULTS for k in self.faults):
            raise UsageError(f"faults must be kinds of {', '.join(FAULTS)} with fractions summing to <= 1")
        self.by_kind: Counter[str] = Counter()
        self.prompts: Counter[str] = Counter()  # hash of the request's messages -> times asked
        self._count = threading.Lock()

    def start(self) -> JudgeServer:
        self._server = _Server(("127.0.0.1", self.port), self._handler_class())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def _fault(self, texts: list[str]) -> str | None:
        if not self.faults:
            return None
        u = int.from_bytes(hashlib.sha256("\n".join(texts).encode()).digest()[:8], "big") / 2**64
        edge = 0.0
        for kind in FAULTS:
            edge += self.faults.get(kind, 0.0)
            if u < edge:
                return kind
        return None

    def reply(self, request: dict[str, Any]) -> dict[str, Any]:
        messages = request.get("messages") or []
        system = next((str(m.get("content") or "") for m in messages if m.get("role") == "system"), "")
        scale = _SCALE.search(system)
        lo, hi = (float(scale.group(1)), float(scale.group(2))) if scale else (0.0, 1.0)
        mode, texts = _renderings(messages)
        fault = self._fault(texts)
        key = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()
        with self._count:
            self.by_kind[fault or mode] += 1
            self.prompts[key] += 1
        base = {"delay": self.latency} if self.latency else {}
        if fault == "500":
            return {**base, "status": 500, "message": "judge overloaded (scripted)"}
        if fault == "malformed":
            return {**base, "raw": "<html>bad gateway</html>"}
        if fault == "badjson":
            return {**base, "content": "I would give it a ten."}
        if mode == "none":
            return {**base, "status": 400, "message": "no trajectory in the prompt"}
        scores = [round(lo + (hi - lo) * self.rule(t), 4) for t in texts]
        if fault == "range":
            scores = [hi + 10 * (hi - lo) for _ in scores]
        why = "rule score from the trajectory text"
        if mode == "group":
            body = {"scores": [{"id": i, "score": s, "rationale": why} for i, s in enumerate(scores, 1)]}
        else:
            body = {"score": scores[0], "rationale": why}
        return {**base, "content": json.dumps(body)}

    def stats(self) -> dict[str, Any]:
        with self._count:
            return {"requests": self.calls, "by_kind": dict(self.by_kind), "distinct_prompts": len(self.prompts),
                    "repeated_prompts": sum(1 for n in self.prompts.values() if n > 1)}

    def _handler_class(self):
        base = super()._handler_class()
        server = self

        class Handler(base):
            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/stats"):
                    self._send(200, json.dumps(server.stats()).encode())
                else:
                    super().do_GET()

        return Handler


class JudgeProcess:
    """`with JudgeProcess(rule="grid") as judge: judge.base_url, judge.stats()`: the server in a subprocess."""

    def __init__(self, rule: str = "grid", latency: float = 0.0, faults: dict[str, float] | None = None,
                 port: int = 0):
        self.args = [sys.executable, "-m", "omrl.testing.judge_server", "--port", str(port), "--rule", rule,
                     "--latency", str(latency)] + [a for k, v in (faults or {}).items() for a in ("--fault", f"{k}={v}")]
        self.proc: subprocess.Popen | None = None
        self.base_url = ""

    def start(self) -> JudgeProcess:
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""  # "" when it died before serving
        if not line.startswith("ready "):
            self.stop()
            raise RuntimeError(f"judge server did not start: {line!r}")
        self.base_url = line.split()[1]
        return self

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.base_url + "/stats", timeout=10) as resp:
            return json.loads(resp.read())

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> JudgeProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _fault(text: str) -> tuple[str, float]:
    kind, _, fraction = text.partition("=")
    try:
        return kind, float(fraction)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--fault wants KIND=FRACTION, got {text!r}") from None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A rule-following OpenAI-compatible judge on 127.0.0.1.")
    parser.add_argument("--port", type=int, default=0, help="TCP port (0: any free one; the ready line says which)")
    parser.add_argument("--rule", choices=sorted(RULES), default="grid", help="how trajectories are scored")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before each reply (a remote judge)")
    parser.add_argument("--fault", type=_fault, action="append", default=[],
                        help=f"KIND=FRACTION of prompts that fail; kinds: {', '.join(FAULTS)}")
    args = parser.parse_args(argv)
    server = JudgeServer(args.rule, args.latency, dict(args.fault), args.port).start()
    print(f"ready {server.base_url}", flush=True)
    try:
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is the way to stop it
            threading.Event().wait()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
