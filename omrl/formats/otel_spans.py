"""Span files as OpenTelemetry exporters write them, read into plain spans grouped by trace, and written back.

Read:
- OTLP JSON: an ExportTraceServiceRequest {"resourceSpans": [{"resource": {"attributes"}, "scopeSpans":
  [{"scope", "spans": [{traceId, spanId, parentSpanId, name, kind, startTimeUnixNano, endTimeUnixNano,
  attributes: [{key, value: {stringValue|intValue|doubleValue|boolValue|arrayValue|kvlistValue|bytesValue}}],
  events, status: {code, message}}]}]}]}: one per .json file, or one per line of a .jsonl file (the
  Collector's file exporter). Ids hex (the OTLP/JSON rule) or base64 (protobuf's generic JSON mapping).
- The Python SDK's span JSON (`ReadableSpan.to_json()`, what ConsoleSpanExporter prints; one per line, or
  a JSON list): {name, context: {trace_id: "0x..", span_id}, parent_id, kind, start_time, end_time
  (ISO 8601), status: {status_code, description}, attributes: {key: value}, events, resource}.

A plain span: {trace_id, span_id, parent_id, name, kind, start, end (ns since the epoch), attributes
{key: value}, events [{name, time, attributes}], status {code: UNSET/OK/ERROR, message}, resource
{key: value}}.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from omrl.formats.records import BadRecord, FormatError, read_records
from omrl.formats.values import list_field
from omrl.store.readers import json_kind

HEX_ID = re.compile(r"(0x)?([0-9a-fA-F]{16}|[0-9a-fA-F]{32})")
# OTLP's ranges: times are fixed64 nanoseconds since 1970 (up to the year 2554), integers int64.
TIME_RANGE = range(0, 2**64)
TIME_WHAT = "a span time (nanoseconds since 1970, up to the year 2554)"
INT64 = range(-(2**63), 2**63)
MAX_DIGITS = 40  # number text longer than this is refused unparsed (an int64 or a time needs 20)
# The most spans one trace may have: far above real agent runs (a few thousand); a trace past it is refused,
# naming the record that went over, before any of it is converted.
MAX_TRACE_SPANS = 100_000
STATUS_CODES = {0: "UNSET", 1: "OK", 2: "ERROR", "STATUS_CODE_UNSET": "UNSET", "STATUS_CODE_OK": "OK",
                "STATUS_CODE_ERROR": "ERROR", "UNSET": "UNSET", "OK": "OK", "ERROR": "ERROR"}


def is_span_record(record: Any) -> bool:
    """Whether a record is an OTLP request or an SDK span (for format detection)."""
    if not isinstance(record, dict):
        return False
    if isinstance(record.get("resourceSpans"), list):
        return True
    context = record.get("context")
    return isinstance(context, dict) and "trace_id" in context and "span_id" in context and "name" in record


def read_traces(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(index, {"trace_id", "spans"}) per trace of a file, in the order traces first appear; spans by start time."""
    traces: dict[str, list[dict[str, Any]]] = {}
    for index, value in read_records(path):
        where = f"{path.name} record {index}"
        if isinstance(value, BadRecord):
            raise FormatError(f"{path.name} {value.error}", value.reason)
        for span in spans_of(value, where):
            trace = traces.setdefault(span["trace_id"], [])
            if len(trace) == MAX_TRACE_SPANS:
                raise FormatError(f"{where}: trace {span['trace_id']} has more than {MAX_TRACE_SPANS:,} spans; "
                                  "omrl imports traces of at most that many", "trace too large")
            trace.append(span)
    for k, (trace_id, spans) in enumerate(traces.items()):
        spans.sort(key=lambda s: (s["start"], s["end"]))
        yield k, {"trace_id": trace_id, "spans": spans}


def spans_of(value: Any, where: str) -> list[dict[str, Any]]:
    """The plain spans of one record: an OTLP request or an SDK span."""
    if not isinstance(value, dict):
        raise FormatError(f"{where}: expected an OTLP request or a span object, got {json_kind(value)}", "not an object")
    if "resourceSpans" in value:
        return _otlp_spans(value, where)
    if is_span_record(value):
        return [_sdk_span(value, where)]
    raise FormatError(f"{where}: neither an OTLP request (resourceSpans) nor a span (name, context)", "not a span")


def _otlp_spans(request: dict[str, Any], where: str) -> list[dict[str, Any]]:
    out = []
    for r, block in enumerate(list_field(request.get("resourceSpans"), where, "resourceSpans")):
        at = f"{where} resourceSpans[{r}]"
        if not isinstance(block, dict):
            raise FormatError(f"{at}: must be an object", "bad span")
        resource = attributes((block.get("resource") or {}).get("attributes"), f"{at} resource")
        for s, scope in enumerate(list_field(block.get("scopeSpans", block.get("instrumentationLibrarySpans")), at,
                                        "scopeSpans")):
            if not isinstance(scope, dict):
                raise FormatError(f"{at} scopeSpans[{s}]: must be an object", "bad span")
            for k, span in enumerate(list_field(scope.get("spans"), at, "spans")):
                here = f"{at} scopeSpans[{s}] spans[{k}]"
                if not isinstance(span, dict):
                    raise FormatError(f"{here}: must be an object", "bad span")
                status = span.get("status") if isinstance(span.get("status"), dict) else {}
                out.append({
                    "trace_id": span_id(span.get("traceId"), 32, f"{here} traceId"),
                    "span_id": span_id(span.get("spanId"), 16, f"{here} spanId"),
                    "parent_id": span_id(span.get("parentSpanId"), 16, f"{here} parentSpanId", optional=True),
                    "name": str(span.get("name") or ""),
                    "kind": span.get("kind"),
                    "start": _nanos(span.get("startTimeUnixNano"), f"{here} startTimeUnixNano"),
                    "end": _nanos(span.get("endTimeUnixNano"), f"{here} endTimeUnixNano"),
                    "attributes": attributes(span.get("attributes"), here),
                    "events": [{"name": e.get("name"), "time": _nanos(e.get("timeUnixNano"), f"{here} event"),
                                "attributes": attributes(e.get("attributes"), f"{here} event")}
                               for e in list_field(span.get("events"), here, "events") if isinstance(e, dict)],
                    "status": {"code": STATUS_CODES.get(status.get("code"), "UNSET"), "message": status.get("message")},
                    "resource": resource,
                })
    return out


def _sdk_span(span: dict[str, Any], where: str) -> dict[str, Any]:
    context = span["context"]
    status = span.get("status") if isinstance(span.get("status"), dict) else {}
    resource = span.get("resource") if isinstance(span.get("resource"), dict) else {}
    attrs = span.get("attributes") if isinstance(span.get("attributes"), dict) else {}
    return {
        "trace_id": span_id(context.get("trace_id"), 32, f"{where} context.trace_id"),
        "span_id": span_id(context.get("span_id"), 16, f"{where} context.span_id"),
        "parent_id": span_id(span.get("parent_id"), 16, f"{where} parent_id", optional=True),
        "name": str(span.get("name") or ""),
        "kind": span.get("kind"),
        "start": _iso_nanos(span.get("start_time"), f"{where} start_time"),
        "end": _iso_nanos(span.get("end_time"), f"{where} end_time"),
        "attributes": dict(attrs),
        "events": [{"name": e.get("name"), "time": _iso_nanos(e.get("timestamp"), f"{where} event"),
                    "attributes": dict(e.get("attributes") or {})}
                   for e in list_field(span.get("events"), where, "events") if isinstance(e, dict)],
        "status": {"code": STATUS_CODES.get(status.get("status_code"), "UNSET"), "message": status.get("description")},
        "resource": dict(resource.get("attributes") or {}),
    }


def span_id(value: Any, length: int, where: str, optional: bool = False) -> str | None:
    """A trace or span id as lowercase hex: from hex (0x-prefixed or not) or base64."""
    if value in (None, "") and optional:
        return None
    if isinstance(value, str):
        match = HEX_ID.fullmatch(value)
        if match and len(match.group(2)) == length:
            return match.group(2).lower()
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) * 2 == length:
            return raw.hex()
    raise FormatError(f"{where}: not a {length}-hex-digit id ({str(value)[:40]!r})", "bad span id")


def _nanos(value: Any, where: str) -> int:
    """A time in nanoseconds since 1970 (0 when absent); other values, or times out of OTLP's range, are a
    FormatError naming `where` (a 400-digit time would otherwise overflow later, far from its span)."""
    if value in (None, ""):
        return 0
    return _in_range(_integer(value, where, "a time in nanoseconds", "bad span time"), TIME_RANGE, where,
                     TIME_WHAT, "bad span time")


def _integer(value: Any, where: str, what: str, reason: str) -> int:
    """An integer from a number or its text; longer text than any int64 needs is refused before it is parsed."""
    if isinstance(value, str) and len(value) > MAX_DIGITS:
        raise FormatError(f"{where}: {value[:20]!r}... ({len(value):,} characters) is too long for {what}", reason)
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: a JSON number too big for a float (inf)
        raise FormatError(f"{where}: not {what} ({str(value)[:40]!r})", reason) from None


def _in_range(number: int, bounds: range, where: str, what: str, reason: str) -> int:
    """`number` when `bounds` holds it, else a FormatError naming `where`."""
    if number not in bounds:
        digits = str(number)  # a JSON number is not held to MAX_DIGITS: show a long one cut
        shown = digits if len(digits) <= MAX_DIGITS else f"{digits[:20]}... ({len(digits)} digits)"
        raise FormatError(f"{where}: {shown} is out of range for {what} ({bounds.start} to {bounds.stop - 1})",
                          reason)
    return number


def _iso_nanos(value: Any, where: str) -> int:
    if value in (None, ""):
        return 0
    if not isinstance(value, str):
        raise FormatError(f"{where}: not an ISO 8601 time", "bad span time")
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise FormatError(f"{where}: not an ISO 8601 time ({value[:40]!r})", "bad span time") from None
    moment = moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
    whole = int(moment.replace(microsecond=0).timestamp())
    fraction = re.search(r"\.(\d+)", value)  # datetime keeps microseconds; the text may hold nanoseconds
    nanos = whole * 10**9 + (int(fraction.group(1)[:9].ljust(9, "0")) if fraction else 0)
    return _in_range(nanos, TIME_RANGE, where, TIME_WHAT, "bad span time")


def _double(number: Any, where: str) -> float | None:
    """An OTLP double: a number, or its text ("NaN", "Infinity" too); other text is a FormatError naming `where`."""
    if not isinstance(number, (int, float, str)):
        return None
    try:
        return float(number)
    except ValueError:
        raise FormatError(f"{where}: not a number ({str(number)[:40]!r})", "bad attribute") from None


def attributes(items: Any, where: str) -> dict[str, Any]:
    """OTLP key-values [{key, value: AnyValue}] as a dict of plain values."""
    out = {}
    for k, item in enumerate(list_field(items, where, "attributes")):
        if not isinstance(item, dict) or not isinstance(item.get("key"), str):
            raise FormatError(f"{where} attributes[{k}]: expected {{key, value}}", "bad attribute")
        out[item["key"]] = any_value(item.get("value"), f"{where} attribute {item['key']!r}")
    return out


def any_value(value: Any, where: str) -> Any:
    """One OTLP AnyValue as a plain value."""
    if not isinstance(value, dict) or not value:
        return None
    if "stringValue" in value:
        return value["stringValue"]
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "intValue" in value:  # int64 comes as a string in OTLP JSON
        if value["intValue"] in (None, ""):
            return 0
        return _in_range(_integer(value["intValue"], where, "an integer", "bad attribute"), INT64, where, "an int64",
                         "bad attribute")
    if "doubleValue" in value:
        return _double(value["doubleValue"], where)
    if "arrayValue" in value:
        return [any_value(v, where) for v in list_field((value["arrayValue"] or {}).get("values"), where, "values")]
    if "kvlistValue" in value:
        return attributes((value["kvlistValue"] or {}).get("values"), where)
    if "bytesValue" in value:
        return value["bytesValue"]  # base64 text, kept as is
    return None


# ---------------------------------------------------------------- writing


def encode_value(value: Any) -> dict[str, Any]:
    """A plain value as an OTLP AnyValue (ints as strings, as OTLP JSON writes int64)."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value if math.isfinite(value) else str(value)}
    if isinstance(value, (list, tuple)):
        return {"arrayValue": {"values": [encode_value(v) for v in value]}}
    if isinstance(value, dict):
        return {"kvlistValue": {"values": encode_attributes(value)}}
    return {"stringValue": str(value)}


def encode_attributes(values: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": key, "value": encode_value(value)} for key, value in values.items() if value is not None]
