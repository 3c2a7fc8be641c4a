"""BFCL multi-turn data, read from the installed bfcl-eval package: entries, ground truth, function docs.

Nothing here is copied from the package: entries and ground truth come from its data files, the class
and file names from its constants, so a newer bfcl-eval brings its own data. Imported by the environment
(parent process) and by its worker process alike.
"""

from __future__ import annotations

import ast
import copy
import inspect
import json
from functools import cache
from importlib import import_module, metadata
from importlib.resources import files
from typing import Any

PACKAGE = "bfcl-eval"
PINNED_VERSION = "2026.3.23"  # the version omrl's tests and figures were made with
# BFCL's multi-turn categories (bfcl_eval.constants.category_mapping.MULTI_TURN_CATEGORY, composite excluded)
CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")


class BfclDataError(Exception):
    """An entry id or ground-truth call that the installed bfcl-eval does not have or omrl cannot read."""


def version() -> str:
    """The installed bfcl-eval version."""
    return metadata.version(PACKAGE)


def _data_dir():
    return files("bfcl_eval") / "data"


def _read_jsonl(path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


@cache
def entries(category: str) -> dict[str, dict[str, Any]]:
    """The entries of one category by id, each with its "ground_truth" (a list of call strings per turn)."""
    if category not in CATEGORIES:
        raise BfclDataError(f"unknown BFCL multi-turn category {category!r}; known: {', '.join(CATEGORIES)}")
    from bfcl_eval.constants.category_mapping import VERSION_PREFIX

    name = f"{VERSION_PREFIX}_{category}.json"
    questions = _read_jsonl(_data_dir() / name)
    answers = {a["id"]: a["ground_truth"] for a in _read_jsonl(_data_dir() / "possible_answer" / name)}
    out = {}
    for entry in questions:
        if entry["id"] not in answers:
            raise BfclDataError(f"{name}: entry {entry['id']} has no ground truth")
        out[entry["id"]] = {**entry, "ground_truth": answers[entry["id"]]}
    return out


def category_of(entry_id: str) -> str:
    """The category of an entry id (multi_turn_base_12 -> multi_turn_base), as BFCL derives it."""
    return entry_id.rsplit("_", 1)[0]


def entry(entry_id: str) -> dict[str, Any]:
    """One entry by its BFCL id."""
    found = entries(category_of(entry_id)).get(entry_id) if category_of(entry_id) in CATEGORIES else None
    if found is None:
        raise BfclDataError(f"bfcl-eval {version()} has no multi-turn entry {entry_id!r}")
    return found


@cache
def function_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    """The function docs of one API class (BFCL's multi_turn_func_doc file for it)."""
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    return tuple(_read_jsonl(_data_dir() / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]))


def entry_functions(item: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[int, list[dict[str, Any]]]]:
    """(the docs offered from the start, {turn: docs added at that turn}) as BFCL populates a multi-turn entry:
    every function of the involved classes, less those `missed_function` holds back until their turn."""
    docs = [dict(doc) for name in item["involved_classes"] for doc in function_docs(name)]
    held: dict[int, list[dict[str, Any]]] = {}
    for turn, names in (item.get("missed_function") or {}).items():
        for name in names:
            doc = next((d for d in docs if d["name"] == name), None)
            if doc is not None:
                docs.remove(doc)
                held.setdefault(int(turn), []).append(doc)
    return docs, held


def tool_schema(doc: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI function-tool schema from a BFCL function doc, by the rules of BFCL's OpenAI handler: Gorilla
    types mapped to JSON Schema (GORILLA_TO_OPENAPI; unknown ones become string), float parameters marked
    `format: float` with " This is a float type value." added to their description. The doc's `response`
    schema is left out (not part of an OpenAI function schema; the results describe themselves)."""
    parameters = copy.deepcopy(doc["parameters"])
    parameters["type"] = "object"
    parameters["properties"] = _openai_properties(parameters.get("properties") or {})
    return {"type": "function",
            "function": {"name": doc["name"], "description": doc["description"], "parameters": parameters}}


def _openai_properties(properties: dict[str, Any]) -> dict[str, Any]:
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI as TYPES

    for spec in properties.values():
        kind = spec.get("type")
        if kind == "float":
            spec["format"] = "float"
            spec["description"] = spec.get("description", "") + " This is a float type value."
        spec["type"] = TYPES.get(kind, "string")
        if spec["type"] not in ("array", "object"):
            continue
        if "properties" in spec:
            spec["properties"] = _openai_properties(spec["properties"])
        items = spec.get("items")
        if isinstance(items, dict):
            items["type"] = TYPES.get(items.get("type"), "string")
            if items["type"] == "object" and "properties" in items:
                items["properties"] = _openai_properties(items["properties"])
            inner = items.get("items")
            if items["type"] == "array" and isinstance(inner, dict):
                inner["type"] = TYPES.get(inner.get("type"), "string")
    return properties


def parse_call(text: str) -> tuple[str, list[Any], dict[str, Any]]:
    """(name, positional arguments, keyword arguments) of one ground-truth call string such as
    "mv(source='a', destination='b')". Only literal arguments are read (no code is evaluated)."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            raise ValueError("not a plain function call")
        args = [ast.literal_eval(a) for a in node.args]
        kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
    except (SyntaxError, ValueError) as exc:
        raise BfclDataError(f"cannot read the ground-truth call {text!r}: {exc}") from None
    return node.func.id, args, kwargs


@cache
def api_class(class_name: str) -> type:
    """One of BFCL's stateful API classes (GorillaFileSystem, TradingBot, ...), imported from the package."""
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    return getattr(import_module(CLASS_FILE_PATH_MAPPING[class_name]), class_name)


def call_arguments(item: dict[str, Any], text: str) -> tuple[str, dict[str, Any]]:
    """A ground-truth call string as (function name, keyword arguments): positional arguments are named
    from the signature of the method of an involved class that has that name."""
    name, args, kwargs = parse_call(text)
    if not args:
        return name, kwargs
    for class_name in item["involved_classes"]:
        method = getattr(api_class(class_name), name, None)
        if method is not None and not name.startswith("_"):
            bound = inspect.signature(method).bind(None, *args, **kwargs)
            return name, {k: v for k, v in list(bound.arguments.items())[1:]}
    raise BfclDataError(f"entry {item['id']}: no involved class has the function {name!r}")


def turn_text(messages: list[dict[str, Any]]) -> str:
    """One user turn as one observation (BFCL's turns hold one user message; several are joined)."""
    return "\n\n".join(str(m.get("content") or "") for m in messages)
