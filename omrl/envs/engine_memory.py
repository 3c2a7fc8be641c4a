"""Memory caps for engine processes (omrl.envs.engine): a JVM's heap, and an engine's whole process tree.

    worker = EngineWorker(target, env=jvm_env(1024), memory_mb=1536)   # -Xmx1024m; 1536 MB for it all

- `jvm_env(heap_mb)` sets JAVA_TOOL_OPTIONS=-Xmx for the JVM a package starts (py4j's launch_gateway takes no
  java options from us). Without it a JVM may take a quarter of the host's memory and, allocating on every
  step, grows into it: ScienceWorld at 4 in flight went from 0.7 to 12.5 GB in two minutes.
- EngineMemory holds an engine's tree (the worker, the JVM, heap and all) to memory_mb: a cgroup where this
  host lets omrl make one (omrl.sandbox.limits.memory_cap(); the kernel kills inside it past the cap), else
  a thread that sums the tree every MEMORY_POLL_S and kills the engine's group past it.
- `jvm_caps` reads an environment's two options (jvm_heap_mb, memory_mb; 0: no cap), `jvm_limits` says them
  for `omrl envs`.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

from omrl.errors import UsageError
from omrl.sandbox.limits import PolledMemory, RunGroup, SandboxLimits, memory_cap

MEMORY_POLL_S = 0.5  # where no cgroup can be made: how often an engine's tree is summed against its cap
ENGINE_TASKS = 4096  # pids.max of an engine's cgroup: a JVM runs dozens of threads; this stops only a runaway
JVM_OVERHEAD_MB = 512  # an engine's memory beyond its JVM's heap: the worker, metaspace, code cache, GC, stacks


def jvm_env(heap_mb: int) -> dict[str, str]:
    """What to add to an engine's environment so the JVM its package starts gets at most `heap_mb` MB of heap
    (0: none added, the JVM's own default of a quarter of the host's memory).

    JAVA_TOOL_OPTIONS, because the packages' launchers (py4j's launch_gateway) take no java options from us
    and every JVM reads it at start; a user's own options in it stay, ours last (the last -Xmx wins)."""
    if heap_mb <= 0:
        return {}
    own = os.environ.get("JAVA_TOOL_OPTIONS", "").strip()
    return {"JAVA_TOOL_OPTIONS": f"{own} -Xmx{int(heap_mb)}m".strip()}


def jvm_caps(env: str, heap_mb: Any, memory_mb: Any) -> tuple[int, int]:
    """(heap MB, engine memory MB) from an environment's options, each a whole number >= 0 (0: no cap); a
    memory_mb of None is the heap and JVM_OVERHEAD_MB (none when the heap is uncapped too: that cap would then be
    the first limit the JVM meets, long before its own default heap)."""
    caps = []
    for key, value in (("jvm_heap_mb", heap_mb), ("memory_mb", memory_mb)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise UsageError(f"{env} {key} must be a whole number of MB, 0 for no cap, got {value!r}")
        caps.append(value)
    heap = caps[0] or 0
    if caps[1] is None:
        return heap, heap + JVM_OVERHEAD_MB if heap > 0 else 0
    return heap, caps[1]


def memory_hold() -> str:
    """How an engine's memory cap is held on this host, in words."""
    cap = memory_cap()
    if cap.kind == "polling":
        return f"a thread that sums its resident memory every {MEMORY_POLL_S:g} s (no cgroup can be made here)"
    return f"a {cap.kind} group per engine (the kernel holds it)"


def jvm_limits(heap_mb: int, memory_mb: int) -> str:
    """The limits of an engine running a JVM, for an environment's resource_limits() (`omrl envs`)."""
    heap = f"jvm_heap_mb={heap_mb} (the JVM's -Xmx)" if heap_mb > 0 else "jvm_heap_mb=0 (the JVM's own default heap)"
    if memory_mb <= 0:
        return f"{heap}; memory_mb=0 (no cap on the engine process)"
    return (f"{heap}; memory_mb={memory_mb} for each engine process with its JVM, by {memory_hold()}: an engine "
            f"past it is killed, its episode stored as env_error and the engine replaced, so a command holds at "
            f"most episodes in flight x {memory_mb} MB in engines; 0 turns either off (--env-option)")


class EngineMemory:
    """One engine's process tree held to `mb` MB: by a cgroup where this host lets omrl make one (the kernel
    kills inside it past the cap), else by a thread that sums the tree every MEMORY_POLL_S and kills it."""

    def __init__(self, mb: int, name: str) -> None:
        self.mb, self.name = mb, name
        limits = SandboxLimits(memory_mb=mb, max_processes=ENGINE_TASKS)
        cap = memory_cap()
        self.group: RunGroup | None = None
        if cap.kind != "polling":
            with contextlib.suppress(OSError):  # the probe made one, this one failed: polling still holds the cap
                self.group = RunGroup(cap, limits)
        self.meter = PolledMemory(cap, limits) if self.group is None else None
        self.killed = False  # the group's verdict, kept once it is removed
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def wrap(self, argv: list[str]) -> list[str]:
        """The engine's argv, entering the group first when there is one."""
        return self.group.wrap(argv) if self.group is not None else argv

    def watch(self, process: Any) -> None:
        """Start summing `process`'s tree against the cap (where no cgroup holds it)."""
        if self.meter is not None:
            self._thread = threading.Thread(target=self._poll, args=(process,), name=f"{self.name}-memory",
                                            daemon=True)
            self._thread.start()

    def _poll(self, process: Any) -> None:
        assert self.meter is not None
        while not self._stop.wait(MEMORY_POLL_S) and process.alive():
            if self.meter.over(process.pid):
                process.kill_engine()
                return

    def exceeded(self) -> bool:
        """Whether the cap killed the engine or something it started."""
        if self.meter is not None:
            return self.meter.exceeded
        return self.killed or (self.group is not None and self.group.oom_killed())

    def describe(self) -> str:
        """Why the engine was killed, in words."""
        held = f"it held {self.meter.peak >> 20} MB" if self.meter is not None else "the kernel killed it"
        return f"it went over its memory cap of {self.mb} MB ({held})"

    def finish(self) -> None:
        """Stop watching; remove the group (killing what is left inside). Idempotent."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        if self.group is not None:
            self.killed = self.group.finish()[1] or self.killed
            self.group = None
