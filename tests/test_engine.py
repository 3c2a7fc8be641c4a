"""omrl.envs.engine: engine processes answer, fail visibly, are replaced, and never outlive their owner."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from omrl.envs import engine_memory
from omrl.envs.base import Action, Reset, StepResult, Task
from omrl.envs.engine import EngineCrashed, EngineError, EngineWorker, GuardedProcess
from omrl.sandbox.limits import MemoryCap, memory_cap
from tests.engine_helpers import running

ECHO = "omrl.testing.engines:EchoEngine"
ROOT = Path(__file__).resolve().parents[1]


def wait_gone(pids: list[int], seconds: float = 10.0) -> list[int]:
    """The pids still running after waiting up to `seconds` for them to end."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = [p for p in pids if running(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if running(p)]


@pytest.fixture
def worker():
    engine = EngineWorker(ECHO, {"with_child": True}, name="echo")
    yield engine
    engine.close()


def test_calls_come_back_and_errors_are_engine_errors(worker):
    assert worker.call("echo", {"a": [1, "x"]}) == {"a": [1, "x"]}
    with pytest.raises(EngineError, match="ValueError: boom"):
        worker.call("fail", "boom")
    with pytest.raises(EngineError, match="cannot be sent back"):
        worker.call("unpicklable")
    assert worker.call("echo", 7) == 7  # an engine error leaves the engine running
    pids = worker.call("pids")
    assert worker.engine_pids()[:1] == pids[:1] and set(pids) <= set(worker.engine_pids())


def test_a_dead_engine_is_a_crash_with_its_status_and_output_then_replaced(worker):
    pids = worker.call("pids")
    with pytest.raises(EngineCrashed, match=r"exited with code 3 during exit.*dying now"):
        worker.call("exit", 3, "dying now")
    assert wait_gone(pids) == []  # its child went with it (the guard kills the group)
    with pytest.raises(EngineCrashed):
        worker.call("echo", 1)
    assert worker.ensure() is True and worker.restarts == 1
    assert worker.call("echo", 2) == 2
    assert worker.ensure() is False


def test_a_silent_engine_is_killed_after_its_timeout(worker):
    pids = worker.call("pids")
    started = time.monotonic()
    with pytest.raises(EngineCrashed, match="no answer to hang within 0.5 s"):
        worker.call("hang", 30, timeout=0.5)
    assert time.monotonic() - started < 10
    assert wait_gone(pids) == [] and not worker.alive()


def test_close_kills_the_engine_and_what_it_started(worker):
    pids = worker.call("pids")
    assert len(pids) == 2 and all(running(p) for p in pids)
    worker.close()
    assert wait_gone(pids) == []
    worker.close()  # idempotent
    with pytest.raises(EngineCrashed, match="closed"):
        worker.call("echo", 1)


def test_a_constructor_that_fails_leaves_nothing_running():
    with pytest.raises(EngineError, match="unexpected keyword"):
        EngineWorker(ECHO, {"no_such_option": 1}, name="echo")


OWNER = textwrap.dedent("""
    import json, os, sys, threading, time
    from omrl.envs.engine import EngineWorker, GuardedProcess
    made = {}
    def make():  # in a thread that then exits, as environments are made in worker threads
        made["worker"] = EngineWorker("omrl.testing.engines:EchoEngine", {"with_child": True})
        made["raw"] = GuardedProcess([sys.executable, "-c", "import time; time.sleep(3600)"])
    thread = threading.Thread(target=make); thread.start(); thread.join()
    while not made["raw"].engine_pids():  # the guard starts its engine a moment after it started
        time.sleep(0.01)
    pids = made["worker"].engine_pids() + made["raw"].engine_pids()
    if sys.argv[1] == "fork" and os.fork() == 0:  # a forked child must not keep the engines alive
        time.sleep(60); os._exit(0)
    print(json.dumps(pids), flush=True)
    time.sleep(60)
""")


@pytest.mark.parametrize("mode", ["plain", "fork"])
def test_engines_die_when_their_owner_is_killed_with_sigkill(mode):
    owner = subprocess.Popen([sys.executable, "-c", OWNER, mode], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
    try:
        pids = json.loads(owner.stdout.readline())
        assert len(pids) == 3 and all(running(p) for p in pids)  # worker, its child, the raw process
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        assert wait_gone(pids) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(owner.pid, signal.SIGKILL)  # the forked child, if any
        owner.wait()


def test_guarded_process_reports_how_it_ended():
    process = GuardedProcess([sys.executable, "-c", "import sys; sys.stderr.write('bye\\n'); sys.exit(5)"])
    process.process.wait(30)
    assert process.exit_status() == "exited with code 5"
    process._readers[0].join(5)
    assert process.stderr_tail() == "bye"
    process.close()
    killed = GuardedProcess([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"])
    killed.process.wait(30)
    assert killed.exit_status() == "was killed by signal 15 (SIGTERM)"
    killed.close()


def test_a_piped_stdout_is_read_and_closed_with_the_process():
    """chromedriver's stdout: read into a tail (a pipe left unread fills), closed by close() (no unclosed file)."""
    process = GuardedProcess([sys.executable, "-c", "print('listening on 9515', flush=True); import time; time.sleep(60)"],
                             stdout=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while "listening" not in process.stdout_tail() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process.stdout_tail() == "listening on 9515" and process.stderr_tail() == ""
    finally:
        process.close()
    assert process.process.stdout.closed and process.process.stderr.closed


CAP_MB, HOG_MB = 200, 400  # an echo engine (python and a child) holds about 40 MB of its own


@pytest.fixture(params=["host", "polling"])
def hold(request, monkeypatch):
    """How engines' memory caps are held: as this host allows (a cgroup where one can be made), and by polling."""
    if request.param == "polling":
        monkeypatch.setattr(engine_memory, "memory_cap", lambda: MemoryCap("polling", "forced by the test"))
    return request.param


@pytest.mark.parametrize("in_child", [False, True], ids=["engine", "its-child"])
def test_an_engine_over_its_memory_cap_is_killed_and_replaced(hold, in_child):
    capped = EngineWorker(ECHO, {"with_child": True}, name="echo", memory_mb=CAP_MB)
    try:
        assert (capped.memory.group is None) == (hold == "polling" or memory_cap().kind == "polling")
        pids = capped.call("pids")
        started = time.monotonic()
        with pytest.raises(EngineCrashed, match=f"memory cap of {CAP_MB} MB") as crash:
            capped.call("hog", HOG_MB, 60, in_child)  # held for a minute unless the cap kills it
        assert time.monotonic() - started < 30, crash.value
        assert wait_gone(pids) == [] and not capped.alive() and capped.over_memory()
        assert capped.ensure() is True and capped.restarts == 1
        assert capped.call("echo", 2) == 2 and not capped.over_memory()
        capped.call("hog", CAP_MB // 4, 0.1, in_child)  # below the cap: nothing happens
        assert capped.alive()
    finally:
        capped.close()


def test_an_uncapped_engine_holds_what_it_likes():
    engine = EngineWorker(ECHO, name="echo")
    try:
        assert engine.memory is None
        engine.call("hog", HOG_MB, 0.6)  # longer than one poll
        assert engine.alive() and not engine.over_memory()
    finally:
        engine.close()


class HoggingEnv:
    """A reusable environment on a capped echo engine; a task whose id starts with "hog" makes it pass its cap."""

    name = "hogging"
    reusable = True

    def __init__(self) -> None:
        self.engine = EngineWorker(ECHO, {"with_child": True}, name="echo", memory_mb=CAP_MB)
        self.task: Task | None = None

    def reset(self, task: Task) -> Reset:
        self.engine.ensure()
        self.task = task
        return Reset(observation="go")

    def step(self, action: Action) -> StepResult:
        assert self.task is not None
        if self.task.id.startswith("hog"):
            self.engine.call("hog", HOG_MB, 60, True)
        return StepResult("done", 1.0, True, {"success": True})

    def expert_action(self) -> Action:
        return Action(text="go")

    def close(self) -> None:
        self.engine.close()


def test_an_episode_whose_engine_passes_its_cap_is_an_env_error_and_the_rest_go_on():
    from omrl.policies import make_policy
    from omrl.rollout import EnvPool, RolloutSettings, play_episodes

    pool = EnvPool(HoggingEnv)
    jobs = [(Task(id=name, instruction="go"), 0) for name in ("calm-1", "hog-1", "calm-2")]
    settings = RolloutSettings(env="hogging", max_turns=2, concurrency=1)

    async def run():
        try:
            return await play_episodes(jobs, HoggingEnv, make_policy("scripted"), settings, run_id="cap", pool=pool)
        finally:
            await pool.close()

    episodes = asyncio.run(run())
    assert [e.status for e in episodes] == ["ok", "env_error", "ok"]
    assert f"memory cap of {CAP_MB} MB" in episodes[1].row["error"]
    assert pool.made == 2  # the engine over its cap went with its instance; a new one played the last
