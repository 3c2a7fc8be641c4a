"""Run agent-written code in a bubblewrap sandbox; `run_sandboxed` returns a SandboxResult, on time.

What the sandbox gives the command (see README, "Sandbox for agent code"):
- its own unprivileged user (uid/gid 65534), no capabilities, no new privileges, no nested user namespaces;
- its own network (none: only a loopback), PID, IPC, UTS and mount namespaces; /proc shows only its processes;
- a clean environment and read-only binds of only what the interpreter needs (/usr, /bin, /lib*, the Python
  installation, /etc/ld.so.cache): no /etc, no home folder, no host project folders;
- the project copied into a size-capped tmpfs at /tmp (the one writable place; its size is the total disk limit);
- rlimits on processes (RLIMIT_NPROC, counted per sandbox), address space, CPU time, file size and open files;
- a wall-time limit that kills the whole tree, setsid children included, and returns even when a descendant
  holds the output pipe open; nothing started inside outlives the call (the PID namespace dies with it).

Two bwraps: an outer one only prepares the view the inner one needs and gives the run its own PID
namespace, whose pid 1 (the inner bwrap, or as root a small reaper) takes everything with it when it ends
or is killed. When omrl runs as root, the outer layer also drops to uid 65534 before the inner bwrap
starts: the kernel does not apply RLIMIT_NPROC to processes that are root outside their namespace. As
the Python installation may sit where uid 65534 cannot look (e.g. /root/.pyenv), the outer layer shows it
at a reachable path. `run_unsandboxed` is the explicit unsafe fallback: rlimits and a process-group kill.

The limits of a run and how its total memory is held (cgroups or polling): omrl.sandbox.limits.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import resource
import select
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omrl.errors import OmrlError, UsageError
from omrl.sandbox.limits import PolledMemory, RunGroup, SandboxLimits, memory_cap, process_tree

SANDBOX_UID = 65534          # "nobody": the sandbox's user inside, and outside too when omrl runs as root
PROJECT_DIR = "/tmp/project"  # where the project is copied inside the sandbox (cwd of the command)
INSTALL_HINT = "install bubblewrap (`apt-get install bubblewrap`, or `make system-deps`)"
_STAGE = "/tmp/omrl-python"  # root mode: where the outer mount namespace shows the Python installation
_GRACE_S = 1.0               # after the command ends: how long to wait for the rest of its output


class SandboxUnavailable(OmrlError, ValueError):
    """The sandbox cannot run on this machine (the message says why and what to install)."""


class SandboxError(OmrlError, RuntimeError):
    """The sandbox failed to start a command (an infrastructure failure, not the command's)."""


@dataclass
class SandboxResult:
    """How one run ended: returncode (negative: killed by that signal), the output tail, timing."""

    returncode: int | None
    output: str
    timed_out: bool
    elapsed_s: float
    sandboxed: bool
    output_truncated: bool = False
    out_of_memory: bool = False            # the run went past its total memory cap (a process of it was killed)
    memory_peak_mb: float | None = None    # the most memory the tree held at once, where the cap measures it
    memory_cap: str = ""                   # how the total was held: cgroup2, cgroup1 or polling (MemoryCap.kind)


# ---------------------------------------------------------------------------- availability

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


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "no output")[:300]


def _bwrap() -> str | None:
    return shutil.which("bwrap")


@functools.lru_cache(maxsize=4)
def _disable_userns(bwrap: str) -> tuple[str, ...]:
    """--disable-userns (bwrap >= 0.8: the sandbox cannot make user namespaces of its own) when supported."""
    try:
        usage = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return ("--disable-userns",) if "--disable-userns" in usage else ()


# ---------------------------------------------------------------------------- the interpreter inside


def sandbox_python() -> str | None:
    """The real interpreter of this Python installation (a venv's python is a link into sys.base_prefix)."""
    prefix = Path(os.path.realpath(sys.base_prefix))
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for name in (version, "python3"):
        candidate = prefix / "bin" / name
        if candidate.is_file():
            return str(candidate)
    return None


def map_command(command: list[str]) -> list[str]:
    """The command with this process's interpreter (or a bare python/python3) replaced by sandbox_python()."""
    if not command:
        return command
    python = sandbox_python()
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    ours = {sys.executable, os.path.realpath(sys.executable), "python", "python3", version}
    if python is not None and command[0] in ours:
        return [python, *command[1:]]
    return list(command)


def _system_binds() -> list[str]:
    """Read-only binds (or symlinks, on merged-/usr systems) of what programs and the interpreter need."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    args += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]  # library paths, e.g. /usr/local/lib
    args += ["--ro-bind-try", "/etc/alternatives", "/etc/alternatives"]  # what /usr/bin/awk and co. link to
    return args


def _prefix_outside_binds() -> str | None:
    """sys.base_prefix when the system binds do not already cover it (e.g. /opt/python, ~/.pyenv/...)."""
    prefix = os.path.realpath(sys.base_prefix)
    covered = ["/usr", *(os.path.realpath(t) for t in ("/bin", "/sbin", "/lib", "/lib64") if os.path.isdir(t))]
    if any(prefix == c or prefix.startswith(c.rstrip("/") + "/") for c in covered):
        return None
    return prefix


# ---------------------------------------------------------------------------- the total memory cap


def _total_memory(limits: SandboxLimits) -> RunGroup | PolledMemory:
    """What holds this run's total memory: a cgroup where the host allows one, else the polling supervisor."""
    cap = memory_cap()
    if cap.kind != "polling":
        try:
            return RunGroup(cap, limits)
        except OSError as exc:  # e.g. the parent's limits or its number of groups
            raise SandboxError(f"cannot make the run's {cap.kind} group under {cap.memory_parent}: "
                               f"{exc.strerror or exc}") from None
    return PolledMemory(cap, limits)


# ---------------------------------------------------------------------------- running


# Runs inside the sandbox as its user, under `python -I -S`: copy the project in, apply the limits, exec.
_BOOTSTRAP = r"""
import json, os, resource, sys, tarfile
spec = json.loads(sys.argv[1])
os.write(spec["started_fd"], b"1")
os.close(spec["started_fd"])
try:
    os.makedirs(spec["project"], exist_ok=True)
    with os.fdopen(spec["archive_fd"], "rb") as stream, tarfile.open(fileobj=stream, mode="r|") as archive:
        extra = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        archive.extractall(spec["project"], **extra)
except OSError as exc:
    sys.stderr.write("sandbox: cannot copy the project in (%s); the project may exceed the sandbox's disk "
                     "limit\n" % (exc.strerror or exc))
    sys.exit(125)
if spec["archive_fd"] == 0:
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
for name, value in spec["limits"].items():
    resource.setrlimit(getattr(resource, name), (value, value))
os.chdir(spec["project"])
try:
    os.execvp(spec["command"][0], spec["command"])
except OSError as exc:
    sys.stderr.write("sandbox: cannot run %s: %s\n" % (spec["command"][0], exc.strerror or exc))
    sys.exit(127)
"""

# Runs as root, as pid 1 of the outer PID namespace. The child becomes uid/gid 65534 for good and starts bwrap;
# this process stays root so that the kernel's kill when bwrap's root launcher dies (--die-with-parent) is
# allowed to reach it (a launcher without capabilities may not signal another uid's process), and its end
# ends the namespace. Meanwhile it reaps what is orphaned inside.
_DEMOTE = f"""
import os, sys
child = os.fork()
if child == 0:
    os.setgroups([])
    os.setresgid({SANDBOX_UID}, {SANDBOX_UID}, {SANDBOX_UID})
    os.setresuid({SANDBOX_UID}, {SANDBOX_UID}, {SANDBOX_UID})
    os.execv(sys.argv[1], sys.argv[1:])
while True:
    pid, status = os.waitpid(-1, 0)
    if pid == child:
        code = os.waitstatus_to_exitcode(status)
        sys.exit(code if code >= 0 else 128 - code)
"""


def base_env() -> dict[str, str]:
    """The whole environment the sandboxed command starts with (plus what the caller adds)."""
    python = sandbox_python()
    folders = ([os.path.dirname(python)] if python is not None else []) + ["/usr/local/bin", "/usr/bin", "/bin"]
    path = ":".join(dict.fromkeys(folders))
    return {"PATH": path, "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONHASHSEED": "0"}


@dataclass(frozen=True)
class SandboxView:
    """What a run sees besides the system binds: host folders shown read-only (host path -> path inside),
    extra empty writable folders (tmpfs, inside the disk and memory caps), its uid inside (0 looks like root
    but has no capabilities: the user namespace maps it to uid 65534 outside) and where the project goes."""

    binds: tuple[tuple[str, str], ...] = ()
    writable: tuple[str, ...] = ()
    uid: int = SANDBOX_UID
    project_dir: str = PROJECT_DIR


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


def _argv(bwrap: str, python: str, command: list[str], limits: SandboxLimits, env: dict[str, str],
          started_fd: int, info_fd: int, view: SandboxView = SandboxView(), archive_fd: int = 0) -> list[str]:
    """bwrap inside an outer bwrap; see the module docstring for why two."""
    root = os.geteuid() == 0
    prefix = _prefix_outside_binds()
    limit_values = {"RLIMIT_NPROC": limits.max_processes, "RLIMIT_AS": limits.memory_mb << 20,
                    "RLIMIT_CPU": int(limits.timeout_s) + 1, "RLIMIT_FSIZE": limits.max_file_mb << 20,
                    "RLIMIT_NOFILE": limits.max_open_files, "RLIMIT_CORE": 0}
    spec = {"started_fd": started_fd, "archive_fd": archive_fd, "project": view.project_dir, "command": command,
            "limits": limit_values}
    inner = [bwrap, "--unshare-all", "--unshare-user", *_disable_userns(bwrap), "--die-with-parent",
             "--new-session", "--uid", str(view.uid), "--gid", str(view.uid), "--hostname", "sandbox"]
    for folder in view.writable:  # before the binds: one below a writable folder (e.g. /root/.pyenv) stays seen
        inner += ["--size", str(limits.disk_mb << 20), "--tmpfs", folder]
    inner += _system_binds()
    if prefix is not None:
        inner += ["--ro-bind", _STAGE, prefix]
    staged = [(host, f"{_STAGE}-bind-{i}", inside) for i, (host, inside) in enumerate(view.binds)]
    for _, stage, inside in staged:  # the outer layer shows each where the sandbox user can reach it
        inner += ["--ro-bind", stage, inside]
    inner += ["--proc", "/proc", "--dev", "/dev", "--size", str(limits.disk_mb << 20), "--tmpfs", "/tmp",
              "--remount-ro", "/", "--remount-ro", "/dev", "--chdir", "/tmp", "--clearenv"]
    for key, value in env.items():
        inner += ["--setenv", key, value]
    inner += ["--", python, "-I", "-S", "-c", _BOOTSTRAP, json.dumps(spec)]
    # The outer layer shows the Python installation where the sandbox user can reach it and, as root, drops
    # to that user. Its own PID namespace has the inner bwrap (as root: _DEMOTE) as pid 1: when that ends,
    # the kernel kills and reaps whatever is left (bwrap's launcher does not reap its sandbox's init, and
    # some inits never do), and killing it kills everything.
    outer = [bwrap, *([] if root else ["--unshare-user"]), "--unshare-pid", "--as-pid-1", "--die-with-parent",
             "--dev-bind", "/", "/", "--tmpfs", "/tmp", "--info-fd", str(info_fd)]
    if prefix is not None:
        outer += ["--ro-bind", prefix, _STAGE]
    for host, stage, _ in staged:
        outer += ["--ro-bind", host, stage]
    if root:
        return [*outer, "--", python, "-I", "-S", "-c", _DEMOTE, *inner]
    return [*outer, "--", *inner]


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


def _pack(folder: Path, out: io.BufferedIOBase) -> None:
    """A tar of the folder's regular files and folders (links and devices are left out)."""
    with tarfile.open(fileobj=out, mode="w") as archive:
        for path in sorted(folder.rglob("*")):
            if path.is_symlink() or not (path.is_file() or path.is_dir()):
                continue
            archive.add(path, arcname=str(path.relative_to(folder)), recursive=False)


class _Run:
    """One started process group. kill() is safe from any thread until (and after) the leader is reaped.

    When bwrap told us its child's pid, that child is killed (through a pidfd, so a reused pid is never hit)
    and bwrap reaps it and exits by itself; otherwise, and for whatever is left at the end, the group is.
    """

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process
        self.lock = threading.Lock()
        self.reaped = False
        self.killed = threading.Event()
        self.child: int | None = None  # pidfd of bwrap's child

    def kill(self) -> None:
        with self.lock:
            if self.reaped:
                return
            self.killed.set()
            if self.child is not None:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(self.child, signal.SIGKILL)
            else:
                self._kill_group()

    def _kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def reap(self) -> int:
        """Wait for the leader (killing the group if it does not end soon), then kill leftovers in its group."""
        try:
            self.process.wait(timeout=_GRACE_S if self.killed.is_set() else 0.2)
        except subprocess.TimeoutExpired:
            with self.lock:
                self._kill_group()
        with self.lock:
            self._kill_group()  # before reaping, while the group id cannot have been reused
            returncode = self.process.wait()
            self.reaped = True
            if self.child is not None:
                os.close(self.child)
                self.child = None
        return returncode

    def set_child(self, pid: int) -> None:
        with self.lock:
            if self.reaped or self.child is not None:
                return
            try:
                child = os.pidfd_open(pid)
            except (AttributeError, OSError):
                return
            try:  # the pidfd pins a process; keep it only if that is bwrap's child, not a reuse of its pid
                stat = Path(f"/proc/{pid}/stat").read_text()
                ours = int(stat.rsplit(")", 1)[1].split()[1]) == self.process.pid
            except (OSError, ValueError, IndexError):
                ours = False
            if ours:
                self.child = child
            else:
                os.close(child)


def _supervise(argv: list[str], *, stdin, limits: SandboxLimits, env: dict[str, str], sandboxed: bool,
               cwd: str | os.PathLike[str] | None = None, preexec_fn: Callable[[], None] | None = None,
               pass_fds: tuple[int, ...] = (), started: int | None = None, info: int | None = None,
               close_after_start: tuple[int, ...] = (),
               on_start: Callable[[Callable[[], None]], None] | None = None) -> SandboxResult:
    """Start argv in its own session; read its output until it ends or the wall time is up; kill the rest.

    Never waits for the output pipe to close: a descendant that keeps it open only costs _GRACE_S. The whole
    tree's memory is held by a cgroup the first process enters before it execs, or polled every tick.
    """
    try:
        total = _total_memory(limits)
    except BaseException:
        for fd in close_after_start:
            os.close(fd)
        raise
    read_end, write_end = os.pipe()
    start = time.monotonic()
    deadline = start + limits.timeout_s
    try:
        process = subprocess.Popen(total.wrap(argv), stdin=stdin, stdout=write_end, stderr=write_end, cwd=cwd, env=env,
                                   start_new_session=True, pass_fds=pass_fds, preexec_fn=preexec_fn)
    except BaseException:
        os.close(read_end)
        total.finish()
        raise
    finally:
        os.close(write_end)
        for fd in close_after_start:  # the child holds them now: EOF means it is gone
            os.close(fd)
    run = _Run(process)
    exited = _pidfd(process.pid)
    output, info_text = _Tail(limits.max_output_bytes), bytearray()
    was_started = started is None
    timed_out = out_of_memory = False
    next_check = start
    try:
        if on_start is not None:
            on_start(run.kill)
        watched = [fd for fd in (read_end, started, info) if fd is not None]
        while not run.killed.is_set() and process.poll() is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                run.kill()
                break
            if total.tick_s is not None and time.monotonic() >= next_check:
                next_check = time.monotonic() + total.tick_s
                if total.over(process.pid):
                    out_of_memory = True
                    run.kill()
                    break
            wait = remaining if exited is not None else min(remaining, 0.05)
            if total.tick_s is not None:
                wait = min(wait, max(0.0, next_check - time.monotonic()))
            fds = watched + ([exited] if exited is not None else [])
            ready = _ready(fds, wait)
            if read_end in ready and not output.read(read_end):
                watched.remove(read_end)
            if started is not None and started in ready:
                was_started = was_started or os.read(started, 1) == b"1"
                watched.remove(started)
            if info is not None and info in ready:
                chunk = os.read(info, 4096)
                info_text += chunk
                if not chunk:
                    watched.remove(info)
                    with contextlib.suppress(ValueError, KeyError, TypeError):
                        run.set_child(int(json.loads(info_text.decode())["child-pid"]))
            if exited is not None and exited in ready:
                break
        returncode = run.reap()
        grace = time.monotonic() + _GRACE_S
        while read_end in watched:  # what was written before the end; the writers are dead or detached
            ready = _ready([read_end], max(0.0, grace - time.monotonic()))
            if not ready or not output.read(read_end):
                break
        if started is not None and started in watched and not was_started:
            ready = _ready([started], 0)
            was_started = bool(ready) and os.read(started, 1) == b"1"
    finally:
        if not run.reaped:  # an exception on the way: leave nothing running
            run.kill()
            run.reap()
        peak_mb, memory_killed = total.finish()
        os.close(read_end)
        if exited is not None:
            os.close(exited)
    elapsed = time.monotonic() - start
    text = output.text()
    if not was_started and not timed_out and not run.killed.is_set():
        raise SandboxError(f"bwrap did not start the command (exit {returncode}): {_last_line(text)}")
    return SandboxResult(returncode=returncode, output=text, timed_out=timed_out, elapsed_s=elapsed,
                         sandboxed=sandboxed, output_truncated=output.truncated,
                         out_of_memory=out_of_memory or memory_killed, memory_peak_mb=peak_mb,
                         memory_cap=total.cap.kind)


# ---------------------------------------------------------------------------- a long-lived shell

# Runs as the sandbox's command: bash reading NUL-separated (command, token) pairs from fd 3 (our pipe), each
# command eval'd in the one shell (cwd, variables, functions and background jobs persist; `declare` makes a
# local, as inside any function) with /dev/null as its input, followed by a line with the token and its exit
# status. SIGUSR1 (sent at a timeout) abandons the rest of the command line with status 124.
# Why the token comes after the command and is read only once the command is over: while the command runs,
# the token of its end is in no variable (`set`, `declare -p`), argument or environment of the shell, and fd 3
# is closed for the command (`3<&-`), so `cat <&3` cannot read the token (or the commands after it) either;
# a fresh 128-bit token per command leaves nothing to guess from earlier ones. Residual risk, deliberate only:
# to restore fd 3 afterwards, bash keeps a copy of it at a descriptor >= 10 (10 in this loop; close-on-exec and
# closed in subshells) while the command runs, so a builtin of the shell itself (`read -u 10`) can take the
# waiting token from the pipe and print the marker early. Opening /proc/$$/fd/10 from a child is refused when
# omrl runs as root (the pipe belongs to a host user the sandbox's user is not), but may work when omrl runs as
# an ordinary user, as the sandbox's user then maps to the pipe's owner. Either way it gains no more than any
# command has over the shell it runs in (it can redefine `printf` or `read` for the loop): a say in what later
# outputs show. So callers must not trust the shell's output once an agent's command ran in it (the os env
# computes expected answers before the first one). The loop notices a stolen token when it reads the next
# command in its place: the shell exits and the next command gets a fresh one.
_SHELL_LOOP = r"""exec 3<&0 0</dev/null
__omrl_run() {
  trap 'trap - USR1; return 124' USR1
  eval "$1"
  local __omrl_status=$?
  trap - USR1
  return $__omrl_status
}
while IFS= read -r -d '' __omrl_command <&3; do
  __omrl_run "$__omrl_command" 3<&-
  __omrl_status=$?
  IFS= read -r -d '' __omrl_token <&3 || break
  case $__omrl_token in __omrl_done_*) ;; *) exit 125 ;; esac
  printf '\n%s %d\n' "$__omrl_token" "$__omrl_status"
  unset __omrl_token
done
"""
_SHELL_MARKER = "omrl-sandbox-shell"


@dataclass
class ShellResult:
    """One command's end: its exit status (None: it timed out or the shell died), output (capped), timing."""

    returncode: int | None
    output: str
    timed_out: bool
    elapsed_s: float
    output_truncated: bool = False
    restarted: bool = False  # the shell ended (exit, a kill, its memory cap): the next command gets a fresh one


class SandboxShell:
    """A bash that lives across commands inside one sandbox (the same isolation and total caps as
    run_sandboxed, for the shell's whole life): run(command) returns when the command ends or its time is up,
    when only the processes that command started are killed. close() ends everything inside.

    limits.timeout_s is the whole shell's life; each run() has its own timeout. Output is capped per command.
    """

    def __init__(self, project: str | os.PathLike[str] | None = None, limits: SandboxLimits = SandboxLimits(),
                 env: dict[str, str] | None = None, view: SandboxView = SandboxView()) -> None:
        require_sandbox()
        self.project, self.limits, self.env, self.view = project, limits, dict(env or {}), view
        self.lock = threading.Lock()
        self.process: subprocess.Popen | None = None
        self.started_at = 0.0

    # -------------------------------------------------------------- life

    def start(self) -> None:
        """Start the shell (run() does it when needed); raises SandboxError when it cannot start."""
        bwrap, python = _bwrap(), sandbox_python()
        if bwrap is None or python is None:
            raise SandboxUnavailable(f"bwrap or the interpreter is missing; {INSTALL_HINT}")
        self.total = _total_memory(self.limits)
        command = ["/bin/bash", "--noprofile", "--norc", "-c", _SHELL_LOOP, _SHELL_MARKER]
        with tempfile.TemporaryFile() as archive, tempfile.TemporaryDirectory(prefix="omrl-empty-") as empty:
            _pack(Path(self.project or empty), archive)
            archive.seek(0)
            started_r, started_w = os.pipe()
            info_r, info_w = os.pipe()
            self.output_r, output_w = os.pipe()
            try:
                argv = _argv(bwrap, python, command, self.limits, {**base_env(), **self.env}, started_w, info_w,
                             self.view, archive_fd=archive.fileno())
                self.process = subprocess.Popen(
                    self.total.wrap(argv), stdin=subprocess.PIPE, stdout=output_w, stderr=output_w, cwd="/",
                    env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, start_new_session=True,
                    pass_fds=(started_w, info_w, archive.fileno()))
            except BaseException:
                os.close(self.output_r)
                self.total.finish()
                raise
            finally:
                for fd in (started_w, info_w, output_w):
                    os.close(fd)
            self.run_handle = _Run(self.process)
            try:
                ready = _ready([started_r], 30.0)
                ok = bool(ready) and os.read(started_r, 1) == b"1"
                info = b""
                while _ready([info_r], 5.0):
                    chunk = os.read(info_r, 4096)
                    if not chunk:
                        break
                    info += chunk
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    self.run_handle.set_child(int(json.loads(info.decode())["child-pid"]))
            finally:
                os.close(started_r)
                os.close(info_r)
        if not ok:
            text = self._drain(1.0)
            self.close()
            raise SandboxError(f"the sandbox shell did not start: {_last_line(text)}")
        self.started_at = time.monotonic()
        self.pending = bytearray()

    def close(self) -> None:
        """End the shell and everything it started; safe to call twice."""
        process, self.process = self.process, None
        if process is None:
            return
        self.run_handle.kill()
        self.run_handle.reap()
        with contextlib.suppress(OSError):
            process.stdin.close()
        os.close(self.output_r)
        self.total.finish()

    def __enter__(self) -> SandboxShell:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # -------------------------------------------------------------- commands

    def run(self, command: str, timeout_s: float = 30.0, max_output_bytes: int | None = None) -> ShellResult:
        """Run one bash command in the shell; returns when it ends, or kills what it started at timeout_s."""
        with self.lock:
            restarted = False
            if self.process is not None and not self.alive:
                self.close()
                restarted = True
            if self.process is None:
                self.start()
            if "\0" in command:
                raise UsageError("a shell command cannot contain a NUL character")
            token = f"__omrl_done_{os.urandom(16).hex()}"
            marker = re.compile(rb"\n" + token.encode() + rb" (\d+)\n")
            before = set(self._inside())
            start = time.monotonic()
            output = _Tail(max_output_bytes or self.limits.max_output_bytes)
            try:
                self.process.stdin.write(command.encode("utf-8", "replace") + b"\0" + token.encode() + b"\0")
                self.process.stdin.flush()
            except OSError:
                self.close()
                return ShellResult(None, "(the shell had ended; a new one starts with the next command)", False,
                                   0.0, restarted=True)
            life_left = self.limits.timeout_s - (start - self.started_at)
            deadline = start + min(timeout_s, max(0.0, life_left))
            status, timed_out, memory = None, False, False
            buffer = bytearray()
            while True:
                found = marker.search(buffer)
                if found:
                    status = int(found.group(1))
                    output.add(bytes(buffer[:found.start()]))
                    break
                if len(buffer) > 1 << 16:  # keep what cannot hold the start of a marker
                    keep = len(token) + 32
                    output.add(bytes(buffer[:-keep]))
                    del buffer[:-keep]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    timed_out = True
                    break
                if self.total.tick_s is not None and self.total.over(self.process.pid):
                    memory = True
                    break
                wait = remaining if self.total.tick_s is None else min(remaining, self.total.tick_s)
                if _ready([self.output_r], wait):
                    chunk = os.read(self.output_r, 1 << 16)
                    if not chunk:
                        break  # the whole sandbox ended
                    buffer += chunk
                elif not self.alive:
                    break
            if status is None and not timed_out and not memory:  # the shell itself ended (exit, a kill, a cap)
                output.add(bytes(buffer) + self._drain(0.2))
                self.close()
                restarted = True
                note = "\n(the shell ended; a new one starts with the next command)"
                return ShellResult(None, output.text() + note, False, time.monotonic() - start, output.truncated,
                                   restarted)
            if timed_out or memory:
                output.add(bytes(buffer))
                if not self._interrupt(before, marker, output):  # the shell itself was stuck: end it
                    self.close()
                    restarted = True
                if memory:
                    output.add(f"\n(killed: the sandbox went past its {self.limits.memory_mb} MB memory cap)".encode())
            return ShellResult(status if not (timed_out or memory) else None, output.text(), timed_out,
                               time.monotonic() - start, output.truncated, restarted)

    def _interrupt(self, before: set[int], marker: re.Pattern, output: _Tail) -> bool:
        """Tell the shell to abandon the command line, kill the processes the command started (not those
        from before, e.g. a start script's background job); True when the shell then ends it by itself."""
        top, inside = self._shell_pids()
        for pid, sig in [(top, signal.SIGUSR1)] * (top is not None) + [(p, signal.SIGKILL) for p in inside]:
            if sig == signal.SIGKILL and pid in before:
                continue
            if sig == signal.SIGKILL and top is not None:
                time.sleep(0.05)  # the shell takes the USR1 first, then sees its child die
                top = None
            with contextlib.suppress(OSError):
                handle = os.pidfd_open(pid)
                try:
                    signal.pidfd_send_signal(handle, sig)
                finally:
                    os.close(handle)
        buffer = bytearray()
        deadline = time.monotonic() + _GRACE_S
        while time.monotonic() < deadline:
            if _ready([self.output_r], max(0.0, deadline - time.monotonic())):
                chunk = os.read(self.output_r, 1 << 16)
                if not chunk:
                    return False
                buffer += chunk
                found = marker.search(buffer)
                if found:
                    output.add(bytes(buffer[:found.start()]))
                    return True
        output.add(bytes(buffer))
        return False

    def _inside(self) -> list[int]:
        """Host pids of the shell's descendants (the processes its commands started)."""
        return self._shell_pids()[1]

    def _shell_pids(self) -> tuple[int | None, list[int]]:
        """(the shell's host pid, its descendants' pids); (None, []) when it is not running."""
        if self.process is None:
            return None, []
        tree = process_tree(self.process.pid)
        shells = [pid for pid in tree  # the bash itself: the bwraps above it carry the marker in their arguments
                  if _read_bytes(f"/proc/{pid}/cmdline").startswith(b"/bin/bash\0")
                  and _SHELL_MARKER.encode() in _read_bytes(f"/proc/{pid}/cmdline")]
        if not shells:
            return None, []
        top = shells[0]  # _tree lists parents before their children
        return top, [pid for pid in process_tree(top) if pid != top]

    def _drain(self, seconds: float) -> bytes:
        data = bytearray()
        deadline = time.monotonic() + seconds
        with contextlib.suppress(OSError):
            while _ready([self.output_r], max(0.0, deadline - time.monotonic())):
                chunk = os.read(self.output_r, 1 << 16)
                if not chunk:
                    break
                data += chunk
        return bytes(data)


def _read_bytes(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError:
        return b""


def _ready(fds: list[int], timeout_s: float) -> list[int]:
    """The fds that can be read (or hit end of file) within timeout_s; poll, as fds may exceed FD_SETSIZE."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return [fd for fd, _ in poller.poll(max(0, int(timeout_s * 1000 + 0.999)))]


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when the process exits (None: poll instead)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


class _Tail:
    """The last `limit` bytes of a stream."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self.truncated = False

    def read(self, fd: int) -> bool:
        """Read what is there; False at end of file."""
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return False
        self.add(chunk)
        return True

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > 2 * self.limit:
            del self.data[: len(self.data) - self.limit]
            self.truncated = True

    def text(self) -> str:
        data = self.data
        if len(data) > self.limit:
            data = data[-self.limit:]
            self.truncated = True
        return data.decode("utf-8", errors="replace")
