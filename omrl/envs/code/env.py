"""`code`: SWE-style repair of a small Python project in a temporary folder; reward 1 when its tests pass.

The tests are agent-written code: they run in the bubblewrap sandbox of omrl.sandbox (a copy of the project,
no network, no host files, limits on processes, memory, disk and wall time; the memory cap holds the whole
process tree where the host lets omrl make a cgroup, see `resource_limits()`). Without a working sandbox the
environment refuses to start unless it is built with unsafe_no_sandbox=True (`--unsafe-no-sandbox`).

A task names its project (projects.py) by payload["files"] (path -> text), payload["project"] (a folder name among the
shipped projects or under the env option projects_root) or payload["project_dir"] (a folder inside
projects_root); any other path is an invalid task, never a host folder read into the episode.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import shutil
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omrl import sandbox
from omrl.envs import patch_guard
from omrl.envs.base import Action, InvalidTask, Reset, StepResult, Task, tool_schema
from omrl.envs.code.expert import expert_plan
from omrl.envs.code.projects import name_problem, project_files
from omrl.envs.code.tasks import shipped_tasks
from omrl.envs.toolenv import InvalidAction, ToolEnv
from omrl.sandbox import limits as sandbox_limits

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


@dataclass
class CodeOptions:
    """CodeEnv's constructor options, as `--env-option KEY=VALUE` gives them (checked by the recipe loader)."""

    test_timeout_s: float = 10.0
    memory_mb: int = 1024
    test_command: list[str] | None = None
    max_processes: int = 64
    disk_mb: int = 64
    unsafe_no_sandbox: bool = False
    projects_root: str | None = None


class CodeEnv(ToolEnv):
    """Repair a small Python project until its unittest suite passes (tests run sandboxed, with limits)."""

    name = "code"
    options_class = CodeOptions
    tools = TOOLS

    @classmethod
    def resource_limits(cls) -> str:
        """The limits the tests run under here, and how the memory total is held on this host."""
        cap = sandbox_limits.memory_cap()
        total = "for the whole sandbox" if cap.kind != "polling" else "for the whole sandbox, polled"
        return (f"memory_mb=1024 {total}, by {cap.description}; also per process (address space). "
                "max_processes=64; disk_mb=64 (its /tmp); test_timeout_s=10 for the whole tree; 50 MB a file")

    @classmethod
    def generate_tasks(cls, n: int | None = None, seed: int = 0, split: str = "train") -> list[Task]:
        """The shipped repair projects with their files embedded (tasks.py)."""
        return shipped_tasks(n, seed=seed, split=split)

    def __init__(self, test_timeout_s: float = 10.0, memory_mb: int = 1024,
                 test_command: list[str] | None = None, max_processes: int = 64, disk_mb: int = 64,
                 unsafe_no_sandbox: bool = False, projects_root: str | None = None) -> None:
        super().__init__()
        self.projects_root = projects_root
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
        files = project_files(task, self.projects_root)
        self.task, self.original = task, files
        self.root = Path(tempfile.mkdtemp(prefix="omrl-code-")).resolve()
        try:
            for relative, content in files.items():
                target = self._resolve(relative)
                target.parent.mkdir(parents=True, exist_ok=True)
                _write_whole(target, _encoded(content, f"the content of {relative}"))
        except (InvalidAction, OSError) as exc:
            self.close()  # a failed reset leaves no folder behind, even if the caller never closes
            raise InvalidTask(f"code task {task.id!r}: cannot lay out project file: {exc}") from None
        self.command = task.payload.get("test_command") or self.test_command or \
            [sys.executable, "-m", "unittest", "discover", "-s", ".", "-t", "."]
        self._plan = expert_plan(task)
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
        data = _encoded(content, "content")
        target = self._resolve(path)
        try:
            if target.is_dir():
                raise InvalidAction(f"{path} is a folder")
            target.parent.mkdir(parents=True, exist_ok=True)
            _write_whole(target, data)
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
        data = _encoded(text.replace(old, new, 1), "`new`")
        try:
            _write_whole(target, data)
        except OSError as exc:
            raise InvalidAction(f"cannot write {path}: {exc.strerror or exc}") from None
        return StepResult(observation=f"Edited {path}.")

    def tool_run_tests(self) -> StepResult:
        passed, output, info = self.run_tests()
        return StepResult(observation=("Tests passed.\n" if passed else "Tests failed.\n") + output, info=info)

    def tool_submit(self) -> StepResult:
        """The final run decides the reward, on the project with its tests and start-up hooks as the task gave
        them (patch_guard.protected: the agent's edits to those are undone and named) and only when no line
        the agent added reaches into the test runner or the interpreter (patch_guard.forged_lines)."""
        restored = self._restore_protected()
        signs = self._forgery_signs()
        passed, output, info = self.run_tests()
        self.done = True
        if restored:
            info["restored_before_scoring"] = restored
            output = f"(tests and start-up hooks as the task gave them: {', '.join(restored[:10])})\n{output}"
        if signs:
            info["forgery_signs"] = signs[:10]
            output = "Refused: the changes reach into the test runner or the interpreter.\n" + output
        success = passed and not signs
        return StepResult(observation=("Tests passed. " if success else "Tests failed. ") + "Submitted.\n" + output,
                          reward=1.0 if success else 0.0, done=True, info={**info, "success": success})

    def _restore_protected(self) -> list[str]:
        """Put the task's own version of every protected file back and delete protected files it did not have
        (links included); the paths changed."""
        known = frozenset(self.original)
        changed = []
        for path in self._entries():
            if path not in known and patch_guard.protected(path, known):
                (self.root / path).unlink()
                changed.append(path)
        for path in sorted(p for p in known if patch_guard.protected(p, known)):
            target, data = self.root / path, self.original[path].encode("utf-8")
            for parent in reversed(Path(path).parents[:-1]):  # a folder swapped for a link or a file
                if (self.root / parent).is_symlink() or (self.root / parent).is_file():
                    (self.root / parent).unlink()
            if target.is_file() and not target.is_symlink() and target.read_bytes() == data:
                continue
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.is_symlink() or target.exists():
                target.unlink()
            target.parent.mkdir(parents=True, exist_ok=True)
            _write_whole(target, data)
            changed.append(path)
        return sorted(set(changed))

    def _forgery_signs(self) -> list[str]:
        """Lines the agent added to the project's other files that show signs of forging."""
        added = []
        for path in self._entries():
            target = self.root / path
            if target.is_symlink() or not target.is_file():
                continue
            before = set(self.original.get(path, "").splitlines())
            text = target.read_bytes().decode("utf-8", "replace")
            added += [line for line in text.splitlines() if line not in before]
        return patch_guard.forged_lines(added)

    def _entries(self) -> list[str]:
        """Every file and link in the project (links to folders too), as relative POSIX paths."""
        return patch_guard.tree_files(self.root)

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
        if result.out_of_memory:
            text += (f"\nKilled: the tests needed more than {self.memory_mb} MB of memory in total "
                     "(all their processes, files in /tmp and memfds together).")
        passed = not result.timed_out and not result.out_of_memory and result.returncode == 0
        return passed, text, {"returncode": result.returncode, "timed_out": result.timed_out,
                              "out_of_memory": result.out_of_memory, "memory_peak_mb": result.memory_peak_mb,
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
        problem = name_problem(path)
        if problem:
            raise InvalidAction(f"unusable path {shown!r}: {problem}")
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


def _encoded(text: str, what: str) -> bytes:
    """text as UTF-8; a lone surrogate (which no file can hold) is an invalid action."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidAction(f"{what} is not valid text: a lone surrogate ({text[exc.start]!r}) at character "
                            f"{exc.start}") from None


def _write_whole(target: Path, data: bytes) -> None:
    """The whole file or none of it: written beside the target, then renamed over it (mode kept, else 0644)."""
    try:
        mode = target.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = 0o644
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=".omrl-write-")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


_warned = False


def _warn_unsafe() -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn("the code environment runs agent-written tests WITHOUT a sandbox (unsafe_no_sandbox): "
                      "they can read your files and environment, use the network and leave processes behind",
                      stacklevel=3)


