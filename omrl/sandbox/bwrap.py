"""The bwrap command line of a run: what the sandbox shows (system binds, the interpreter, a SandboxView),
the bootstrap that copies the project in and applies the rlimits, and the two layers' argv.
"""

from __future__ import annotations

import functools
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from omrl.sandbox.limits import SandboxLimits

SANDBOX_UID = 65534          # "nobody": the sandbox's user inside, and outside too when omrl runs as root
PROJECT_DIR = "/tmp/project"  # where the project is copied inside the sandbox (cwd of the command)
INSTALL_HINT = "install bubblewrap (`apt-get install bubblewrap`, or `make system-deps`)"
_STAGE = "/tmp/omrl-python"  # root mode: where the outer mount namespace shows the Python installation


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


def _argv(bwrap: str, python: str, command: list[str], limits: SandboxLimits, env: dict[str, str],
          started_fd: int, info_fd: int, view: SandboxView = SandboxView(), archive_fd: int = 0) -> list[str]:
    """bwrap inside an outer bwrap; see omrl.sandbox's docstring for why two."""
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


def _pack(folder: Path, out: io.BufferedIOBase) -> None:
    """A tar of the folder's regular files and folders (links and devices are left out)."""
    with tarfile.open(fileobj=out, mode="w") as archive:
        for path in sorted(folder.rglob("*")):
            if path.is_symlink() or not (path.is_file() or path.is_dir()):
                continue
            archive.add(path, arcname=str(path.relative_to(folder)), recursive=False)
