"""The trajectory store: a folder (or S3 prefix) of Parquet parts that is also a Hugging Face dataset.

Modules, lowest first: storage (local disk and S3), manifest (omrl.json and its listing of parts), layout
(how parts and their side files are written), card (the dataset card), parts (reading: the listing against
the folders, the live parts), commit (writing under the lock), store (the Store: create, append, compact),
check (check and repair), query (the one confined DuckDB connection), search (the text index).
"""

from omrl.store.manifest import MANIFEST, TABLES, StoreError
from omrl.store.parts import REPLACES_KEY, CorruptPartWarning
from omrl.store.search import (
    SearchIndexWarning,  # importing search attaches its index to every store's commits
)
from omrl.store.store import Appended, AutoCompactWarning, Store, open_store

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
