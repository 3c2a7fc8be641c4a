"""What a sandboxed run may use (SandboxLimits), and how this host holds a run's total memory: a cgroup v2 or v1
group per run where one can be made (RunGroup), else a supervisor that sums the tree's memory (PolledMemory).
memory_cap() says which holds here; omrl.sandbox runs the commands.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import os
import re
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from omrl.store.durable import pid_alive


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
        group = RunGroup(probe, SandboxLimits(), name=f"omrl-{os.getpid()}-probe")
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


class RunGroup:
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

    def oom_killed(self) -> bool:
        """Whether the cap has killed something in the group so far (readable until finish())."""
        events = _read_text(os.path.join(self.folders[0], "memory.events" if self.v2 else "memory.oom_control"))
        kills = re.search(r"^oom_kill (\d+)$", events, re.MULTILINE)
        return bool(kills and int(kills.group(1)))

    def finish(self) -> tuple[float | None, bool]:
        """(peak MB, whether the cap killed something); then kills what is left inside and removes the group."""
        memory = self.folders[0]
        peak = _read_int(os.path.join(memory, "memory.peak" if self.v2 else "memory.max_usage_in_bytes"))
        killed = self.oom_killed()
        self._remove()
        return (round(peak / (1 << 20), 1) if peak is not None else None), killed

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


class PolledMemory:
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
        for pid in process_tree(root_pid):
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


def process_tree(root_pid: int) -> list[int]:
    """root_pid and its descendants now (orphans inside a sandbox are reparented to its init, still below)."""
    found, queue = [], [root_pid]
    while queue:
        pid = queue.pop()
        found.append(pid)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{pid}/task"):
                queue += [int(child) for child in _read_text(f"/proc/{pid}/task/{task}/children").split()]
    return found


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        return ""


def _read_int(path: str) -> int | None:
    text = _read_text(path).strip()
    return int(text) if text.isdigit() else None
