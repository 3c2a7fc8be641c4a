"""Which storage a store path names: storage_for gives its root and its Storage (local disk or S3)."""

from __future__ import annotations

import os
from pathlib import Path

from omrl.errors import UsageError
from omrl.store.s3 import S3_SCHEME, S3Path, is_s3, s3_storage
from omrl.store.storage import LOCAL, Storage


def storage_for(path: str | os.PathLike[str]) -> tuple[Path | S3Path, Storage]:
    """The root of a store at `path` and its storage: S3 for `s3://bucket/prefix`, local disk otherwise."""
    if not is_s3(path):
        return Path(path), LOCAL
    text = str(path)[len(S3_SCHEME):].strip("/")
    if not text or text.split("/", 1)[0] in ("", ".", ".."):
        raise UsageError(f"{path!r} names no bucket; a store on S3 is s3://BUCKET/PREFIX")
    if any(part in (".", "..") for part in text.split("/")):
        raise UsageError(f"{path!r}: '.' and '..' are not allowed in an S3 store path")
    return S3Path(text), s3_storage()
