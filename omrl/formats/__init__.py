"""Importers and exporters for trajectory data made outside omrl: one module per format, plus detection.

FORMATS (a Registry, omrl/plugins.py) names the built-in formats. Each format module has NAME and
`convert(record, ctx) -> trajectory dict` (or a list of them; it may have `detect(record) -> bool`, used
for plugin formats when no built-in format matches, and, when its records are not the file's records
(otel: one per trace, gathered from the whole file), `read_records(path)`); `omrl.formats.importer` reads
files, converts, validates and appends to a store. Installed packages add formats through the
`omrl.formats` entry-point group (name = "package.module"; see omrl/plugins.py).

EXPORTERS (a Registry too) names the formats `omrl export` writes one JSON record per line of: each target
is `export_records(rows) -> records`, trajectory row dicts in, JSON-ready dicts out, in order (atif may
fold subagent rows into their parents). Installed packages add them through the `omrl.exporters` group
(name = "package.module:function"). The folder exports (parquet, traces) are omrl.formats.exporters' own.
"""

from __future__ import annotations

from types import ModuleType

from omrl.plugins import Registry

FORMATS = Registry("format", "omrl.formats", {
    "sharegpt": "omrl.formats.sharegpt",
    "openai": "omrl.formats.openai",
    "swe_agent": "omrl.formats.swe_agent",
    "openmanus": "omrl.formats.openmanus",
    "toolbench": "omrl.formats.toolbench",
    "atif": "omrl.formats.atif",
    "adp": "omrl.formats.adp",
    "steps": "omrl.formats.steps",
    "otel": "omrl.formats.otel",
})


EXPORTERS = Registry("export format", "omrl.exporters", {
    "omrl": "omrl.formats.exporters:omrl_records",
    "openai": "omrl.formats.exporters:openai_records",
    "sharegpt": "omrl.formats.exporters:sharegpt_records",
    "atif": "omrl.formats.atif:export_records",
    "adp": "omrl.formats.exporters:adp_records",
    "otel": "omrl.formats.otel:export_records",
    "swebench-predictions": "omrl.formats.exporters:swebench_predictions",
    "jsonl": "omrl.formats.exporters:omrl_records",  # omrl's older name
})


def format_names() -> list[str]:
    """Every import format: the built-ins and those of installed plugins."""
    return FORMATS.names()


def format_module(name: str) -> ModuleType:
    """The module implementing a format; errors list the known ones."""
    module = FORMATS.load(name)
    if not callable(getattr(module, "convert", None)):
        raise FORMATS.error(f"format {name!r} ({FORMATS.get(name).target}) has no convert(record, ctx)")
    return module


def plugin_formats() -> list[str]:
    """The names of formats that installed plugins add (not the built-ins)."""
    return FORMATS.plugin_names()
