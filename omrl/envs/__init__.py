"""Environments: the protocol (base.py) and the built-in environments, one module each.

ENVIRONMENTS maps a name to "module:Class"; modules are imported only when an environment is made, so
listing them stays cheap. `make_env` also accepts any "package.module:ClassName" following the protocol.
"""

from __future__ import annotations

import importlib
from typing import Any

from omrl.envs.base import Environment
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


class EnvSpecError(OmrlError, ValueError):
    """An environment name or class path that cannot be used."""


def env_class(spec: str) -> type:
    """The class behind a built-in name or a "package.module:ClassName" path."""
    target = ENVIRONMENTS.get(spec, spec)
    if ":" not in target:
        raise EnvSpecError(f"unknown environment {spec!r}; built in: {', '.join(sorted(ENVIRONMENTS))}, "
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


def make_env(spec: str, **options: Any) -> Environment:
    """A new environment instance from a built-in name or "package.module:ClassName"; options go to its constructor."""
    cls = env_class(spec)
    try:
        env = cls(**options)
    except TypeError as exc:
        raise EnvSpecError(f"cannot create environment {spec!r} with options {sorted(options)}: {exc}") from None
    if not getattr(env, "name", None):
        env.name = spec
    return env


def describe(spec: str) -> str:
    """The first line of an environment class's docstring (or why it cannot be loaded)."""
    try:
        cls = env_class(spec)
    except EnvSpecError as exc:
        return f"(unavailable: {exc})"
    return (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
