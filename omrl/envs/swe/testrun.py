"""Test runs of a package's tree inside the sandbox: pytest with per-test time limits, the outcomes read from
pytest's own JUnit report (on a pipe the host reads, never from the output the code under test can print),
and with the guard (guard.py) between the agent's patches and the task's test patches when scoring.

Work folders are locked while in use, so the next process removes those a killed run left behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import re
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree

from omrl import sandbox
from omrl.envs import patch_guard as guard
from omrl.envs.swe.packages import ENV_INSIDE, Package


@dataclass
class TestRun:
    """One pytest run in the sandbox: the outcome of each test (node id -> PASSED/FAILED/ERROR/SKIPPED/XFAIL, read
    from pytest's own JUnit report, never from the output), timing, what the guard removed before it ran."""

    outcomes: dict[str, str] = field(default_factory=dict)
    returncode: int | None = None
    timed_out: bool = False
    per_test_timeouts: int = 0
    seconds: float = 0.0
    output: str = ""
    report_error: str = ""  # why the report could not be read (then every test counts as not run)
    removed: list[str] = field(default_factory=list)  # protected files the guard removed inside the sandbox

    def passed(self) -> set[str]:
        return {test for test, outcome in self.outcomes.items() if outcome in ("PASSED", "XFAIL")}


def pytest_command(tests: list[str] | None = None, per_test_timeout_s: float = 10.0,
                   report_fd: int | None = None) -> list[str]:
    """pytest as the sandbox runs it: the package's own addopts ignored (they may name plugins not installed),
    one line per test outcome, a per-test time limit (pytest-timeout, signal method), and with `report_fd` its
    JUnit report (xunit1: each case names its file) written to that inherited descriptor."""
    report = ["--junitxml", f"/proc/self/fd/{report_fd}", "-o", "junit_family=xunit1", "-o", "junit_logging=no"] \
        if report_fd is not None else []
    return ["python3", "-m", "pytest", "-q", "-rA", "--tb=line", "--no-header", "-p", "no:cacheprovider",
            "-o", "addopts=", "-p", "pytest_timeout", f"--timeout={per_test_timeout_s:g}",
            "--timeout-method=signal", "--color=no", *report, *(tests or [])]


# The patches, applied in order inside the sandbox (one that does not apply fails the run), the guard's sweep
# between the agent's patches and the task's test patches, then pytest.
_APPLY = ('for p in "$@"; do case "$p" in .omrl-*.patch) git apply --whitespace=nowarn "$p" || '
          "{ echo 'OMRL: the patch does not apply'; exit 97; }; rm -f \"$p\"; shift;; "
          '.omrl-sweep) rm -f .omrl-sweep; python3 -I -S -c "$OMRL_SWEEP" "$OMRL_ORIGINAL" .omrl-files .omrl-guard '
          '|| { echo "OMRL: the guard failed"; exit 98; }; rm -f .omrl-files .omrl-guard; '
          'shift;; *) break;; esac; done; exec "$@"')
ORIGINAL_INSIDE = "/opt/omrl-original"  # the untouched tree, read-only, for the guard to restore from
MAX_REPORT_BYTES = 32 << 20


def run_tests(package: Package, tree: Path, tests: list[str] | None = None, per_test_timeout_s: float = 10.0,
              timeout_s: float = 300.0, patches: list[str] = (), memory_mb: int = 2048,
              test_patches: list[str] | None = None) -> TestRun:
    """Run the package's tests (or the node ids or files `tests`) on `tree` inside the sandbox. `patches` are
    first applied in order with `git apply`, inside the sandbox too (one that does not apply fails the run).
    With `test_patches` (a list, even empty: scoring an agent's patch) the guard then restores the tree's tests,
    pytest configuration and start-up hooks from the original (omrl.envs.patch_guard) before they are applied."""
    sweep_stale_work_folders()
    report_r, report_w = os.pipe()
    if os.geteuid() == 0:  # the sandbox's user opens it by /proc/self/fd: a pipe is its creator's, mode 0600
        os.fchown(report_w, sandbox.SANDBOX_UID, sandbox.SANDBOX_UID)
    command = pytest_command(tests, per_test_timeout_s, report_fd=report_w)
    reader = _ReportReader(report_r)
    env = {"PYTHONPATH": f"{ENV_INSIDE}:{sandbox.PROJECT_DIR}/src:{sandbox.PROJECT_DIR}", "PYTHONHASHSEED": "0",
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",  # only the plugin named: pytest_timeout
           "PYTHONPYCACHEPREFIX": "/tmp/omrl-pycache"}  # compiled files from elsewhere than the tree's __pycache__
    binds = [(str(package.env), ENV_INSIDE)]
    try:
        with work_folder("omrl-swe-run-") as work:
            project = Path(work) / "project"
            shutil.copytree(tree, project, symlinks=True)
            names = []
            for i, patch in enumerate(patches):
                names.append(f".omrl-{i}.patch")
                (project / names[-1]).write_text(patch, encoding="utf-8")
            if test_patches is not None:
                names.append(".omrl-sweep")
                (project / ".omrl-sweep").write_text("", encoding="utf-8")
                (project / ".omrl-files").write_text(json.dumps(guard.tree_files(tree)), encoding="utf-8")
                (project / ".omrl-guard").write_text(Path(guard.__file__).read_text(encoding="utf-8"), encoding="utf-8")
                env.update({"OMRL_SWEEP": guard.SWEEP, "OMRL_ORIGINAL": ORIGINAL_INSIDE})
                binds.append((str(tree), ORIGINAL_INSIDE))
                for i, patch in enumerate(p for p in test_patches if p and p.strip()):
                    names.append(f".omrl-test-{i}.patch")
                    (project / names[-1]).write_text(patch, encoding="utf-8")
            if names:
                command = ["/bin/sh", "-c", _APPLY, "sh", *names, *command]
            result = sandbox.run_sandboxed(
                command, project, sandbox.SandboxLimits(timeout_s=timeout_s, memory_mb=memory_mb, max_processes=128,
                                                        disk_mb=512, max_output_bytes=8 << 20),
                env=env, view=sandbox.SandboxView(binds=tuple(binds)), pass_fds=(report_w,))
    finally:
        os.close(report_w)
        report = reader.result()
    outcomes, error = read_junit(report)
    timeouts = len(re.findall(r"Timeout \(?>", result.output))  # pytest-timeout: "Failed: Timeout (>2.0s) ..."
    removed = re.findall(r"^OMRL: removed (.+)$", result.output, re.MULTILINE)
    return TestRun(outcomes, result.returncode, result.timed_out, timeouts, round(result.elapsed_s, 3),
                   result.output, error, removed)


class _ReportReader:
    """Reads the report pipe on a thread (pytest would block on a full pipe), up to MAX_REPORT_BYTES."""

    def __init__(self, fd: int) -> None:
        self.fd, self.data, self.overflow = fd, bytearray(), False
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            while chunk := os.read(self.fd, 1 << 16):
                if len(self.data) + len(chunk) > MAX_REPORT_BYTES:
                    self.overflow = True
                    continue  # keep draining so the writer never blocks
                self.data += chunk
        finally:
            os.close(self.fd)

    def result(self) -> bytes | None:
        """The bytes written, once every writer has closed the pipe; None when past the cap."""
        self.thread.join()
        return None if self.overflow else bytes(self.data)


def read_junit(report: bytes | None) -> tuple[dict[str, str], str]:
    """(node id -> outcome, error) from pytest's xunit1 report. Anything but exactly one well-formed report (none,
    two documents written to the pipe, past the size cap) gives no outcomes and says why."""
    if report is None:
        return {}, f"the test report is over {MAX_REPORT_BYTES >> 20} MB"
    if not report.strip():
        return {}, "pytest wrote no test report"
    try:
        root = ElementTree.fromstring(report)
    except ElementTree.ParseError as exc:
        return {}, f"the test report is not one XML document ({exc})"
    outcomes: dict[str, str] = {}
    for case in root.iter("testcase"):
        test = _node_id(case.get("file") or "", case.get("classname") or "", case.get("name") or "")
        outcome = _outcome(case)
        if _RANK[outcome] >= _RANK.get(outcomes.get(test, "PASSED"), 0):
            outcomes[test] = outcome
    return outcomes, ""


_RANK = {"PASSED": 0, "XFAIL": 0, "SKIPPED": 1, "FAILED": 2, "ERROR": 3}


def _outcome(case: ElementTree.Element) -> str:
    if case.find("error") is not None:
        return "ERROR"
    if case.find("failure") is not None:
        return "FAILED"
    skipped = case.find("skipped")
    if skipped is not None:
        return "XFAIL" if skipped.get("type") == "pytest.xfail" else "SKIPPED"
    return "PASSED"


def _node_id(file: str, classname: str, name: str) -> str:
    """pytest's node id back from a JUnit case: the file, the classes after its dotted module path, the name."""
    module = re.sub(r"\.py$", "", file).replace("/", ".")
    classes = classname[len(module) + 1:].split(".") if classname.startswith(module + ".") else []
    return "::".join([file, *classes, name]) if file else f"{classname}::{name}"


@contextlib.contextmanager
def work_folder(prefix: str):
    """A temporary folder under the system's temp folder, locked while in use, so that a later process can
    tell it from one a killed run left (sweep_stale_work_folders removes those)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    lock = os.open(folder / ".omrl-lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield folder
    finally:
        os.close(lock)
        shutil.rmtree(folder, ignore_errors=True)


@functools.cache
def sweep_stale_work_folders() -> list[str]:
    """Once per process: remove the work folders of SWE runs that were killed (their lock is free); the names."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob("omrl-swe-*"):
        lock_path = folder / ".omrl-lock"
        if not folder.is_dir() or folder.is_symlink() or not lock_path.is_file():
            continue
        if time.time() - lock_path.stat().st_mtime < 60:  # just made: its owner may not hold the lock yet
            continue
        try:
            lock = os.open(lock_path, os.O_RDWR)
        except OSError:
            continue  # removed meanwhile by its owner
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # in use by a live run
        finally:
            os.close(lock)
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder.name)
    return removed
