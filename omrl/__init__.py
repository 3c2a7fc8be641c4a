"""omrl: a data-centric toolkit for training LLM agents with reinforcement learning."""

from omrl.errors import OmrlError
from omrl.schema import SCHEMA_VERSION, Annotation, Message, SchemaError, ToolCall, Trajectory, Turn
from omrl.store import Store, StoreError

__version__ = "0.1.0"

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
