"""Automatic metrics: plain functions that receive only the arguments they declare (see inputs.py).

A metric returns a number or bool (the score), a string (a label), a dict with score/label/rationale,
or None meaning "not applicable" (e.g. no gold answer): then NO annotation is written and the row is
counted as skipped. A metric that raises becomes an error annotation (status "error"), never a 0.
Installed packages add named metrics through the `omrl.metrics` entry-point group (name =
"package.module:function"; see omrl/plugins.py).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import math
import re
import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omrl.annotate.inputs import metric_inputs
from omrl.errors import UsageError
from omrl.plugins import Registry
from omrl.schema.payloads import info_of
from omrl.schema.rows import TrajectoryRow, UncheckedRow

Metric = Callable[..., Any]


# ---------------------------------------------------------------- built-in metrics


def env_reward(reward):
    """The environment's trajectory reward."""
    return reward


def success(success):
    """1.0 when the task was solved, 0.0 when not; not applicable when unknown."""
    return None if success is None else float(success)


def format_valid(messages, final_answer):
    """1.0 when every tool call's arguments are a JSON object and a final answer is present."""
    for msg in messages:
        for call in msg.get("tool_calls") or []:
            try:
                args = json.loads(call.get("arguments") or "")
            except json.JSONDecodeError:
                return 0.0
            if not isinstance(args, dict):
                return 0.0
    return 1.0 if final_answer is not None and str(final_answer).strip() else 0.0


def _golds(answer: Any) -> list[str]:
    values = answer if isinstance(answer, list) else [answer]
    return [v if isinstance(v, str) else json.dumps(v) for v in values if v is not None]


def exact_match(final_answer, answer):
    """1.0 when the final answer equals a gold answer after stripping surrounding whitespace."""
    if answer is None:
        return None
    got = (final_answer or "").strip()
    return float(any(got == g.strip() for g in _golds(answer)))


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_text(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces (SQuAD-style answer normalisation)."""
    text = _ARTICLES.sub(" ", text.lower().translate(_PUNCT))
    return " ".join(text.split())


def normalized_match(final_answer, answer):
    """1.0 when the normalised final answer equals a normalised gold answer."""
    if answer is None:
        return None
    got = normalize_text(final_answer or "")
    return float(any(got == normalize_text(g) for g in _golds(answer)))


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?|-?\.\d+")


def last_number(text: str | None) -> float | None:
    """The last number written in a text (thousands separators allowed), or None."""
    found = _NUMBER.findall(text or "")
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def numeric_match(final_answer, answer):
    """1.0 when the last number of the final answer equals the gold number (relative tolerance 1e-6).

    Not applicable when there is no gold answer or the gold answer holds no number.
    """
    if answer is None:
        return None
    golds = [g for g in (last_number(x) for x in _golds(answer)) if g is not None]
    if not golds:
        return None
    got = last_number(final_answer)
    if got is None:
        return 0.0
    return float(any(math.isclose(got, g, rel_tol=1e-6, abs_tol=1e-9) for g in golds))


def num_turns(num_turns, messages):
    """The number of assistant turns."""
    if num_turns is not None:
        return num_turns
    return sum(1 for m in messages if m.get("role") == "assistant")


def num_tokens(prompt_tokens, completion_tokens, turns):
    """Prompt plus completion tokens as recorded (row totals, else the sum over turns); None if unrecorded."""
    if prompt_tokens is not None or completion_tokens is not None:
        return (prompt_tokens or 0) + (completion_tokens or 0)
    counts = [(t.get("prompt_tokens") or 0) + (t.get("completion_tokens") or 0) for t in turns
              if t.get("prompt_tokens") is not None or t.get("completion_tokens") is not None]
    return sum(counts) if counts else None


def _action_key(msg: dict[str, Any]) -> str:
    calls = [(c.get("name"), _canonical_args(c.get("arguments"))) for c in msg.get("tool_calls") or []]
    return json.dumps([" ".join((msg.get("content") or "").split()), calls])


def _canonical_args(arguments: str | None) -> str:
    try:
        return json.dumps(json.loads(arguments or "{}"), sort_keys=True)
    except json.JSONDecodeError:
        return arguments or ""


def repetition(messages):
    """Fraction of assistant messages that repeat an earlier assistant message exactly (text and calls)."""
    keys = [_action_key(m) for m in messages if m.get("role") == "assistant"]
    if not keys:
        return None
    return 1.0 - len(set(keys)) / len(keys)


def truncated(status):
    """1.0 when the episode stopped on its turn or token budget (status truncated)."""
    return float(status == "truncated")


_ERROR_TEXT = re.compile(r"^\s*(error|exception|traceback|invalid)\b", re.IGNORECASE)


def tool_error_rate(messages, turns):
    """Fraction of tool results that are errors: text starting with error/exception/traceback/invalid,
    or a turn whose info has invalid_action or error. Not applicable without tool results."""
    results = [m for m in messages if m.get("role") == "tool"]
    if not results:
        return None
    errors = sum(1 for m in results if _ERROR_TEXT.match(m.get("content") or ""))
    flagged = 0
    for turn in turns:
        info = info_of(turn)
        if info.get("invalid_action") or info.get("error"):
            flagged += 1
    return min(1.0, max(errors, flagged) / len(results))


METRICS = Registry("metric", "omrl.metrics", {name: f"omrl.annotate.metrics:{name}" for name in (
    "env_reward", "success", "format_valid", "exact_match", "numeric_match", "normalized_match",
    "num_turns", "num_tokens", "repetition", "truncated", "tool_error_rate")})


def metric_names() -> list[str]:
    """Every named metric: the built-ins and those of installed plugins."""
    return METRICS.names()


# ---------------------------------------------------------------- loading and calling


@dataclass
class NamedMetric:
    name: str  # the annotator name written to the store
    fn: Metric
    spec: str  # how the user named it (builtin name, module:function or file.py:function)


def load_metric(spec: str) -> NamedMetric:
    """A registered name (built-in or plugin), `module:function`, or `path/to/file.py:function` -> a metric."""
    if ":" not in spec:
        if METRICS.get(spec) is None:
            raise UsageError(f"unknown metric {spec!r}: named metrics are {', '.join(metric_names())}; "
                             "or give module:function or path/to/file.py:function")
        fn = METRICS.load(spec)
        if not callable(fn):
            raise UsageError(f"metric {spec!r} ({METRICS.get(spec).target}) is not a function")
        check_signature(fn, spec)
        return NamedMetric(spec, fn, spec)
    where, _, attr = spec.rpartition(":")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise FileNotFoundError(f"metric file {where} not found")
        module_spec = importlib.util.spec_from_file_location(f"omrl_user_metric_{path.stem}", path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise UsageError(f"metric {spec!r}: cannot import {where}: {exc}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise UsageError(f"metric {spec!r}: {where} has no function {attr!r}")
    check_signature(fn, spec)
    return NamedMetric(attr, fn, spec)


def check_signature(fn: Metric, spec: str) -> None:
    """Refuse a metric that declares an argument nobody can give it (before running it on every row)."""
    known = set(metric_inputs({}))
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.name not in known and p.default is p.empty:
            raise UsageError(f"metric {spec!r} asks for unknown argument {p.name!r}; "
                             f"available: {', '.join(sorted(known))}")


def call_metric(fn: Metric, inputs: dict[str, Any]) -> Any:
    """Call a metric with only the arguments it declares (all of them when it takes **kwargs)."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return fn(**inputs)
    return fn(**{p.name: inputs[p.name] for p in params if p.name in inputs})


def result_fields(value: Any) -> dict[str, Any] | None:
    """A metric's return value as annotation fields (None: not applicable). Raises TypeError on junk."""
    if value is None:
        return None
    if isinstance(value, bool):
        return {"kind": "score", "score": float(value)}
    if isinstance(value, (int, float)):
        if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
            raise TypeError(f"metric returned {value!r}, not a finite number")
        return {"kind": "score", "score": float(value)}
    if isinstance(value, str):
        return {"kind": "label", "label": value}
    if isinstance(value, dict):
        unknown = set(value) - {"score", "label", "rationale"}
        if unknown:
            raise TypeError(f"metric returned a dict with unknown keys {sorted(unknown)}")
        fields = result_fields(value.get("score")) or {"kind": "label"}
        if "label" in value:
            fields["label"] = value["label"]
        if "rationale" in value:
            fields["rationale"] = value["rationale"]
        return fields
    raise TypeError(f"metric returned {type(value).__name__}; expected a number, bool, str, dict or None")


def annotate_row(row: TrajectoryRow, metrics: list[NamedMetric], run_id: str,
                 inputs: dict[str, Any] | None = None) -> tuple[list[UncheckedRow], list[str]]:
    """Annotation rows for one trajectory, and the names of the metrics that were not applicable (skipped)."""
    inputs = inputs or metric_inputs(row)
    out, skipped = [], []
    for metric in metrics:
        base = {"trajectory_id": row["id"], "annotator": metric.name, "run_id": run_id,
                "metadata": {"metric": metric.spec}}
        try:
            fields = result_fields(call_metric(metric.fn, inputs))
        except Exception as exc:  # any failure of user code must show up as an error row, not a score
            out.append({**base, "status": "error", "error": f"{type(exc).__name__}: {exc}"})
            continue
        if fields is None:
            skipped.append(metric.name)
            continue
        out.append({**base, **fields, "status": "ok"})
    return out, skipped
