"""Supervising a started run: read its output until it ends or its wall time is up, hold its total memory,
and kill the whole tree, never waiting on a pipe a descendant holds open.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from omrl.sandbox.limits import PolledMemory, RunGroup, SandboxLimits, memory_cap
from omrl.sandbox.results import SandboxError, SandboxResult

_GRACE_S = 1.0               # after the command ends: how long to wait for the rest of its output


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "no output")[:300]


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
