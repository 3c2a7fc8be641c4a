"""omrl.envs.engine: engine processes answer, fail visibly, are replaced, and never outlive their owner."""

from __future__ import annotations

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

from omrl.envs.engine import EngineCrashed, EngineError, EngineWorker, GuardedProcess
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
    process._reader.join(5)
    assert process.stderr_tail() == "bye"
    process.close()
    killed = GuardedProcess([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"])
    killed.process.wait(30)
    assert killed.exit_status() == "was killed by signal 15 (SIGTERM)"
    killed.close()
