from __future__ import annotations

import time

import pytest

from omrl import sandbox
from omrl.envs import make_env as _make_env
from omrl.envs.base import Action, Task
from omrl.envs.toolenv import play_episode
from omrl.tasks import generate_tasks, load_tasks, shipped_datasets_dir

SHIPPED = load_tasks(shipped_datasets_dir() / "tasks" / "code.jsonl")
SANDBOXED = sandbox.sandbox_status()[0]  # tests/test_sandbox.py checks the sandbox itself


def make_env(spec: str, **options):
    """The code env, sandboxed where bubblewrap works; these trusted shipped projects may run without it."""
    return _make_env(spec, unsafe_no_sandbox=not SANDBOXED, **options)


def test_a_dozen_shipped_tasks():
    assert len(SHIPPED) >= 12 and all(t.env == "code" and t.payload["fix"] for t in SHIPPED)


@pytest.mark.parametrize("task", SHIPPED, ids=lambda t: t.id)
def test_tests_fail_before_and_expert_fixes_each_task(task):
    env = make_env("code")
    env.reset(task)
    before = env.step(Action(tool="run_tests"))
    assert before.observation.startswith("Tests failed") and before.info["returncode"] != 0
    assert before.info["sandboxed"] is SANDBOXED
    total, last, _ = play_episode(env, task)
    assert total == 1.0 and last.info["success"] and last.done
    env.close()


def test_submit_without_fix_gets_zero():
    env = make_env("code")
    env.reset(SHIPPED[0])
    result = env.step(Action(tool="submit"))
    assert result.done and result.reward == 0.0 and result.info["success"] is False
    env.close()


def test_generated_code_tasks_embed_their_files():
    tasks = generate_tasks("code")
    assert len(tasks) == len(SHIPPED) and all(t.payload["files"] for t in tasks)
    total, _, _ = play_episode(make_env("code"), tasks[0])
    assert total == 1.0


def test_writes_outside_the_folder_are_refused(tmp_path):
    env = make_env("code")
    env.reset(SHIPPED[0])
    outside = tmp_path / "escape.py"
    for path in ["../escape.py", str(outside), "a/../../escape.py"]:
        result = env.step(Action(tool="write_file", arguments={"path": path, "content": "x = 1"}))
        assert result.info["invalid_action"] and "outside the project" in result.observation
    assert not outside.exists()
    read = env.step(Action(tool="read_file", arguments={"path": "/etc/passwd"}))
    assert read.info["invalid_action"] and "root:" not in read.observation
    missing = env.step(Action(tool="read_file", arguments={"path": "nope.py"}))
    assert missing.info["invalid_action"] and "no such file" in missing.observation
    twice = env.step(Action(tool="replace_in_file", arguments={"path": SHIPPED[0].payload["fix"][0]["path"],
                                                               "old": "", "new": "x"}))
    assert twice.info["invalid_action"]
    env.close()


def test_endless_loop_is_killed_within_its_limit():
    loop = Task(id="loop", instruction="never ends", env="code", payload={"files": {
        "test_loop.py": "import unittest\n\nclass T(unittest.TestCase):\n    def test_forever(self):\n"
                        "        while True:\n            pass\n"}})
    env = make_env("code", test_timeout_s=1.5)
    env.reset(loop)
    start = time.monotonic()
    result = env.step(Action(tool="submit"))
    elapsed = time.monotonic() - start
    assert result.info["timed_out"] and result.reward == 0.0 and "Killed" in result.observation
    assert elapsed < 1.5 + 5  # killed, not waited out
    env.close()


def test_memory_limit_stops_a_hungry_test():
    hungry = Task(id="mem", instruction="eats memory", env="code", payload={"files": {
        "test_mem.py": "import unittest\n\nclass T(unittest.TestCase):\n    def test_eat(self):\n"
                       "        self.block = bytearray(600 * 1024 * 1024)\n"}})
    env = make_env("code", memory_mb=256)
    env.reset(hungry)
    result = env.step(Action(tool="run_tests"))
    assert result.observation.startswith("Tests failed") and "MemoryError" in result.observation
    env.close()


def test_close_removes_the_folder():
    env = make_env("code")
    env.reset(SHIPPED[0])
    root = env.root
    assert root.is_dir()
    env.close()
    assert not root.exists()


def test_bad_paths_and_arguments_are_invalid_actions_not_errors():
    env = make_env("code")
    env.reset(SHIPPED[0])
    first = env._files()[0]
    moves = [("write_file", {"path": f"{first}/inner.py", "content": "x = 1"}),  # a parent that is a file
             ("read_file", {"path": "bad\0name.py"}),
             ("replace_in_file", {"path": first, "old": 1, "new": "x"})]
    for tool, arguments in moves:
        result = env.step(Action(tool=tool, arguments=arguments))
        assert result.info["invalid_action"] and not result.done, (tool, result.observation)
    env.close()


def test_a_reset_that_fails_leaves_no_folder(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    escaping = Task(id="bad", instruction="x", env="code", payload={"files": {"../escape.py": "x = 1"}})
    env = make_env("code")
    with pytest.raises(ValueError, match="bad"):
        env.reset(escaping)
    assert list(tmp_path.iterdir()) == [] and env.root is None
