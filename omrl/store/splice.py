"""Merging Parquet parts without decoding them: their row groups copied byte for byte under one new footer.

A compaction of parts whose row groups are already of a useful size (appends cut them by bytes,
layout.row_group_sizes) gains nothing from decoding and encoding every page again, which cost more than
writing the same rows as JSONL (benchmarks/store_bench.py). A spliced part is the parts' column chunks
in order, and a footer that lists their row groups with every file offset moved by where its chunk now
starts; the pages (and their checksums) are unchanged. Parts that differ in Parquet or Arrow schema, or
whose row groups are small (many small appends: those are merged by encoding them again), are not
spliced. The footer is Parquet's Thrift compact encoding, read and written here field by field, fields
this module does not touch kept as they are.
"""

from __future__ import annotations

import base64
import struct
from typing import Any

import pyarrow as pa

MAGIC = b"PAR1"
ARROW_SCHEMA_KEY = b"ARROW:schema"
# FileMetaData / RowGroup / ColumnChunk / ColumnMetaData field ids (parquet.thrift) this module reads or moves
_FILE_SCHEMA, _FILE_ROWS, _FILE_GROUPS, _FILE_KEYS, _FILE_ORDERS, _FILE_ENCRYPTION = 2, 3, 4, 5, 7, 8
_GROUP_COLUMNS, _GROUP_BYTES, _GROUP_OFFSET, _GROUP_ORDINAL = 1, 2, 5, 7
_CHUNK_OFFSET, _CHUNK_META, _CHUNK_OFFSET_INDEX, _CHUNK_COLUMN_INDEX, _CHUNK_CRYPTO = 2, 3, 4, 6, 8
_META_OFFSETS = (9, 10, 11, 14)  # data, index and dictionary page offsets; bloom filter offset
_STRUCT, _LIST, _SET, _MAP = 12, 9, 10, 11


class ThriftError(ValueError):
    """A footer this module cannot read (not Thrift compact, or cut short)."""


# ------------------------------------------------------------------------ Thrift compact protocol


def _varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _unzigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _put_varint(out: bytearray, n: int) -> None:
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


class Raw(bytes):
    """A field's encoded value, kept as it was read (a part of the footer this module does not change)."""


ALL = None  # a spec that decodes everything below it
# What `read_struct` decodes of a footer (field id -> spec of its struct or of its list's structs): the row
# groups' offsets and the key-value metadata; a column's statistics, encodings and the schema stay Raw.
_COLUMN_CHUNK: dict[int, Any] = {_CHUNK_META: {}}
_FOOTER_SPEC = {_FILE_GROUPS: {_GROUP_COLUMNS: _COLUMN_CHUNK}, _FILE_KEYS: ALL}


def _skip(buf: bytes | memoryview, pos: int, kind: int) -> int:
    """The position after a value of `kind` at `pos`."""
    if kind == 3:
        return pos + 1
    if kind in (4, 5, 6):
        while buf[pos] >= 0x80:
            pos += 1
        return pos + 1
    if kind == 7:
        return pos + 8
    if kind == 8:
        n, pos = _varint(buf, pos)
        return pos + n
    if kind in (_LIST, _SET):
        header = buf[pos]
        pos += 1
        size, element = header >> 4, header & 0x0F
        if size == 15:
            size, pos = _varint(buf, pos)
        if element in (1, 2, 3):
            return pos + size
        for _ in range(size):
            pos = _skip(buf, pos, element)
        return pos
    if kind == _MAP:
        size, pos = _varint(buf, pos)
        if size == 0:
            return pos
        types = buf[pos]
        pos += 1
        for _ in range(size):
            pos = _skip(buf, _skip(buf, pos, types >> 4), types & 0x0F)
        return pos
    if kind == _STRUCT:
        while True:
            header = buf[pos]
            pos += 1
            if header == 0:
                return pos
            if not header >> 4:
                pos = _varint(buf, pos)[1]
            if header & 0x0F not in (1, 2):
                pos = _skip(buf, pos, header & 0x0F)
    raise ThriftError(f"unknown Thrift compact type {kind} at byte {pos}")


def _read_value(buf: bytes | memoryview, pos: int, kind: int, spec: dict | None = ALL) -> tuple[Any, int]:
    if kind == 3:  # byte
        return buf[pos], pos + 1
    if kind in (4, 5, 6):  # i16, i32, i64
        n, pos = _varint(buf, pos)
        return _unzigzag(n), pos
    if kind == 7:  # double
        return buf[pos:pos + 8], pos + 8
    if kind == 8:  # binary
        n, pos = _varint(buf, pos)
        return bytes(buf[pos:pos + n]), pos + n
    if kind in (_LIST, _SET):
        header = buf[pos]
        pos += 1
        size, element = header >> 4, header & 0x0F
        if size == 15:
            size, pos = _varint(buf, pos)
        items = []
        for _ in range(size):
            if element in (1, 2):  # a bool in a container is a byte: 1 true
                items.append(buf[pos] == 1)
                pos += 1
            else:
                item, pos = _read_value(buf, pos, element, spec)
                items.append(item)
        return (element, items), pos
    if kind == _MAP:
        size, pos = _varint(buf, pos)
        if size == 0:
            return (0, []), pos
        types = buf[pos]
        pos += 1
        pairs = []
        for _ in range(size):
            key, pos = _read_value(buf, pos, types >> 4)
            value, pos = _read_value(buf, pos, types & 0x0F)
            pairs.append((key, value))
        return (types, pairs), pos
    if kind == _STRUCT:
        return read_struct(buf, pos, spec)
    raise ThriftError(f"unknown Thrift compact type {kind} at byte {pos}")


def read_struct(buf: bytes | memoryview, pos: int = 0, spec: dict | None = ALL) -> tuple[list[list], int]:
    """A Thrift compact struct at `pos` as [field id, type, value] lists, in order; and the position after it.
    With a `spec`, only scalars and the container fields it names (with their own specs) are decoded; other
    containers are Raw."""
    fields: list[list] = []
    last = 0
    while True:
        header = buf[pos]
        pos += 1
        if header == 0:
            return fields, pos
        kind, delta = header & 0x0F, header >> 4
        if delta:
            field = last + delta
        else:
            n, pos = _varint(buf, pos)
            field = _unzigzag(n)
        if kind in (1, 2):  # a bool field is its type
            value: Any = kind == 1
        elif spec is not ALL and kind in (_LIST, _SET, _MAP, _STRUCT) and field not in spec:
            end = _skip(buf, pos, kind)
            value, pos = Raw(buf[pos:end]), end
        else:
            value, pos = _read_value(buf, pos, kind, ALL if spec is ALL else spec.get(field))
        fields.append([field, kind, value])
        last = field


def _write_value(out: bytearray, kind: int, value: Any) -> None:
    if isinstance(value, Raw):
        out += value
    elif kind == 3:
        out.append(value & 0xFF)
    elif kind in (4, 5, 6):
        _put_varint(out, _zigzag(value))
    elif kind == 7:
        out += value
    elif kind == 8:
        _put_varint(out, len(value))
        out += value
    elif kind in (_LIST, _SET):
        element, items = value
        if len(items) < 15:
            out.append((len(items) << 4) | element)
        else:
            out.append(0xF0 | element)
            _put_varint(out, len(items))
        for item in items:
            if element in (1, 2):
                out.append(1 if item else 2)
            else:
                _write_value(out, element, item)
    elif kind == _MAP:
        types, pairs = value
        _put_varint(out, len(pairs))
        if pairs:
            out.append(types)
            for key, item in pairs:
                _write_value(out, types >> 4, key)
                _write_value(out, types & 0x0F, item)
    elif kind == _STRUCT:
        write_struct(out, value)
    else:
        raise ThriftError(f"unknown Thrift compact type {kind}")


def write_struct(out: bytearray, fields: list[list]) -> None:
    """Append the Thrift compact encoding of `fields` (as `read_struct` gives them) to `out`."""
    last = 0
    for field, kind, value in fields:
        header = (1 if value else 2) if kind in (1, 2) else kind
        if 0 < field - last <= 15:
            out.append(((field - last) << 4) | header)
        else:
            out.append(header)
            _put_varint(out, _zigzag(field))
        if kind not in (1, 2):
            _write_value(out, kind, value)
        last = field
    out.append(0)


def _get(fields: list[list], field: int) -> Any:
    """The field's [id, type, value] list, or None; Any: what its value holds depends on the field."""
    return next((f for f in fields if f[0] == field), None)


# ---------------------------------------------------------------------------------------- parts


class Footer:
    """A Parquet file's bytes and its footer, parsed: where its column chunks end, its row groups."""

    def __init__(self, data: bytes, name: str = "part"):
        if len(data) < 12 or data[:4] != MAGIC or data[-4:] != MAGIC:
            raise ThriftError(f"{name}: not a Parquet file (no PAR1 at both ends)")
        length = struct.unpack("<I", data[-8:-4])[0]
        self.data_end = len(data) - 8 - length
        self.data = data
        try:
            self.fields, _ = read_struct(memoryview(data)[self.data_end:len(data) - 8], 0, _FOOTER_SPEC)
        except IndexError:
            raise ThriftError(f"{name}: its footer is cut short") from None

    def value(self, field: int) -> Any:
        found = _get(self.fields, field)
        return None if found is None else found[2]

    @property
    def groups(self) -> list[list[list]]:
        groups = self.value(_FILE_GROUPS)
        return [] if groups is None else groups[1]

    @property
    def keys(self) -> dict[bytes, bytes]:
        listed = self.value(_FILE_KEYS)
        out = {}
        for entry in [] if listed is None else listed[1]:
            key, value = _get(entry, 1), _get(entry, 2)
            out[key[2]] = value[2] if value else b""
        return out

    def arrow_schema(self) -> pa.Schema | None:
        encoded = self.keys.get(ARROW_SCHEMA_KEY)
        if encoded is None:
            return None
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(encoded)))


def spliceable(footers: list[Footer], schema: pa.Schema, min_group_bytes: int) -> bool:
    """Whether these parts can be spliced into one of `schema`: each holds that Arrow schema (a part of an
    older schema is conformed by encoding it again), all share one Parquet schema and column order, none is
    encrypted or has a page index or bloom filter, and their row groups average `min_group_bytes` or more."""
    if not footers:
        return False
    first = footers[0]
    groups = [g for f in footers for g in f.groups]
    if not groups or sum(_get(g, _GROUP_BYTES)[2] for g in groups) < min_group_bytes * len(groups):
        return False
    for footer in footers:
        if footer.value(_FILE_ENCRYPTION) is not None or footer.value(_FILE_SCHEMA) != first.value(_FILE_SCHEMA):
            return False
        if footer.value(_FILE_ORDERS) != first.value(_FILE_ORDERS):
            return False
        arrow = footer.arrow_schema()
        if arrow is None or not arrow.equals(schema, check_metadata=False):
            return False
        for group in footer.groups:
            for chunk in _get(group, _GROUP_COLUMNS)[2][1]:
                if any(_get(chunk, f) is not None for f in (_CHUNK_OFFSET_INDEX, _CHUNK_COLUMN_INDEX, _CHUNK_CRYPTO)):
                    return False
                if _get(_get(chunk, _CHUNK_META)[2], 14) is not None:
                    return False
    return True


def _moved(group: list[list], shift: int, ordinal: int) -> list[list]:
    """A row group's footer entry with every file offset moved by `shift` bytes, numbered `ordinal`."""
    out = []
    for field, kind, value in group:
        if field == _GROUP_COLUMNS:
            chunks = []
            for chunk in value[1]:
                moved = []
                for f, k, v in chunk:
                    if f == _CHUNK_OFFSET and v:
                        v = v + shift
                    elif f == _CHUNK_META:
                        v = [[mf, mk, mv + shift if mf in _META_OFFSETS else mv] for mf, mk, mv in v]
                    moved.append([f, k, v])
                chunks.append(moved)
            value = (value[0], chunks)
        elif field == _GROUP_OFFSET and value:
            value = value + shift
        elif field == _GROUP_ORDINAL:
            value = ordinal
        out.append([field, kind, value])
    return out


def splice(footers: list[Footer], schema: pa.Schema, write) -> None:
    """Write, through `write(bytes)`, one Parquet file holding the row groups of `footers` in order (their
    pages as they are), whose Arrow schema is `schema` and whose key-value metadata is `schema`'s."""
    metadata = dict(schema.metadata or {})
    keys = [[[1, 8, k], [2, 8, v]] for k, v in metadata.items() if k != ARROW_SCHEMA_KEY]
    keys.append([[1, 8, ARROW_SCHEMA_KEY], [2, 8, base64.b64encode(schema.serialize().to_pybytes())]])
    write(MAGIC)
    at = len(MAGIC)
    groups: list[list] = []
    for footer in footers:
        shift = at - len(MAGIC)
        groups += [_moved(group, shift, len(groups) + i) for i, group in enumerate(footer.groups)]
        write(memoryview(footer.data)[len(MAGIC):footer.data_end])
        at += footer.data_end - len(MAGIC)
    fields = []
    for field, kind, value in footers[0].fields:
        if field == _FILE_ROWS:
            value = sum(f.value(_FILE_ROWS) for f in footers)
        elif field == _FILE_GROUPS:
            value = (_STRUCT, groups)
        elif field == _FILE_KEYS:
            continue
        fields.append([field, kind, value])
    fields.append([_FILE_KEYS, _LIST, (_STRUCT, keys)])
    fields.sort(key=lambda f: f[0])
    encoded = bytearray()
    write_struct(encoded, fields)
    write(bytes(encoded))
    write(struct.pack("<I", len(encoded)))
    write(MAGIC)
