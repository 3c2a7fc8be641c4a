"""The engine guard: runs one engine process and kills its whole process group when omrl is gone.

    python -I -S _guard.py WATCH_FD -- ARGV...

Started by omrl.envs.engine (never by hand), in a session of its own. It starts ARGV in a new process
group with its standard streams and the descriptors in OMRL_GUARD_KEEP_FDS (comma separated), then
waits for one of two things:
- the watch pipe WATCH_FD reaches end of file: omrl closed it or omrl died, however it died (SIGKILL
  included: the kernel closes a dead process's descriptors). The guard kills the engine's group.
- the engine exits: the guard kills what the engine left in its group (a JVM's or a browser's
  children) and exits with the engine's status (128 + N when signal N killed it).
The engine is reaped only after its group was killed, so the group id cannot be reused by another
process in between. The engine also gets PR_SET_PDEATHSIG(SIGKILL) towards the guard's main thread,
which lives as long as the guard: killing the guard kills the engine too.

Standard library only and run with -I -S (not from its folder on sys.path, where the omrl.envs.math package would
shadow the standard library's math): it starts in tens of milliseconds and imports nothing of omrl.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading

_PR_SET_PDEATHSIG = 1


def _own_group_dying_with_guard() -> None:
    # Runs in the engine child between fork and exec (the guard's only thread forked it): a process
    # group of its own, and SIGKILL when the guard dies.
    os.setpgid(0, 0)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the watch pipe still covers omrl's death
        pass


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: _guard.py WATCH_FD -- ARGV...\n")
        return 2
    watch_fd, command = int(argv[0]), argv[2:]
    keep = tuple(int(fd) for fd in os.environ.pop("OMRL_GUARD_KEEP_FDS", "").split(",") if fd)
    try:
        child = subprocess.Popen(command, pass_fds=keep, preexec_fn=_own_group_dying_with_guard)
    except OSError as exc:
        sys.stderr.write(f"cannot start {command[0]}: {exc}\n")
        return 127
    for fd in keep:  # the engine has them now; the guard must not keep them open
        os.close(fd)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)  # nor the engine's stdin and stdout: omrl sees EOF as soon as the engine is gone
    os.dup2(devnull, 1)

    lock = threading.Lock()
    reaped = False

    def kill_group() -> None:
        with lock:
            if not reaped:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)

    def watch() -> None:
        while True:
            try:
                if not os.read(watch_fd, 4096):
                    break
            except InterruptedError:
                continue
            except OSError:
                break
        kill_group()

    threading.Thread(target=watch, daemon=True).start()
    # Wait for the engine without reaping it: until it is reaped its group id stays taken.
    while True:
        try:
            os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
            break
        except InterruptedError:
            continue
    kill_group()
    with lock:
        reaped = True
        code = child.wait()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
