"""Lone surrogates: text Arrow cannot store and httpx cannot send, made U+FFFD."""

from __future__ import annotations

import re
from typing import Any

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def replace_lone_surrogates(value: Any) -> tuple[Any, int]:
    """(value, how many were replaced): every lone surrogate in its strings (dict keys too) made U+FFFD.

    Such a string is not Unicode text: Arrow cannot store it and httpx cannot send it. A model server's
    reply or an environment's observation may hold one; text from a file is refused instead (omrl.store.readers)."""
    if isinstance(value, str):
        if not _LONE_SURROGATE.search(value):
            return value, 0
        fixed = value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")  # joins pairs, fixes halves
        return fixed, len(_LONE_SURROGATE.findall(value))
    if isinstance(value, dict):
        out, total = {}, 0
        for key, item in value.items():
            key, n = replace_lone_surrogates(key)
            out[key], m = replace_lone_surrogates(item)
            total += n + m
        return (out if total else value), total
    if isinstance(value, (list, tuple)):
        items = [replace_lone_surrogates(item) for item in value]
        total = sum(n for _, n in items)
        return (type(value)(item for item, _ in items) if total else value), total
    return value, 0
