"""How a sandboxed run ends: its SandboxResult, or the errors saying the sandbox could not run it."""

from __future__ import annotations

from dataclasses import dataclass

from omrl.errors import OmrlError


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
