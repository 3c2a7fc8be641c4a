"""SandboxShell: a bash that lives across commands inside one sandbox, each command with its own timeout."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from omrl.errors import UsageError
from omrl.sandbox.bwrap import INSTALL_HINT, SandboxView, _argv, _bwrap, _pack, base_env, sandbox_python
from omrl.sandbox.limits import SandboxLimits, process_tree
from omrl.sandbox.results import SandboxError, SandboxUnavailable
from omrl.sandbox.runner import require_sandbox
from omrl.sandbox.supervise import _GRACE_S, _last_line, _ready, _Run, _Tail, _total_memory

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
