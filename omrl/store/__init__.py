"""The trajectory store: a folder (or S3 prefix) of Parquet parts that is also a Hugging Face dataset.

Modules: store (the Store: append, read, commit, compact), manifest (omrl.json and its listing of parts),
layout (how parts and their side files are written), storage (local disk and S3 backends), check (check
and repair), query (the one confined DuckDB connection and the SQL over a store), search (the text index).
"""

from omrl.store.manifest import MANIFEST, TABLES, StoreError
from omrl.store.store import (
    REPLACES_KEY,
    Appended,
    AutoCompactWarning,
    CorruptPartWarning,
    SearchIndexWarning,
    Store,
    open_store,
)

__all__ = [
    "MANIFEST",
    "REPLACES_KEY",
    "TABLES",
    "Appended",
    "AutoCompactWarning",
    "CorruptPartWarning",
    "SearchIndexWarning",
    "Store",
    "StoreError",
    "open_store",
]
