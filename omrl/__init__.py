"""omrl: a data-centric toolkit for training LLM agents with reinforcement learning."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from omrl.errors import OmrlError

if TYPE_CHECKING:
    from omrl.schema import SCHEMA_VERSION, SchemaError
    from omrl.store import Store, StoreError

__version__ = "0.1.0"

# The store and schema names load on first use (PEP 562): importing any omrl module (an engine process
# hosting a game, the CLI) then does not pay for pyarrow and DuckDB unless it uses them. The record
# dataclasses (omrl.schema.Trajectory, ...) are not exported: omrl reads and writes rows as dicts, validated
# by omrl.schema's normalisers, which take their defaults from those dataclasses.
_LAZY = {"SCHEMA_VERSION": "omrl.schema", "SchemaError": "omrl.schema", "Store": "omrl.store", "StoreError": "omrl.store"}

__all__ = [
    "SCHEMA_VERSION",
    "OmrlError",
    "SchemaError",
    "Store",
    "StoreError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'omrl' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
