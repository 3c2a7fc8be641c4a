from __future__ import annotations

import time
from pathlib import Path

import pytest

from omrl import sandbox
from omrl.envs import make_env as _make_env
from omrl.envs.base import Action, Task
from omrl.envs.toolenv import play_episode
from omrl.tasks import generate_tasks, load_tasks, shipped_datasets_dir
from tests.cases.hacks import CODE_HACK_PROJECT, CODE_HACKS, PASSING_TEST

SHIPPED = load_tasks(shipped_datasets_dir() / "tasks" / "code.jsonl")
SANDBOXED = sandbox.sandbox_status()[0]  # tests/test_sandbox.py checks the sandbox itself
CODE_HACK_TASK = next(t for t in SHIPPED if t.payload["project"] == CODE_HACK_PROJECT)


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


@pytest.mark.parametrize("writes", CODE_HACKS.values(), ids=list(CODE_HACKS))
def test_a_forged_pass_is_not_rewarded(writes):
    """Rewriting the tests, shadowing a module, a start-up hook, an exit at import or a patched runner: the tests
    as the task gave them decide, and changes that reach into the runner are refused."""
    env = make_env("code")
    try:
        env.reset(CODE_HACK_TASK)
        for path, content in writes.items():
            env.step(Action(tool="write_file", arguments={"path": path, "content": content}))
        result = env.step(Action(tool="submit"))
        assert result.reward == 0.0 and not result.info["success"], result.observation
        assert result.info.get("restored_before_scoring") or result.info.get("forgery_signs")
    finally:
        env.close()


def test_an_honest_fix_that_also_edits_a_test_still_passes():
    task = CODE_HACK_TASK
    env = make_env("code")
    try:
        env.reset(task)
        for edit in task.payload["fix"]:
            env.step(Action(tool="replace_in_file", arguments={"path": edit["path"], "old": edit["old"],
                                                               "new": edit["new"]}))
        env.step(Action(tool="write_file", arguments={"path": "test_series.py", "content": PASSING_TEST}))
        result = env.step(Action(tool="submit"))
        assert result.reward == 1.0 and result.info["restored_before_scoring"] == ["test_series.py"]
    finally:
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


# ------------------------------------------------------------------------------ hostile tasks and actions (issue 21)

from omrl.envs.base import InvalidTask  # noqa: E402
from tests.cases import escapes  # noqa: E402


@pytest.mark.parametrize("name", sorted(escapes.task_attacks(Path("/nonexistent"), create=False)))
def test_a_project_outside_the_shipped_or_named_roots_is_an_invalid_task(name, tmp_path):
    payload, options = escapes.task_attacks(tmp_path)[name]
    env = make_env("code", **options)
    with pytest.raises(InvalidTask) as refused:
        env.reset(Task(id=name, instruction="x", env="code", payload=payload))
    assert f"code task {name!r}" in str(refused.value) and escapes.SANDBOX_SECRET not in str(refused.value)
    assert env.root is None
    env.close()


def test_projects_resolve_in_a_root_the_user_names(tmp_path):
    project = tmp_path / "mine" / "calc"
    project.mkdir(parents=True)
    (project / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    tasks = [Task(id="by-name", instruction="x", env="code", payload={"project": "mine/calc"}),
             Task(id="by-dir", instruction="x", env="code", payload={"project_dir": "mine/calc"})]
    for task in tasks:
        env = make_env("code", projects_root=str(tmp_path))
        assert "calc.py" in env.reset(task).observation
        env.close()
        with pytest.raises(InvalidTask, match="projects_root"):  # not without the root named
            make_env("code").reset(task)
    shipped = make_env("code", projects_root=str(tmp_path))  # the shipped projects still resolve
    assert shipped.reset(SHIPPED[0]).observation
    shipped.close()


def test_an_invalid_task_is_stored_as_such_not_a_traceback(tmp_path):
    import json

    from click.testing import CliRunner

    from omrl.cli.main import cli
    from omrl.store import Store

    payload, _ = escapes.task_attacks(tmp_path)["project_dotdot"]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "climb", "instruction": "x", "env": "code", "payload": payload}) + "\n")
    flags = [] if SANDBOXED else ["--unsafe-no-sandbox"]
    result = CliRunner().invoke(cli, ["collect", "--env", "code", "--tasks", str(tasks), "--policy", "scripted",
                                      "--store", str(tmp_path / "s"), "--no-progress", *flags])
    assert result.exit_code == 0, result.output
    [row] = Store(tmp_path / "s").read().to_pylist()
    assert row["status"] == "env_error" and "InvalidTask: code task 'climb': payload.project" in row["error"]
    assert "Traceback" not in row["error"] and escapes.SANDBOX_SECRET not in json.dumps(row, default=str)


@pytest.mark.parametrize("name", sorted(escapes.ACTION_ATTACKS))
def test_lone_surrogates_and_control_characters_are_invalid_actions(name):
    tool, arguments = escapes.ACTION_ATTACKS[name]
    env = make_env("code")
    env.reset(Task(id=name, instruction="x", env="code", payload={"files": {"a.py": "a = 1\n"}}))
    result = env.step(Action(tool=tool, arguments=arguments))
    assert result.info["invalid_action"] and not result.done, result.observation
    assert escapes.snapshot(env.root) == {"a.py": b"a = 1\n"}  # nothing created, nothing half-written
    assert env.step(Action(tool="list_files")).observation == "a.py"
    env.close()


def test_every_code_input_case_of_the_escape_harness_holds(tmp_path):
    results = escapes.run_code_input_cases(tmp_path)
    assert len(results) == len(escapes.task_attacks(tmp_path)) + len(escapes.ACTION_ATTACKS) >= 15
    assert [(name, leaks) for name, _, leaks in results if leaks] == []
