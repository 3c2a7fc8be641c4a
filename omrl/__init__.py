"""omrl: a data-centric toolkit for training LLM agents with reinforcement learning."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from omrl.errors import OmrlError

if TYPE_CHECKING:
    from omrl.schema import SCHEMA_VERSION, Annotation, Message, SchemaError, ToolCall, Trajectory, Turn
    from omrl.store import Store, StoreError

__version__ = "0.1.0"

# The store and schema names load on first use (PEP 562): importing any omrl module (an engine process
# hosting a game, the CLI) then does not pay for pyarrow and DuckDB unless it uses them.
_LAZY = {"SCHEMA_VERSION": "omrl.schema", "Annotation": "omrl.schema", "Message": "omrl.schema",
         "SchemaError": "omrl.schema", "ToolCall": "omrl.schema", "Trajectory": "omrl.schema", "Turn": "omrl.schema",
         "Store": "omrl.store", "StoreError": "omrl.store"}

__all__ = [
    "SCHEMA_VERSION",
    "Annotation",
    "Message",
    "OmrlError",
    "SchemaError",
    "Store",
    "StoreError",
    "ToolCall",
    "Trajectory",
    "Turn",
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
