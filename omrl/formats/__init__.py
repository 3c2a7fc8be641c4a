"""Importers for trajectory data made outside omrl: one module per format, plus detection.

Each format module has NAME and `convert(record, ctx) -> trajectory dict` (or a list of them; it may
have `detect(record) -> bool`, used for plugin formats when no built-in format matches, and, when its
records are not the file's records (otel: one per trace, gathered from the whole file),
`read_records(path)`); `omrl.formats.importer` reads files, converts, validates and appends to a store.
Installed packages add formats through the `omrl.formats` entry-point group (name = "package.module"; see
omrl/plugins.py).
"""

from __future__ import annotations

from types import ModuleType

from omrl.plugins import Registry

FORMATS = ("sharegpt", "openai", "swe_agent", "openmanus", "toolbench", "atif", "adp", "steps", "otel")
REGISTRY = Registry("format", "omrl.formats", {name: f"omrl.formats.{name}" for name in FORMATS})


def format_names() -> list[str]:
    """Every import format: the built-ins and those of installed plugins."""
    return REGISTRY.names()


def format_module(name: str) -> ModuleType:
    """The module implementing a format; errors list the known ones."""
    module = REGISTRY.load(name)
    if not callable(getattr(module, "convert", None)):
        raise REGISTRY.error(f"format {name!r} ({REGISTRY.get(name).target}) has no convert(record, ctx)")
    return module


def plugin_formats() -> list[str]:
    """The names of formats that installed plugins add (not the built-ins)."""
    return [name for name in REGISTRY.entries() if name not in REGISTRY.builtins]
