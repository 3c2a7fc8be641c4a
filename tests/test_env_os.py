"""The long-lived sandboxed shell (omrl.sandbox.SandboxShell) and the `os` environment on AgentBench's OS tasks."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from omrl import sandbox
from omrl.envs import generate_tasks, make_env
from omrl.envs.base import Action, InvalidTask
from omrl.envs.os_interaction.env import size_match
from omrl.envs.os_interaction.tasks import refusal, task_from_record
from omrl.envs.toolenv import play_episode
from tests.cases import os_hacks
from tests.cases.escapes import processes_with
from tests.cases.os_hacks import HIDDEN_FILES, OsHack, os_hack_cases, play_hack

AVAILABLE, WHY = sandbox.sandbox_status()
needs_sandbox = pytest.mark.skipif(not AVAILABLE, reason=f"bubblewrap sandbox unavailable here: {WHY}")


@pytest.fixture
def os_source(real_data):
    return str(real_data / "agentbench_os_dev.json")


@needs_sandbox
def test_the_shell_keeps_its_state_and_a_timeout_kills_only_that_command():
    marker = "omrl-shell-test-7c1d"
    view = sandbox.SandboxView(writable=("/root",), uid=0, project_dir="/root")
    with sandbox.SandboxShell(limits=sandbox.SandboxLimits(timeout_s=60), view=view) as shell:
        assert shell.run("cd /root && export X=41 && echo $((X + 1)) > f").returncode == 0
        assert shell.run("pwd; echo $X; cat f; id -u").output.split() == ["/root", "41", "42", "0"]
        background = f"python3 -c 'import time\nwhile True: time.sleep(0.1)' {marker} &"
        assert shell.run(background).returncode == 0
        start = time.monotonic()
        slow = shell.run("sleep 30; echo never", timeout_s=1.5)
        assert slow.timed_out and slow.returncode is None and "never" not in slow.output
        assert time.monotonic() - start < 1.5 + 3
        assert shell.run("echo $X; pwd").output.split() == ["41", "/root"]  # the shell's state survived
        assert processes_with(marker)  # the start-script-like job runs on
        failed = shell.run("echo out; echo err >&2; read line; exit 7")
        assert failed.restarted and "out" in failed.output and "err" in failed.output
        assert shell.run("echo $X; ls /root").output.strip() == ""  # a new shell, a new /root
        assert processes_with(marker) == []  # the old sandbox died whole
        with pytest.raises(ValueError, match="NUL"):
            shell.run("echo \0")
        flood = shell.run("yes | head -c 3000000", max_output_bytes=10_000)
        assert flood.output_truncated and len(flood.output) <= 10_000
        shell.run(background)
    assert processes_with(marker) == []  # close ends everything inside


@needs_sandbox
def test_the_shell_is_held_by_the_total_memory_cap():
    with sandbox.SandboxShell(limits=sandbox.SandboxLimits(timeout_s=60, memory_mb=200)) as shell:
        result = shell.run("python3 -c \"import os\nfor i in range(8):\n  fd = os.memfd_create('m')\n  "
                           "[os.write(fd, b'1' * (1 << 20)) for _ in range(49)]\n  print(i, flush=True)\"",
                           timeout_s=30)
        printed = [int(x) for x in result.output.split() if x.isdigit()]
        assert result.returncode != 0 and max(printed, default=0) < 4, result.output  # 4 x 49 MB > 200 MB


def test_the_agentbench_tasks_that_cannot_run_here_are_refused_by_name(os_source):
    import json

    records = json.loads(Path(os_source).read_text())
    payloads = [task_from_record(r, i, "dev", "os").payload for i, r in enumerate(records)]
    refused = {i: refusal(p) for i, p in enumerate(payloads) if refusal(p)}
    assert len(records) == 26 and len(records) - len(refused) >= 20, refused
    assert all(("does not include" in why or "su" in why) for why in refused.values()), refused
    tasks = generate_tasks("os", n=None, source=os_source)
    assert len(tasks) == 26 - len(refused) and all(t.env == "os" and t.split == "dev" for t in tasks)
    assert size_match("4.0K", "4.0K") and size_match("4096", "4.0K") and not size_match("8K", "4.0K")


@needs_sandbox
@pytest.mark.parametrize("index", [0, 6, 8, 14, 18, 22])  # match + start script, counts, size, groups, useradd, string
def test_expert_solutions_pass_and_a_wrong_answer_fails(index, os_source):
    task = next(t for t in generate_tasks("os", n=None, source=os_source) if t.payload["source_index"] == index)
    env = make_env("os")
    try:
        total, last, _ = play_episode(env, task)
        assert total == 1.0 and last.info["success"], last.info
        env.reset(task)
        wrong = env.step(Action(tool="answer", arguments={"answer": "not-the-answer"}))
        assert wrong.done and wrong.reward == 0.0 and wrong.info["success"] is False
    finally:
        env.close()


@needs_sandbox
def test_a_refused_task_is_an_invalid_task_and_bash_is_sandboxed(os_source):
    import json

    records = json.loads(Path(os_source).read_text())
    env = make_env("os", command_timeout_s=1.5)
    try:
        with pytest.raises(InvalidTask, match="does not include"):
            env.reset(task_from_record(records[3], 3, "dev", "os"))
        env.reset(task_from_record(records[6], 6, "dev", "os"))
        seen = env.step(Action(tool="bash", arguments={"command": "cat /etc/shadow; ls /work 2>&1; whoami"}))
        assert "root:*:" in seen.observation and "No such file" in seen.observation  # its own /etc, no host folders
        slow = env.step(Action(tool="bash", arguments={"command": "sleep 60"}))
        assert slow.info["timed_out"] and "killed after 1.5 s" in slow.observation and not slow.done
    finally:
        env.close()


# ------------------------------------------------------------------------ reward hacks (tests/cases/os_hacks.py)


def _task(source: str, index: int):
    return next(t for t in generate_tasks("os", n=None, source=source) if t.payload["source_index"] == index)


def _bash(env, command: str):
    return env.step(Action(tool="bash", arguments={"command": command}))


@needs_sandbox
@pytest.mark.parametrize("hack", os_hack_cases(), ids=lambda hack: hack.name)
def test_a_hostile_episode_earns_no_reward(hack, os_source):
    task = _task(os_source, hack.task)
    honest = make_env("os")
    try:
        total, right, _ = play_episode(honest, task)  # the expert: run the example, answer what it prints
    finally:
        honest.close()
    assert total == 1.0
    expected = right.info["expected"]
    last = play_hack(hack, task)
    assert last.done and last.reward == 0.0 and last.info["success"] is False, (hack.name, last.info)
    assert last.info["expected"] == expected  # the hack changed the shell, not what the answer meets


@needs_sandbox
def test_after_exit_the_shell_gets_the_task_setup_again(os_source):
    env = make_env("os")
    try:
        env.reset(_task(os_source, HIDDEN_FILES))
        left = _bash(env, "exit")
        assert left.info["setup_rerun"] and left.info["shell_restarted"] and not left.done
        assert "the shell restarted; the task's setup was run again" in left.observation
        assert _bash(env, 'ls -a /home | grep "^\\." | wc -l').observation.strip() == "8"  # init's files are back
        assert _bash(env, "getent passwd | wc -l").observation.strip() == "17"  # and the base system's users
        calm = _bash(env, "true")
        assert calm.info["setup_rerun"] is False and "restarted" not in calm.observation
        assert env.step(Action(tool="answer", arguments={"answer": "8"})).reward == 1.0
    finally:
        env.close()


@needs_sandbox
def test_a_shell_killed_between_commands_is_set_up_again_before_the_next_one(os_source):
    env = make_env("os")
    try:
        env.reset(_task(os_source, HIDDEN_FILES))
        assert _bash(env, "(sleep 0.3; kill -KILL $$) >/dev/null 2>&1 &").info["setup_rerun"] is False
        deadline = time.monotonic() + 10
        while env.shell.alive and time.monotonic() < deadline:
            time.sleep(0.1)
        seen = _bash(env, 'ls -a /home | grep "^\\." | wc -l')
        assert seen.info["setup_rerun"] and seen.observation.startswith("8\n"), seen.observation
        assert "the task's setup was run again" in seen.observation
    finally:
        env.close()


@needs_sandbox
def test_an_example_that_prints_nothing_or_hangs_at_reset_is_a_setup_failure(monkeypatch):
    record = {"description": "How many?", "evaluation": {"check": [None, {"file": "check/integer-match.py"}],
                                                         "example": "true"}}
    env = make_env("os")
    try:
        with pytest.raises(RuntimeError, match="no expected answer at reset"):
            env.reset(task_from_record(record, 0, "dev", "os"))
        monkeypatch.setattr(env, "example_timeout_s", 1.0)
        record["evaluation"]["example"] = "sleep 30; echo 3"
        with pytest.raises(RuntimeError, match="timed out: True"):
            env.reset(task_from_record(record, 1, "dev", "os"))
    finally:
        env.close()


@needs_sandbox
def test_the_expected_answer_is_the_examples_in_a_clean_bash(os_source):
    """Even what the init script leaves in the shell (a function, an alias, PATH) does not reach the example."""
    init = "touch /home/.a /home/.b; wc() { cat >/dev/null; echo 99; }; export PATH=/nowhere:$PATH"
    record = {"description": "How many hidden files are in /home? Is /nowhere on PATH?",
              "create": {"init": {"code": init}}, "evaluation": {
                  "check": [None, {"file": "check/string-match.py"}],
                  "example": {"code": 'ls -a /home | grep "^\\." | wc -l; echo "$PATH" | grep -c nowhere'}}}
    env = make_env("os")
    try:
        env.reset(task_from_record(record, 0, "dev", "os"))
        last = env.step(Action(tool="answer", arguments={"answer": "4\n0"}))  # . .. .a .b; PATH is the env's
        assert last.reward == 1.0, last.info
    finally:
        env.close()


@needs_sandbox
def test_the_hack_runner_counts_what_scores(os_source, monkeypatch):
    cases = [os_hack_cases()[0], OsHack("honest-answer", HIDDEN_FILES, [("answer", {"answer": "8"})])]
    monkeypatch.setattr(os_hacks, "os_hack_cases", lambda: cases)
    report = os_hacks.run_os_hacks(os_source)
    assert report == {"tried": 2, "scored": ["honest-answer"], "honest_ok": True, "errors": []}
