"""`code`: SWE-style repair of a small Python project in a temporary folder; reward 1 when its tests pass.

The tests are agent-written code: they run in the bubblewrap sandbox of omrl.sandbox (a copy of the project,
no network, no host files, limits on processes, memory, disk and wall time). Without a working sandbox the
environment refuses to start unless it is built with unsafe_no_sandbox=True (`--unsafe-no-sandbox`).
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omrl import sandbox
from omrl.envs.base import Action, Reset, StepResult, Task, tool_schema
from omrl.envs.toolenv import InvalidAction, ToolEnv
from omrl.errors import UsageError
from omrl.shipped import shipped_datasets_dir

MAX_FILE_CHARS = 20_000     # what read_file shows
MAX_OUTPUT_CHARS = 4_000    # tail of the test output shown
MAX_WRITE_CHARS = 200_000
MAX_PATH_CHARS = 1_000
SYSTEM_PROMPT = ("You are fixing a bug in a small Python project. Inspect the files, edit them, run the tests, "
                 "and call submit when the tests pass.")

TOOLS = [
    tool_schema("list_files", "List the project's files.", {}),
    tool_schema("read_file", "Show one file.", {"path": {"type": "string", "description": "path inside the project"}}),
    tool_schema("write_file", "Replace a file's whole content (creates it if needed).",
                {"path": {"type": "string"}, "content": {"type": "string"}}),
    tool_schema("replace_in_file", "Replace one exact occurrence of `old` by `new` in a file.",
                {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}}),
    tool_schema("run_tests", "Run the project's tests and show the result.", {}),
    tool_schema("submit", "Finish: the tests are run one last time and decide the reward.", {}),
]


class CodeEnv(ToolEnv):
    """Repair a small Python project until its unittest suite passes (tests run sandboxed, with limits)."""

    name = "code"
    tools = TOOLS

    @classmethod
    def generate_tasks(cls, n: int | None = None, seed: int = 0, split: str = "train") -> list[Task]:
        """The shipped repair projects with their files embedded (self-contained); n caps how many, seed
        shuffles which."""
        from omrl import readers  # not omrl.tasks: it imports the environments (a cycle)

        tasks = [Task.from_row(record.value)
                 for record in readers.iter_records(shipped_datasets_dir() / "tasks" / "code.jsonl")]
        if n is not None and n < len(tasks):
            tasks = random.Random(seed).sample(tasks, n)
        for task in tasks:
            task.payload["files"] = project_files(task)
            task.split = split
        return tasks

    def __init__(self, test_timeout_s: float = 10.0, memory_mb: int = 1024,
                 test_command: list[str] | None = None, max_processes: int = 64, disk_mb: int = 64,
                 unsafe_no_sandbox: bool = False) -> None:
        super().__init__()
        self.test_timeout_s = test_timeout_s
        self.memory_mb = memory_mb
        self.test_command = test_command
        self.limits = sandbox.SandboxLimits(timeout_s=float(test_timeout_s), memory_mb=int(memory_mb),
                                            max_processes=int(max_processes), disk_mb=int(disk_mb))
        self.sandboxed = not unsafe_no_sandbox
        if not self.sandboxed:
            _warn_unsafe()
        else:
            ok, reason = sandbox.sandbox_status()
            if not ok:
                raise sandbox.SandboxUnavailable(
                    f"the code environment runs agent-written tests in a bubblewrap sandbox, which is unavailable "
                    f"here: {reason}. To run them UNSANDBOXED, with your privileges, files and network, pass "
                    "--unsafe-no-sandbox (env option unsafe_no_sandbox=True).")
        self.root: Path | None = None
        self._kill_tests: Callable[[], None] | None = None
        self._lock = threading.Lock()

    def reset(self, task: Task) -> Reset:
        self.close()
        super().__init__()
        files = project_files(task)
        self.task = task
        self.root = Path(tempfile.mkdtemp(prefix="omrl-code-")).resolve()
        try:
            for relative, content in files.items():
                target = self._resolve(relative)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(content, encoding="utf-8")
        except (InvalidAction, OSError) as exc:
            self.close()  # a failed reset leaves no folder behind, even if the caller never closes
            raise UsageError(f"code task {task.id!r}: cannot lay out project file: {exc}") from None
        self.command = task.payload.get("test_command") or self.test_command or \
            [sys.executable, "-m", "unittest", "discover", "-s", ".", "-t", "."]
        self._plan = _expert_plan(task)
        listing = "\n".join(sorted(files))
        return Reset(observation=f"{task.instruction}\n\nProject files:\n{listing}", tools=list(TOOLS),
                     system_prompt=SYSTEM_PROMPT)

    def close(self) -> None:
        super().close()
        with self._lock:  # a test run still going (an episode that timed out) is killed, tree and all
            kill, self._kill_tests = self._kill_tests, None
        if kill is not None:
            kill()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    # ---------------------------------------------------------------- tools

    def tool_list_files(self) -> StepResult:
        return StepResult(observation="\n".join(self._files()) or "(no files)")

    def tool_read_file(self, path: str) -> StepResult:
        target = self._existing(path)
        try:
            text = target.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise InvalidAction(f"cannot read {path}: {exc.strerror or exc}") from None
        if len(text) > MAX_FILE_CHARS:
            text = text[:MAX_FILE_CHARS] + f"\n... (truncated at {MAX_FILE_CHARS} characters)"
        return StepResult(observation=text)

    def tool_write_file(self, path: str, content: str) -> StepResult:
        if not isinstance(content, str):
            raise InvalidAction("content must be a string")
        if len(content) > MAX_WRITE_CHARS:
            raise InvalidAction(f"content longer than {MAX_WRITE_CHARS} characters")
        target = self._resolve(path)
        try:
            if target.is_dir():
                raise InvalidAction(f"{path} is a folder")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content, encoding="utf-8")
        except OSError as exc:  # e.g. a parent of the path is a file
            raise InvalidAction(f"cannot write {path}: {exc.strerror or exc}") from None
        return StepResult(observation=f"Wrote {len(content)} characters to {path}.")

    def tool_replace_in_file(self, path: str, old: str, new: str) -> StepResult:
        if not isinstance(old, str) or not isinstance(new, str):
            raise InvalidAction("`old` and `new` must be strings")
        target = self._existing(path)
        try:
            text = target.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise InvalidAction(f"{path} is not UTF-8 text; use write_file to replace it") from None
        except OSError as exc:
            raise InvalidAction(f"cannot read {path}: {exc.strerror or exc}") from None
        count = text.count(old) if old else 0
        if count != 1:
            raise InvalidAction(f"`old` must occur exactly once in {path}; it occurs {count} times")
        if len(text) - len(old) + len(new) > MAX_WRITE_CHARS:
            raise InvalidAction(f"the edited file would be longer than {MAX_WRITE_CHARS} characters")
        try:
            target.write_text(text.replace(old, new, 1), encoding="utf-8")
        except OSError as exc:
            raise InvalidAction(f"cannot write {path}: {exc.strerror or exc}") from None
        return StepResult(observation=f"Edited {path}.")

    def tool_run_tests(self) -> StepResult:
        passed, output, info = self.run_tests()
        return StepResult(observation=("Tests passed.\n" if passed else "Tests failed.\n") + output, info=info)

    def tool_submit(self) -> StepResult:
        passed, output, info = self.run_tests()
        self.done = True
        return StepResult(observation=("Tests passed. " if passed else "Tests failed. ") + "Submitted.\n" + output,
                          reward=1.0 if passed else 0.0, done=True, info={**info, "success": passed})

    # ---------------------------------------------------------------- running tests

    def run_tests(self) -> tuple[bool, str, dict[str, Any]]:
        """Run the test command on the project under the limits (in the sandbox unless opted out); kill it on
        timeout, the whole process tree included, and return on time."""
        run = sandbox.run_sandboxed if self.sandboxed else sandbox.run_unsandboxed
        env = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0", "LANG": "C.UTF-8"}
        if not self.sandboxed:  # what the tests would otherwise inherit from us; never the caller's secrets
            env.update({"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.root)})
        result = run(self.command, self.root, self.limits, env=env, on_start=self._started)
        with self._lock:
            self._kill_tests = None
        text = result.output
        if len(text) > MAX_OUTPUT_CHARS:
            text = "...\n" + text[-MAX_OUTPUT_CHARS:]
        if result.timed_out:
            text += f"\nKilled: the tests ran longer than {self.test_timeout_s:g} s."
        passed = not result.timed_out and result.returncode == 0
        return passed, text, {"returncode": result.returncode, "timed_out": result.timed_out,
                              "test_seconds": round(result.elapsed_s, 3), "sandboxed": result.sandboxed}

    def _started(self, kill: Callable[[], None]) -> None:
        with self._lock:
            self._kill_tests = kill
        if self.done:  # closed while the run was starting (submit sets done only after its run)
            kill()

    # ---------------------------------------------------------------- paths

    def _resolve(self, path: Any) -> Path:
        """A path inside the project folder; anything resolving outside it (.., absolute, symlinks) is refused."""
        if not isinstance(path, str) or not path.strip():
            raise InvalidAction("path must be a non-empty string")
        shown = path if len(path) <= 80 else path[:77] + "..."
        if len(path) > MAX_PATH_CHARS or any(len(part.encode("utf-8", "replace")) > 255 for part in path.split("/")):
            raise InvalidAction(f"path {shown!r} is too long (at most {MAX_PATH_CHARS} characters, 255 bytes a name)")
        try:
            target = (self.root / path).resolve()
            os.lstat(target)
        except FileNotFoundError:
            pass  # a file to be created
        except (OSError, ValueError) as exc:  # a NUL byte, a symlink loop, a name too long
            if isinstance(exc, OSError) and exc.errno == errno.ENOTDIR:
                raise InvalidAction(f"{shown}: a parent of this path is a file") from None
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise InvalidAction(f"unusable path {shown!r}: {reason}") from None
        if target != self.root and self.root not in target.parents:
            raise InvalidAction(f"{shown} is outside the project folder; paths must stay inside it")
        return target

    def _existing(self, path: Any) -> Path:
        target = self._resolve(path)
        try:
            is_file = target.is_file()
        except OSError as exc:
            raise InvalidAction(f"unusable path: {exc.strerror or exc}") from None
        if not is_file:
            raise InvalidAction(f"no such file: {path}. Files: {', '.join(self._files())}")
        return target

    def _files(self) -> list[str]:
        return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*")
                      if p.is_file() and "__pycache__" not in p.parts)

    # ---------------------------------------------------------------- scripted policies

    def expert_action(self) -> Action:
        """Run the tests, read and patch each file of the gold fix, then submit."""
        if self._plan:
            return self._plan.pop(0)
        return Action(tool="submit")

    def random_action(self, rng: random.Random) -> Action:
        files = self._files()
        choice = rng.choice(["list_files", "read_file", "run_tests", "submit"])
        if choice == "read_file" and files:
            return Action(tool="read_file", arguments={"path": rng.choice(files)})
        return Action(tool="list_files" if choice == "read_file" else choice)


def project_files(task: Task) -> dict[str, str]:
    """The task's project: payload["files"] (path -> text), or a folder named by payload["project_dir"] or
    payload["project"] (looked up in the shipped code_tasks/: omrl/data, a checkout's datasets/)."""
    if isinstance(task.payload.get("files"), dict):
        return {str(k): str(v) for k, v in task.payload["files"].items()}
    folder = task.payload.get("project_dir")
    if folder is None and task.payload.get("project"):
        folder = shipped_datasets_dir() / "code_tasks" / str(task.payload["project"])
    if folder is None:
        raise UsageError(f"code task {task.id!r} names no project (payload needs files, project or project_dir)")
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"code task {task.id!r}: project folder {folder} not found")
    return {str(p.relative_to(folder)): p.read_text(encoding="utf-8") for p in sorted(folder.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


_warned = False


def _warn_unsafe() -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn("the code environment runs agent-written tests WITHOUT a sandbox (unsafe_no_sandbox): "
                      "they can read your files and environment, use the network and leave processes behind",
                      stacklevel=3)


def _expert_plan(task: Task) -> list[Action]:
    plan = [Action(tool="run_tests")]
    for edit in task.payload.get("fix") or []:
        plan.append(Action(tool="read_file", arguments={"path": edit["path"]}))
        if "content" in edit:
            plan.append(Action(tool="write_file", arguments={"path": edit["path"], "content": edit["content"]}))
        else:
            plan.append(Action(tool="replace_in_file",
                               arguments={"path": edit["path"], "old": edit["old"], "new": edit["new"]}))
    plan.append(Action(tool="run_tests"))
    return plan
