"""Recipes: YAML files mapped onto dataclass configs, so YAML keys, `key=value` overrides and help share one source.

    recipe = load_recipe("recipes/sft_tiny.yaml", SFTRecipe, ["learning_rate=1e-4", "lora.r=8"])

The one config loader of omrl: training recipes, reward recipes, judge rubrics and specs, import and task
mappings are all dataclasses loaded by `from_dict` / `load_recipe`, and every refusal is a RecipeError (a
UsageError) naming the file and the key's dotted path (`recipes/x.yaml: grpo.max_steps must be int`).

A config is a dataclass whose fields carry `metadata={"help": ...}`; nested dataclasses are sections
(`lora.r`, `rollout.max_turns`). A section given in part keeps the enclosing field's defaults for the rest
(GRPO's `rollout` defaults are not RolloutSettings' own). Values are converted to the field's type (a YAML
`"1e-4"` string becomes a float); an unknown key is an error naming the key and the file. A list field given
text takes it split at commas (`lora.target_modules=q_proj,v_proj`), or whole with `metadata={"comma": False}`;
a `Literal[...]` field takes one of its values only (`batching: Literal["bridge", "trl"]`);
a list of dataclasses may be written as a mapping keyed by each item's first field, a plain value standing
for its second (`components: {env_reward: 1.0, judge:q: {weight: 0.5}}`). A config's own checks
(`__post_init__` raising ValueError) become RecipeErrors naming the file and the section. A library's own
config (TRL's GRPOConfig, SFTConfig) is reached through a pass-through section, `pass_through`.

Why not pydantic (installed as openai's dependency): its TypeAdapter validates stdlib dataclasses, but a
partial section would take the nested class's defaults instead of the enclosing field's (a behaviour change
for every recipe with a `rollout:` section), unknown keys pass unless every class is configured, and its
errors are multi-line; this loader is ~150 lines and says exactly what omrl means.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from omrl.errors import UsageError
from omrl.shipped import resolve_recipe


class RecipeError(UsageError):
    """A config file or mapping that does not fit its dataclass: the message names the file and the key."""


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _convert(value: Any, kind: Any, key: str, where: str, comma: bool = True) -> Any:
    """`value` as type `kind` (a type hint), or a RecipeError naming `key`; `comma`: text for a list is
    split at commas (else it is the list's one item)."""
    origin = typing.get_origin(kind)
    args = typing.get_args(kind)
    if kind is Any:
        return value
    if origin is typing.Literal:  # one of the listed values, as written (`level: Literal["token", "turn"]`)
        for allowed in args:
            if value == allowed and type(value) is type(allowed):
                return allowed
        raise RecipeError(f"{where}: {key} must be one of {', '.join(str(a) for a in args)}, not {value!r}")
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _convert(value, option, key, where, comma)
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
        inner = args[0] if args else Any
        if isinstance(value, dict) and dataclasses.is_dataclass(inner) and origin is list:
            return [_convert(item, inner, f"{key}.{name}", where) for name, item in _keyed_items(inner, value)]
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()] if comma else [value]
        if not isinstance(value, (list, tuple)):
            raise RecipeError(f"{where}: {key} must be a list, not {value!r}")
        if origin is tuple and args and args[-1] is not Ellipsis:  # tuple[float, float]: that many items
            if len(value) != len(args):
                raise RecipeError(f"{where}: {key} must be a list of {len(args)} items, not {value!r}")
            return tuple(_convert(v, a, f"{key}[{i}]", where) for i, (v, a) in enumerate(zip(value, args, strict=True)))
        items = [_convert(v, inner, f"{key}[{i}]", where) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
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


def _keyed_items(cls: type, data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """`{name: settings}` as (name, a `cls` mapping) pairs: the key fills the first field, a plain value the
    second (`{env_reward: 1.0}` -> {name: env_reward, weight: 1.0})."""
    first, second = [f.name for f in dataclasses.fields(cls) if f.init][:2]
    return [(str(name), {first: name, **(value if isinstance(value, dict) else {second: value})})
            for name, value in data.items()]


def from_dict(cls: type, data: dict[str, Any], *, where: str = "recipe", prefix: str = "") -> Any:
    """An instance of dataclass `cls` from a mapping; unknown keys and missing required keys are errors.

    The one config loader: `where` is the file (or what stands for it), `prefix` the section's dotted path."""
    if not isinstance(data, dict):
        raise RecipeError(f"{where}: {prefix.rstrip('.') + ' ' if prefix else ''}expected a mapping of settings, "
                          f"got {type(data).__name__}")
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
            values[name] = _convert(value, hints[name], prefix + name, where, f.metadata.get("comma", True))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise RecipeError(f"{where}: missing required key {prefix}{name} ({help_of(f)})")
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:  # the config's own checks (__post_init__)
        raise RecipeError(f"{where}: {prefix.rstrip('.') + ': ' if prefix else ''}{exc}") from None


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
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:  # one line: the file, the line and what is wrong there
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None)
        raise RecipeError(f"{path}{line}: not valid YAML" + (f" ({problem})" if problem else "")) from None
    except UnicodeDecodeError:
        raise RecipeError(f"{path}: not valid UTF-8") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: the top level must be a mapping of settings")
    return data


def load_recipe(source: Any, cls: type, overrides: list[str] | tuple = (), *, where: str = "recipe") -> Any:
    """The config `cls` from a YAML file (a path or `shipped:NAME`), a mapping (named `where` in errors) or
    None (the defaults), plus `key=value` overrides; a `cls` instance is returned as it is."""
    if isinstance(source, cls) and not overrides:
        return source
    if source is None:
        data = {}
    elif isinstance(source, dict):
        data = source
    else:
        data, where = read_yaml(source), str(source)
    return from_dict(cls, merge(data, parse_overrides(list(overrides))), where=where)


def pass_through(config_class: type, settings: dict[str, Any], extra: dict[str, Any], section: str = "trl",
                 owned: tuple[str, ...] = ()) -> Any:
    """`config_class(**settings, **extra)`: a recipe's pass-through section (`trl:`) handed to a library's
    config dataclass as given, next to the `settings` omrl derives from the recipe's own keys. A key of `extra`
    that is not a field of `config_class`, or one of `settings` or `owned` (set by omrl only in some runs), is a
    RecipeError naming `section.key`."""
    known = {f.name for f in dataclasses.fields(config_class) if f.init} if extra else set()
    for key in sorted(extra):
        if key not in known:
            raise RecipeError(f"{section}.{key} is not a setting of {config_class.__name__}")
        if key in settings or key in owned:
            raise RecipeError(f"{section}.{key}: omrl sets {config_class.__name__}.{key} from the recipe's own keys "
                              f"(see the recipe's --help); set it there")
    return config_class(**settings, **extra)


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
