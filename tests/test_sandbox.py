"""The sandbox for agent-written code: each escape an attacker probe found, tried by a test file the agent
wrote, run through CodeEnv.run_tests inside the bubblewrap sandbox.

The attempts (the agent's test bodies and judges of what they got) are defined once, in
tests/cases/escapes.py, whose report (every attempt, counted) is checked here too."""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from omrl import sandbox
from omrl.cli.main import cli
from omrl.envs import make_env
from omrl.envs.base import Action, Task
from omrl.envs.toolenv import play_episode
from omrl.sandbox import limits as sandbox_limits
from omrl.store import Store
from omrl.tasks import load_tasks, shipped_datasets_dir
from tests.cases import escapes
from tests.cases.escapes import SANDBOX_SECRET as SECRET
from tests.cases.escapes import SandboxProbe, SandboxRun, agent_test, processes_with, run_agent_test

AVAILABLE, WHY = sandbox.sandbox_status()
needs_sandbox = pytest.mark.skipif(not AVAILABLE, reason=f"bubblewrap sandbox unavailable here: {WHY}")
SHIPPED = load_tasks(shipped_datasets_dir() / "tasks" / "code.jsonl")


@needs_sandbox
def test_host_files_are_not_visible(tmp_path):
    probe = SandboxProbe.make(tmp_path)
    seen, info, env = run_agent_test(escapes.HOST_FILES.body(probe), marker=probe.marker)
    env.close()
    assert info["sandboxed"] and info["returncode"] == 0, seen
    assert "root:" not in seen and "READ " not in seen and seen.count("DENIED") == len(probe.read_targets()), seen
    assert SECRET not in seen and f'LISTED ["{probe.host_dir}"' not in seen  # the host folder: not read, not listed
    assert "'work'" not in seen and "'home'" not in seen and "ID 65534 65534" in seen
    assert escapes.HOST_FILES.judge(probe, SandboxRun(seen, info, 0, 10)) == []  # nothing of the host listed


@needs_sandbox
def test_parent_environment_secrets_do_not_reach_the_tests(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    probe = SandboxProbe.make(tmp_path)
    seen, info, env = run_agent_test(escapes.ENV_SECRETS.body(probe), marker=probe.marker)
    env.close()
    assert info["sandboxed"] and "ENV {" in seen and "PROC 1 " in seen, seen
    assert SECRET not in seen and "OPENAI_API_KEY" not in seen and "WITH THE SECRET []" in seen


@needs_sandbox
def test_writes_outside_the_project_do_not_reach_the_host(tmp_path):
    probe = SandboxProbe.make(tmp_path)
    targets = probe.write_targets()
    seen, info, env = run_agent_test(escapes.HOST_WRITES.body(probe), marker=probe.marker)
    assert info["sandboxed"] and seen.count("REFUSED") == len(targets) and "WROTE" not in seen, seen
    assert not any(os.path.lexists(t) for t in targets)
    assert [p.name for p in tmp_path.iterdir()] == [probe.host_dir.name]
    assert [p.name for p in probe.host_dir.iterdir()] == ["secret.txt"]
    assert not (env.root / "inside.txt").exists()  # the tests work on a copy of the project
    env.close()


@needs_sandbox
def test_no_network_not_even_the_hosts_loopback(tmp_path):
    with escapes.loopback_server() as (port, accepted):
        probe = SandboxProbe.make(tmp_path, port=port)
        seen, info, env = run_agent_test(escapes.NETWORK.body(probe), marker=probe.marker)
        env.close()
    assert info["sandboxed"] and "NO CONNECTION" in seen and "NO DNS" in seen, seen
    assert "CONNECTED" not in seen and accepted == []


@needs_sandbox
def test_forking_150_processes_is_limited(tmp_path):
    probe = SandboxProbe.make(tmp_path)
    seen, info, env = run_agent_test(escapes.FORK_BOMB.body(probe), marker=probe.marker, **escapes.FORK_BOMB.options)
    env.close()
    children = int(seen.split("CHILDREN ")[1].split()[0])
    assert info["sandboxed"] and "FORK REFUSED 11" in seen and 40 <= children < escapes.FORK_LIMIT, seen
    assert processes_with(probe.marker) == []  # the sleeping children (forks of the marked run) died with it


@needs_sandbox
def test_disk_writes_are_capped_in_total(tmp_path):
    probe = SandboxProbe.make(tmp_path)
    seen, info, env = run_agent_test(escapes.DISK_FILL.body(probe), marker=probe.marker, **escapes.DISK_FILL.options)
    written = int(seen.split("MB ")[-1].split()[0])
    assert info["sandboxed"] and "No space left on device" in seen and written < escapes.DISK_MB, seen
    assert sum(p.stat().st_size for p in env.root.rglob("*") if p.is_file()) < 1 << 20  # host copy untouched
    env.close()


@needs_sandbox
def test_a_detached_child_holding_the_output_open_is_killed_on_time(tmp_path):
    probe = SandboxProbe.make(tmp_path)
    limit = escapes.DETACHED_CHILD.options["test_timeout_s"]
    start = time.monotonic()
    seen, info, env = run_agent_test(escapes.DETACHED_CHILD.body(probe), marker=probe.marker, test_timeout_s=limit)
    elapsed = time.monotonic() - start
    assert info["sandboxed"] and info["timed_out"] and "Killed" in seen and "child started" in seen, seen
    assert elapsed < limit + escapes.RETURN_GRACE_S  # returned on time although a detached child held the pipe
    assert processes_with(probe.marker) == []  # and nothing the tests started outlived the call
    env.close()


@needs_sandbox
def test_close_kills_a_test_run_still_going():
    marker = "omrl-close-marker-51e"
    env = make_env("code", test_timeout_s=30)
    env.reset(Task(id="slow", instruction="slow", env="code", payload={"files": {
        "test_slow.py": agent_test(f"time.sleep(60)  # {marker}")}}))
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.update(result=env.step(Action(tool="run_tests"))))
    start = time.monotonic()
    thread.start()
    time.sleep(1.0)
    env.close()  # as the episode runner does when an episode times out
    thread.join(timeout=10)
    assert not thread.is_alive() and time.monotonic() - start < 8
    assert processes_with(marker) == []


@needs_sandbox
@pytest.mark.parametrize("task", SHIPPED[:3], ids=lambda t: t.id)
def test_shipped_projects_still_pass_after_the_gold_fix(task):
    env = make_env("code")
    total, last, _ = play_episode(env, task)
    env.close()
    assert total == 1.0 and last.info["success"] and last.info["sandboxed"]


@needs_sandbox
def test_payload_test_command_runs_with_the_interpreter_inside():
    import sys

    for command in ([sys.executable, "-m", "unittest", "-q"], ["python3", "-m", "unittest", "-q"]):
        env = make_env("code")
        env.reset(Task(id="cmd", instruction="x", env="code", payload={
            "test_command": command, "files": {"test_ok.py": agent_test("self.assertTrue(True)")}}))
        result = env.step(Action(tool="run_tests"))
        env.close()
        assert result.observation.startswith("Tests passed") and result.info["sandboxed"], result.observation


@needs_sandbox
def test_sandbox_run_reports_its_result():
    with pytest.raises(ValueError):
        sandbox.run_sandboxed([], "/nonexistent")
    result = sandbox.run_sandboxed(["python3", "-c", "import sys; print('out'); sys.exit(3)"], Path(__file__).parent,
                                   sandbox.SandboxLimits(timeout_s=20))
    assert (result.returncode, result.output.strip(), result.timed_out, result.sandboxed) == (3, "out", False, True)
    missing = sandbox.run_sandboxed(["no-such-program"], Path(__file__).parent)
    assert missing.returncode == 127 and "cannot run no-such-program" in missing.output


def no_bwrap(monkeypatch) -> None:
    """The availability probe as on a machine without bubblewrap (the cached answer is restored afterwards)."""
    monkeypatch.setattr(sandbox.runner, "_bwrap", lambda: None)
    monkeypatch.setattr(sandbox.runner, "_status", None)


def test_without_a_sandbox_the_env_refuses_unless_told_otherwise(monkeypatch):
    no_bwrap(monkeypatch)
    with pytest.raises(sandbox.SandboxUnavailable) as refused:
        make_env("code")
    message = str(refused.value)
    assert "apt-get install bubblewrap" in message and "--unsafe-no-sandbox" in message and "not found" in message
    env = make_env("code", unsafe_no_sandbox=True)
    total, last, _ = play_episode(env, SHIPPED[0])
    env.close()
    assert total == 1.0 and last.info["sandboxed"] is False


def test_collect_refuses_cleanly_and_takes_the_unsafe_flag(tmp_path, monkeypatch):
    no_bwrap(monkeypatch)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": SHIPPED[0].id, "instruction": SHIPPED[0].instruction, "env": "code",
                                 "payload": SHIPPED[0].payload}) + "\n")
    common = ["--env", "code", "--tasks", str(tasks), "--policy", "scripted", "--no-progress"]
    refused = CliRunner().invoke(cli, ["collect", *common, "--store", str(tmp_path / "a")])
    assert refused.exit_code != 0 and "apt-get install bubblewrap" in refused.output, refused.output
    unsafe = CliRunner().invoke(cli, ["collect", *common, "--store", str(tmp_path / "b"), "--unsafe-no-sandbox"])
    assert unsafe.exit_code == 0 and "1 written" in unsafe.output, unsafe.output
    evaluated = CliRunner().invoke(cli, ["eval", *common, "--unsafe-no-sandbox"])
    assert evaluated.exit_code == 0 and "100.0%" in evaluated.output, evaluated.output


@needs_sandbox
def test_collect_does_not_store_the_parents_secrets(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    leak = Task(id="leak", instruction="x", env="code", payload={"fix": [], "files": {"test_leak.py": agent_test(
        'print(dict(os.environ), open(f"/proc/{os.getppid()}/environ").read(), open("/proc/1/environ").read())')}})
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": leak.id, "instruction": leak.instruction, "env": "code",
                                 "payload": leak.payload}) + "\n")
    result = CliRunner().invoke(cli, ["collect", "--env", "code", "--tasks", str(tasks), "--policy", "scripted",
                                      "--store", str(tmp_path / "s"), "--no-progress"])
    assert result.exit_code == 0, result.output
    stored = b"".join(p.read_bytes() for p in (tmp_path / "s").rglob("*") if p.is_file())
    rows = Store(tmp_path / "s").read().to_pylist()
    assert len(rows) == 1 and "PYTHONHASHSEED" in json.dumps(rows[0]["messages"])  # the test did print its env
    assert SECRET not in json.dumps(rows[0], default=str) and SECRET.encode() not in stored


def test_unsafe_mode_still_returns_on_time(tmp_path):
    # Without the sandbox a child in a new session escapes the group kill, but the call must not wait for it.
    pid_file = tmp_path / "child.pid"
    script = (f"import subprocess, sys, time\n"
              f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'], start_new_session=True)\n"
              f"open({str(pid_file)!r}, 'w').write(str(child.pid))\nprint('started', flush=True)\ntime.sleep(30)\n")
    start = time.monotonic()
    result = sandbox.run_unsandboxed(["python3", "-c", script], tmp_path, sandbox.SandboxLimits(timeout_s=1.5),
                                     env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    elapsed = time.monotonic() - start
    try:
        assert result.timed_out and not result.sandboxed and "started" in result.output
        assert elapsed < 1.5 + 3
    finally:
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), 9)


@pytest.mark.parametrize("path", ["a" * 300 + ".py", "d/" * 3000 + "x.py", "sub/" + "c" * 256, "bad\0.py"])
def test_unusable_paths_are_invalid_actions(path, monkeypatch):
    env = make_env("code", unsafe_no_sandbox=True)  # no tests run here
    env.reset(SHIPPED[0])
    for tool, arguments in [("write_file", {"path": path, "content": "x = 1"}), ("read_file", {"path": path}),
                            ("replace_in_file", {"path": path, "old": "a", "new": "b"})]:
        result = env.step(Action(tool=tool, arguments=arguments))
        assert result.info["invalid_action"] and not result.done, (tool, result.observation)
    assert sorted(p.name for p in env.root.iterdir()) == sorted(p.name for p in env.root.iterdir() if p.is_file())
    env.close()


# ------------------------------------------------------------------------------ the whole report, counted


@needs_sandbox
def test_no_escape_attempt_succeeds(tmp_path):
    """The report behind benchmarks/chaos.py's sandbox_escapes: every attempt through CodeEnv.run_tests; it
    restores the environment and leaves nothing in its folder."""
    secrets = {name: os.environ.get(name) for name in escapes.SANDBOX_SECRET_VARS}
    start = time.monotonic()
    report = escapes.run_sandbox_escapes(tmp_path / "work")
    assert report.escapes == 0 and report.details == [], "\n".join(report.details)
    inputs = len(escapes.task_attacks(tmp_path, create=False)) + len(escapes.ACTION_ATTACKS)
    assert report.cases == len(escapes.SANDBOX_ATTEMPTS) + inputs and len(escapes.SANDBOX_ATTEMPTS) >= 10
    assert report.to_dict() == {"suite": "sandbox", "cases": report.cases, "escapes": 0, "details": [], "escaped": []}
    assert time.monotonic() - start < 90
    assert {name: os.environ.get(name) for name in escapes.SANDBOX_SECRET_VARS} == secrets
    assert list((tmp_path / "work").iterdir()) == []


def test_without_a_sandbox_the_report_counts_no_case_and_says_why(tmp_path, monkeypatch):
    no_bwrap(monkeypatch)
    report = escapes.run_sandbox_escapes(tmp_path)
    assert (report.cases, report.escapes, len(report.details)) == (0, 0, 1)
    assert "sandbox unavailable" in report.details[0] and "bwrap was not found" in report.details[0]


def test_the_attempts_judges_see_each_leak(tmp_path):
    """What an escaped run would show is counted (the report relies on these judges); a run that shows
    the attempt did not happen is not a case."""
    probe = SandboxProbe.make(tmp_path, port=1)

    def run(seen: str, timed_out: bool = True, **shown) -> SandboxRun:
        return SandboxRun(seen, {"sandboxed": True, "timed_out": timed_out}, 0.0, 10.0, **shown)

    created = Path(probe.write_targets()[0])
    created.write_text("x")  # as if the sandbox had written it
    leaked = [
        (escapes.HOST_FILES, run(f'READ /etc/passwd root:x:0:0\nLISTED ["{probe.host_dir}", ["secret.txt"]]\nROOT []'),
         ["read host files /etc/passwd", "host file content", f"listed host folder {probe.host_dir}: secret.txt"]),
        (escapes.ENV_SECRETS, run(f"ENV {{'OPENAI_API_KEY': '{SECRET}'}}\nSOURCES 2 WITH THE SECRET ['1']"),
         ["the parent's secret in the output", "variables OPENAI_API_KEY visible", "the parent's secret in ['1']"]),
        (escapes.HOST_WRITES, run("WROTE x", project_files=("inside.txt",)),
         [f"created host file {created}", "wrote into the host's project folder"]),
        (escapes.NETWORK, run("CONNECTED\nRESOLVED", accepted=1), ["accepted 1", "connected", "resolved"]),
        (escapes.FORK_BOMB, run("CHILDREN 150"), ["forked 150 processes"]),
        (escapes.DISK_FILL, run("MB 160", project_bytes=2 << 20), ["wrote 160 MB inside", "grew to 2 MB"]),
        (escapes.DETACHED_CHILD, run("child started", timed_out=False), ["not killed"]),
        (escapes.MEMORY_FORKS, run("HELD AT ONCE MB 3200 CHILDREN [0, 1, 2, 3]"), ["held 3200 MB at once"]),
        (escapes.MEMORY_MEMFD, run("MEMFD MB 1470\nHELD AT ONCE MB 1470"), ["held 1470 MB at once"]),
        (escapes.MEMORY_TMPFS, run("TMPFS MB 392\nHELD AT ONCE MB 392"), ["held 392 MB at once"]),
    ]
    assert [attempt for attempt, _, _ in leaked] == list(escapes.SANDBOX_ATTEMPTS)
    for attempt, shown, needles in leaked:
        leaks = attempt.judge(probe, shown)
        assert len(leaks) == len(needles) and all(n in leak for n, leak in zip(needles, leaks, strict=True)), leaks
        with pytest.raises(escapes.CouldNotRun):
            attempt.judge(probe, run(""))
    assert not created.exists()  # the judge removed what the escape left


# ------------------------------------------------------------------------------ the total memory cap (issue 21)


@pytest.fixture
def polling(monkeypatch):
    """The sandbox as on a host where no cgroup can be made: the supervisor polls the tree's memory."""
    monkeypatch.setenv(sandbox_limits.CGROUP_ENV, "off")
    sandbox_limits.memory_cap(refresh=True)
    yield sandbox_limits.memory_cap()
    monkeypatch.delenv(sandbox_limits.CGROUP_ENV)
    sandbox_limits.memory_cap(refresh=True)


def run_memory_body(body: str, **options) -> tuple[str, dict]:
    seen, info, env = run_agent_test(body, **{"test_timeout_s": 30, **options})
    env.close()
    assert info["sandboxed"], seen
    return seen, info


@needs_sandbox
@pytest.mark.parametrize("mode", ["host", "polling"])
def test_forked_children_share_one_memory_cap(mode, request):
    """Four children of 150 MB each under memory_mb=256 held 600 MB at once when the cap was per process."""
    if mode == "polling":
        request.getfixturevalue("polling")
    seen, info = run_memory_body(escapes.forks_body(children=4, mb=150), memory_mb=256)
    held = escapes.held_at_once_mb(seen)
    if sandbox_limits.memory_cap().kind == "polling":  # the poller kills the whole run past the cap
        assert info["out_of_memory"] and "more than 256 MB of memory in total" in seen, seen
        assert held is None or held <= 300, seen
    else:  # the kernel kills one process of the group; the parent lives on to report
        assert held is not None and held <= 256, seen
        assert info["out_of_memory"] and info["memory_peak_mb"] <= 256, info
    assert info["memory_peak_mb"] is not None


@needs_sandbox
@pytest.mark.parametrize("mode", ["host", "polling"])
def test_memfd_pages_count_against_the_cap(mode, request):
    """memfd_create pages are in no process's address space: 30 x 49 MB reached 1,470 MB under memory_mb=256."""
    if mode == "polling":
        request.getfixturevalue("polling")
    seen, info = run_memory_body(escapes.memfd_body(count=30, mb=49), memory_mb=256)
    held = escapes.held_at_once_mb(seen) or 0
    slack = 2 * 49 if sandbox_limits.memory_cap().kind == "polling" else 0  # a poll may come a write or two late
    assert held <= 256 + slack and info["out_of_memory"], seen
    assert "Tests failed" in seen and "memory in total" in seen


@needs_sandbox
def test_tmpfs_writes_count_against_the_cap():
    """/tmp is a tmpfs: its pages are memory, so with disk_mb above memory_mb the memory cap holds them."""
    seen, info = run_memory_body(escapes.tmpfs_body(count=8, mb=49), memory_mb=128, disk_mb=512)
    assert (escapes.held_at_once_mb(seen) or 0) <= 128 and info["out_of_memory"], seen


@needs_sandbox
def test_a_run_within_its_cap_reports_its_peak_and_leaves_no_group():
    result = sandbox.run_sandboxed(["python3", "-c", "x = b'1' * (50 << 20); print('ok')"], Path(__file__).parent,
                                   sandbox.SandboxLimits(timeout_s=20, memory_mb=256))
    assert result.returncode == 0 and not result.out_of_memory and result.memory_cap == sandbox_limits.memory_cap().kind
    assert result.memory_peak_mb is not None and 50 <= result.memory_peak_mb <= 256
    cap = sandbox_limits.memory_cap()
    if cap.memory_parent is not None:
        mine = [p for p in os.listdir(cap.memory_parent) if p.startswith(f"omrl-{os.getpid()}-")]
        assert mine == []  # each run's group is removed when it ends


def test_the_cap_in_force_is_named_in_omrl_envs():
    cap = sandbox_limits.memory_cap()
    assert cap.kind in ("cgroup2", "cgroup1", "polling") and cap.description.startswith(
        {"cgroup2": "cgroup v2", "cgroup1": "cgroup v1", "polling": "polling"}[cap.kind])
    listed = CliRunner().invoke(cli, ["envs", "list"], terminal_width=400)
    assert listed.exit_code == 0 and cap.description.split(" (")[0] in " ".join(listed.output.split()), listed.output


def test_without_cgroups_the_limit_is_not_called_a_total(polling):
    from omrl.envs.code import CodeEnv

    assert polling.kind == "polling" and "turned off by OMRL_SANDBOX_CGROUP=off" in polling.description
    limits = CodeEnv.resource_limits()
    assert "polled" in limits and "polling" in limits and "cgroup v" not in limits


def test_a_cgroup_v2_group_is_made_with_its_limits(tmp_path):
    """The cgroup v2 files (no v2 controllers here: checked on a plain folder standing in for the parent)."""
    cap = sandbox_limits.MemoryCap("cgroup2", "test", str(tmp_path), str(tmp_path))
    group = sandbox_limits.RunGroup(cap, sandbox.SandboxLimits(memory_mb=300, max_processes=10), name="omrl-1-x")
    folder = tmp_path / "omrl-1-x"
    assert (folder / "memory.max").read_text() == str(300 << 20) and (folder / "memory.swap.max").read_text() == "0"
    assert (folder / "pids.max").read_text() == str(10 + sandbox_limits._LAYER_PROCESSES)
    import subprocess

    shown = subprocess.run(group.wrap(["/bin/sh", "-c", "echo $$"]), capture_output=True, text=True, check=True)
    assert (folder / "cgroup.procs").read_text().strip() == shown.stdout.strip()  # entered, then exec'd the command


def test_a_named_cgroup_v2_parent_that_cannot_delegate_is_refused_with_why(tmp_path, monkeypatch):
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("")
    (tmp_path / "cgroup.subtree_control").chmod(0o444)
    monkeypatch.setenv(sandbox_limits.CGROUP_ENV, str(tmp_path))
    monkeypatch.setattr(Path, "write_text", lambda self, text: (_ for _ in ()).throw(OSError(16, "Device busy")))
    cap = sandbox_limits.memory_cap(refresh=True)
    monkeypatch.undo()
    sandbox_limits.memory_cap(refresh=True)
    assert cap.kind == "polling" and "cannot enable memory, pids" in cap.description
    assert sandbox_limits.CGROUP_ENV in cap.description  # and says what to do


# ---------------------------------------------------------------------------- the long-lived shell's end marker

_SHELL_VIEW = sandbox.SandboxView(writable=("/root",), uid=0, project_dir="/root")
# Every value the shell holds (variables, `set`, `declare -p`, its environment and arguments) printed as the
# marker would be, `<value> 0` on a line of its own; then the command line itself and its fd 3 tried.
_MARKER_GUESSES = r"""for v in $(compgen -v); do printf '\n%s 0\n' "${!v}"; done
set | while IFS= read -r line; do printf '\n%s 0\n' "${line#*=}"; done
declare -p | while IFS= read -r line; do value=${line#*=}; printf '\n%s 0\n' "${value//\"/}"; done
tr '\0' '\n' < /proc/$$/environ | while IFS= read -r line; do printf '\n%s 0\n' "${line#*=}"; done
tr '\0' '\n' < /proc/$$/cmdline | while IFS= read -r line; do printf '\n%s 0\n' "$line"; done
printf '\n%s 0\n' "$__omrl_token" "$__omrl_command" "$BASH_EXECUTION_STRING"
cat <&3
echo the-end"""


@needs_sandbox
def test_a_command_cannot_end_its_output_early_by_printing_a_guess_of_the_marker():
    with sandbox.SandboxShell(limits=sandbox.SandboxLimits(timeout_s=60), view=_SHELL_VIEW) as shell:
        assert shell.run("echo warm").output == "warm\n"  # an earlier command's token has come and gone
        guessed = shell.run(_MARKER_GUESSES, timeout_s=20)
        assert not guessed.timed_out and guessed.output.rstrip().endswith("the-end"), guessed.output[-500:]
        assert not re.search(r"__omrl_done_[0-9a-f]{8}", guessed.output)  # no token anywhere it could look
        assert shell.run("echo clean").output == "clean\n"  # nothing of the guesses shifted into the next one


@needs_sandbox
def test_a_command_that_reads_the_shells_saved_pipe_costs_it_its_shell():
    """The documented residual risk (omrl/sandbox/shell.py, _SHELL_LOOP): a builtin reading bash's saved copy of fd 3
    takes the waiting token and may end its output early; the loop then exits at the next command."""
    steal = r"""for n in $(ls /proc/$$/fd); do
  [ "$n" -ge 10 ] && read -u "$n" -r -d '' token 2>/dev/null && printf '\n%s 0\n' "$token"
done
echo rest"""
    with sandbox.SandboxShell(limits=sandbox.SandboxLimits(timeout_s=60), view=_SHELL_VIEW) as shell:
        assert shell.run("export X=1").returncode == 0
        shell.run(steal)
        after = shell.run("echo $X; echo second", timeout_s=10)
        assert after.restarted and not after.timed_out and "second" not in after.output
        assert shell.run("echo ${X:-unset}; echo third").output == "unset\nthird\n"  # a fresh shell, in step
