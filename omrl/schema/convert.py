"""The field converters: one value checked and turned into what its column stores, or a SchemaError naming it."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from typing import Any

from omrl.errors import OmrlError
from omrl.schema.ids import utcnow


class SchemaError(OmrlError, ValueError):
    """A record that does not fit the schema; the message names the record and the field."""


def _json_text(value: Any, where: str, default: str) -> str:
    """Free-form payloads are stored as JSON text; dicts and lists are serialised, text must parse."""
    if value is None:
        return default
    if type(value) is str and (value == "{}" or value == "[]"):  # most payloads are empty: no parse needed
        return value
    if isinstance(value, str):
        try:
            json.loads(value)
        except json.JSONDecodeError as exc:
            raise SchemaError(f"field '{where}' must be JSON text: {exc}") from None
        except RecursionError:
            raise SchemaError(f"field '{where}' is JSON nested too deeply to read") from None
        except ValueError as exc:  # e.g. an integer beyond Python's digit limit
            raise SchemaError(f"field '{where}' must be JSON text: {exc}") from None
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError) as exc:
        raise SchemaError(f"field '{where}' cannot be serialised to JSON: {exc}") from None
    except RecursionError:
        raise SchemaError(f"field '{where}' is nested too deeply to serialise") from None


def _short(value: Any, limit: int = 80) -> str:
    """A value for an error message, cut short: a record may hold megabytes."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _names(names: set[str], limit: int = 10) -> str:
    shown = [str(n)[:40] for n in sorted(map(str, names))[:limit]]
    return ", ".join(shown) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _text(value: Any, where: str) -> str | None:
    """A field that must be text (instruction): no number or object is turned into its repr."""
    if value is None or isinstance(value, str):
        return value
    raise SchemaError(f"field '{where}' must be a string, got {type(value).__name__}")


def _key(value: Any, where: str) -> str | None:
    """An id-like field: text, or an integer taken as its digits; never a float, bool or object."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise SchemaError(f"field '{where}' must be a string, got {type(value).__name__} {_short(value)}")


def _finite(value: Any, where: str) -> float | None:
    """A reward or score: a finite number or null (JSON's Infinity and NaN are refused, never stored)."""
    if type(value) is float and math.isfinite(value):  # the common case, without the checks below
        return value
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SchemaError(f"field '{where}' must be a number, got {_short(value)}")
    name = where.rsplit(".", 1)[-1]
    try:
        number = float(value)
    except OverflowError:
        raise SchemaError(f"field '{where}': {name} must be a finite number, got an integer too large for a float"
                          ) from None
    if not math.isfinite(number):
        raise SchemaError(f"field '{where}': {name} must be a finite number, got {number!r}")
    return number


def _opt_str(value: Any, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float, bool)):
        return str(value)
    raise SchemaError(f"field '{where}' must be a string, got {type(value).__name__}")


_INT_LIMITS = {32: 2**31, 64: 2**63}


def _opt_int(value: Any, where: str, bits: int = 32) -> int | None:
    if type(value) is int and -_INT_LIMITS[bits] <= value < _INT_LIMITS[bits]:  # the common case, checked once
        return value
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
        isinstance(value, float) and not value.is_integer()
    ):
        raise SchemaError(f"field '{where}' must be an integer, got {_short(value)}")
    value = int(value)
    if not -_INT_LIMITS[bits] <= value < _INT_LIMITS[bits]:
        raise SchemaError(f"field '{where}' must fit in {bits} bits, got {_short(value)}")
    return value


def _opt_float(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SchemaError(f"field '{where}' must be a number, got {_short(value)}")
    try:
        value = float(value)
    except OverflowError:
        raise SchemaError(f"field '{where}' must be a number that fits a float, got a huge integer") from None
    if math.isnan(value):
        return None
    return value


def _opt_bool(value: Any, where: str) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise SchemaError(f"field '{where}' must be true or false, got {_short(value)}")


def _timestamp(value: Any, where: str) -> datetime:
    if value is None:
        return utcnow()
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise SchemaError(f"field '{where}' must be an ISO-8601 time, got {_short(value)}") from None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)
    raise SchemaError(f"field '{where}' must be a timestamp, got {_short(value)}")


def _numbers(values: Any, where: str, kind: type) -> list[Any]:
    """A list of token ids (int) or logprobs (float); a bad one is named instead of failing deep in Python."""
    if not values:
        return []
    if isinstance(values, (str, bytes, dict)):  # a string would otherwise become one number per character
        raise SchemaError(f"field '{where}' must be a list of numbers, got {type(values).__name__}")
    try:
        numbers = [kind(v) for v in values]
    except (TypeError, ValueError, OverflowError):
        index, bad = next((i, v) for i, v in enumerate(values) if not _converts(kind, v))
        raise SchemaError(f"field '{where}[{index}]' must be a number, got {_short(bad)}") from None
    if kind is int:  # token ids are int32 in the schema
        for index, number in enumerate(numbers):
            if not -_INT_LIMITS[32] <= number < _INT_LIMITS[32]:
                raise SchemaError(f"field '{where}[{index}]' must fit in 32 bits, got {_short(number)}")
    return numbers


def _converts(kind: type, value: Any) -> bool:
    try:
        kind(value)
    except (TypeError, ValueError, OverflowError):
        return False
    return True
