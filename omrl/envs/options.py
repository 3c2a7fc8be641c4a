"""An environment's constructor options from `--env-option KEY=VALUE` text, checked against its typed options.

A built-in environment declares its constructor's options as a dataclass, its `options_class`; the recipe
loader (omrl.config.from_dict) checks the given keys and converts their values, so a wrong key or type is one
line naming the option and the environment. A class without one (a plugin's) gets its values unchecked.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Mapping
from typing import Any

from omrl.config import from_dict


def options_class(env_cls: type) -> type | None:
    """The dataclass typing an environment class's constructor options, or None when it declares none."""
    return getattr(env_cls, "options_class", None)


def read_value(text: str, hint: Any = Any) -> Any:
    """One option's text as its value: JSON when it parses (numbers, true/false, lists, null), else the text;
    an option that takes text only keeps it as written (`id_key=1` stays "1")."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if value is None or isinstance(value, str) or not _text_only(hint):
        return value
    return text


def _text_only(hint: Any) -> bool:
    if hint is str or typing.get_origin(hint) is typing.Literal:
        return True
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return all(_text_only(arg) for arg in typing.get_args(hint) if arg is not type(None))
    return False


def checked_options(spec: str, env_cls: type, texts: Mapping[str, str]) -> dict[str, Any]:
    """`texts` (option -> its text) as the constructor options of environment `spec` (class `env_cls`): the
    keys given, each value read and converted to its declared type; RecipeError names the option and `spec`."""
    cls = options_class(env_cls)
    if cls is None:
        return {key: read_value(text) for key, text in texts.items()}
    hints = typing.get_type_hints(cls)
    values = {key: read_value(text, hints.get(key, Any)) for key, text in texts.items()}
    options = from_dict(cls, values, where=f"environment {spec!r} (--env-option)")
    return {key: getattr(options, key) for key in values}

