"""Named components from omrl and from installed packages: one Registry per kind.

Five kinds are pluggable, each with its built-ins and an entry-point group an installed package adds
to in its pyproject.toml:

    [project.entry-points."omrl.envs"]        tiny = "omrl_tiny.env:TinyEnv"           # an environment class
    [project.entry-points."omrl.formats"]     tinylog = "omrl_tiny.format"             # a module with convert()
    [project.entry-points."omrl.exporters"]   tinylog = "omrl_tiny.format:export_records"  # rows -> JSON records
    [project.entry-points."omrl.metrics"]     shouty = "omrl_tiny.metrics:shouty"      # a metric function
    [project.entry-points."omrl.policies"]    echo = "omrl_tiny.policy:EchoPolicy.from_spec"  # factory(arg, **options)

A target is "module" or "module:attribute" (the attribute may be dotted). Targets are imported only when
used, so listing stays cheap. A plugin never replaces a built-in of the same name, and of two plugins
registering one name the first found wins; `omrl plugins` shows which package provides each name.

A broken plugin never takes the others down: a package whose entry points cannot be read, or a plugin whose
import or `detect()` raises anything while omrl looks through all of them (`omrl envs`, format detection), is
named in one warning line (PluginWarning: the plugin, its package and entry point, the error's first line)
and skipped. Asking for a broken plugin by name is one error line (Registry.load, Registry.create).

Every named kind in omrl is a Registry, built-ins declared as plugins declare theirs (name -> target):
environments (omrl.envs.ENVIRONMENTS), import formats (omrl.formats.FORMATS), export formats
(omrl.formats.EXPORTERS), metrics (omrl.annotate.metrics.METRICS), policies (omrl.policies.POLICIES), judge modes
(omrl.annotate.judge.JUDGE_MODES), trainers (omrl.train.trainer.TRAINERS) and the CLI's verbs
(omrl.cli.main.COMMANDS). The last three have no entry-point group: only omrl provides them.
"""

from __future__ import annotations

import importlib
import re
import warnings
from dataclasses import dataclass
from functools import cache
from typing import Any

from omrl.errors import OmrlError, UsageError

BUILTIN_PROVIDER = "omrl"


@dataclass(frozen=True)
class Entry:
    """One named component: where it lives and which package provides it."""

    name: str
    target: str  # "module" or "module:attribute"
    provider: str  # "omrl" for built-ins, else the distribution that registered it
    summary: str = ""  # one line known without importing the target (the CLI's verbs); "" for plugins


class PluginWarning(UserWarning):
    """An installed plugin that cannot be read, loaded or asked: it is skipped, the others stay usable."""


def error_line(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def warn_skipped(what: str, exc: BaseException) -> None:
    """Say in one line that a broken plugin (`what` names it and its entry point) is skipped, and why."""
    # stacklevel=1: one place, so the "default" filter shows each message once however often it is met
    warnings.warn(f"skipping {what}: {error_line(exc)}", PluginWarning, stacklevel=1)


class Registry:
    """The built-ins of one kind plus what installed packages register under its entry-point group.

    `builtins` maps a name to its target, or to (target, one-line summary); a group of None: no plugins.
    """

    def __init__(self, kind: str, group: str | None, builtins: dict[str, str | tuple[str, str]],
                 error: type[Exception] = UsageError):
        self.kind = kind  # "environment", "format", ... for messages
        self.group = group
        self.builtins = {name: _builtin(name, value) for name, value in builtins.items()}  # in declared order
        self.error = error

    def entries(self) -> dict[str, Entry]:
        """Every name: the built-ins first, then installed plugins (which cannot replace a built-in)."""
        found = dict(self.builtins)
        for entry in entry_points(self.group) if self.group else ():
            found.setdefault(entry.name, entry)
        return found

    def names(self) -> list[str]:
        return sorted(self.entries())

    def plugin_names(self) -> list[str]:
        """The names installed packages add (not the built-ins), in the order they were found."""
        return [name for name in self.entries() if name not in self.builtins]

    def get(self, name: str) -> Entry | None:
        if name in self.builtins:  # no entry-point scan for a built-in
            return self.builtins[name]
        return self.entries().get(name)

    def load(self, name: str) -> Any:
        """The object a registered name stands for; an unknown name or a failing import raises self.error.

        A plugin's import failing in any way (its module raising RuntimeError, say) is self.error too: it is
        the package's fault, not omrl's. A built-in's import failing on anything but ImportError is a bug
        in omrl and keeps its traceback."""
        entry = self.get(name)
        if entry is None:
            raise self.error(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")
        plugin = entry.provider != BUILTIN_PROVIDER
        what = f"{self.kind} {name!r}" + (f" (from package {entry.provider})" if plugin else "")
        return load_target(entry.target, self.error, what, failures=(Exception,) if plugin else (ImportError,))

    def create(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Call the factory a name stands for; a plugin's factory failing with anything but omrl's own errors
        raises self.error naming the plugin and the error in one line, not a traceback."""
        factory = self.load(name)
        if name in self.builtins:
            return factory(*args, **kwargs)
        try:
            return factory(*args, **kwargs)
        except OmrlError:
            raise
        except Exception as exc:
            raise self.error(f"{self.kind} {name!r} ({self._plugin(name)}) failed: {error_line(exc)}") from None

    def skip(self, name: str, exc: BaseException) -> None:
        """Warn in one line that plugin `name` is skipped because of `exc`: the plugin, its entry point and the
        error (for a failed load, the import's own error rather than load's wrapping of it)."""
        cause = exc.__context__ if isinstance(exc, self.error) and exc.__context__ is not None else exc
        warn_skipped(f"plugin {self.kind} {name!r} ({self._plugin(name)})", cause)

    def _plugin(self, name: str) -> str:
        entry = self.get(name)
        if entry is None:
            return "no longer registered"
        return f'package {entry.provider}, entry point "{name} = {entry.target}" in {self.group}'


def _builtin(name: str, value: str | tuple[str, str]) -> Entry:
    target, summary = (value, "") if isinstance(value, str) else value
    return Entry(name, target, BUILTIN_PROVIDER, summary)


def load_target(target: str, error: type[Exception] = UsageError, what: str | None = None,
                failures: tuple[type[BaseException], ...] = (ImportError,)) -> Any:
    """Import "module" or "module:attribute.path"; failures raise `error` naming `what` (default: the target).

    failures: the exceptions of the import that become `error` (others propagate)."""
    what = what or repr(target)
    module_name, _, attribute = target.partition(":")
    try:
        value: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise error(f"cannot import {module_name!r} for {what}: {exc}") from None
    except failures as exc:
        raise error(f"cannot import {module_name!r} for {what}: {error_line(exc)}") from None
    for part in filter(None, attribute.split(".")):
        if not hasattr(value, part):
            raise error(f"{what}: module {module_name!r} has no {attribute!r}")
        value = getattr(value, part)
    return value


@cache
def entry_points(group: str) -> tuple[Entry, ...]:
    """The entry points installed packages declare in `group`, as Entries (read once per process).

    Read package by package (the first of a name found on the path wins, as importlib.metadata decides):
    a package whose entry points cannot be read is named in a warning and skipped, not the whole group."""
    from importlib.metadata import distributions

    found, seen = [], set()
    for dist in distributions():
        try:
            name = dist.name or "?"  # None: no metadata at all; its entry points still count
            points = dist.entry_points.select(group=group)
        except Exception as exc:  # undecodable metadata, a malformed entry_points.txt: that package's fault only
            where = getattr(dist, "_path", None)  # the .dist-info folder, when the name cannot be read
            warn_skipped(f"the installed package at {where}: its metadata or entry points cannot be read", exc)
            continue
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen and name != "?":
            continue
        seen.add(key)
        found += [Entry(point.name, point.value, name) for point in points]
    return tuple(found)


# Every pluggable kind: its registry, found where the kind lives (imported only when listed).
REGISTRIES = {
    "omrl.envs": "omrl.envs:ENVIRONMENTS",
    "omrl.formats": "omrl.formats:FORMATS",
    "omrl.exporters": "omrl.formats:EXPORTERS",
    "omrl.metrics": "omrl.annotate.metrics:METRICS",
    "omrl.policies": "omrl.policies:POLICIES",
}


def registries() -> list[Registry]:
    """The registry of every pluggable kind, in REGISTRIES order."""
    return [load_target(target) for target in REGISTRIES.values()]
