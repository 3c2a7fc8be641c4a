"""Stores in an S3-compatible bucket (`s3://bucket/prefix`): S3Path and the S3Storage backend.

S3 has neither rename nor flock, so the commit protocol is built from what objects do offer:

- An object appears whole or not at all: every file is serialised in memory and sent as one PUT (up to
  5 GB; no multipart upload, so a writer killed mid-upload leaves nothing, not even an upload to abort).
  Parts and side files are PUT with `If-None-Match: *`, so an existing object is never overwritten.
- Order is the commit: a part's side files are PUT before the part, and a compaction PUTs its merged
  part (whose footer names the parts it replaces) before it deletes them. Listings are strongly
  consistent (S3 since 2020, and moto), so a reader sees either the old parts or the merged one hiding
  them, never rows twice or lost; a part deleted under a reader raises FileNotFoundError and the store
  lists again, as on local disk.
- The lock is a lease object `PREFIX/.NAME.lock` (owner, expiry) created with a conditional PUT
  (`If-None-Match: *`, honoured by AWS S3 since 2024 and by moto 5). Its holder renews it in a
  background thread (a PUT with `If-Match` on its own ETag); a waiter that finds it expired, i.e. its
  writer was killed, deletes it with `If-Match` on the ETag it read (so it never deletes a renewed or
  newer lease) and tries again. Every write made while holding a lease first checks that the lease is
  still held and unexpired, so a writer that stalled past its lease stops instead of committing next to
  a new holder. The expiry is in the writer's clock: clocks must agree to well within LEASE_SECONDS.
- No temporary objects, so nothing needs the local store's stale-temporary cleanup; side files whose
  part never arrived (a writer killed between them) are removed by the next writer under the lock.
- Queries stay confined: DuckDB is handed pyarrow datasets on pyarrow's S3 client (S3Storage), so it
  still opens no path itself, and its own S3 access (httpfs) stays off like every other extension.

What an S3 store does not do (each refused with a message saying so): derived stores (filter, augment,
export write local folders: `Store.staged`), and text search (tantivy indexes need a local folder, so
none are built for S3 parts and `Store.search` refuses; SQL over the messages view still finds text).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import PurePosixPath
from typing import Any, BinaryIO

from omrl.errors import UsageError
from omrl.store.storage import ObjectPath, Stat, Storage, StorageError, StorePath

S3_SCHEME = "s3://"
LEASE_SECONDS = 30.0  # a killed writer's lock is taken over this long after its last renewal
MAX_PUT_BYTES = 5 * 2**30  # S3's limit for one PUT
_LOCK_POLL_S = (0.02, 0.5)  # first and longest wait between tries for a held lock


def is_s3(path: str | os.PathLike[str]) -> bool:
    """Whether a store path names S3 storage (`s3://bucket/prefix`, or an S3Path)."""
    return isinstance(path, S3Path) or (isinstance(path, str) and path.startswith(S3_SCHEME))


class S3Path(ObjectPath):
    """`bucket/key...` of an object, with the path arithmetic of PurePosixPath; str() is the s3:// URL.

    os.fspath refuses it, so `open(path)` and pyarrow's readers cannot take it for a local file; but
    `Path(s3_path)` copies its parts without asking (pathlib does that for every PurePath), so code that
    converts with Path() must check `store.storage.local` first. `stat()` is its one file method, because
    layout code sizes parts with `part.stat()`; `resolve()` returns it unchanged (already absolute).
    """

    def __str__(self) -> str:
        return S3_SCHEME + super().__str__()

    def __fspath__(self) -> str:
        raise TypeError(f"{self} is an object in S3 storage, not a local file")

    @property
    def key(self) -> str:
        """`bucket/key`, the form the S3 filesystem takes."""
        return PurePosixPath.__str__(self)

    def stat(self) -> Stat:
        return s3_storage().part_stat(self)

    def resolve(self) -> S3Path:
        return self


def _s3_error_code(exc: BaseException) -> str | None:
    """The S3 error code behind an exception s3fs translated (its cause is botocore's ClientError)."""
    for err in (exc, exc.__cause__):
        response = getattr(err, "response", None)
        if isinstance(response, dict):
            return response.get("Error", {}).get("Code")
    return None


def _conflict(exc: BaseException) -> bool:
    """A conditional request that did not hold: 412, or 409 for racing conditional writes on AWS."""
    return _s3_error_code(exc) in ("PreconditionFailed", "ConditionalRequestConflict")


class _Lease:
    """A held lease object: renewed in the background until released; `check` raises once it is lost."""

    def __init__(self, storage: S3Storage, key: str, etag: str, owner: str, expires: float):
        self.storage, self.key, self.etag, self.owner, self.expires = storage, key, etag, owner, expires
        self.lost: str | None = None
        self._stop = threading.Event()
        self._guard = threading.Lock()  # the renewer and `check` read etag/expires together
        self._thread = threading.Thread(target=self._renew_loop, name=f"omrl-lease {key}", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(LEASE_SECONDS / 3):
            expires = time.time() + LEASE_SECONDS
            try:
                etag = self.storage._put(self.key, _lease_body(self.owner, expires), IfMatch=self.etag)
            except OSError as exc:
                if _conflict(exc):  # the lease object changed: another writer took it over
                    with self._guard:
                        self.lost = f"another writer holds it now ({type(exc).__name__}: {exc})"
                    return
                continue  # a failed request: try again; `check` fails once the lease runs out unrenewed
            with self._guard:
                self.etag, self.expires = etag, expires

    def check(self) -> None:
        with self._guard:
            problem = self.lost or ("it expired (this process stalled)" if time.time() > self.expires else None)
        if problem:
            raise StorageError(f"lost the store lock {S3_SCHEME}{self.key}: {problem}; nothing more written, "
                               "retry the operation")

    def release(self) -> None:
        self._stop.set()
        self._thread.join()
        if self.lost is None:
            with contextlib.suppress(OSError):  # expired and taken over meanwhile: the lease is not ours to delete
                self.storage._delete(self.key, IfMatch=self.etag)


def _lease_body(owner: str, expires: float) -> bytes:
    return json.dumps({"owner": owner, "expires": expires}).encode()


class S3Storage(Storage):
    """An S3-compatible bucket (endpoint and credentials from the usual AWS_* variables).

    Two clients, each for what only it does well: s3fs (`s3`) for the store's own requests, conditional
    PUTs and deletes included (pyarrow cannot send If-None-Match); pyarrow's C++ S3 client (`filesystem`)
    for the datasets DuckDB scans. A Python filesystem under a DuckDB scan deadlocked now and then (a
    DuckDB worker waiting on a pyarrow read that waited for the GIL); the C++ client needs no GIL.
    """

    local = False

    def __init__(self) -> None:
        try:
            import s3fs
        except ImportError:
            raise UsageError("stores on S3 need s3fs: pip install 'omrl[s3]'") from None
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        # No listings cache: a cached listing would hide another writer's new part from the id check.
        self.s3 = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False, endpoint_url=endpoint or None)
        from pyarrow import fs as arrow_fs

        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        self.filesystem = arrow_fs.S3FileSystem(endpoint_override=endpoint or None, region=region)
        self._leases: dict[int, _Lease] = {}  # the leases this process holds (each write checks them)
        self._leases_guard = threading.Lock()  # also guards _parts_listed
        self._parts_listed: dict[str, dict[str, Stat]] = {}  # folder key -> its parts in the newest listing

    def arrow_path(self, path: StorePath) -> str:
        return _key(path)

    def arrow_source(self, path: StorePath, size: int | None = None, whole: bool = False) -> Any:
        import pyarrow as pa

        if whole:  # a whole part: one GET beats the many small ranged reads a pyarrow file would make
            return pa.BufferReader(self.read_bytes(path))
        return self.s3.open(_key(path), "rb", size=size)

    def _check_leases(self) -> None:
        with self._leases_guard:
            leases = list(self._leases.values())
        for lease in leases:
            lease.check()

    def _put(self, key: str, data: bytes, **condition: str) -> str:
        """One PUT of `data`; returns the new ETag. Conditions: IfNoneMatch="*", IfMatch=ETAG."""
        if len(data) > MAX_PUT_BYTES:
            raise StorageError(f"{S3_SCHEME}{key}: {len(data)} bytes is more than one S3 PUT takes "
                               f"({MAX_PUT_BYTES}); append fewer rows at a time")
        bucket, _, name = key.partition("/")
        reply = self.s3.call_s3("put_object", Bucket=bucket, Key=name, Body=data, **condition)
        return reply["ETag"]

    def _delete(self, key: str, **condition: str) -> None:
        bucket, _, name = key.partition("/")
        self.s3.call_s3("delete_object", Bucket=bucket, Key=name, **condition)

    def _head(self, key: str) -> dict[str, Any]:
        """One HEAD request (s3fs's `info` adds a listing for a missing key, to find folders)."""
        bucket, _, name = key.partition("/")
        return self.s3.call_s3("head_object", Bucket=bucket, Key=name)

    def exists(self, path: StorePath) -> bool:
        try:
            self._head(_key(path))
        except FileNotFoundError:
            return False
        return True

    def stat(self, path: StorePath) -> Stat:
        reply = self._head(_key(path))
        return Stat(int(reply["ContentLength"]), _mtime_ns(reply.get("LastModified")))

    def list_stats(self, folder: StorePath) -> dict[str, Stat]:
        try:
            entries = self.s3.ls(_key(folder), detail=True)
        except FileNotFoundError:
            entries = []
        stats = {e["name"].rsplit("/", 1)[-1]: Stat(int(e["size"]), _mtime_ns(e.get("LastModified")))
                 for e in entries if e["type"] == "file"}
        with self._leases_guard:
            self._parts_listed[_key(folder)] = {n: st for n, st in stats.items() if n.startswith("part-")}
        return stats

    def part_stat(self, path: StorePath) -> Stat:
        # From the newest listing, else a HEAD: the store sizes every part after each listing, and layout
        # code every small part after each append (CompactPolicy), a round trip each otherwise.
        with self._leases_guard:
            listed = self._parts_listed.get(_key(path.parent), {}).get(path.name)
        return listed if listed is not None else self.stat(path)

    def read_bytes(self, path: StorePath) -> bytes:
        return self.s3.cat_file(_key(path), max_concurrency=1)  # one GET, no HEAD first

    def write_bytes(self, path: StorePath, data: bytes) -> None:
        self._check_leases()
        self._put(_key(path), data)

    def write_new(self, path: StorePath, write: Callable[[BinaryIO], object]) -> None:
        buffer = io.BytesIO()
        write(buffer)  # serialised whole before anything is sent: one PUT, the object appears complete
        self._check_leases()
        try:
            self._put(_key(path), buffer.getvalue(), IfNoneMatch="*")
        except FileExistsError:
            raise FileExistsError(f"{path} exists already (objects omrl writes are never overwritten)") from None

    def delete(self, path: StorePath) -> None:
        self._check_leases()
        self.s3.rm_file(_key(path))  # S3 answers a delete of a missing key with success
        with self._leases_guard:
            self._parts_listed.get(_key(path.parent), {}).pop(path.name, None)

    @contextlib.contextmanager
    def lock(self, root: StorePath, name: str, wait: bool = True) -> Iterator[bool]:
        # Threads of one process wait for each other like processes do (as with flock on separate opens).
        lease = self._acquire(f"{_key(root)}/.{name}.lock", wait)
        if lease is None:
            yield False
            return
        with self._leases_guard:
            self._leases[id(lease)] = lease
        try:
            yield True
        finally:
            with self._leases_guard:
                self._leases.pop(id(lease), None)
            lease.release()

    def _acquire(self, key: str, wait: bool) -> _Lease | None:
        owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        delay = _LOCK_POLL_S[0]
        while True:
            expires = time.time() + LEASE_SECONDS
            try:
                etag = self._put(key, _lease_body(owner, expires), IfNoneMatch="*")
                return _Lease(self, key, etag, owner, expires)
            except FileExistsError:
                pass  # held: see whether its holder is gone
            except OSError as exc:
                if not _conflict(exc):
                    raise
            self._break_if_expired(key)
            if not wait:
                return None
            time.sleep(delay)
            delay = min(_LOCK_POLL_S[1], delay * 2)

    def _break_if_expired(self, key: str) -> None:
        """Delete the lease at `key` when it has expired (its writer was killed), only if it is unchanged."""
        # The ETag first, then the body: a body newer than the ETag makes the conditional delete fail (safe).
        try:
            etag = self.s3.info(key)["ETag"]
            data = self.s3.cat_file(key)
        except FileNotFoundError:
            return  # released meanwhile: the next try takes it
        try:
            expires = float(json.loads(data)["expires"])
        except (ValueError, KeyError, TypeError):
            expires = 0.0  # not a lease omrl wrote (or cut short): treat it as expired
        if time.time() <= expires:
            return
        with contextlib.suppress(OSError):  # renewed or replaced since the read: not expired after all
            self._delete(key, IfMatch=etag)


def _mtime_ns(modified: Any) -> int:
    return int(modified.timestamp() * 1e9) if modified is not None else 0


def _key(path: StorePath) -> str:
    if not isinstance(path, S3Path):
        raise TypeError(f"{path!r} is not an S3 path")
    return path.key


_S3: dict[tuple[str | None, ...], S3Storage] = {}
_S3_GUARD = threading.Lock()


def s3_storage() -> S3Storage:
    """The process's S3 storage for the current AWS_* settings (one client, and one lease table, per setting)."""
    settings = tuple(os.environ.get(name) for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID",
                                                        "AWS_PROFILE", "AWS_DEFAULT_REGION", "AWS_REGION"))
    with _S3_GUARD:
        if settings not in _S3:
            _S3[settings] = S3Storage()
        return _S3[settings]
