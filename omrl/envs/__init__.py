"""Environments: the protocol (base.py), shared plumbing (toolenv, textgame, engine, ...) and the built-in
environments, one package each (<name>/env.py, with tasks.py and expert.py where it has them).

ENVIRONMENTS (a Registry, omrl/plugins.py) maps a name to "module:Class". Built-ins and plugins come in one way:
the `omrl.envs` entry-point group, omrl's own entries declared in its pyproject.toml (BUILTIN_NAMES says which
must be there), installed packages adding theirs (name = "package.module:Class"; see omrl/plugins.py). Modules
are imported only when an environment is made, described or asked for tasks, so listing them stays cheap.
`make_env` also accepts any "package.module:ClassName" following the protocol. An environment's constructor
options are typed by its `options_class` dataclass (`--env-option`, checked in omrl/envs/options.py).
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
from collections.abc import Iterable, Mapping
from typing import Any

from omrl.envs.base import Environment, Task
from omrl.errors import OmrlError
from omrl.plugins import BUILTIN_PROVIDER, Entry, Registry, load_target


class EnvSpecError(OmrlError, ValueError):
    """An environment name or class path that cannot be used."""


# The built-in environments, in listing order; their targets are omrl's entry points in the omrl.envs group.
BUILTIN_NAMES = ("math", "sql", "code", "swebench", "shop", "http", "grid", "bfcl", "os", "scienceworld", "textworld",
                 "twx", "swe", "miniwob")


class EnvironmentRegistry(Registry):
    """The environments' Registry, its built-ins read from omrl's installed metadata (the same entry-point group
    plugins use) when first asked for, so importing omrl.envs reads no metadata."""

    group: str  # always omrl.envs (a Registry without plugins has None)

    def __init__(self, names: tuple[str, ...]) -> None:
        super().__init__("environment", "omrl.envs", {}, error=EnvSpecError)
        del self.builtins  # the cached property below reads them
        self.builtin_names = names

    # why the ignore: mypy takes a cached_property for read-only, but it is a writable attribute at run time
    # (Registry.__init__ sets it, __init__ above deletes it); a stub gap: typeshed#9726 (no __set__).
    @functools.cached_property
    def builtins(self) -> dict[str, Entry]:  # type: ignore[override]
        """omrl's own entries in the group, in BUILTIN_NAMES order; one missing is an install older than
        pyproject.toml, an EnvSpecError saying how to fix it."""
        points: Iterable[importlib.metadata.EntryPoint]
        try:
            points = importlib.metadata.distribution(BUILTIN_PROVIDER).entry_points.select(group=self.group)
        except importlib.metadata.PackageNotFoundError:
            points = ()
        targets = {point.name: point.value for point in points}
        missing = [name for name in self.builtin_names if name not in targets]
        if missing:
            raise EnvSpecError(f"omrl's installed metadata lacks the built-in environment(s) {', '.join(missing)} "
                               f"(entry-point group {self.group}, declared in pyproject.toml): reinstall omrl, "
                               "e.g. pip install -e .")
        return {name: Entry(name, targets[name], BUILTIN_PROVIDER) for name in self.builtin_names}


ENVIRONMENTS = EnvironmentRegistry(BUILTIN_NAMES)


def registry() -> dict[str, Entry]:
    """Every named environment: the built-ins, then installed plugins (a plugin cannot replace a built-in)."""
    return ENVIRONMENTS.entries()


def known_names() -> list[str]:
    """The names `--env` accepts besides package.module:ClassName paths."""
    return ENVIRONMENTS.names()


def env_class(spec: str) -> type:
    """The class behind a registered name or a "package.module:ClassName" path."""
    entry = ENVIRONMENTS.get(spec)
    if entry is not None:
        cls, target = ENVIRONMENTS.load(spec), entry.target
    elif ":" in spec:
        cls, target = load_target(spec, EnvSpecError, f"environment {spec!r}"), spec
    else:
        raise EnvSpecError(f"unknown environment {spec!r}; known: {', '.join(known_names())}, "
                           "or give package.module:ClassName")
    missing = [m for m in ("reset", "step", "close") if not callable(getattr(cls, m, None))]
    if missing:
        raise EnvSpecError(f"{target} is not an environment: it lacks {', '.join(missing)} "
                           "(see omrl/envs/base.py for the protocol)")
    return cls


def env_options(spec: str, texts: Mapping[str, str]) -> dict[str, Any]:
    """`--env-option` texts (option -> its text) as environment `spec`'s constructor options, typed and checked
    by its options dataclass (omrl/envs/options.py; a RecipeError names the option and `spec`); none given: {}."""
    if not texts:
        return {}
    from omrl.envs.options import checked_options  # the recipe loader: only when options are given

    return checked_options(spec, env_class(spec), texts)

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
