"""run_sandboxed and run_unsandboxed: one command, on time, with its SandboxResult; whether the sandbox
works here (a probe run, cached per process).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from omrl.errors import UsageError
from omrl.sandbox.bwrap import (
    INSTALL_HINT,
    SANDBOX_UID,
    SandboxView,
    _argv,
    _bwrap,
    _pack,
    base_env,
    map_command,
    sandbox_python,
)
from omrl.sandbox.limits import SandboxLimits
from omrl.sandbox.results import SandboxError, SandboxResult, SandboxUnavailable
from omrl.sandbox.supervise import _last_line, _supervise

_status_lock = threading.Lock()
_status: tuple[bool, str] | None = None


def sandbox_status(refresh: bool = False) -> tuple[bool, str]:
    """(available, reason): whether bwrap runs a tiny probe here; checked once per process, then cached."""
    global _status
    with _status_lock:
        if _status is None or refresh:
            _status = _probe()
        return _status


def require_sandbox() -> None:
    """Raise SandboxUnavailable (naming what to install) unless the sandbox works here."""
    ok, reason = sandbox_status()
    if not ok:
        raise SandboxUnavailable(f"the sandbox for agent-written code is unavailable: {reason}")


def _probe() -> tuple[bool, str]:
    if _bwrap() is None:
        return False, f"bwrap was not found on PATH; {INSTALL_HINT}"
    python = sandbox_python()
    if python is None:
        return False, f"no Python interpreter found under {sys.base_prefix}/bin to run inside the sandbox"
    with tempfile.TemporaryDirectory(prefix="omrl-probe-") as folder:
        Path(folder, "probe.py").write_text("import os\nprint('ok', os.getuid())\n", encoding="utf-8")
        try:
            result = run_sandboxed([python, "probe.py"], folder, SandboxLimits(timeout_s=30.0), probing=True)
        except (SandboxError, OSError) as exc:
            return False, (f"bwrap is installed but cannot create a sandbox here ({_last_line(str(exc))}); "
                           "it needs user namespaces (e.g. sysctl kernel.unprivileged_userns_clone=1, "
                           "or a container allowed to create them)")
    if result.returncode != 0 or f"ok {SANDBOX_UID}" not in result.output:
        return False, f"bwrap's probe run failed (exit {result.returncode}): {_last_line(result.output)}"
    return True, "bubblewrap sandbox available"


def run_sandboxed(command: list[str], project: str | os.PathLike[str], limits: SandboxLimits = SandboxLimits(),
                  env: dict[str, str] | None = None, on_start: Callable[[Callable[[], None]], None] | None = None,
                  probing: bool = False, view: SandboxView = SandboxView(),
                  pass_fds: tuple[int, ...] = ()) -> SandboxResult:
    """Run `command` inside a bwrap sandbox on a copy of `project` (its cwd); the host folder is never written.

    `on_start(kill)` receives a function that kills the whole run (safe from any thread, idempotent).
    `pass_fds` are host descriptors the command inherits under the same numbers (e.g. a pipe's write end for
    a report the host reads); the caller keeps and closes them.
    Raises SandboxUnavailable when the sandbox does not work here, SandboxError when bwrap failed to start.
    """
    if not probing:
        require_sandbox()
    bwrap = _bwrap()
    if bwrap is None:
        raise SandboxUnavailable(f"bwrap was not found on PATH; {INSTALL_HINT}")
    command = map_command(list(command))
    if not command:
        raise UsageError("empty command")
    python = sandbox_python() or command[0]
    with tempfile.TemporaryFile() as archive:
        _pack(Path(project), archive)
        archive.seek(0)
        started_r, started_w = os.pipe()
        info_r, info_w = os.pipe()
        try:
            argv = _argv(bwrap, python, command, limits, {**base_env(), **(env or {})}, started_w, info_w, view)
        except BaseException:
            for fd in (started_r, started_w, info_r, info_w):
                os.close(fd)
            raise
        try:
            # bwrap's own environment is visible inside as /proc/1/environ: give it nothing worth reading.
            # _supervise closes the write ends (they are the child's), always; the read ends are closed here.
            return _supervise(argv, stdin=archive, limits=limits, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                              cwd="/", pass_fds=(started_w, info_w, *pass_fds), started=started_r, info=info_r,
                              close_after_start=(started_w, info_w), on_start=on_start, sandboxed=True)
        finally:
            os.close(started_r)
            os.close(info_r)


def run_unsandboxed(command: list[str], cwd: str | os.PathLike[str], limits: SandboxLimits = SandboxLimits(),
                    env: dict[str, str] | None = None,
                    on_start: Callable[[Callable[[], None]], None] | None = None) -> SandboxResult:
    """UNSAFE: run `command` in `cwd` with the caller's privileges, under rlimits, the total memory cap and a
    process-group kill.

    Children that start a new session escape the kill (unless a cgroup holds them); the call still returns on time.
    """
    return _supervise(list(command), stdin=subprocess.DEVNULL, limits=limits, env=dict(env or {}), cwd=cwd,
                      preexec_fn=_unsafe_limits(limits), on_start=on_start, sandboxed=False)


def _unsafe_limits(limits: SandboxLimits) -> Callable[[], None]:
    # Runs in the child between fork and exec, where other threads' locks may be held: no imports here.
    memory = limits.memory_mb << 20
    cpu = int(limits.timeout_s) + 1  # a CPU-time backstop in case the wall-clock kill were missed
    size = limits.max_file_mb << 20

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply
