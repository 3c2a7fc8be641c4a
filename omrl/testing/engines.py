"""A stand-in engine for tests of omrl.envs.engine: answers, raises, dies, hangs, holds memory, starts a child process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any


class EchoEngine:
    """Runs in an EngineWorker; `with_child` starts a long-lived child process, as a JVM launcher would."""

    def __init__(self, with_child: bool = False) -> None:
        self.child = None
        if with_child:
            self.child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])

    def echo(self, value: Any) -> Any:
        return value

    def fail(self, message: str) -> None:
        raise ValueError(message)

    def exit(self, code: int, message: str = "") -> None:
        if message:
            sys.stderr.write(message + "\n")
            sys.stderr.flush()
        os._exit(code)

    def hang(self, seconds: float) -> None:
        time.sleep(seconds)

    def hog(self, mb: int, seconds: float, in_child: bool = False) -> None:
        """Hold `mb` MB (written, so resident) for `seconds`, here or in a child process (as a JVM would)."""
        if in_child:
            holder = f"import time; held = b'x' * ({int(mb)} << 20); time.sleep({float(seconds)})"
            code = subprocess.run([sys.executable, "-c", holder]).returncode
            if code != 0:
                raise RuntimeError(f"the child holding {mb} MB ended with code {code}")
            return
        held = b"x" * (int(mb) << 20)
        time.sleep(seconds)
        del held

    def pids(self) -> list[int]:
        """This process's pid, then its child's (when it has one)."""
        return [os.getpid()] + ([self.child.pid] if self.child is not None else [])

    def unpicklable(self) -> Any:
        return lambda: None
