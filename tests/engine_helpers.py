"""Helpers for the tests of engine-backed environments (TextWorld, TextWorldExpress, ...)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from omrl.envs import env_class, unavailable
from omrl.policies.base import EpisodeContext, PolicyReply
from omrl.policies.scripted import ScriptedPolicy

ROOT = Path(__file__).resolve().parents[1]


def require_env(name: str) -> None:
    """Skip when the environment cannot run here, except under CI (`make test` installs what it needs there)."""
    reason = unavailable(env_class(name))
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"environment {name} cannot run in CI: {reason} (make test should have installed it)")
    pytest.skip(f"environment {name} cannot run here: {reason}")


def running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def gone_within(pids: list[int], seconds: float = 10.0) -> bool:
    """True once none of `pids` is running; False if some still run after `seconds`. A SIGKILLed JVM takes a
    moment to tear its threads down, longer on a loaded machine: checking at once races with that."""
    deadline = time.monotonic() + seconds
    while any(running(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def marked_processes(marker: str) -> list[int]:
    """Running processes whose environment holds OMRL_TEST_MARKER=marker (a command and all it started)."""
    needle = f"OMRL_TEST_MARKER={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0") and running(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def jvm_caps_seen(engine: Any) -> tuple[str, int]:
    """(JAVA_TOOL_OPTIONS in the environment of the JVM an EngineWorker started, the heap ceiling the JVM
    itself reports in MB): what -Xmx reached the JVM, read from it."""
    java = [p for p in engine.engine_pids()[1:] if "java" in command_line(p).split(" ")[0]]
    assert len(java) == 1, [command_line(p) for p in engine.engine_pids()]
    environ = dict(item.split(b"=", 1) for item in Path(f"/proc/{java[0]}/environ").read_bytes().split(b"\0")
                   if b"=" in item)
    return environ.get(b"JAVA_TOOL_OPTIONS", b"").decode(), engine.call("max_heap_mb")


def kill_collect_mid_run(argv: list[str], cwd: Path, engine_word: str, timeout: float = 240.0) -> tuple[list[int], list[int]]:
    """Start `omrl ARGV`, wait until an engine process whose command line holds `engine_word` runs, SIGKILL
    the command; returns (the engine pids seen, the marked processes still running 10 s later)."""
    marker = uuid.uuid4().hex
    env = {**os.environ, "OMRL_TEST_MARKER": marker, "PYTHONPATH": str(ROOT)}
    command = subprocess.Popen([sys.executable, "-m", "omrl", *argv], cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + timeout
        engines: list[int] = []
        while time.monotonic() < deadline and command.poll() is None:
            engines = [p for p in marked_processes(marker) if engine_word in command_line(p)]
            if engines:
                break
            time.sleep(0.2)
        assert engines, f"no {engine_word} process appeared: {command.stderr.read().decode()[-2000:] if command.poll() is not None else 'still starting'}"
        time.sleep(1.0)  # let it play a little
        engines = [p for p in marked_processes(marker) if engine_word in command_line(p)] or engines  # at the kill
        os.kill(command.pid, signal.SIGKILL)
        command.wait()
        deadline = time.monotonic() + 10
        left = marked_processes(marker)
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = marked_processes(marker)
        return engines, left
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()
        for pid in marked_processes(marker):  # never leave anything behind, even when the test fails
            os.kill(pid, signal.SIGKILL)


class KillingPolicy(ScriptedPolicy):
    """The scripted expert, except that at turn `at` of the first episode it kills the environment's engine
    processes (`which`: "engine" = the engine process, "child" = what it started, e.g. the JVM)."""

    name = "killing-expert"

    def __init__(self, at: int = 2, which: str = "engine") -> None:
        self.at, self.which = at, which
        self.killed: list[int] = []

    async def act(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                  context: EpisodeContext) -> PolicyReply:
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        if turn == self.at and not self.killed:
            pids = context.env.engine.engine_pids()
            victims = pids[:1] if self.which == "engine" else pids[1:]
            assert victims, f"no {self.which} process to kill: {pids}"
            for pid in victims:
                os.kill(pid, signal.SIGKILL)
            self.killed = victims
            deadline = time.monotonic() + 10
            while any(running(p) for p in victims) and time.monotonic() < deadline:
                time.sleep(0.05)
        return await super().act(messages, tools, context)
