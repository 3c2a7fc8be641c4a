"""Engine processes that omrl starts and owns: slow engines (JVMs, game interpreters, browsers).

    engine = EngineWorker("omrl.envs.twx.env:TwxEngine", {"step_limit": 50}, name="twx")
    first = engine.call("reset", payload)     # runs in the engine's own process; returns what it returned
    engine.ensure()                           # a new process if the old one died (between episodes)
    engine.close()

    driver = GuardedProcess(["chromedriver", "--port=9515"])   # a raw engine, spoken to over a port
    driver.close()

What omrl guarantees for every engine started here:
- It never outlives the omrl command, however the command ends: close(), an exception, Ctrl-C, or
  SIGKILL. Each engine runs under a guard (omrl/envs/_guard.py), a small process in a session of its
  own that holds the reading end of a pipe only this process can write to. When this process closes
  the pipe or dies, the guard kills the engine's whole process group, so whatever the engine started
  dies with it (the JVM a package launches through py4j, a browser's children). A forked child of
  this process does not inherit the pipe (os.register_at_fork closes it there).
  Why not PR_SET_PDEATHSIG from here: it fires when the *thread* that started the process exits, and
  environments are made in worker threads that come and go. Why not a process group of our own
  alone: nothing kills a group when its parent is SIGKILLed. The guard does set PR_SET_PDEATHSIG on the
  engine towards its own single thread, so killing the guard kills the engine too.
- A crash is an error, never a hang: a call to a dead engine raises EngineCrashed (with its exit
  status and the tail of its stderr); a call that gets no answer within its timeout kills the engine
  and raises EngineCrashed. The environment lets that reach the agent loop (the episode is stored as
  env_error), and the episode runner closes that instance instead of reusing it.
- Packages that launch their own engine (textworld_express and scienceworld start a JVM with py4j's
  `launch_gateway`) run inside an EngineWorker: their engine is a child of the worker, in the group the
  guard kills.
- Memory is bounded per engine (omrl/envs/engine_memory.py): `jvm_env(heap_mb)` caps a JVM's heap, and
  `EngineWorker(memory_mb=N)` caps the worker with all it started (the JVM, heap and all), held by a cgroup
  where this host allows one, else by polling. An engine past its cap is killed, the call in flight raises
  EngineCrashed saying so (its episode is stored as env_error) and `ensure()` starts a new engine; a command
  then holds at most engines x memory_mb in engines.

EngineWorker runs `python -m omrl.envs.engine FD`: a loop that builds one object from "module:callable"
and calls its methods for the parent over a socket pair (pickled messages; the worker is our own child
running our own code). What the engine prints goes to its stderr, kept (the last 8 KB) for error messages.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from omrl.envs.engine_memory import EngineMemory
from omrl.errors import OmrlError
from omrl.plugins import load_target

GUARD = str(Path(__file__).with_name("_guard.py"))
_TAIL_BYTES = 8192
_OPEN_WATCH_FDS: set[int] = set()  # write ends of live guards' watch pipes, closed in forked children


class EngineCrashed(OmrlError, RuntimeError):
    """The engine process died, or gave no answer in time (and was killed)."""


class EngineTimeout(EngineCrashed):
    """The engine gave no answer within the call's timeout and was killed (a runaway call, for instance)."""


class EngineError(OmrlError, RuntimeError):
    """The engine answered with an exception (it is still running)."""


def _close_watch_fds_after_fork() -> None:
    for fd in list(_OPEN_WATCH_FDS):
        with contextlib.suppress(OSError):
            os.close(fd)
    _OPEN_WATCH_FDS.clear()


os.register_at_fork(after_in_child=_close_watch_fds_after_fork)


class _Tail:
    """The last bytes of a stream, read by a thread."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.lock = threading.Lock()

    def read(self, stream: Any) -> None:
        for chunk in iter(lambda: stream.read1(4096), b""):
            with self.lock:
                self.data += chunk
                del self.data[:-_TAIL_BYTES]

    def last_lines(self, lines: int) -> str:
        with self.lock:
            text = self.data.decode("utf-8", "replace")
        return "\n".join(text.strip().splitlines()[-lines:])


class GuardedProcess:
    """One engine process under a guard: killed with its whole process group by close() or when omrl dies.

    `keep_fds` are passed on to the engine; stdin and stdout default to /dev/null; stderr (and stdout when
    it is subprocess.PIPE) is read by a thread that keeps its last 8 KB (`stderr_tail()`, `stdout_tail()`).
    """

    def __init__(self, argv: list[str], *, keep_fds: tuple[int, ...] = (), env: dict[str, str] | None = None,
                 cwd: str | os.PathLike[str] | None = None, stdin: Any = subprocess.DEVNULL,
                 stdout: Any = subprocess.DEVNULL, name: str | None = None) -> None:
        self.argv = list(argv)
        self.name = name or Path(argv[0]).name
        read_end, self._watch = os.pipe()  # both close-on-exec: only the guard gets the read end
        _OPEN_WATCH_FDS.add(self._watch)
        environment = dict(os.environ if env is None else env)
        environment["OMRL_GUARD_KEEP_FDS"] = ",".join(str(fd) for fd in keep_fds)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-S", GUARD, str(read_end), "--", *self.argv], pass_fds=(read_end, *keep_fds),
                start_new_session=True, stdin=stdin, stdout=stdout, stderr=subprocess.PIPE, env=environment,
                cwd=cwd)
        except BaseException:
            self._close_watch()
            raise
        finally:
            os.close(read_end)
        # The readers hold the streams and the tails, not self: a forgotten GuardedProcess is collected
        # (and its engine killed by __del__) even while its readers still run.
        self._tail, self._out_tail = _Tail(), _Tail()
        streams = [(self._tail, self.process.stderr, "stderr"), (self._out_tail, self.process.stdout, "stdout")]
        self._readers = [threading.Thread(target=tail.read, args=(stream,), name=f"{self.name}-{what}", daemon=True)
                         for tail, stream, what in streams if stream is not None]
        for reader in self._readers:
            reader.start()

    def stderr_tail(self, lines: int = 8) -> str:
        """The last lines the engine wrote to stderr."""
        return self._tail.last_lines(lines)

    def stdout_tail(self, lines: int = 8) -> str:
        """The last lines the engine wrote to stdout (empty unless it was started with stdout=subprocess.PIPE)."""
        return self._out_tail.last_lines(lines)

    @property
    def pid(self) -> int:
        """The guard's pid (the engine is its child; `engine_pids()` lists the engine's group)."""
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def exit_status(self) -> str:
        """How the engine ended, in words ("exited with code 1", "was killed by signal 9")."""
        code = self.process.poll()
        if code is None:
            return "is running"
        if code > 128:
            try:
                return f"was killed by signal {code - 128} ({signal.Signals(code - 128).name})"
            except ValueError:
                return f"was killed by signal {code - 128}"
        if code < 0:  # the guard itself was killed (the engine died with it)
            return f"was killed with its guard (signal {-code})"
        return f"exited with code {code}"

    def _leader(self) -> int | None:
        """The engine's pid (its group's id), the guard's only child; None when it is gone."""
        try:
            children = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    def kill_engine(self) -> None:
        """SIGKILL the engine's process group now, from any thread; the guard then exits with its status.

        The guard reaps the engine only after killing its group, so the group id cannot be another's yet."""
        leader = self._leader()
        if leader is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(leader, signal.SIGKILL)

    def engine_pids(self) -> list[int]:
        """The processes of the engine's group (the engine first), from /proc; empty when it is gone."""
        leader = self._leader()
        if leader is None:
            return []
        found = [leader]
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != leader:
                try:
                    fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                except (OSError, IndexError):
                    continue
                if int(fields[2]) == leader:  # field 5 of stat: the process group id
                    found.append(int(entry.name))
        return found

    def _close_watch(self) -> None:
        if self._watch is not None:
            _OPEN_WATCH_FDS.discard(self._watch)
            os.close(self._watch)
            self._watch = None

    def close(self, timeout: float = 10.0) -> None:
        """Kill the engine's group (by closing the watch pipe) and wait for the guard; idempotent."""
        self._close_watch()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:  # a stuck guard: killing it kills the engine (PDEATHSIG)
            self.process.kill()
            self.process.wait()
        for reader in self._readers:
            reader.join(timeout=1.0)
        for stream in (self.process.stderr, self.process.stdout):
            if stream is not None:
                stream.close()

    def __del__(self) -> None:  # a forgotten engine still goes when its owner is collected
        if getattr(self, "_watch", None) is not None:
            self._close_watch()


def _worker_env(extra: dict[str, str]) -> dict[str, str]:
    """This process's environment and `extra`, with the folder holding the omrl package first on PYTHONPATH."""
    env = {**os.environ, **extra}
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


class EngineWorker:
    """One engine object (`target` "module:callable" called with `kwargs`) living in a guarded process
    (with `env` added to its environment).

    `call(method, ...)` runs one of its methods there and returns the result; the engine's exceptions
    come back as EngineError, its death or silence as EngineCrashed. One call at a time (a lock).
    `memory_mb` (0: none) caps the memory of the engine process with everything it started; an engine past
    it is killed and the call in flight raises EngineCrashed saying so.
    """

    def __init__(self, target: str, kwargs: dict[str, Any] | None = None, *, name: str | None = None,
                 env: dict[str, str] | None = None, start_timeout: float = 180.0, call_timeout: float = 120.0,
                 memory_mb: int = 0) -> None:
        self.target, self.kwargs, self.env = target, dict(kwargs or {}), dict(env or {})
        self.name = name or target
        self.start_timeout, self.call_timeout = start_timeout, call_timeout
        self.memory_mb = int(memory_mb)
        self.restarts = 0
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self.process: GuardedProcess | None = None
        self.memory: EngineMemory | None = None
        self._start()

    def _start(self) -> None:
        self.memory = EngineMemory(self.memory_mb, self.name) if self.memory_mb > 0 else None
        ours, theirs = socket.socketpair()
        argv = [sys.executable, "-m", "omrl.envs.engine", str(theirs.fileno())]
        try:
            self.process = GuardedProcess(self.memory.wrap(argv) if self.memory else argv, keep_fds=(theirs.fileno(),),
                                          env=_worker_env(self.env), name=self.name)
        except BaseException:
            ours.close()
            self.close()
            raise
        finally:
            theirs.close()
        self._conn = Connection(ours.detach())
        if self.memory is not None:
            self.memory.watch(self.process)
        started = time.monotonic()
        try:
            self._request(("start", self.target, self.kwargs), self.start_timeout, "start")
        except BaseException:
            self.close()
            raise
        self.start_s = time.monotonic() - started

    def over_memory(self) -> bool:
        """Whether this engine's memory cap killed it or something it started (its JVM, for instance)."""
        return self.memory is not None and self.memory.exceeded()

    def alive(self) -> bool:
        """The engine process runs, whole: nothing of it was killed for its memory cap."""
        return (self._conn is not None and self.process is not None and self.process.alive()
                and not self.over_memory())

    def ensure(self) -> bool:
        """Start a new engine process when the current one is gone; True when it did."""
        if self.alive():
            return False
        self.close()
        self._start()
        self.restarts += 1
        return True

    def call(self, method: str, *args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        """`engine.method(*args, **kwargs)` in the engine process."""
        with self._lock:
            return self._request(("call", method, args, kwargs), timeout or self.call_timeout, method)

    def _request(self, message: tuple[Any, ...], timeout: float, what: str) -> Any:
        conn = self._conn
        if conn is None or self.process is None:
            raise EngineCrashed(f"the {self.name} engine is closed")
        try:
            conn.send(message)
            if not conn.poll(timeout):
                self.process.close()
                raise EngineTimeout(f"the {self.name} engine gave no answer to {what} within {timeout:g} s "
                                    "and was killed")
            reply = conn.recv()
        except (EOFError, OSError):
            raise EngineCrashed(self._died(what)) from None
        if reply[0] == "ok":
            return reply[1]
        if self.over_memory():  # the cap killed what the engine started (its JVM), and the engine said so
            assert self.memory is not None
            self.process.close()
            raise EngineCrashed(f"the {self.name} engine's {what} failed and it was killed: "
                                f"{self.memory.describe()}; it said {reply[1]}: {reply[2][:500]}")
        raise EngineError(f"the {self.name} engine's {what} raised {reply[1]}: {reply[2]}")

    def _died(self, what: str) -> str:
        assert self.process is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.process.wait(2.0)
        tail = self.process.stderr_tail()
        memory = f": {self.memory.describe()}" if self.memory is not None and self.over_memory() else ""
        return (f"the {self.name} engine {self.process.exit_status()} during {what}{memory}"
                + (f"; its last output: {tail}" if tail else ""))

    def engine_pids(self) -> list[int]:
        """The engine's processes (the worker first, then what it started, a JVM for instance)."""
        return self.process.engine_pids() if self.process is not None else []

    def close(self) -> None:
        """Kill the engine process and everything it started; idempotent, safe during a call."""
        if self.process is not None:
            self.process.close()  # first: a call blocked in another thread then ends with EOF
        if self.memory is not None:
            self.memory.finish()
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


# ---------------------------------------------------------------- the worker side


def serve(fd: int) -> None:
    """The worker loop: build the engine object on "start", run its methods on "call", until EOF."""
    os.dup2(2, 1)  # what the engine prints lands in stderr (kept for error messages), never anywhere else
    conn = Connection(fd)
    engine: Any = None
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            break
        try:
            if message[0] == "start":
                engine = load_target(message[1])(**message[2])
                result = None
            else:
                _, method, args, kwargs = message
                result = getattr(engine, method)(*args, **kwargs)
            reply: tuple[Any, ...] = ("ok", result)
        except Exception as exc:  # the engine's own error: the caller raises it as EngineError
            reply = ("error", type(exc).__name__, str(exc)[:4000])
        try:
            conn.send(reply)
        except Exception as exc:  # an unpicklable result: say so instead of dying
            conn.send(("error", type(exc).__name__, f"the result of {message[1]} cannot be sent back: {exc}"))
    close = getattr(engine, "close", None)
    if callable(close):
        close()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
