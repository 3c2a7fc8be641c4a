"""Where a store's files live: a local folder (the default) or an S3-compatible bucket (`s3://bucket/prefix`).

`storage_for(path)` (omrl.store.location) gives the store its root and one `Storage` with the few
operations it needs: list a folder, stat, read, write a file whole, delete, and an exclusive lock. Everything else (parts, ids, the
card, compaction) is the store's and the same for both.

Local disk keeps its protocol: a file is written to a hidden temporary beside it, fsynced and renamed in,
and the lock is an `fcntl.flock` on a lock file in the store folder.

S3 (omrl.store.s3) has neither rename nor flock: its commit protocol is explained there.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from omrl.errors import OmrlError
from omrl.store.durable import fsync_path


class StorageError(OmrlError, RuntimeError):
    """Object storage that cannot be used as asked (a lost lease, a missing bucket); the message says why."""


@dataclass(frozen=True)
class Stat:
    """The size and modification time of a file or object (what `os.stat_result` offers the store)."""

    st_size: int
    st_mtime_ns: int


class ObjectPath(PurePosixPath):
    """A file in object storage (omrl.store.s3.S3Path): the path arithmetic of PurePosixPath, and `stat()`,
    its one file method (layout code sizes parts with `part.stat()`)."""

    def stat(self) -> Stat:
        raise NotImplementedError


# A store's file: a local Path, or an object's path (omrl.store.s3.S3Path: bucket/key).
StorePath = Path | ObjectPath


def local_path(path: StorePath) -> Path:
    """A store file as the local Path it is where `Storage.local` (files on disk: glob, stat, open); a
    TypeError for an S3 path, which code working on disk must have checked `storage.local` to rule out."""
    if not isinstance(path, Path):
        raise TypeError(f"{path!r} is not a local path")
    return path


class Storage:
    """The operations a store makes on its files; paths are a local Path or an S3Path."""

    local: bool = True
    # What pyarrow readers are given with these paths (None: local paths, pyarrow opens them itself).
    filesystem: Any = None

    def arrow_path(self, path: StorePath) -> str:
        """The path string to give pyarrow together with `filesystem` (datasets of many files)."""
        raise NotImplementedError

    def arrow_source(self, path: StorePath, size: int | None = None, whole: bool = False) -> Any:
        """What a pyarrow reader (pq.read_table, read_metadata) takes for one file: a local path, or for S3
        the object's bytes (`whole`: one GET) or a lazily read file (footers; `size` saves a HEAD)."""
        raise NotImplementedError

    def exists(self, path: StorePath) -> bool:
        raise NotImplementedError

    def stat(self, path: StorePath) -> Stat:
        """Size and mtime; FileNotFoundError when it is gone."""
        raise NotImplementedError

    def list_names(self, folder: StorePath) -> list[str]:
        """The names of the files directly in `folder`, sorted ([] when it does not exist)."""
        return sorted(self.list_stats(folder))

    def part_stat(self, path: StorePath) -> Stat:
        """The stat of a part or side file (written once, never changed): S3 answers from the newest
        listing of its folder instead of a HEAD per part; local disk asks again."""
        return self.stat(path)

    def list_stats(self, folder: StorePath) -> dict[str, Stat]:
        """The files directly in `folder` with their stats, from one listing ({} when it does not exist)."""
        raise NotImplementedError

    def read_bytes(self, path: StorePath) -> bytes:
        raise NotImplementedError

    def write_bytes(self, path: StorePath, data: bytes) -> None:
        """Replace `path` with `data` whole (a reader sees the old or the new content, never a mix)."""
        raise NotImplementedError

    def write_new(self, path: StorePath, write: Callable[[BinaryIO], object]) -> None:
        """Create the file `path` whole from what `write` writes to a binary file (parts, side files)."""
        raise NotImplementedError

    def delete(self, path: StorePath) -> None:
        """Remove a file; nothing when it is already gone."""
        raise NotImplementedError

    def lock(self, root: StorePath, name: str, wait: bool = True) -> contextlib.AbstractContextManager[bool]:
        """An exclusive lock `name` shared by every process using the store at `root`; yields whether it is
        held (always True when `wait`)."""
        raise NotImplementedError


class LocalStorage(Storage):
    """A folder on local disk: temporary file, fsync, rename; flock for locks."""

    local = True
    filesystem = None

    def arrow_path(self, path: StorePath) -> str:
        return str(path)

    def arrow_source(self, path: StorePath, size: int | None = None, whole: bool = False) -> Any:
        return str(path)

    def exists(self, path: StorePath) -> bool:
        return Path(path).is_file()

    def stat(self, path: StorePath) -> Stat:
        st = Path(path).stat()
        return Stat(st.st_size, st.st_mtime_ns)

    def list_names(self, folder: StorePath) -> list[str]:
        try:  # names only: no stat per entry (d_type says what is a file)
            with os.scandir(folder) as entries:
                return sorted(e.name for e in entries if e.is_file())
        except FileNotFoundError:
            return []

    def list_stats(self, folder: StorePath) -> dict[str, Stat]:
        out = {}
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    try:
                        if entry.is_file():
                            st = entry.stat()
                            out[entry.name] = Stat(st.st_size, st.st_mtime_ns)
                    except FileNotFoundError:
                        continue  # removed since the listing (a compaction's cleanup)
        except FileNotFoundError:
            pass  # no folder: no files
        return out

    def read_bytes(self, path: StorePath) -> bytes:
        return Path(path).read_bytes()

    def write_bytes(self, path: StorePath, data: bytes) -> None:
        path = Path(path)
        # A random temporary name: two writers of one file (each under its own lock) never share one.
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_path(path.parent)

    def write_new(self, path: StorePath, write: Callable[[BinaryIO], object]) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".{path.name}.tmp"  # hidden and not *.parquet: no reader ever picks it up
        try:
            with open(tmp, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_path(path.parent)

    def delete(self, path: StorePath) -> None:
        Path(path).unlink(missing_ok=True)

    @contextlib.contextmanager
    def lock(self, root: StorePath, name: str, wait: bool = True) -> Iterator[bool]:
        with open(Path(root) / f".{name}.lock", "a+") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


LOCAL = LocalStorage()
