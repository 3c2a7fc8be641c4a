"""Importers for trajectory data made outside omrl: one module per format, plus detection.

Each format module has NAME and `convert(record, ctx) -> trajectory dict`; `omrl.formats.importer`
reads files, converts, validates and appends to a store.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from omrl.errors import UsageError

FORMATS = ("sharegpt", "openai", "swe_agent", "openmanus", "toolbench", "atif", "adp", "steps")


def format_module(name: str) -> ModuleType:
    """The module implementing a format; errors list the known ones."""
    if name not in FORMATS:
        raise UsageError(f"unknown format {name!r}; known formats: {', '.join(FORMATS)}")
    return importlib.import_module(f"omrl.formats.{name}")
