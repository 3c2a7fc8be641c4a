"""The sandbox for agent-written code: each escape an attacker probe found, tried by a test file the agent
wrote, run through CodeEnv.run_tests inside the bubblewrap sandbox."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import textwrap
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
from omrl.store import Store
from omrl.tasks import load_tasks, shipped_datasets_dir

AVAILABLE, WHY = sandbox.sandbox_status()
needs_sandbox = pytest.mark.skipif(not AVAILABLE, reason=f"bubblewrap sandbox unavailable here: {WHY}")
SECRET = "sk-omrl-test-secret-4f1c9a"
SHIPPED = load_tasks(shipped_datasets_dir() / "tasks" / "code.jsonl")


def agent_test(body: str) -> str:
    """A unittest file whose one test runs `body` (indented into the method) and always passes."""
    return ("import os, socket, subprocess, sys, time, unittest\n\n"
            "class T(unittest.TestCase):\n    def test_probe(self):\n"
            + textwrap.indent(textwrap.dedent(body).strip() + "\n", " " * 8))


def run_agent_test(body: str, **options) -> tuple[str, dict, object]:
    """Write the test with the agent's write_file tool, run it with run_tests; (observation, info, env)."""
    env = make_env("code", **options)
    env.reset(Task(id="probe", instruction="probe", env="code", payload={"files": {"README": "x\n"}}))
    wrote = env.step(Action(tool="write_file", arguments={"path": "test_probe.py", "content": agent_test(body)}))
    assert not wrote.info.get("invalid_action"), wrote.observation
    result = env.step(Action(tool="run_tests"))
    return result.observation, result.info, env


def processes_with(marker: str) -> list[int]:
    """Pids of host processes whose command line contains `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@needs_sandbox
def test_host_files_are_not_visible():
    seen, info, env = run_agent_test("""
        for path in ["/etc/passwd", "/etc/shadow", "/etc/hostname", os.path.expanduser("~root") + "/.bashrc",
                     "/work/shared/DESIGN.md"]:
            try:
                print("READ", path, open(path).read()[:200])
            except OSError as exc:
                print("DENIED", path, type(exc).__name__)
        print("ROOT", sorted(os.listdir("/")))
        print("ID", os.getuid(), os.getgid())
    """)
    env.close()
    assert info["sandboxed"] and info["returncode"] == 0, seen
    assert "root:" not in seen and "READ" not in seen and seen.count("DENIED") == 5
    assert "'work'" not in seen and "'home'" not in seen and "ID 65534 65534" in seen


@needs_sandbox
def test_parent_environment_secrets_do_not_reach_the_tests(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    seen, info, env = run_agent_test("""
        print("ENV", dict(os.environ))
        for pid in sorted({str(os.getppid()), "1", "self"} | {p for p in os.listdir("/proc") if p.isdigit()}):
            try:
                print("PROC", pid, open(f"/proc/{pid}/environ").read().replace("\\0", " "))
            except OSError as exc:
                print("PROC", pid, "denied", exc)
    """)
    env.close()
    assert info["sandboxed"] and "ENV {" in seen and "PROC 1 " in seen, seen
    assert SECRET not in seen and "OPENAI_API_KEY" not in seen


@needs_sandbox
def test_writes_outside_the_project_do_not_reach_the_host(tmp_path):
    host_file = tmp_path / "escaped.txt"
    seen, info, env = run_agent_test(f"""
        for path in [{str(host_file)!r}, "/escaped.txt", "/usr/escaped.txt", "/dev/shm/escaped.txt"]:
            try:
                open(path, "w").write("x")
                print("WROTE", path)
            except OSError as exc:
                print("REFUSED", path, type(exc).__name__)
        open("inside.txt", "w").write("only in the sandbox's copy")
    """)
    assert info["sandboxed"] and seen.count("REFUSED") == 4 and "WROTE" not in seen, seen
    assert not host_file.exists() and list(tmp_path.iterdir()) == []
    assert not (env.root / "inside.txt").exists()  # the tests work on a copy of the project
    env.close()


@needs_sandbox
def test_no_network_not_even_the_hosts_loopback():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted: list[object] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(server.accept())
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        seen, info, env = run_agent_test(f"""
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=3)
                print("CONNECTED")
            except OSError as exc:
                print("NO CONNECTION", type(exc).__name__)
            try:
                socket.getaddrinfo("example.com", 80)
                print("RESOLVED")
            except OSError as exc:
                print("NO DNS", type(exc).__name__)
        """)
        env.close()
    finally:
        stop.set()
        thread.join()
        server.close()
    assert info["sandboxed"] and "NO CONNECTION" in seen and "NO DNS" in seen, seen
    assert "CONNECTED" not in seen and accepted == []


@needs_sandbox
def test_forking_150_processes_is_limited():
    marker = "omrl-fork-marker-7d1"
    seen, info, env = run_agent_test(f"""
        children = 0
        try:
            for _ in range(150):
                pid = os.fork()
                if pid == 0:
                    time.sleep(3)  # {marker}
                    os._exit(0)
                children += 1
        except OSError as exc:
            print("FORK REFUSED", exc.errno)
        print("CHILDREN", children)
    """, max_processes=64)
    env.close()
    children = int(seen.split("CHILDREN ")[1].split()[0])
    assert info["sandboxed"] and "FORK REFUSED 11" in seen and 40 <= children < 64, seen
    assert processes_with(marker) == []  # the sleeping children died with the sandbox


@needs_sandbox
def test_disk_writes_are_capped_in_total(tmp_path):
    seen, info, env = run_agent_test("""
        written = 0
        try:
            for name in [f"big{i}.bin" for i in range(4)] + [f"/tmp/big{i}.bin" for i in range(4)]:
                with open(name, "wb") as out:
                    for _ in range(20):  # 20 MB each, 160 MB in all
                        out.write(b"x" * (1 << 20))
                        out.flush()
                        written += 1
        except OSError as exc:
            print("WRITE REFUSED", exc.strerror)
        print("MB", written)
    """, disk_mb=64)
    written = int(seen.split("MB ")[-1].split()[0])
    assert info["sandboxed"] and "No space left on device" in seen and written < 64, seen
    assert sum(p.stat().st_size for p in env.root.rglob("*") if p.is_file()) < 1 << 20  # host copy untouched
    env.close()


@needs_sandbox
def test_a_detached_child_holding_the_output_open_is_killed_on_time():
    marker = "omrl-detached-marker-93b"
    body = f"""
        subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(0.1)  # {marker}"],
                         start_new_session=True)
        print("child started", flush=True)
        time.sleep(60)
    """
    start = time.monotonic()
    seen, info, env = run_agent_test(body, test_timeout_s=2)
    elapsed = time.monotonic() - start
    assert info["sandboxed"] and info["timed_out"] and "Killed" in seen and "child started" in seen, seen
    assert elapsed < 2 + 3  # returned on time although a detached child held the pipe open
    assert processes_with(marker) == []  # and nothing the tests started outlived the call
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
    monkeypatch.setattr(sandbox, "_bwrap", lambda: None)
    monkeypatch.setattr(sandbox, "_status", None)


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
