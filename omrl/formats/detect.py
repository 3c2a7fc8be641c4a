"""Guess the format of a trajectory file from its extension and the keys of its first record."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omrl.formats import FORMATS, format_module, format_names, plugin_formats
from omrl.formats.otel_spans import is_span_record
from omrl.formats.records import BadRecord, FormatError, first_record
from omrl.formats.steps import step_list
from omrl.store import readers
from omrl.store.readers import json_kind

OPENMANUS_KEYS = {"reward_model", "item_id", "data_source", "extra_info"}


def detect_record(record: Any) -> str | None:
    """The format of one native record, or None when its keys match none."""
    if not isinstance(record, dict):
        return None
    keys = set(record)
    if str(record.get("schema_version", "")).startswith("ATIF") and "steps" in keys:
        return "atif"
    if is_span_record(record):
        return "otel"
    if "history" in keys and ({"trajectory", "info", "replay_config"} & keys):
        return "swe_agent"
    if isinstance(record.get("answer_generation"), dict):
        return "toolbench"
    if "conversations" in keys:
        return "openmanus" if len(OPENMANUS_KEYS & keys) >= 2 else "sharegpt"
    if "messages" in keys:
        return "openai"
    content = record.get("content")
    if isinstance(content, list) and content and isinstance(content[0], dict) and "class_" in content[0]:
        return "adp"
    if step_list(record):
        return "steps"
    return _plugin_format(record)


def _plugin_format(record: dict[str, Any]) -> str | None:
    """The first installed plugin format whose `detect(record)` says yes (built-in formats come first).

    A plugin that cannot be imported, or whose detect() raises, is named in a warning and skipped: the
    other formats still detect (one broken package must not stop every import)."""
    for name in plugin_formats():
        try:
            detect = getattr(format_module(name), "detect", None)
            if callable(detect) and detect(record):
                return name
        except Exception as exc:  # the plugin's code, not omrl's: whatever it raises
            FORMATS.skip(name, exc)
    return None


def detect_format(path: str | Path) -> str:
    """The format of a file: .traj is SWE-agent; otherwise decided by the first record's keys."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    if path.suffix.lower() == ".traj":
        return "swe_agent"
    if path.suffix.lower() == ".parquet":
        # The schema is enough, no need to read rows; a file that is not Parquet is a FormatError naming it.
        names = set(readers.parquet_schema(path, error=FormatError).names)
        found = detect_record(dict.fromkeys(names))
        record = first_record(path) if found is None else None  # only to explain what fits
    else:
        record = first_record(path)
        if isinstance(record, BadRecord):  # the first line does not parse: say so, not "unknown keys"
            raise FormatError(f"{path.name} {record.error}", record.reason)
        found = detect_record(record)
        if found is None and record is None:
            raise FormatError(f"{path.name}: the file holds no records", "empty file")
        if not isinstance(record, dict):
            raise FormatError(f"{path.name}: the first record is {json_kind(record)}, not an object", "not an object")
        names = set(record)
    if found is None:
        shown = sorted(map(str, names))
        keys = shown if len(shown) <= 20 else [*shown[:20], f"... {len(shown) - 20} more"]
        raise FormatError(f"{path.name}: cannot tell the format from keys {keys}; {explain(record)}; "
                          f"or pass --format ({', '.join(format_names())}); "
                          "a task dataset goes through `omrl tasks import`", "unknown format")
    return found


# What each format needs in a record, for explaining a record that fits none.
SIGNATURES = {
    "openai": ({"messages"}, {"tools", "reward", "id", "instance_id", "resolved"}),
    "sharegpt": ({"conversations"}, {"id", "reward", "system", "tools"}),
    "openmanus": ({"conversations", "reward_model", "item_id"}, OPENMANUS_KEYS),
    "swe_agent": ({"history", "trajectory"}, {"info", "replay_config", "environment"}),
    "toolbench": ({"answer_generation"}, {"win", "query_id"}),
    "atif": ({"schema_version", "steps"}, {"session_id", "agent", "final_metrics"}),
    "adp": ({"id", "content"}, {"details"}),
    "steps": ({"steps"}, {"task", "reward", "goal"}),
    "otel": ({"resourceSpans"}, {"name", "context", "attributes"}),
}


def message_lists(record: Any) -> list[tuple[str, str]]:
    """(dotted path, style) of the lists of messages in a record, one level deep: style openai or sharegpt."""
    found = []
    if not isinstance(record, dict):
        return found
    for key, value in record.items():
        candidates = [(str(key), value)]
        if isinstance(value, dict):
            candidates += [(f"{key}.{k}", v) for k, v in value.items()]
        for path, v in candidates:
            if isinstance(v, list) and v and isinstance(v[0], dict):
                if "role" in v[0] and ("content" in v[0] or "text" in v[0] or "tool_calls" in v[0]):
                    found.append((path, "openai"))
                elif "from" in v[0] and "value" in v[0]:
                    found.append((path, "sharegpt"))
    return found


def explain(record: Any) -> str:
    """Why a record fits no format: the closest format, what it missed, and the flag that would fix it."""
    keys = set(map(str, record)) if isinstance(record, dict) else set()

    def score(item: tuple[str, tuple[set[str], set[str]]]) -> tuple[int, int]:
        required, typical = item[1]
        return (len(required & keys), len(typical & keys))

    name, (required, _) = max(SIGNATURES.items(), key=score)
    lists = message_lists(record)
    if lists:
        path, style = lists[0]
        name = style
        required = SIGNATURES[style][0]
    missing = sorted(required - keys)
    if not lists and not required & keys:
        text = ("no format's keys are there (openai needs 'messages', sharegpt 'conversations', swe_agent "
                "'history', adp 'content', steps 'steps')")
    else:
        text = f"closest format: {name}, which needs {', '.join(repr(k) for k in missing) or 'its keys'}"
    if lists:
        text += (f"; a message list is under '{path}': pass --messages-key {path} (and --reward-key, "
                 "--id-key, ... for the other fields), or a --map map.yaml (examples in recipes/imports/)")
    else:
        text += ("; if the records hold a conversation under another key, pass --messages-key KEY "
                 "(dotted paths allowed) or --map map.yaml (examples in recipes/imports/)")
    return text
