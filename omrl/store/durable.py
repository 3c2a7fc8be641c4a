"""Durable writes on a local file system: what the store, its search index and exports use to survive a crash."""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# A temporary file or staging folder whose writer process is gone, or older than this, is garbage.
STALE_SECONDS = 24 * 3600


def fsync_path(path: Path) -> None:
    """fsync a file or a folder (a folder: so that renames and new names in it are durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists (a live process of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def is_stale(path: Path, pattern: re.Pattern[str]) -> bool:
    """A temporary file or folder whose writer has died (its pid is group 1 of `pattern` in the name), or
    that is very old."""
    match = pattern.search(path.name)
    try:
        age = time.time() - path.lstat().st_mtime
    except FileNotFoundError:
        return False
    if match is not None and not pid_alive(int(match.group(1))):
        return True
    return age > STALE_SECONDS


@contextmanager
def staged_folder(out: Path) -> Iterator[Path]:
    """A hidden folder beside `out`, renamed to `out` when the block ends (an earlier `out` swapped out only
    then); an error or a kill leaves no half-written `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.staging-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        yield staging
        old = None
        if out.exists():
            old = out.parent / f".{out.name}.replaced-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            os.rename(out, old)
        os.rename(staging, out)
        if old is not None:
            shutil.rmtree(old) if old.is_dir() else old.unlink()
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
