"""Recipes: YAML files mapped onto dataclass configs, so YAML keys, `key=value` overrides and help share one source.

    recipe = load_recipe("recipes/sft_tiny.yaml", SFTRecipe, ["learning_rate=1e-4", "lora.r=8"])

A config is a dataclass whose fields carry `metadata={"help": ...}`; nested dataclasses are sections
(`lora.r`, `rollout.max_turns`). A section given in part keeps the field's own defaults for the rest.
Values are converted to the field's type (a YAML `"1e-4"` string becomes a float); an unknown key is an
error naming the key and the file. A config may map keys it moved to their new place in `LEGACY_KEYS`
({"max_turns": "rollout.max_turns"}): recipes written before the move still load.
"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from omrl.errors import OmrlError
from omrl.shipped import resolve_recipe


class RecipeError(OmrlError, ValueError):
    """A recipe that does not fit its config: the message names the file and the key."""


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _convert(value: Any, kind: Any, key: str, where: str) -> Any:
    """`value` as type `kind` (a type hint), or a RecipeError naming `key`."""
    origin = typing.get_origin(kind)
    args = typing.get_args(kind)
    if kind is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _convert(value, option, key, where)
            except RecipeError as exc:
                errors.append(str(exc))
        raise RecipeError(errors[0] if errors else f"{where}: {key} cannot be null")
    if dataclasses.is_dataclass(kind):
        if isinstance(value, kind):
            return value
        if not isinstance(value, dict):
            raise RecipeError(f"{where}: {key} must be a mapping of {kind.__name__} settings")
        return from_dict(kind, value, where=where, prefix=f"{key}.")
    if origin in (list, tuple):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise RecipeError(f"{where}: {key} must be a list, not {value!r}")
        inner = args[0] if args else Any
        return [_convert(v, inner, f"{key}[{i}]", where) for i, v in enumerate(value)]
    if origin is dict or kind is dict:
        if not isinstance(value, dict):
            raise RecipeError(f"{where}: {key} must be a mapping, not {value!r}")
        return dict(value)
    if value is None:
        raise RecipeError(f"{where}: {key} cannot be null")
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "1", "on", "false", "no", "0", "off"):
            return value.lower() in ("true", "yes", "1", "on")
        raise RecipeError(f"{where}: {key} must be true or false, not {value!r}")
    if kind in (int, float):
        if isinstance(value, bool):
            raise RecipeError(f"{where}: {key} must be a number, not {value!r}")
        try:
            number = float(value) if kind is float else int(str(value), 0) if isinstance(value, str) else value
        except ValueError:
            raise RecipeError(f"{where}: {key} must be {kind.__name__}, not {value!r}") from None
        if kind is int and (not isinstance(number, int) or isinstance(number, bool)):
            if isinstance(number, float) and number.is_integer():
                return int(number)
            raise RecipeError(f"{where}: {key} must be an integer, not {value!r}")
        return kind(number)
    if kind is str:
        if isinstance(value, (dict, list)):
            raise RecipeError(f"{where}: {key} must be text, not {value!r}")
        return str(value)
    return value


def from_dict(cls: type, data: dict[str, Any], *, where: str = "recipe", prefix: str = "") -> Any:
    """An instance of dataclass `cls` from a mapping; unknown keys and missing required keys are errors."""
    if not isinstance(data, dict):
        raise RecipeError(f"{where}: expected a mapping of settings, got {type(data).__name__}")
    data = fold_legacy(cls, data, where=where, prefix=prefix)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise RecipeError(f"{where}: unknown key {prefix}{unknown[0]!s}"
                          + (f" (and {', '.join(prefix + u for u in unknown[1:])})" if unknown[1:] else "")
                          + f"; known keys: {', '.join(sorted(fields))}")
    hints = _hints(cls)
    values = {}
    for name, f in fields.items():
        if name in data:
            value = data[name]
            if (dataclasses.is_dataclass(hints[name]) and isinstance(value, dict)
                    and f.default_factory is not dataclasses.MISSING):
                value = merge(dataclasses.asdict(f.default_factory()), value)  # the field's defaults for the rest
            values[name] = _convert(value, hints[name], prefix + name, where)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise RecipeError(f"{where}: missing required key {prefix}{name} ({help_of(f)})")
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise RecipeError(f"{where}: {exc}") from None


def fold_legacy(cls: type, data: dict[str, Any], *, where: str = "recipe", prefix: str = "") -> dict[str, Any]:
    """`data` with the keys `cls.LEGACY_KEYS` moved ("old.path": "new.path") put at their new place.

    An old key and its new place both set to different values is a RecipeError naming both.
    """
    moves: dict[str, str] = getattr(cls, "LEGACY_KEYS", {})
    if not moves or not any(_has(data, old) for old in moves):
        return data
    data = copy.deepcopy(data)
    for old, new in moves.items():
        if not _has(data, old):
            continue
        *parents, leaf = old.split(".")
        node = data
        for part in parents:
            node = node[part]
        value = node.pop(leaf)
        *parents, leaf = new.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise RecipeError(f"{where}: {prefix}{part} must be a mapping of settings")
        if leaf in node and node[leaf] != value:
            raise RecipeError(f"{where}: {prefix}{old} moved to {prefix}{new}, and the two disagree "
                              f"({value!r} and {node[leaf]!r}); set only {prefix}{new}")
        node[leaf] = value
    return data


def _has(data: dict[str, Any], path: str) -> bool:
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def section(cls: type, name: str, set_by_run: tuple[str, ...], doc: str) -> type:
    """A typed recipe section: a dataclass of `cls`'s settings less `set_by_run` (the keys the enclosing run
    fills in), each with its type, default and help; `to_recipe` gives the full `cls`.

    A section's values are checked as `cls` checks them, when the section is made (so at load time, not
    when the stage starts): `cls` is built with the run's required keys as placeholders.
    """
    hints = _hints(cls)
    required = [f.name for f in dataclasses.fields(cls)
                if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = sorted(set(required) - set(set_by_run))
    if missing:
        raise TypeError(f"a section of {cls.__name__} must leave {', '.join(missing)} to the run (no default)")
    specs = []
    for f in dataclasses.fields(cls):
        if not f.init or f.name in set_by_run:
            continue
        default = ({"default": f.default} if f.default is not dataclasses.MISSING
                   else {"default_factory": f.default_factory})
        specs.append((f.name, hints[f.name], dataclasses.field(metadata=f.metadata, **default)))

    def values(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def __post_init__(self) -> None:
        try:
            cls(**{key: "-" for key in required}, **values(self))
        except (TypeError, ValueError) as exc:
            raise RecipeError(str(exc)) from None

    def to_recipe(self, **run: Any) -> Any:
        """The full config: this section's values and the run's keys (`run` wins)."""
        return from_dict(cls, {**to_dict(self), **run}, where=name)

    return dataclasses.make_dataclass(name, specs, namespace={
        "__doc__": doc, "__module__": cls.__module__, "__post_init__": __post_init__, "to_recipe": to_recipe})


def help_of(f: dataclasses.Field) -> str:
    return f.metadata.get("help", "")


def parse_overrides(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """`["a.b=1", "c=x"]` -> {"a": {"b": 1}, "c": "x"}; values are parsed as YAML scalars."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise RecipeError(f"override {item!r} is not key=value")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key:
            raise RecipeError(f"override {item!r} has no key")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise RecipeError(f"override {item!r} conflicts with another override of {part}")
        node[parts[-1]] = value
    return out


def merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`base` with `changes` applied recursively (sections merge, scalars replace)."""
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping in a recipe file (an empty file is an empty mapping); `shipped:NAME` names a recipe
    shipped with omrl (omrl.shipped)."""
    path = Path(resolve_recipe(path))
    if not path.is_file():
        raise FileNotFoundError(f"recipe {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise RecipeError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: the top level must be a mapping of settings")
    return data


def load_recipe(source: str | Path | dict[str, Any] | None, cls: type, overrides: list[str] | tuple = ()) -> Any:
    """The config `cls` from a YAML file (or mapping) plus `key=value` overrides."""
    if source is None:
        data, where = {}, "recipe"
    elif isinstance(source, dict):
        data, where = source, "recipe"
    else:
        data, where = read_yaml(source), str(source)
    return from_dict(cls, merge(data, parse_overrides(list(overrides))), where=where)


def to_dict(config: Any) -> dict[str, Any]:
    """A config as plain data (for JSON run records)."""
    return dataclasses.asdict(config)


def describe(cls: type, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key, default, help) for every setting of `cls`, nested sections flattened with dots."""
    rows = []
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            rows.extend(describe(kind, prefix + f.name + "."))
            continue
        if f.default is not dataclasses.MISSING:
            default = repr(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = repr(f.default_factory())
        else:
            default = "(required)"
        rows.append((prefix + f.name, default, help_of(f)))
    return rows
