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
"""

from __future__ import annotations

import contextlib
import errno
import functools
import io
import itertools
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

from omrl.durable import pid_alive
from omrl.errors import OmrlError, UsageError

SANDBOX_UID = 65534          # "nobody": the sandbox's user inside, and outside too when omrl runs as root
PROJECT_DIR = "/tmp/project"  # where the project is copied inside the sandbox (cwd of the command)
INSTALL_HINT = "install bubblewrap (`apt-get install bubblewrap`, or `make system-deps`)"
_STAGE = "/tmp/omrl-python"  # root mode: where the outer mount namespace shows the Python installation
_GRACE_S = 1.0               # after the command ends: how long to wait for the rest of its output


class SandboxUnavailable(OmrlError, ValueError):
    """The sandbox cannot run on this machine (the message says why and what to install)."""


class SandboxError(OmrlError, RuntimeError):
    """The sandbox failed to start a command (an infrastructure failure, not the command's)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits for one run: memory, processes and disk for the whole sandbox (see memory_cap() for how the
    memory total is held on this host), CPU time, address space and file size per process."""

    timeout_s: float = 10.0       # wall time for the whole tree
    memory_mb: int = 1024         # the whole tree's memory (tmpfs and memfd pages included); also each one's RLIMIT_AS
    max_processes: int = 64       # RLIMIT_NPROC: processes and threads of the sandbox user, in this sandbox
    disk_mb: int = 64             # size of the only writable filesystem (/tmp, which holds the project)
    max_file_mb: int = 50         # RLIMIT_FSIZE
    max_open_files: int = 1024    # RLIMIT_NOFILE
    max_output_bytes: int = 1 << 20  # output kept (the tail) from stdout and stderr together


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

CGROUP_ENV = "OMRL_SANDBOX_CGROUP"  # "off": never make cgroups (polling); a path: the cgroup v2 folder to make them in
POLL_INTERVAL_S = 0.02              # polling: how often the supervisor sums the tree's memory
_LAYER_PROCESSES = 8                # pids.max headroom for the sandbox's own layers (bwraps, reaper, bootstrap)
_CGROUP_V2_HELP = (f"set {CGROUP_ENV} to a cgroup v2 folder this user may write, with memory and pids in its "
                   "cgroup.subtree_control and no processes of its own (a delegated subtree)")


@dataclass(frozen=True)
class MemoryCap:
    """How this host holds a run's total memory: kind "cgroup2", "cgroup1" or "polling", in one line, and
    where run groups are made (memory and, when separate, pids folders: cgroup v1 has one tree per controller)."""

    kind: str
    description: str
    memory_parent: str | None = None
    pids_parent: str | None = None


_cap_lock = threading.Lock()
_cap: MemoryCap | None = None
_group_numbers = itertools.count()


def memory_cap(refresh: bool = False) -> MemoryCap:
    """The total memory cap in force for runs on this host (probed once per process, then cached)."""
    global _cap
    with _cap_lock:
        if _cap is None or refresh:
            _cap = _probe_cap()
        return _cap


def _probe_cap() -> MemoryCap:
    setting = os.environ.get(CGROUP_ENV, "").strip()
    if setting.lower() in ("off", "0", "no", "none"):
        return _polling(f"cgroups turned off by {CGROUP_ENV}={setting}")
    reasons = []
    for probe in ((lambda: _cgroup2_cap(setting)),) if setting else (lambda: _cgroup2_cap(None), _cgroup1_cap):
        cap, reason = probe()
        if cap is not None:
            return cap
        reasons.append(reason)
    return _polling("; ".join(reasons))


def _polling(reason: str) -> MemoryCap:
    return MemoryCap("polling", f"polling: no cgroup can be made here ({reason}), so the supervisor sums the tree's "
                     f"memory (PSS, memfds, its /tmp) every {POLL_INTERVAL_S * 1000:g} ms and kills the run past the "
                     "cap; allocations faster than that can overshoot it briefly")


def _cgroup_mounts() -> list[tuple[str, str, str, set[str]]]:
    """(mount point, root inside the hierarchy, fstype, super options) of each cgroup mount of this process."""
    mounts = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return mounts
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
            unescape = functools.partial(re.sub, r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)))
            mounts.append((unescape(fields[4]), unescape(fields[3]), tail[0], set(tail[2].split(","))))
    return mounts


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and under "" its cgroup v2 path."""
    paths = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return paths
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def _on_mount(mount: str, root: str, path: str) -> str:
    """The folder of cgroup `path` under a mount of the hierarchy's `root`."""
    if root != "/" and (path == root or path.startswith(root.rstrip("/") + "/")):
        path = path[len(root):]
    elif root != "/":
        path = "/"
    return os.path.join(mount, path.lstrip("/")).rstrip("/") or "/"


def _cgroup2_cap(named: str | None) -> tuple[MemoryCap | None, str]:
    if named:
        parent = named
    else:
        mount = next(((point, root) for point, root, kind, _ in _cgroup_mounts() if kind == "cgroup2"), None)
        own = _own_cgroups().get("")
        if mount is None or own is None:
            return None, "no cgroup v2 mount"
        parent = _on_mount(mount[0], mount[1], own)
    try:
        available = Path(parent, "cgroup.controllers").read_text().split()
        enabled = Path(parent, "cgroup.subtree_control").read_text().split()
    except OSError as exc:
        return None, f"cgroup v2 folder {parent} unreadable ({exc.strerror or exc})"
    if "memory" not in available:
        return None, f"cgroup v2 at {parent} has no memory controller"
    wanted = [c for c in ("memory", "pids") if c in available and c not in enabled]
    if wanted:
        try:
            Path(parent, "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in wanted))
        except OSError as exc:
            return None, (f"cannot enable {', '.join(wanted)} for groups under {parent} ({exc.strerror or exc}); "
                          + _CGROUP_V2_HELP)
    pids = "pids" in available
    error = _try_group("cgroup2", parent, parent if pids else None)
    if error:
        return None, error
    what = "memory.max" + (" and pids.max" if pids else " (no pids controller: processes by RLIMIT_NPROC only)")
    return MemoryCap("cgroup2", f"cgroup v2 group per run ({what}, swap off; tmpfs and memfd pages count) under "
                     f"{parent}", parent, parent if pids else None), ""


def _cgroup1_cap() -> tuple[MemoryCap | None, str]:
    mounts = _cgroup_mounts()
    own = _own_cgroups()
    found: dict[str, str] = {}
    for controller in ("memory", "pids"):
        mount = next(((point, root) for point, root, kind, options in mounts
                      if kind == "cgroup" and controller in options), None)
        if mount is not None and controller in own:
            found[controller] = _on_mount(mount[0], mount[1], own[controller])
    if "memory" not in found:
        return None, "no cgroup v1 memory controller mounted"
    error = _try_group("cgroup1", found["memory"], found.get("pids"))
    if error:
        return None, error
    what = "memory.limit_in_bytes" + (" and pids.max" if "pids" in found else
                                      " (no pids controller: processes by RLIMIT_NPROC only)")
    return MemoryCap("cgroup1", f"cgroup v1 group per run ({what}; tmpfs and memfd pages count) under "
                     f"{found['memory']}", found["memory"], found.get("pids")), ""


def _try_group(kind: str, memory_parent: str, pids_parent: str | None) -> str:
    """'' when a group with a memory limit can be made (and removed) under the parent, else why not."""
    _sweep(memory_parent, pids_parent)
    probe = MemoryCap(kind, "", memory_parent, pids_parent)
    try:
        group = _RunGroup(probe, SandboxLimits(), name=f"omrl-{os.getpid()}-probe")
    except OSError as exc:
        return f"cannot make a {kind} group under {memory_parent} ({exc.strerror or exc})"
    group.finish()
    return ""


def _sweep(*parents: str | None) -> None:
    """Remove the empty run groups of omrl processes that are gone (killed before they could remove them)."""
    for parent in filter(None, parents):
        with contextlib.suppress(OSError):
            for entry in os.scandir(parent):
                match = re.fullmatch(r"omrl-(\d+)-\w+", entry.name)
                if match and entry.is_dir() and not pid_alive(int(match.group(1))):
                    with contextlib.suppress(OSError):
                        os.rmdir(entry.path)


class _RunGroup:
    """One run's cgroup(s): made with its limits, entered by the run's first process before it execs, read for
    the peak and the out-of-memory kills, emptied and removed at the end."""

    tick_s: float | None = None

    def __init__(self, cap: MemoryCap, limits: SandboxLimits, name: str | None = None) -> None:
        self.cap = cap
        self.v2 = cap.kind == "cgroup2"
        name = name or f"omrl-{os.getpid()}-{next(_group_numbers)}"
        self.folders = [os.path.join(cap.memory_parent, name)]
        if cap.pids_parent is not None and cap.pids_parent != cap.memory_parent:
            self.folders.append(os.path.join(cap.pids_parent, name))
        memory = limits.memory_mb << 20
        writes: list[tuple[str, str, bool]] = []  # (file, value, required)
        if self.v2:
            writes += [("memory.max", str(memory), True), ("memory.swap.max", "0", False)]
        else:
            writes += [("memory.limit_in_bytes", str(memory), True), ("memory.memsw.limit_in_bytes", str(memory), False)]
        pids_folder = self.folders[-1] if cap.pids_parent is not None else None
        try:
            for folder in self.folders:
                os.mkdir(folder)
            for file, value, required in writes:
                try:
                    Path(self.folders[0], file).write_text(value)
                except OSError:
                    if required:
                        raise
            if pids_folder is not None:
                Path(pids_folder, "pids.max").write_text(str(limits.max_processes + _LAYER_PROCESSES))
        except BaseException:
            self._remove()
            raise

    def wrap(self, argv: list[str]) -> list[str]:
        """argv run by a shell that first moves itself into the group(s), so every descendant starts inside."""
        procs = [os.path.join(folder, "cgroup.procs") for folder in self.folders]
        script = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 126; shift; n=$((n-1)); done; exec "$@"'
        return ["/bin/sh", "-c", script, "sh", str(len(procs)), *procs, *argv]

    def over(self, root_pid: int) -> bool:
        return False  # the kernel holds the cap

    def finish(self) -> tuple[float | None, bool]:
        """(peak MB, whether the cap killed something); then kills what is left inside and removes the group."""
        memory = self.folders[0]
        peak = _read_int(os.path.join(memory, "memory.peak" if self.v2 else "memory.max_usage_in_bytes"))
        events = _read_text(os.path.join(memory, "memory.events" if self.v2 else "memory.oom_control"))
        kills = re.search(r"^oom_kill (\d+)$", events, re.MULTILINE)
        self._remove()
        return (round(peak / (1 << 20), 1) if peak is not None else None), bool(kills and int(kills.group(1)))

    def _remove(self) -> None:
        for folder in self.folders:
            for attempt in range(50):
                try:
                    os.rmdir(folder)
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY:  # gone already, or not ours to remove
                        break
                    self._kill_inside(folder)  # processes still inside (exiting, or left behind)
                    time.sleep(0.02 * min(attempt + 1, 5))

    def _kill_inside(self, folder: str) -> None:
        if self.v2 and os.path.exists(os.path.join(folder, "cgroup.kill")):
            with contextlib.suppress(OSError):
                Path(folder, "cgroup.kill").write_text("1")
            return
        for pid in _read_text(os.path.join(folder, "cgroup.procs")).split():
            with contextlib.suppress(OSError):  # a pidfd, and a check that it is still in the group: no reused pid
                handle = os.pidfd_open(int(pid))
                try:
                    if os.path.basename(folder) in Path(f"/proc/{pid}/cgroup").read_text():
                        signal.pidfd_send_signal(handle, signal.SIGKILL)
                finally:
                    os.close(handle)


class _PolledMemory:
    """The fallback where no cgroup can be made: the tree's memory, summed every tick_s; over() past the cap.

    Counted: each process's anonymous and shared memory, memfds held open, and the used space of the tmpfs
    folders it sees at /tmp. Each tick reads the cheap resident counters (/proc/PID/status, an upper bound:
    pages shared after a fork count in each process); only a sum past the cap is checked again with
    proportional sizes (smaps_rollup, which costs milliseconds a process) before the run is killed. Not
    counted: kernel memory (socket buffers) and SysV segments no process maps; a /tmp file that is also
    mapped counts twice.
    """

    tick_s = POLL_INTERVAL_S

    def __init__(self, cap: MemoryCap, limits: SandboxLimits) -> None:
        self.cap = cap
        self.limit = limits.memory_mb << 20
        self.peak = 0
        self.exceeded = False
        try:
            self.host_tmp = os.stat("/tmp").st_dev
        except OSError:
            self.host_tmp = None

    def wrap(self, argv: list[str]) -> list[str]:
        return argv

    def over(self, root_pid: int) -> bool:
        total = self.measure(root_pid)
        if total > self.limit:
            total = self.measure(root_pid, precise=True)
        self.peak = max(self.peak, total)
        self.exceeded = self.exceeded or total > self.limit
        return total > self.limit

    def measure(self, root_pid: int, precise: bool = False) -> int:
        """Bytes the tree under root_pid holds now: resident counters, or with `precise` proportional sizes
        and memfds that are mapped counted once (see the class docstring)."""
        total, held, mapped, tmpfs = 0, {}, set(), {}
        for pid in _tree(root_pid):
            if precise:
                sizes = _kb_fields(f"/proc/{pid}/smaps_rollup", ("Pss_Anon", "Pss_Shmem", "Pss"))
                total += (sizes["Pss_Anon"] + sizes["Pss_Shmem"]) if "Pss_Anon" in sizes else sizes.get("Pss", 0)
                for line in _read_text(f"/proc/{pid}/maps").splitlines():
                    parts = line.split(None, 5)
                    if len(parts) == 6 and parts[5].startswith("/memfd:"):
                        mapped.add(parts[4])
            else:
                sizes = _kb_fields(f"/proc/{pid}/status", ("RssAnon", "RssShmem"))
                total += sizes.get("RssAnon", 0) + sizes.get("RssShmem", 0)
            with contextlib.suppress(OSError):
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    with contextlib.suppress(OSError):
                        if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:"):
                            info = os.stat(f"/proc/{pid}/fd/{fd}")
                            held[(info.st_dev, info.st_ino)] = info.st_blocks * 512
            with contextlib.suppress(OSError):
                device = os.stat(f"/proc/{pid}/root/tmp").st_dev
                if device != self.host_tmp and device not in tmpfs:
                    tmp = os.statvfs(f"/proc/{pid}/root/tmp")
                    tmpfs[device] = (tmp.f_blocks - tmp.f_bfree) * tmp.f_frsize
        total += sum(size for (_, inode), size in held.items() if str(inode) not in mapped)
        return total + sum(tmpfs.values())

    def finish(self) -> tuple[float | None, bool]:
        return round(self.peak / (1 << 20), 1), self.exceeded


def _kb_fields(path: str, names: tuple[str, ...]) -> dict[str, int]:
    """The `Name:   N kB` fields of a /proc file, in bytes."""
    found = {}
    for line in _read_text(path).splitlines():
        name, _, rest = line.partition(":")
        if name in names:
            with contextlib.suppress(ValueError, IndexError):
                found[name] = int(rest.split()[0]) << 10
    return found


def _tree(root_pid: int) -> list[int]:
    """root_pid and its descendants now (orphans inside a sandbox are reparented to its init, still below)."""
    found, queue = [], [root_pid]
    while queue:
        pid = queue.pop()
        found.append(pid)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{pid}/task"):
                queue += [int(child) for child in _read_text(f"/proc/{pid}/task/{task}/children").split()]
    return found


def _total_memory(limits: SandboxLimits) -> _RunGroup | _PolledMemory:
    """What holds this run's total memory: a cgroup where the host allows one, else the polling supervisor."""
    cap = memory_cap()
    if cap.kind != "polling":
        try:
            return _RunGroup(cap, limits)
        except OSError as exc:  # e.g. the parent's limits or its number of groups
            raise SandboxError(f"cannot make the run's {cap.kind} group under {cap.memory_parent}: "
                               f"{exc.strerror or exc}") from None
    return _PolledMemory(cap, limits)


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        return ""


def _read_int(path: str) -> int | None:
    text = _read_text(path).strip()
    return int(text) if text.isdigit() else None


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
                  probing: bool = False, view: SandboxView = SandboxView()) -> SandboxResult:
    """Run `command` inside a bwrap sandbox on a copy of `project` (its cwd); the host folder is never written.

    `on_start(kill)` receives a function that kills the whole run (safe from any thread, idempotent).
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
                              cwd="/", pass_fds=(started_w, info_w), started=started_r, info=info_r,
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

# Runs as the sandbox's command: bash reading NUL-separated (token, command) pairs from fd 3 (our pipe), each
# command eval'd in the one shell (cwd, variables, functions and background jobs persist; `declare` makes a
# local, as inside any function) with /dev/null as its input, followed by a line with the token and its exit
# status. A fresh token per command: the agent cannot end a command's output early by printing a marker it
# would have to guess. SIGUSR1 (sent at a timeout) abandons the rest of the command line with status 124.
_SHELL_LOOP = r"""exec 3<&0 0</dev/null
__omrl_run() {
  trap 'trap - USR1; return 124' USR1
  eval "$1"
  local __omrl_status=$?
  trap - USR1
  return $__omrl_status
}
while IFS= read -r -d '' __omrl_token <&3 && IFS= read -r -d '' __omrl_command <&3; do
  __omrl_run "$__omrl_command"
  printf '\n%s %d\n' "$__omrl_token" "$?"
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
            token = f"__omrl_done_{os.urandom(8).hex()}"
            marker = re.compile(rb"\n" + token.encode() + rb" (\d+)\n")
            before = set(self._inside())
            start = time.monotonic()
            output = _Tail(max_output_bytes or self.limits.max_output_bytes)
            try:
                self.process.stdin.write(token.encode() + b"\0" + command.encode("utf-8", "replace") + b"\0")
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
        tree = _tree(self.process.pid)
        shells = [pid for pid in tree  # the bash itself: the bwraps above it carry the marker in their arguments
                  if _read_bytes(f"/proc/{pid}/cmdline").startswith(b"/bin/bash\0")
                  and _SHELL_MARKER.encode() in _read_bytes(f"/proc/{pid}/cmdline")]
        if not shells:
            return None, []
        top = shells[0]  # _tree lists parents before their children
        return top, [pid for pid in _tree(top) if pid != top]

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
