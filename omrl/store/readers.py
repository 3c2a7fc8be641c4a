"""The one reading layer for record files (JSONL, JSON, CSV, Parquet): every error names the file and where.

`omrl store append` (omrl.store.record_files), `omrl import` (omrl.formats) and `omrl tasks import` (omrl.tasks) read
through here. What a reader can meet in a bad file (bytes that are not UTF-8, JSON cut short or nested
too deeply for Python, ragged CSV rows, Parquet pages that do not decode, binary or empty files) is raised
as the caller's ValueError subclass, one line naming the file and the line, item, row or row group, so the
CLI prints it cleanly; a UnicodeDecodeError, RecursionError or pyarrow error never escapes.

Text that is not Unicode is refused the same way: a JSON escape of half a surrogate pair (`"\\udc00"`)
parses in Python but cannot be stored (Arrow strings are UTF-8), so the record is an error naming where
in it the lone surrogate sits.

Locators: JSONL and CSV `<file> line N` (from 1, as editors count), JSON `<file> item N` (list position,
from 0), Parquet `<file> row N` (from 0) and `<file> row group N` for pages that do not decode.
"""

from __future__ import annotations

import csv
import io
import json
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from omrl.errors import OmrlError

SUFFIX_KINDS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".traj": "json", ".csv": "csv",
                ".tsv": "tsv", ".parquet": "parquet"}
_WS = re.compile(r"[ \t\n\r]*")
_BOM = b"\xef\xbb\xbf"
_SNIFF_BYTES = 8192
# A JSON escape of a UTF-16 surrogate: the only way text decoded from UTF-8 can come to hold one.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _skip_space(text: str, pos: int) -> int:
    """The position of the first character at or after `pos` that is not JSON whitespace."""
    found = _WS.match(text, pos)
    assert found is not None  # `_WS` matches the empty string: it matches at every position
    return found.end()


class ReadError(OmrlError, ValueError):
    """A file that cannot be read as records; the message names the file and the line, item or row."""

    def __init__(self, message: str, reason: str = "unreadable file"):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class BadLine:
    """A JSONL line that does not parse (yielded instead of raising with bad_lines="yield")."""

    line: int
    error: str  # e.g. "line 3 is not valid JSON (...)": without the file name
    reason: str = "bad json"


class Record(NamedTuple):
    """One record of a file: its position among the records (from 0), where it is, and its value."""

    index: int  # type: ignore[assignment]  # the record's position: shadows tuple.index, which no caller uses
    where: str  # "<file> line 3", "<file> item 2", "<file> row 7"
    value: Any  # a parsed JSON value, a dict for CSV and Parquet rows, or a BadLine


def _fail(error: type[Exception], message: str, reason: str) -> Exception:
    exc = error(message)
    if hasattr(exc, "reason"):  # ReadError and omrl.formats' FormatError carry a short category
        exc.reason = reason
    return exc


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _kind(path: Path, allowed: Iterable[str] | None, error: type[Exception]) -> str:
    suffix = path.suffix.lower()
    allowed = tuple(allowed) if allowed is not None else tuple(SUFFIX_KINDS)
    if suffix not in allowed or suffix not in SUFFIX_KINDS:
        raise _fail(error, f"{path.name}: unsupported file type {suffix!r}; use {', '.join(allowed)}",
                    "unsupported file")
    return SUFFIX_KINDS[suffix]


def _check_file(path: Path) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")


def _open(path: Path, error: type[Exception]):
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file") from None
    except OSError as exc:  # a folder, no permission, ...
        raise _fail(error, f"{path.name}: cannot read ({exc.strerror or _one_line(exc)})", "unreadable file") from None


def _sniff(head: bytes, path: Path, kind: str, error: type[Exception]) -> None:
    """Refuse files that are plainly not text of the expected kind, saying what they look like."""
    what = {"jsonl": "JSON lines text", "json": "JSON text", "csv": "CSV text", "tsv": "TSV text"}[kind]
    if head.startswith(b"PAR1"):
        raise _fail(error, f"{path.name}: a Parquet file, not {what}; name it .parquet", "binary file")
    if head.startswith(b"\x1f\x8b"):
        raise _fail(error, f"{path.name}: gzip-compressed, not {what}; decompress it first", "binary file")
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise _fail(error, f"{path.name}: UTF-16 text; omrl reads UTF-8, save the file as UTF-8", "bad encoding")
    nul = head.find(b"\x00")
    if nul >= 0:
        line = head.count(b"\n", 0, nul) + 1
        raise _fail(error, f"{path.name}: binary data, not {what} (a NUL byte at line {line})", "binary file")


def _empty(path: Path, error: type[Exception]) -> Exception:
    return _fail(error, f"{path.name}: empty file, no records", "empty file")


def _utf8_problem(exc: UnicodeDecodeError, data: bytes, first_line: int = 1) -> str:
    """'line N is not valid UTF-8 (byte 0x.. at column C)' for a decode error inside `data`."""
    line = data.count(b"\n", 0, exc.start) + first_line
    column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
    return f"line {line} is not valid UTF-8 (byte 0x{data[exc.start]:02x} at column {column})"


def _decode_text(data: bytes, path: Path, error: type[Exception]) -> str:
    if data.startswith(_BOM):
        data = data[len(_BOM):]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(error, f"{path.name} {_utf8_problem(exc, data)}", "bad encoding") from None


def _read_bytes(path: Path, error: type[Exception]) -> bytes:
    with _open(path, error) as handle:
        try:
            return handle.read()
        except OSError as exc:
            raise _fail(error, f"{path.name}: cannot read ({exc.strerror or _one_line(exc)})",
                        "unreadable file") from None


def _depth_hint() -> str:
    return f"nested too deeply to read (over {sys.getrecursionlimit()} levels of brackets)"


def lone_surrogate(value: Any, at: str = "") -> str | None:
    """Where in a parsed JSON value a lone surrogate sits ("messages[0].content", "the key 'a\\udc00'"), or None."""
    if isinstance(value, str):
        return (at or "the value") if _SURROGATE.search(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and _SURROGATE.search(key):
                return f"the key {key.encode('utf-8', 'backslashreplace').decode()!r}" + (f" in {at}" if at else "")
            found = lone_surrogate(item, f"{at}.{key}" if at else str(key))
            if found:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = lone_surrogate(item, f"{at}[{index}]")
            if found:
                return found
    return None


def _surrogate_problem(text: str, value: Any) -> str | None:
    """Why `value`, parsed from the JSON `text`, cannot be stored: a lone surrogate, or None (fast when none)."""
    if not _SURROGATE_ESCAPE.search(text):
        return None
    where = lone_surrogate(value)
    if where is None:
        return None  # only escapes of whole pairs, which JSON parsing joins into one character
    return (f"holds a lone surrogate (a \\uD800-\\uDFFF escape without its pair) in {where}: not Unicode text, "
            "so it cannot be stored; fix or remove that escape")


# ---------------------------------------------------------------- JSON lines


def iter_jsonl(path: str | Path, *, error: type[Exception] = ReadError, bad_lines: str = "raise") -> Iterator[Record]:
    """Records of a JSON-lines file; blank lines are skipped. A line that does not parse raises (naming the
    line), or with bad_lines="yield" comes as a BadLine record so a caller can skip and count it."""
    path = Path(path)
    _check_file(path)
    index = 0
    with _open(path, error) as handle:
        head = handle.read(_SNIFF_BYTES)
        _sniff(head, path, "jsonl", error)
        handle.seek(0)
        for number, raw in enumerate(handle, 1):
            if number == 1 and raw.startswith(_BOM):
                raw = raw[len(_BOM):]
            if not raw.strip():
                continue
            value = _parse_line(raw, number)
            if isinstance(value, BadLine) and bad_lines != "yield":
                raise _fail(error, f"{path.name} {value.error}", value.reason)
            yield Record(index, f"{path.name} line {number}", value)
            index += 1
    if index == 0:
        raise _empty(path, error)


def _parse_line(raw: bytes, number: int) -> Any:
    if b"\x00" in raw:
        return BadLine(number, f"line {number} holds binary data (a NUL byte), not JSON text", "binary data")
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return BadLine(number, _utf8_problem(exc, raw, number), "bad encoding")
    try:
        value = json.loads(line)
    except json.JSONDecodeError as exc:
        cut = " (the line ends there: cut short?)" if exc.pos >= len(line.rstrip()) else ""
        return BadLine(number, f"line {number} is not valid JSON ({exc.msg}: column {exc.colno}){cut}")
    except RecursionError:
        return BadLine(number, f"line {number} is {_depth_hint()}", "too deep")
    except ValueError as exc:  # e.g. an integer longer than Python's 4300-digit conversion limit
        return BadLine(number, f"line {number} is not readable JSON ({_one_line(exc)})")
    problem = _surrogate_problem(line, value)
    if problem:
        return BadLine(number, f"line {number} {problem}", "bad encoding")
    return value


# ---------------------------------------------------------------- JSON documents


def read_json(path: str | Path, *, error: type[Exception] = ReadError) -> Any:
    """The JSON document of a file. A top-level list is parsed item by item, so an error names the item
    (and its line and column); other documents name the line and column of the error."""
    path = Path(path)
    _check_file(path)
    data = _read_bytes(path, error)
    _sniff(data[:_SNIFF_BYTES], path, "json", error)
    text = _decode_text(data, path, error)
    start = _skip_space(text, 0)
    if start == len(text):
        raise _empty(path, error)
    if text[start] == "[":
        return list(_json_items(text, start, path, error))
    decoder = json.JSONDecoder()
    try:
        value, end = decoder.raw_decode(text, start)
    except json.JSONDecodeError as exc:
        raise _fail(error, f"{path.name} is not valid JSON ({exc.msg}: line {exc.lineno} column {exc.colno})"
                    f"{_cut_hint(exc, text)}", "bad json") from None
    except RecursionError:
        raise _fail(error, f"{path.name}: the JSON document is {_depth_hint()}", "too deep") from None
    except ValueError as exc:
        raise _fail(error, f"{path.name}: not readable JSON ({_one_line(exc)})", "bad json") from None
    _trailing(text, end, path, error)
    problem = _surrogate_problem(text, value)
    if problem:
        raise _fail(error, f"{path.name} {problem}", "bad encoding")
    return value


def _cut_hint(exc: json.JSONDecodeError, text: str) -> str:
    return " (the file ends there: cut short?)" if exc.pos >= len(text.rstrip()) else ""


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _trailing(text: str, end: int, path: Path, error: type[Exception]) -> None:
    end = _skip_space(text, end)
    if end < len(text):
        raise _fail(error, f"{path.name} line {_line_of(text, end)}: extra data after the JSON document "
                    "(JSON lines? name the file .jsonl)", "bad json")


def _json_items(text: str, start: int, path: Path, error: type[Exception]) -> Iterator[Any]:
    decoder = json.JSONDecoder()
    pos = _skip_space(text, start + 1)
    if pos < len(text) and text[pos] == "]":
        _trailing(text, pos + 1, path, error)
        return
    index = 0
    while True:
        where = f"{path.name} item {index}"
        if pos >= len(text):
            raise _fail(error, f"{where} (line {_line_of(text, pos)}): the JSON list is cut short before this "
                        "item (no closing ']')", "bad json")
        try:
            value, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise _fail(error, f"{where} is not valid JSON ({exc.msg}: line {exc.lineno} column {exc.colno})"
                        f"{_cut_hint(exc, text)}", "bad json") from None
        except RecursionError:
            raise _fail(error, f"{where} (line {_line_of(text, pos)}) is {_depth_hint()}", "too deep") from None
        except ValueError as exc:
            raise _fail(error, f"{where} (line {_line_of(text, pos)}) is not readable JSON ({_one_line(exc)})",
                        "bad json") from None
        problem = _surrogate_problem(text[pos:end], value)
        if problem:
            raise _fail(error, f"{where} (line {_line_of(text, pos)}) {problem}", "bad encoding")
        yield value
        pos = _skip_space(text, end)
        if pos >= len(text):
            raise _fail(error, f"{where} (line {_line_of(text, end)}): the JSON list is cut short after this "
                        "item (no closing ']')", "bad json")
        if text[pos] == "]":
            _trailing(text, pos + 1, path, error)
            return
        if text[pos] != ",":
            raise _fail(error, f"{where} (line {_line_of(text, pos)} column {pos - text.rfind(chr(10), 0, pos)}): "
                        "expected ',' or ']' after this item", "bad json")
        pos = _skip_space(text, pos + 1)
        index += 1


def iter_json(path: str | Path, *, error: type[Exception] = ReadError, single: bool = False) -> Iterator[Record]:
    """Records of a JSON file holding a list of records, or (single=True) one object that is one record."""
    path = Path(path)
    data = read_json(path, error=error)
    if isinstance(data, list):
        for index, value in enumerate(data):
            yield Record(index, f"{path.name} item {index}", value)
    elif single and isinstance(data, dict):
        yield Record(0, f"{path.name} item 0", data)
    else:
        wanted = "a JSON list of records" + (" or one object" if single else "")
        raise _fail(error, f"{path.name}: expected {wanted}, got {json_kind(data)}", "not records")


def json_kind(value: Any) -> str:
    """A value's JSON type for error messages (never the value itself: it may be huge, or a dict whose
    repr would become an id)."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, float):
        return f"a number ({value!r})"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, str):
        return "a string"
    return "null" if value is None else type(value).__name__


# ---------------------------------------------------------------- CSV


def iter_csv(path: str | Path, *, error: type[Exception] = ReadError, delimiter: str = ",") -> Iterator[Record]:
    """Rows of a CSV (or TSV) file with a header, as dicts of strings. Blank lines are skipped; a row with
    more or fewer fields than the header is refused naming its line (never padded or cut)."""
    path = Path(path)
    _check_file(path)
    data = _read_bytes(path, error)
    _sniff(data[:_SNIFF_BYTES], path, "tsv" if delimiter == "\t" else "csv", error)
    text = _decode_text(data, path, error)
    if not text.strip():
        raise _empty(path, error)
    # strict: a quote left open (or text after a closing quote) is an error, not a field swallowing the rest
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    header: list[str] | None = None
    index, line = 0, 1
    while True:
        line = reader.line_num + 1  # where the next row starts (a quoted field may span lines)
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            detail = _one_line(exc)
            if "end of data" in detail:
                detail += ": a quoted field is never closed"
            span = f"line {line}" if reader.line_num <= line else f"line {line} (the row runs to line {reader.line_num})"
            raise _fail(error, f"{path.name} {span}: not valid CSV ({detail})", "bad csv") from None
        if not row or (len(row) == 1 and not row[0].strip() and header is not None and len(header) > 1):
            continue  # a blank line
        if header is None:
            header = row
            seen: set[str] = set()
            for name in header:
                if name in seen:
                    raise _fail(error, f"{path.name} line {line}: column {name!r} appears twice in the header",
                                "bad csv")
                seen.add(name)
            continue
        if len(row) != len(header):
            raise _fail(error, f"{path.name} line {line}: {len(row)} fields, but the header (line 1) has "
                        f"{len(header)}; quote fields that hold the delimiter", "ragged csv")
        yield Record(index, f"{path.name} line {line}", dict(zip(header, row, strict=True)))
        index += 1


# ---------------------------------------------------------------- Parquet


def _parquet_file(path: Path, error: type[Exception]):
    import pyarrow as pa
    import pyarrow.parquet as pq

    _check_file(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise _fail(error, f"{path.name}: cannot read ({exc.strerror or _one_line(exc)})", "unreadable file") from None
    if size == 0:
        raise _empty(path, error)
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError, ValueError) as exc:
        with open(path, "rb") as handle:
            head = handle.read(16).lstrip()
        hint = " (it looks like JSON text; name it .json or .jsonl)" if head[:1] in (b"{", b"[") else ""
        raise _fail(error, f"{path.name}: cannot decode Parquet file{hint}: {_one_line(exc)}", "bad parquet") from None


def parquet_schema(path: str | Path, *, error: type[Exception] = ReadError):
    """The Arrow schema of a Parquet file (from its footer); a file that is not Parquet is a clean error."""
    path = Path(path)
    parquet = _parquet_file(path, error)
    try:
        return parquet.schema_arrow
    finally:
        parquet.close()


def iter_parquet(path: str | Path, *, error: type[Exception] = ReadError, batch_rows: int = 1024) -> Iterator[Record]:
    """Rows of a Parquet file as dicts, one row group at a time; a row group whose pages do not decode is
    an error naming the file and the row group."""
    import pyarrow as pa

    path = Path(path)
    parquet = _parquet_file(path, error)
    try:
        index = 0
        for group in range(parquet.num_row_groups):
            rows = parquet.metadata.row_group(group).num_rows
            where = f"{path.name} row group {group} (rows {index}-{index + rows - 1})"
            try:
                table = parquet.read_row_group(group)
            except (pa.ArrowException, OSError, ValueError, EOFError) as exc:
                raise _fail(error, f"{where}: cannot decode: {_one_line(exc)}", "bad parquet") from None
            for batch in table.to_batches(max_chunksize=batch_rows):
                try:
                    values = batch.to_pylist()
                except (pa.ArrowException, ValueError, OverflowError) as exc:
                    raise _fail(error, f"{where}: cannot convert values: {_one_line(exc)}", "bad parquet") from None
                for value in values:
                    yield Record(index, f"{path.name} row {index}", value)
                    index += 1
    finally:
        parquet.close()


# ---------------------------------------------------------------- any file


def iter_records(path: str | Path, *, allowed: Iterable[str] | None = None, error: type[Exception] = ReadError,
                 bad_lines: str = "raise", single_json: bool = False) -> Iterator[Record]:
    """Records of a .jsonl/.ndjson, .json/.traj, .csv/.tsv or .parquet file, chosen by extension.

    allowed: the extensions this caller takes (others are refused naming them); error: the ValueError
    subclass to raise; bad_lines="yield": broken JSONL lines come as BadLine records instead of raising;
    single_json: a JSON file holding one object is one record. A file with no content is an error.
    """
    path = Path(path)
    _check_file(path)
    kind = _kind(path, allowed, error)
    if kind == "jsonl":
        return iter_jsonl(path, error=error, bad_lines=bad_lines)
    if kind == "json":
        return iter_json(path, error=error, single=single_json or path.suffix.lower() == ".traj")
    if kind in ("csv", "tsv"):
        return iter_csv(path, error=error, delimiter="\t" if kind == "tsv" else ",")
    return iter_parquet(path, error=error)
