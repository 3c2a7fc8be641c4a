"""`code`: SWE-style repair of a small Python project in a temporary folder; reward 1 when its tests pass."""

from __future__ import annotations

import contextlib
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from omrl.envs.base import Action, Reset, StepResult, Task, tool_schema
from omrl.envs.toolenv import InvalidAction, ToolEnv

MAX_FILE_CHARS = 20_000     # what read_file shows
MAX_OUTPUT_CHARS = 4_000    # tail of the test output shown
MAX_WRITE_CHARS = 200_000
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
    """Repair a small Python project until its unittest suite passes (subprocess, time and memory limits)."""

    name = "code"
    tools = TOOLS

    def __init__(self, test_timeout_s: float = 10.0, memory_mb: int = 1024,
                 test_command: list[str] | None = None) -> None:
        super().__init__()
        self.test_timeout_s = test_timeout_s
        self.memory_mb = memory_mb
        self.test_command = test_command
        self.root: Path | None = None

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
            raise ValueError(f"code task {task.id!r}: cannot lay out project file: {exc}") from None
        self.command = task.payload.get("test_command") or self.test_command or \
            [sys.executable, "-m", "unittest", "discover", "-s", ".", "-t", "."]
        self._plan = _expert_plan(task)
        listing = "\n".join(sorted(files))
        return Reset(observation=f"{task.instruction}\n\nProject files:\n{listing}", tools=list(TOOLS),
                     system_prompt=SYSTEM_PROMPT)

    def close(self) -> None:
        super().close()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    # ---------------------------------------------------------------- tools

    def tool_list_files(self) -> StepResult:
        return StepResult(observation="\n".join(self._files()) or "(no files)")

    def tool_read_file(self, path: str) -> StepResult:
        target = self._existing(path)
        text = target.read_text(encoding="utf-8", errors="replace")
        if len(text) > MAX_FILE_CHARS:
            text = text[:MAX_FILE_CHARS] + f"\n... (truncated at {MAX_FILE_CHARS} characters)"
        return StepResult(observation=text)

    def tool_write_file(self, path: str, content: str) -> StepResult:
        if not isinstance(content, str):
            raise InvalidAction("content must be a string")
        if len(content) > MAX_WRITE_CHARS:
            raise InvalidAction(f"content longer than {MAX_WRITE_CHARS} characters")
        target = self._resolve(path)
        if target.is_dir():
            raise InvalidAction(f"{path} is a folder")
        try:
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
        count = text.count(old) if old else 0
        if count != 1:
            raise InvalidAction(f"`old` must occur exactly once in {path}; it occurs {count} times")
        target.write_text(text.replace(old, new, 1), encoding="utf-8")
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
        """Run the test command in the project folder under time and memory limits; kill it on timeout."""
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONDONTWRITEBYTECODE": "1",
               "PYTHONHASHSEED": "0", "HOME": str(self.root), "LANG": "C.UTF-8"}
        start = time.monotonic()
        process = subprocess.Popen(self.command, cwd=self.root, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                   preexec_fn=_limits(self.memory_mb, self.test_timeout_s))
        try:
            output, _ = process.communicate(timeout=self.test_timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            _kill_group(process)
            output, _ = process.communicate()
            timed_out = True
        elapsed = time.monotonic() - start
        text = output.decode("utf-8", errors="replace")
        if len(text) > MAX_OUTPUT_CHARS:
            text = "...\n" + text[-MAX_OUTPUT_CHARS:]
        if timed_out:
            text += f"\nKilled: the tests ran longer than {self.test_timeout_s:g} s."
        passed = not timed_out and process.returncode == 0
        return passed, text, {"returncode": process.returncode, "timed_out": timed_out,
                              "test_seconds": round(elapsed, 3)}

    # ---------------------------------------------------------------- paths

    def _resolve(self, path: Any) -> Path:
        """A path inside the project folder; anything resolving outside it (.., absolute, symlinks) is refused."""
        if not isinstance(path, str) or not path.strip():
            raise InvalidAction("path must be a non-empty string")
        try:
            target = (self.root / path).resolve()
        except (OSError, ValueError) as exc:  # a NUL byte, a symlink loop
            raise InvalidAction(f"unusable path {path!r}: {exc}") from None
        if target != self.root and self.root not in target.parents:
            raise InvalidAction(f"{path} is outside the project folder; paths must stay inside it")
        return target

    def _existing(self, path: Any) -> Path:
        target = self._resolve(path)
        if not target.is_file():
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
    payload["project"] (looked up in the shipped datasets/code_tasks/)."""
    if isinstance(task.payload.get("files"), dict):
        return {str(k): str(v) for k, v in task.payload["files"].items()}
    folder = task.payload.get("project_dir")
    if folder is None and task.payload.get("project"):
        from omrl.tasks import shipped_datasets_dir

        folder = shipped_datasets_dir() / "code_tasks" / str(task.payload["project"])
    if folder is None:
        raise ValueError(f"code task {task.id!r} names no project (payload needs files, project or project_dir)")
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"code task {task.id!r}: project folder {folder} not found")
    return {str(p.relative_to(folder)): p.read_text(encoding="utf-8") for p in sorted(folder.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


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


def _limits(memory_mb: int, timeout_s: float):
    # Runs in the child between fork and exec, where other threads' locks may be held: no imports here.
    def apply() -> None:
        memory = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        cpu = int(timeout_s) + 1  # a CPU-time backstop in case the wall-clock kill were missed
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (50 * 1024 * 1024, 50 * 1024 * 1024))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def _kill_group(process: subprocess.Popen) -> None:
    # The whole session: test runners may have started children of their own.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
