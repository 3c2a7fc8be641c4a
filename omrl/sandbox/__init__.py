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

The package's public names; the work is in its modules: bwrap (the command line), supervise (a started run),
runner (run_sandboxed, availability), shell (SandboxShell), results, and limits (the limits of a run and how
its total memory is held: cgroups or polling).
"""

from omrl.sandbox.bwrap import (
    INSTALL_HINT,
    PROJECT_DIR,
    SANDBOX_UID,
    SandboxView,
    base_env,
    map_command,
    sandbox_python,
)
from omrl.sandbox.limits import SandboxLimits
from omrl.sandbox.results import SandboxError, SandboxResult, SandboxUnavailable
from omrl.sandbox.runner import require_sandbox, run_sandboxed, run_unsandboxed, sandbox_status
from omrl.sandbox.shell import SandboxShell, ShellResult

__all__ = [
    "INSTALL_HINT", "PROJECT_DIR", "SANDBOX_UID", "SandboxError", "SandboxLimits", "SandboxResult", "SandboxShell",
    "SandboxUnavailable", "SandboxView", "ShellResult", "base_env", "map_command", "require_sandbox",
    "run_sandboxed", "run_unsandboxed", "sandbox_python", "sandbox_status",
]
