"""Environments: the protocol (base.py) and the built-in environments, one module each.

ENVIRONMENTS maps a built-in name to "module:Class"; installed packages add their own through the
`omrl.envs` entry-point group (name = "package.module:Class"). Modules are imported only when an
environment is made, described or asked for tasks, so listing them stays cheap. `make_env` also
accepts any "package.module:ClassName" following the protocol.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from functools import cache
from typing import Any

from omrl.envs.base import Environment, Task
from omrl.errors import OmrlError

ENVIRONMENTS: dict[str, str] = {
    "math": "omrl.envs.math:MathEnv",
    "sql": "omrl.envs.sql:SqlEnv",
    "code": "omrl.envs.code:CodeEnv",
    "swebench": "omrl.envs.swebench:SwebenchEnv",
    "shop": "omrl.envs.shop:ShopEnv",
    "http": "omrl.envs.http:HttpEnv",
    "grid": "omrl.envs.grid:GridEnv",
}

ENTRY_POINT_GROUP = "omrl.envs"


class EnvSpecError(OmrlError, ValueError):
    """An environment name or class path that cannot be used."""


@dataclass(frozen=True)
class EnvEntry:
    """One named environment: where its class lives and which package provides it."""

    name: str
    target: str  # "module:Class"
    provider: str  # "omrl" for built-ins, else the distribution that registered it


@cache
def _plugins() -> tuple[EnvEntry, ...]:
    from importlib.metadata import entry_points

    found = []
    for point in entry_points(group=ENTRY_POINT_GROUP):
        provider = point.dist.name if point.dist is not None else "?"
        found.append(EnvEntry(point.name, point.value, provider))
    return tuple(found)


def registry() -> dict[str, EnvEntry]:
    """Every named environment: the built-ins, then installed plugins (a plugin cannot replace a built-in)."""
    entries = {name: EnvEntry(name, target, "omrl") for name, target in ENVIRONMENTS.items()}
    for entry in _plugins():
        entries.setdefault(entry.name, entry)
    return entries


def known_names() -> list[str]:
    """The names `--env` accepts besides package.module:ClassName paths."""
    return sorted(registry())


def env_class(spec: str) -> type:
    """The class behind a registered name or a "package.module:ClassName" path."""
    entry = registry().get(spec)
    target = entry.target if entry is not None else spec
    if ":" not in target:
        raise EnvSpecError(f"unknown environment {spec!r}; known: {', '.join(known_names())}, "
                           "or give package.module:ClassName")
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise EnvSpecError(f"cannot import {module_name!r} for environment {spec!r}: {exc}") from None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise EnvSpecError(f"module {module_name!r} has no class {class_name!r}")
    missing = [m for m in ("reset", "step", "close") if not callable(getattr(cls, m, None))]
    if missing:
        raise EnvSpecError(f"{target} is not an environment: it lacks {', '.join(missing)} "
                           "(see omrl/envs/base.py for the protocol)")
    return cls


def unavailable(cls: type) -> str | None:
    """Why the environment class cannot run on this machine (its `unavailable()`), or None."""
    check = getattr(cls, "unavailable", None)
    return check() if callable(check) else None


def make_env(spec: str, **options: Any) -> Environment:
    """A new environment instance from a registered name or "package.module:ClassName"; options go to its constructor."""
    cls = env_class(spec)
    reason = unavailable(cls)
    if reason:
        raise EnvSpecError(f"environment {spec!r} cannot run here: {reason}")
    try:
        env = cls(**options)
    except TypeError as exc:
        raise EnvSpecError(f"cannot create environment {spec!r} with options {sorted(options)}: {exc}") from None
    if not getattr(env, "name", None):
        env.name = spec
    return env


def generate_tasks(spec: str, n: int = 50, seed: int = 0, split: str | None = None, **options: Any) -> list[Task]:
    """The environment's own generated tasks (its `generate_tasks` classmethod); split None: its first split."""
    cls = env_class(spec)
    generate = getattr(cls, "generate_tasks", None)
    if not callable(generate):
        raise EnvSpecError(f"environment {spec!r} has no task generator; generators: "
                           f"{', '.join(generator_names()) or 'none'}")
    reason = unavailable(cls)
    if reason:
        raise EnvSpecError(f"environment {spec!r} cannot run here: {reason}")
    splits = tuple(getattr(cls, "splits", ()) or ())
    if split is None:
        split = splits[0] if splits else "train"
    elif splits and split not in splits:
        raise EnvSpecError(f"environment {spec!r} has splits {', '.join(splits)}, not {split!r}")
    try:
        inspect.signature(generate).bind(n, seed=seed, split=split, **options)
    except TypeError as exc:
        raise EnvSpecError(f"cannot generate {spec!r} tasks with options {sorted(options)}: {exc}") from None
    return generate(n, seed=seed, split=split, **options)


def generator_names() -> list[str]:
    """Registered environments that generate their own tasks (importable ones only)."""
    names = []
    for name in known_names():
        try:
            if callable(getattr(env_class(name), "generate_tasks", None)):
                names.append(name)
        except EnvSpecError:
            continue
    return names


def describe(spec: str) -> str:
    """The first line of an environment class's docstring (or why it cannot be loaded)."""
    try:
        cls = env_class(spec)
    except EnvSpecError as exc:
        return f"(unavailable: {exc})"
    return (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
