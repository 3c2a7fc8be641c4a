"""Named components from omrl and from installed packages: one Registry per kind.

Four kinds are pluggable, each with its built-ins and an entry-point group an installed package adds
to in its pyproject.toml:

    [project.entry-points."omrl.envs"]        tiny = "omrl_tiny.env:TinyEnv"           # an environment class
    [project.entry-points."omrl.formats"]     tinylog = "omrl_tiny.format"             # a module with convert()
    [project.entry-points."omrl.metrics"]     shouty = "omrl_tiny.metrics:shouty"      # a metric function
    [project.entry-points."omrl.policies"]    echo = "omrl_tiny.policy:EchoPolicy.from_spec"  # factory(arg, **options)

A target is "module" or "module:attribute" (the attribute may be dotted). Targets are imported only when
used, so listing stays cheap. A plugin never replaces a built-in of the same name, and of two plugins
registering one name the first found wins; `omrl plugins` shows which package provides each name.

Every named kind in omrl is a Registry, built-ins declared as plugins declare theirs (name -> target):
environments (omrl.envs.ENVIRONMENTS), import formats (omrl.formats.FORMATS), metrics
(omrl.annotate.metrics.METRICS), policies (omrl.policies.POLICIES), judge modes
(omrl.annotate.judge.JUDGE_MODES), trainers (omrl.train.trainer.TRAINERS) and the CLI's verbs
(omrl.cli.main.COMMANDS). The last three have no entry-point group: only omrl provides them.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache
from typing import Any

from omrl.errors import UsageError

BUILTIN_PROVIDER = "omrl"


@dataclass(frozen=True)
class Entry:
    """One named component: where it lives and which package provides it."""

    name: str
    target: str  # "module" or "module:attribute"
    provider: str  # "omrl" for built-ins, else the distribution that registered it
    summary: str = ""  # one line known without importing the target (the CLI's verbs); "" for plugins


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
        """The object a registered name stands for; an unknown name or a failing import raises self.error."""
        entry = self.get(name)
        if entry is None:
            raise self.error(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")
        return load_target(entry.target, self.error, f"{self.kind} {name!r}" + (
            f" (from package {entry.provider})" if entry.provider != BUILTIN_PROVIDER else ""))


def _builtin(name: str, value: str | tuple[str, str]) -> Entry:
    target, summary = (value, "") if isinstance(value, str) else value
    return Entry(name, target, BUILTIN_PROVIDER, summary)


def load_target(target: str, error: type[Exception] = UsageError, what: str | None = None) -> Any:
    """Import "module" or "module:attribute.path"; failures raise `error` naming `what` (default: the target)."""
    what = what or repr(target)
    module_name, _, attribute = target.partition(":")
    try:
        value: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise error(f"cannot import {module_name!r} for {what}: {exc}") from None
    for part in filter(None, attribute.split(".")):
        if not hasattr(value, part):
            raise error(f"{what}: module {module_name!r} has no {attribute!r}")
        value = getattr(value, part)
    return value


@cache
def entry_points(group: str) -> tuple[Entry, ...]:
    """The entry points installed packages declare in `group`, as Entries (read once per process)."""
    from importlib.metadata import entry_points as installed

    return tuple(Entry(point.name, point.value, point.dist.name if point.dist is not None else "?")
                 for point in installed(group=group))


# Every pluggable kind: its registry, found where the kind lives (imported only when listed).
REGISTRIES = {
    "omrl.envs": "omrl.envs:ENVIRONMENTS",
    "omrl.formats": "omrl.formats:FORMATS",
    "omrl.metrics": "omrl.annotate.metrics:METRICS",
    "omrl.policies": "omrl.policies:POLICIES",
}


def registries() -> list[Registry]:
    """The registry of every pluggable kind, in REGISTRIES order."""
    return [load_target(target) for target in REGISTRIES.values()]
