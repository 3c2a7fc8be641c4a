"""Text search over a store's messages: a per-part index that is exact by itself, the scan where there is none.

Semantics (the one definition; the index and the full scan both follow it):

- The searched text of a message is its `content` (reasoning and tool-call arguments are not searched;
  SQL reaches those). A message without content matches nothing.
- Tokens: the text lower-cased (`str.lower`), then each maximal run of Unicode word characters (Python's
  `\\w`: letters, digits, underscore, in any script) is one token. The query is tokenised the same way.
- A query is whitespace-separated terms and "quoted phrases". A term that is one token is a word; a
  phrase, or a term that splits into several tokens (`os.path`, `don't`), must occur as consecutive tokens.
  Words match whole tokens only (`palindrome` does not match `is_palindrome`); a term of word characters
  and `*` is a pattern, matching a token where each `*` stands for any word characters (`palin*` a prefix,
  `*palindrome*` a part of a token).
  A message is a hit when every word, phrase and pattern occurs in it: matches never span two messages.
- A hit is one message: (trajectory_id, position, role, snippet), ordered by trajectory_id then position,
  `limit` taken after ordering. Rows of every live trajectories part are searched.

Index: one per trajectories part, in a hidden folder beside it (`.part-X.parquet.search/`, written in a
temporary folder and renamed in whole, never matching the `part-*.parquet` names the store and its dataset
card list). It holds

- a tantivy index with one document per distinct message text of the part (a system prompt or a tool
  output repeated in many messages is indexed once), its tokens made by `tokenize` above and handed to
  tantivy joined by spaces, split again by tantivy's ASCII-whitespace tokenizer (positions kept only with
  POSITIONS): tantivy never tokenises on its own, so it cannot disagree with the scan. A token longer than MAX_TERM_BYTES is
  indexed as its first bytes plus a mark no token holds (tantivy drops terms over 64 KB); a query with such a
  token gets a superset from the index and only those candidate messages are read and checked;
- `messages.parquet`: for every message with a token, (text, row, position, role), sorted by text;
- `rows.parquet`: the trajectory id of each row of the part.

So a search is tantivy's boolean query (every word a term; every pattern a regex over the terms, where only
texts holding a cut term are read and checked; every phrase a phrase query over positions when the index has
them, else all its terms, whose candidate texts are then read and checked), its text numbers mapped to
messages and ids by the two tables: no message text is read to decide a word's hits. Patterns are a query
over the same index: its format (INDEX_VERSION) is unchanged by them.
Text is read only for the snippets of the hits returned (after `limit`; none with `snippets=False` or
`search_ids`). A part without a usable index (an old store, an index of an older version, a crash between
the part and its index, a part rewritten since) is scanned with the same rules instead.

Measured by benchmarks/search_bench.py (2,000 store_bench trajectories, one compacted part): ids-only
searches 85-380x faster than the scan, full hits with snippets 2-3x (their text is read) or 24x for a
rare phrase; the index is 0.30x the part's bytes without positions (the default; 0.89x with them,
POSITIONS). The build reads a part a row group at a time (the next one decompressed meanwhile) and
tokenises in small chunks, so tantivy's thread indexes while Python reads and tokenises the next: on a
5,000-row part 0.71 s, against 1.09 s when the part was read whole first and tokenised in 64 MB chunks;
at store_bench --n 100000 about as long as writing the JSONL (index_ratio 0.82, 1.25, 0.99, 1.08 in four
runs on one VM as this build took shape), most of it tantivy's own indexing of ~1 GB of distinct text.
A document per message instead of per distinct text: 1.8x the bytes, 2.3x the build time.

Why tantivy (maintained, Rust, wheels for every platform): positions and phrase queries, fast fields, a
compact term dictionary. DuckDB's fts extension cannot be installed offline, and its index lives in a
database file rather than beside immutable parts.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import re
import shutil
import threading
import uuid
import warnings
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from omrl.errors import UsageError
from omrl.store.commit import PART_INDEXES, PartIndex
from omrl.store.durable import fsync_path, is_stale  # is_stale: the one rule for dead writers' leftovers
from omrl.store.parts import retry_vanished
from omrl.store.storage import StorePath, local_path

if TYPE_CHECKING:  # a type only: any store; search needs only the reading half of Store
    from omrl.store.commit import StoreWriter
    from omrl.store.parts import StoreReader as Store

TOKEN = re.compile(r"\w+")
_PATTERN = re.compile(r"[\w*]*\w[\w*]*")  # a term of word characters and `*`, at least one word character
INDEX_SUFFIX = ".search"
INDEX_VERSION = 3  # 3: exact documents per distinct text, positions optional (2: blocks of rows, checked on read)
META_FILE = "omrl-search.json"
MESSAGES_FILE = "messages.parquet"
ROWS_FILE = "rows.parquet"
# Longer tokens (hex blobs, minified code) are indexed cut to this many bytes, which keeps the term
# dictionary small; the few queries holding one are checked on their candidates' text.
MAX_TERM_BYTES = 64
CUT_MARK = "\u2026"  # ends a cut term: not a word character, so a cut term never equals a whole token
# Token positions in the index would answer phrases from tantivy alone, but triple its size (search_bench:
# 0.89x the part instead of 0.30x, nearly doubling the store on disk). Without them a phrase's candidates
# (texts holding all its tokens) are read and checked; words stay exact from the index alone either way.
POSITIONS = False
SNIPPET_CHARS = 160
# tantivy's writer: one thread for a part of the usual size (the index is built at compaction and repair,
# often on shared cores; two threads write two segments, slower to build below this many texts).
TANTIVY_HEAP_BYTES = 64_000_000
TWO_THREADS_BYTES = 160_000_000  # about 200,000 texts of store_bench's corpus
# Small chunks keep both cores busy: tantivy's thread indexes one chunk while Python tokenises the next
# (store_bench, 5,000 rows: 64 MB chunks 1.09 s, 4 MB 0.82 s, 1 MB 0.81 s).
TOKENISE_CHUNK_BYTES = 4 * 1024 * 1024
LOADED_CACHE = 32  # opened indexes kept per process (a viewer searches the same parts again and again)
_FIELD = "tokens"
_TEXT = "text"  # fast field: the document's text number, the key of messages.parquet
_ANALYZER = "omrl_tokens"  # splits on the spaces `token_texts` put between tokens: tantivy splits nothing else
_HITS_SCHEMA = pa.schema([
    pa.field("trajectory_id", pa.string()),
    pa.field("position", pa.int32()),
    pa.field("role", pa.string()),
])
RESULT_SCHEMA = _HITS_SCHEMA.append(pa.field("snippet", pa.string()))
_BUILDING = re.compile(r"\.search\.(?:building|removing)-(\d+)-[0-9a-f]+$")


class SearchIndexWarning(UserWarning):
    """A part's index that could not be built or used: the part stands, and searches scan it (same results,
    slower)."""


def tokenize(text: str) -> list[str]:
    """The tokens of `text`: lower-cased, maximal runs of Unicode word characters, in order."""
    return TOKEN.findall(text.lower())


def index_term(token: str) -> str:
    """The term the index holds for `token`: itself, or when longer than MAX_TERM_BYTES its first bytes
    (whole characters) and CUT_MARK."""
    if len(token) * 4 <= MAX_TERM_BYTES:  # a character is at most 4 bytes: short tokens skip the encoding
        return token
    raw = token.encode()
    if len(raw) <= MAX_TERM_BYTES:
        return token
    return raw[:MAX_TERM_BYTES].decode("utf-8", "ignore") + CUT_MARK  # "ignore": a character cut in two goes


# ------------------------------------------------------------------------------------------ queries


@dataclass(frozen=True)
class Query:
    """A parsed query: tokens that must all occur in a message, and token runs that must occur in order."""

    words: tuple[str, ...]  # every token of the query, phrases' included (a phrase's tokens occur too)
    phrases: tuple[tuple[str, ...], ...]

    patterns: tuple[str, ...] = ()  # terms with `*` (any word characters): `palin*`, `*palindrome*`

    def matches(self, text: str | None) -> bool:
        """Whether one message's text is a hit."""
        if not text:
            return False
        lowered = text.lower()
        pieces = [piece for pattern in self.patterns for piece in pattern.split("*") if piece]
        if any(word not in lowered for word in (*self.words, *pieces)):  # substring test: cheap, never drops a hit
            return False
        tokens = TOKEN.findall(lowered)
        if not set(self.words) <= set(tokens):
            return False
        if not all(any(_pattern_regex(p).fullmatch(token) for token in tokens) for p in self.patterns):
            return False
        return all(_has_run(tokens, phrase) for phrase in self.phrases)

    @property
    def index_is_exact(self) -> bool:
        """Whether the index alone decides this query (no token of it is cut in the index)."""
        return all(index_term(word) == word for word in self.words)


@functools.lru_cache(maxsize=256)
def _pattern_regex(pattern: str) -> re.Pattern:
    """A pattern (word characters and `*`) as a regex over one token: each `*` any word characters."""
    return re.compile(r"\w*".join(map(re.escape, pattern.split("*"))))


def _index_regex(pattern: str) -> str:
    """A pattern as tantivy's regex over the index's terms (the whole term must match)."""
    return ".*".join(map(re.escape, pattern.split("*")))


def _has_run(tokens: list[str], phrase: tuple[str, ...]) -> bool:
    first, size = phrase[0], len(phrase)
    return any(tokens[i:i + size] == list(phrase) for i, token in enumerate(tokens) if token == first)


def parse_query(text: str) -> Query:
    """Parse a search query (words and "quoted phrases"); UsageError when it has no words or a stray quote."""
    if not isinstance(text, str):
        raise UsageError(f"a search query is text, not {type(text).__name__}")
    if text.count('"') % 2:
        raise UsageError(f'the search {text!r} has an unclosed quote; close each "phrase" with a second "')
    words: dict[str, None] = {}  # ordered set: the first word gives the snippet
    phrases: dict[tuple[str, ...], None] = {}
    patterns: dict[str, None] = {}
    for match in re.finditer(r'"([^"]*)"|([^\s"]+)', text):
        term = match.group(2)
        if term is not None and "*" in term and _PATTERN.fullmatch(term):
            patterns[re.sub(r"\*+", "*", term.lower())] = None
            continue
        tokens = tokenize(match.group(1) if match.group(1) is not None else term)
        words.update(dict.fromkeys(tokens))
        if len(tokens) > 1:
            phrases[tuple(tokens)] = None
    if not words and not patterns:
        raise UsageError(f"the search {text!r} has no words (letters or digits) to look for")
    return Query(tuple(words), tuple(phrases), tuple(patterns))


# ------------------------------------------------------------------------------------- part contents


@dataclass
class _Messages:
    """A part's messages, flattened: row in the part, position in its conversation, role, text id; and
    the distinct texts the ids point at (a text repeated across messages is held once)."""

    row: np.ndarray  # row number in the part
    local: np.ndarray  # row in `ids`
    position: np.ndarray
    role: pa.Array
    text_id: np.ndarray  # -1: no content
    dictionary: pa.Array  # the distinct texts
    ids: pa.Array  # trajectory id of each row
    _texts: list[str] | None = None

    @property
    def texts(self) -> list[str]:
        if self._texts is None:
            self._texts = self.dictionary.to_pylist()
        return self._texts


_COLUMNS = ["id", "messages.list.element.role", "messages.list.element.content"]
_CONTENT = ["messages.list.element.content"]


def _flatten(table: pa.Table, rows: np.ndarray) -> _Messages:
    """`table` (id, messages with role and content) as messages; `rows` are its rows' numbers in the part.

    Each chunk's texts are numbered apart, from the chunk's own dictionary when its content is
    dictionary-encoded (a row group as `_row_group_messages` reads it), so a text repeated in two chunks has two
    numbers: both are indexed, both are hits."""
    parents, positions, roles, text_ids, dictionaries = [], [], [], [], []
    first_row = texts = 0
    for chunk in table.column("messages").chunks:
        parent = pc.list_parent_indices(chunk).to_numpy(zero_copy_only=False).astype(np.int64)
        offsets = chunk.offsets.to_numpy().astype(np.int64)
        flat = pc.list_flatten(chunk)
        content = pc.struct_field(flat, "content")
        if not pa.types.is_dictionary(content.type):
            content = pc.dictionary_encode(content)
        local = content.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        text_ids.append(np.where(local >= 0, local + texts, -1))
        positions.append(np.arange(len(flat), dtype=np.int64) + offsets[0] - offsets[:-1][parent])
        parents.append(parent + first_row)
        roles.append(pc.struct_field(flat, "role"))
        dictionaries.append(content.dictionary)
        first_row += len(chunk)
        texts += len(content.dictionary)
    parent = np.concatenate([np.zeros(0, np.int64), *parents])
    return _Messages(row=rows[parent], local=parent,
                     position=np.concatenate([np.zeros(0, np.int64), *positions]).astype(np.int32),
                     role=pa.chunked_array(roles, pa.string()).combine_chunks(),
                     text_id=np.concatenate([np.zeros(0, np.int64), *text_ids]),
                     dictionary=pa.concat_arrays(dictionaries) if dictionaries else pa.array([], pa.string()),
                     ids=table.column("id").combine_chunks())


def _row_groups(file: pq.ParquetFile, rows: np.ndarray) -> tuple[list[int], np.ndarray]:
    """The row groups holding `rows` (part row numbers) and, for each row, its row in those groups read."""
    sizes = [file.metadata.row_group(i).num_rows for i in range(file.metadata.num_row_groups)]
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    groups = np.unique(np.searchsorted(starts, rows, side="right") - 1)
    first_read = np.cumsum(np.concatenate([[0], np.diff(starts)[groups]]))[:-1]  # each group's first row read
    at = np.searchsorted(groups, np.searchsorted(starts, rows, side="right") - 1)
    return groups.tolist(), first_read[at] + rows - starts[groups][at]


def message_texts(part: Path, rows: np.ndarray, positions: np.ndarray) -> list[str | None]:
    """The content of the messages at (`rows`, `positions`) of a part, reading only the row groups holding them."""
    if len(rows) == 0:
        return []
    file = pq.ParquetFile(part)
    groups, local = _row_groups(file, np.asarray(rows, dtype=np.int64))
    messages = file.read_row_groups(groups, columns=_CONTENT).column("messages").combine_chunks()
    offsets = messages.offsets.to_numpy().astype(np.int64)
    flat = pc.struct_field(pc.list_flatten(messages), "content")
    return flat.take(pa.array(offsets[local] - offsets[0] + np.asarray(positions, dtype=np.int64))).to_pylist()


def part_messages(part: Path) -> tuple[_Messages, int]:
    """A whole part's messages and its number of rows."""
    messages = _joined(list(_row_group_messages(part)))
    return messages, len(messages.ids)


def _row_group_messages(part: Path) -> Iterator[_Messages]:
    """A part's messages a row group at a time (rows numbered in the part, texts numbered in the group):
    an index build hands each group's texts to tantivy while it reads the next."""
    file = pq.ParquetFile(part, read_dictionary=_CONTENT)
    first = 0
    groups = file.metadata.num_row_groups
    # The next group is read (decompressed, outside the GIL) while the caller works on this one.
    with ThreadPoolExecutor(max_workers=1) as reader:
        ahead = reader.submit(file.read_row_group, 0, columns=_COLUMNS) if groups else None
        for group in range(groups):
            assert ahead is not None  # set when there are groups
            table = ahead.result()
            if group + 1 < groups:
                ahead = reader.submit(file.read_row_group, group + 1, columns=_COLUMNS)
            yield _flatten(table, np.arange(first, first + table.num_rows, dtype=np.int64))
            first += table.num_rows
    if groups == 0:  # a part without row groups: the schema's empty messages
        yield _flatten(file.read(columns=_COLUMNS), np.zeros(0, dtype=np.int64))


def _joined(pieces: list[_Messages], text_counts: list[int] | None = None) -> _Messages:
    """Row groups' messages as one part's: texts numbered on from one group to the next, as `_flatten`
    numbers the chunks of a table that holds them all. `text_counts`: each group's number of texts, where
    the pieces no longer hold them (an index build hands them to tantivy and keeps only the numbers: the
    result's dictionary is then empty)."""
    counts = text_counts if text_counts is not None else [len(piece.dictionary) for piece in pieces]
    text_offsets = np.cumsum([0, *counts])[:-1]
    row_offsets = np.cumsum([0, *[len(piece.ids) for piece in pieces]])[:-1]
    return _Messages(
        row=np.concatenate([np.zeros(0, np.int64), *[piece.row for piece in pieces]]),
        local=np.concatenate([np.zeros(0, np.int64), *[piece.local + offset
                                                       for piece, offset in zip(pieces, row_offsets, strict=True)]]),
        position=np.concatenate([np.zeros(0, np.int32), *[piece.position for piece in pieces]]),
        role=pa.concat_arrays([piece.role for piece in pieces]) if pieces else pa.array([], pa.string()),
        text_id=np.concatenate([np.zeros(0, np.int64), *[np.where(piece.text_id >= 0, piece.text_id + offset, -1)
                                                         for piece, offset in zip(pieces, text_offsets, strict=True)]]),
        dictionary=pa.concat_arrays([piece.dictionary for piece in pieces]) if pieces else pa.array([], pa.string()),
        ids=pa.concat_arrays([piece.ids for piece in pieces]) if pieces else pa.array([], pa.string()))


# ASCII bytes: letters lower-cased, digits and underscore kept, every other byte a space
_ASCII_TOKENS = bytes(c + 32 if 65 <= c <= 90 else c if (48 <= c <= 57 or 97 <= c <= 122 or c == 95) else 32
                      for c in range(256))


def _slow_terms(text: str) -> str:
    tokens = tokenize(text)
    if tokens and len(max(tokens, key=len)) * 4 > MAX_TERM_BYTES:  # some token may be cut
        tokens = [index_term(token) for token in tokens]
    return " ".join(tokens)


def token_texts(texts: pa.Array | list[str | None]) -> list[str]:
    """Each text's index terms (`index_term` of each `tokenize` token) separated by spaces ("" for none).

    ASCII texts are mapped all at once, byte by byte, in the Arrow buffer that holds them: there `\\w` is
    exactly [A-Za-z0-9_] and lower-casing is ASCII's, so the tokens are the same, many times faster. Texts
    with other characters, or with a run of word bytes longer than MAX_TERM_BYTES, take `tokenize`."""
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    array = texts if isinstance(texts, pa.Array) else pa.array(texts, pa.string())
    if array.type not in (pa.string(), pa.large_string()):
        array = pc.cast(array, pa.string())
    _, offsets_buffer, data_buffer = array.buffers()
    width = np.int64 if array.type == pa.large_string() else np.int32
    offsets = np.frombuffer(offsets_buffer, dtype=width)[array.offset:array.offset + len(array) + 1].astype(np.int64)
    slow = pc.invert(pc.string_is_ascii(array).fill_null(False)).to_numpy(zero_copy_only=False)  # nulls: "" below
    begin = int(offsets[0])
    data = memoryview(data_buffer)[begin:int(offsets[-1])] if data_buffer is not None else memoryview(b"")
    joined = data.tobytes().translate(_ASCII_TOKENS)
    offsets -= begin
    slow[_long_token_candidates(joined, offsets)] = True  # checked below: a long token takes `tokenize`
    starts, ends = offsets[:-1].tolist(), offsets[1:].tolist()
    out = [joined[a:b].decode("ascii") for a, b in zip(starts, ends, strict=True)]
    for i in np.flatnonzero(slow).tolist():
        text = array[i].as_py()
        out[i] = "" if text is None else _slow_terms(text)
    return out


def _long_token_candidates(mapped: bytes, offsets: np.ndarray) -> np.ndarray:
    """The texts (by offsets into `mapped`, ASCII-mapped: every non-word byte a space) that may hold a token
    longer than MAX_TERM_BYTES: those holding a whole aligned block of 32 bytes without a space. A run of
    MAX_TERM_BYTES + 1 = 65 word bytes always covers such a block, and word runs in prose and code rarely do,
    so two passes over the bytes find the few candidates (a regular expression over the texts took three
    times as long)."""
    block = 32  # four 8-byte words; at most (MAX_TERM_BYTES + 1) // 2, so a long run covers a whole block
    usable = len(mapped) // block * block
    if usable == 0:
        return np.zeros(0, dtype=np.int64)
    # (byte != space) as 0/1 bytes, read 8 at a time: a block is whole when its four words are all ones
    words = (np.frombuffer(mapped, dtype=np.uint8, count=usable) != 32).view(np.uint64).reshape(-1, block // 8)
    whole = words[:, 0] & words[:, 1] & words[:, 2] & words[:, 3]
    full = np.flatnonzero(whole == 0x0101010101010101) * block
    first = np.searchsorted(offsets, full, side="right") - 1  # the text holding a block's first byte
    last = np.searchsorted(offsets, full + block - 1, side="right") - 1  # and its last
    return np.unique(first[first == last])  # a block across two texts is in no token of either


# ------------------------------------------------------------------------------------------ the index


def index_path(part: Path) -> Path:
    """Where the index of a trajectories part lives (a hidden folder beside it)."""
    part = Path(part)
    return part.with_name(f".{part.name}{INDEX_SUFFIX}")


def _schema(positions: bool):
    import tantivy

    builder = tantivy.SchemaBuilder()
    builder.add_text_field(_FIELD, tokenizer_name=_ANALYZER, index_option="position" if positions else "basic")
    builder.add_unsigned_field(_TEXT, fast=True)
    return builder.build()


def analyzer():
    """The tantivy analyzer of the index: splits on ASCII whitespace, changes nothing."""
    import tantivy

    return tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.whitespace()).build()


def _occurrences(messages: _Messages, indexed: np.ndarray) -> pa.Table:
    """Every message whose text has a token, as (text, row, position, role) sorted by text (then row, position)."""
    keep = messages.text_id >= 0
    keep[keep] = indexed[messages.text_id[keep]]
    text, row, position = messages.text_id[keep], messages.row[keep], messages.position[keep]
    order = np.lexsort((position, row, text))
    return pa.table({"text": pa.array(text[order], pa.uint32()), "row": pa.array(row[order], pa.uint32()),
                     "position": pa.array(position[order], pa.int32()),
                     "role": messages.role.filter(pa.array(keep)).take(pa.array(order))})


def _write_tables(folder: Path, messages: _Messages, indexed: np.ndarray) -> None:
    delta = {"text": "DELTA_BINARY_PACKED", "row": "DELTA_BINARY_PACKED", "position": "DELTA_BINARY_PACKED"}
    pq.write_table(_occurrences(messages, indexed), folder / MESSAGES_FILE, compression="zstd",
                   use_dictionary=["role"], column_encoding=delta)
    pq.write_table(pa.table({"id": messages.ids}), folder / ROWS_FILE, compression="zstd")
    for name in (MESSAGES_FILE, ROWS_FILE):
        fsync_path(folder / name)


def _chunks(texts: pa.Array, chunk_bytes: int) -> list[tuple[int, int]]:
    """(start, stop) slices of `texts` holding about `chunk_bytes` of text each."""
    sizes = pc.binary_length(texts).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    ends = np.cumsum(sizes)
    total = int(ends[-1]) if len(ends) else 0
    cuts = np.unique(np.searchsorted(ends, np.arange(chunk_bytes, total, chunk_bytes), side="right"))
    bounds = [0, *[int(c) for c in cuts if 0 < c < len(texts)], len(texts)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def _content_bytes(part: Path) -> int:
    """Uncompressed bytes of a part's message content as stored (its distinct texts, dictionary-encoded)."""
    metadata = pq.ParquetFile(part).metadata
    paths = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
    at = paths.index(_CONTENT[0])
    return sum(metadata.row_group(g).column(at).total_uncompressed_size for g in range(metadata.num_row_groups))


def _write_tantivy(folder: Path, dictionaries: Iterable[pa.Array], text_bytes: int) -> np.ndarray:
    """Index each distinct text with a token as one document, its number counted on across `dictionaries`;
    returns which texts have one. The texts are tokenised a small chunk at a time, so tantivy's own thread
    indexes one chunk while this one reads and tokenises the next, and no big compaction holds all its terms
    as Python strings."""
    import tantivy

    index = tantivy.Index(_schema(POSITIONS), path=str(folder), reuse=False)
    index.register_tokenizer(_ANALYZER, analyzer())
    # One segment for the usual part (a smaller heap flushes many segments that then merge); bounded for huge ones.
    heap = min(max(TANTIVY_HEAP_BYTES, 2 * text_bytes), 8 * TANTIVY_HEAP_BYTES)
    threads = 2 if text_bytes >= TWO_THREADS_BYTES and (os.cpu_count() or 1) > 1 else 1
    writer = index.writer(heap_size=heap * threads, num_threads=threads)
    indexed = []
    text_id = 0
    for texts in dictionaries:
        has_token = np.zeros(len(texts), dtype=bool)
        for start, stop in _chunks(texts, TOKENISE_CHUNK_BYTES):
            for at, terms in enumerate(token_texts(texts.slice(start, stop - start)), start):
                if terms and not terms.isspace():  # "" or only separators: no token, never a hit
                    has_token[at] = True
                    doc = tantivy.Document()
                    doc.add_text(_FIELD, terms)
                    doc.add_unsigned(_TEXT, text_id + at)  # add_unsigned: a plain int is an i64, refused by the u64 field
                    writer.add_document(doc)
        indexed.append(has_token)
        text_id += len(texts)
    writer.commit()  # syncs tantivy's own files
    writer.wait_merging_threads()
    return np.concatenate([np.zeros(0, dtype=bool), *indexed])


def build_index(part: Path) -> Path:
    """Build the index of one trajectories part beside it, atomically; returns its folder. The part is
    read (its texts a row group's dictionary at a time: faster than hashing rows a caller holds). An index
    already there (another process built it) is kept.
    """
    import tantivy

    part = Path(part)
    final = index_path(part)
    temp = part.with_name(f"{final.name}.building-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    temp.mkdir()
    try:
        pieces: list[_Messages] = []
        text_counts: list[int] = []

        def dictionaries() -> Iterator[pa.Array]:
            for piece in _row_group_messages(part):
                text_counts.append(len(piece.dictionary))
                pieces.append(replace(piece, dictionary=piece.dictionary.slice(0, 0)))  # texts go to tantivy only
                yield piece.dictionary

        indexed = _write_tantivy(temp, dictionaries(), _content_bytes(part))
        messages = _joined(pieces, text_counts)
        num_rows = len(messages.ids)
        _write_tables(temp, messages, indexed)
        meta = {"version": INDEX_VERSION, "tantivy": tantivy.__version__, "part": part.name,  # type: ignore[attr-defined]  # not in tantivy's stubs
                "part_bytes": part.stat().st_size, "rows": int(num_rows), "texts": int(indexed.sum()),
                "messages": len(messages.text_id), "max_term_bytes": MAX_TERM_BYTES, "positions": POSITIONS}
        (temp / META_FILE).write_text(json.dumps(meta) + "\n")
        fsync_path(temp / META_FILE)
        fsync_path(temp)
        try:
            os.rename(temp, final)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            shutil.rmtree(temp, ignore_errors=True)  # built by someone else meanwhile: theirs is as good
        fsync_path(part.parent)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return final


def remove_index(part: Path) -> None:
    """Remove a part's index (nothing happens when it has none); a search running meanwhile scans the part."""
    final = index_path(Path(part))
    doomed = final.with_name(f"{final.name}.removing-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(final, doomed)  # gone at once for readers, then deleted at leisure
    except FileNotFoundError:
        return
    shutil.rmtree(doomed, ignore_errors=True)


def _meta_if_usable(part: Path) -> tuple[os.stat_result, dict] | None:
    """The stat and content of the index's meta file when the part has an index built from it as it is
    now, in this format, by this version of tantivy (its file format changes between versions); None otherwise."""
    import tantivy

    meta_path = index_path(part) / META_FILE
    try:
        stat = meta_path.stat()
        meta = json.loads(meta_path.read_text())
        usable = (isinstance(meta, dict) and meta.get("version") == INDEX_VERSION
                  and meta.get("tantivy") == tantivy.__version__  # type: ignore[attr-defined]  # not in tantivy's stubs
                  and meta.get("part") == part.name
                  and meta.get("part_bytes") == part.stat().st_size and meta.get("max_term_bytes") == MAX_TERM_BYTES
                  and isinstance(meta.get("positions"), bool))
    except (OSError, ValueError):
        return None
    return (stat, meta) if usable else None


def _usable(part: Path) -> bool:
    """Whether the part has an index that fits it (see `_meta_if_usable`); others are rebuilt by `build_missing`."""
    return _meta_if_usable(part) is not None


def missing_indexes(store: Store) -> list[Path]:
    """The live trajectories parts without a usable index (for `store check --repair` and compaction); none
    on an S3 store, which is never indexed (tantivy needs a local folder)."""
    if not store.storage.local:
        return []
    return [part for part in map(local_path, store.parts("trajectories", warn=False)) if not _usable(part)]


def _leftovers(store: Store) -> list[Path]:
    """Index folders whose part is gone, stale ones of rewritten parts, and temporary folders of dead builders."""
    folder = local_path(store.table_dir("trajectories"))  # build_missing's: a local store
    out = []
    for path in folder.glob(f".part-*{INDEX_SUFFIX}*"):
        if _BUILDING.search(path.name):
            if is_stale(path, _BUILDING):
                out.append(path)
        elif path.name.endswith(INDEX_SUFFIX):
            part = folder / path.name[1:-len(INDEX_SUFFIX)]
            if not part.exists() or not _usable(part):
                out.append(path)
    return out


def build_missing(store: Store) -> int:
    """Remove leftover index folders, build every missing index; returns the number built (0 on S3)."""
    if not store.storage.local:
        return 0
    for path in _leftovers(store):
        shutil.rmtree(path, ignore_errors=True)
    built = 0
    for part in missing_indexes(store):
        try:
            build_index(part)
        except FileNotFoundError:
            continue  # compacted away since the listing: its rows are in the new part
        built += 1
    return built


# ----------------------------------------------------------------------------------------- searching


@dataclass
class _Opened:
    """One part's index, opened: tantivy's searcher and the two tables that map its documents to messages."""

    index: Any
    searcher: Any
    positions: bool  # whether tantivy answers phrases (else their candidates are checked)
    text: np.ndarray  # messages.parquet's text column (sorted): where each text's messages start and end
    occurrences: pa.Table  # row, position, role
    ids: pa.Array  # trajectory id of each row

    def matching_texts(self, query: Query, cut_terms: bool = False) -> np.ndarray:
        """The sorted text numbers whose terms hold every word, phrase and pattern of `query` (`index_term`s).

        A pattern matched by a term is a true match (a cut term matches only through its kept prefix); a
        token longer than MAX_TERM_BYTES may match a pattern its cut term does not: `cut_terms` also takes,
        for each pattern, any cut term (the texts to read and check)."""
        import tantivy

        if self.searcher.num_docs == 0:
            return np.zeros(0, dtype=np.int64)
        schema = self.index.schema
        phrases = query.phrases if self.positions else ()
        in_phrases = {token for phrase in phrases for token in phrase}
        clauses = [(tantivy.Occur.Must, tantivy.Query.term_query(schema, _FIELD, index_term(word)))
                   for word in query.words if word not in in_phrases]
        clauses += [(tantivy.Occur.Must, tantivy.Query.phrase_query(schema, _FIELD, list(map(index_term, phrase))))
                    for phrase in phrases]
        for pattern in query.patterns:
            regexes = [_index_regex(pattern), *([".*" + re.escape(CUT_MARK)] if cut_terms else [])]
            clauses.append((tantivy.Occur.Must, tantivy.Query.boolean_query(
                [(tantivy.Occur.Should, tantivy.Query.regex_query(schema, _FIELD, r)) for r in regexes])))
        # ordered by the fast field, tantivy hands back each document's text number instead of a score
        hits = self.searcher.search(tantivy.Query.boolean_query(clauses), limit=self.searcher.num_docs,
                                    count=False, order_by_field=_TEXT).hits
        return np.sort(np.fromiter((value for value, _ in hits), dtype=np.int64, count=len(hits)))

    def messages_of(self, texts: np.ndarray) -> np.ndarray:
        """The rows of `occurrences` holding `texts` (sorted text numbers), in text order."""
        starts = np.searchsorted(self.text, texts, side="left")
        lengths = np.searchsorted(self.text, texts, side="right") - starts
        before = np.cumsum(lengths) - lengths
        return np.repeat(starts - before, lengths) + np.arange(int(lengths.sum()), dtype=np.int64)


_opened: OrderedDict[tuple, _Opened] = OrderedDict()
_opened_lock = threading.Lock()


def _open(part: Path) -> _Opened | None:
    """The part's usable index, opened (kept for the next search while its meta file is unchanged); None
    when it has none. OSError or ValueError when its files are damaged or removed meanwhile."""
    import tantivy

    found = _meta_if_usable(part)
    if found is None:
        return None
    stat, meta = found
    folder = index_path(part)
    key = (str(folder), stat.st_ino, stat.st_mtime_ns, stat.st_size)
    with _opened_lock:
        if key in _opened:
            _opened.move_to_end(key)
            return _opened[key]
    index = tantivy.Index.open(str(folder))
    index.register_tokenizer(_ANALYZER, analyzer())
    occurrences = pq.read_table(folder / MESSAGES_FILE)
    opened = _Opened(index=index, searcher=index.searcher(), positions=meta["positions"],
                     text=occurrences.column("text").to_numpy().astype(np.int64),
                     occurrences=occurrences.drop_columns(["text"]),
                     ids=pq.read_table(folder / ROWS_FILE).column("id").combine_chunks())
    with _opened_lock:
        _opened[key] = opened
        while len(_opened) > LOADED_CACHE:
            _opened.popitem(last=False)
    return opened


# A part's hits before snippets: the result columns, and where each hit's text is (for its snippet).
_PART_HITS = pa.schema([*RESULT_SCHEMA, pa.field("_row", pa.int64()), pa.field("_text", pa.int64())])


def _indexed_hits(part: Path, opened: _Opened, query: Query) -> pa.Table:
    """The hits of one indexed part, decided by the index alone, except for a query holding a token the
    index keeps cut, or a phrase where the index has no positions: then the candidate texts are read and checked."""
    texts = opened.matching_texts(query)
    unsure = np.zeros(0, dtype=np.int64)  # candidate texts read and checked
    if not (query.index_is_exact and (opened.positions or not query.phrases)):
        texts, unsure = unsure, texts
    if query.patterns:  # texts where only a cut term could hold a pattern's token
        unsure = np.union1d(unsure, np.setdiff1d(opened.matching_texts(query, cut_terms=True), texts))
    if len(unsure):
        first = np.searchsorted(opened.text, unsure)  # each candidate text's first message: its text is read
        found = message_texts(part, opened.occurrences.column("row").to_numpy()[first],
                              opened.occurrences.column("position").to_numpy()[first])
        hits = np.fromiter((query.matches(text) for text in found), dtype=bool, count=len(found))
        texts = np.union1d(texts, unsure[hits]).astype(np.int64)
    where = pa.array(opened.messages_of(texts))
    hits = opened.occurrences.take(where)
    rows = hits.column("row").combine_chunks()
    return pa.table({
        "trajectory_id": opened.ids.take(rows),
        "position": hits.column("position"),
        "role": hits.column("role"),
        "snippet": pa.nulls(hits.num_rows, pa.string()),  # made after ordering and `limit`
        "_row": pc.cast(rows, pa.int64()),
        "_text": pa.array(opened.text[where.to_numpy()], pa.int64()),
    }, schema=_PART_HITS)


def _scanned_hits(part: Path, query: Query, snippets: bool) -> pa.Table:
    """The hits of one part found by reading and checking every message (the reference the index is
    tested against, and what a part without an index gets)."""
    messages, _ = part_messages(part)
    has_text = messages.text_id >= 0
    verdicts = np.zeros(len(messages.dictionary), dtype=bool)
    for text_id in np.unique(messages.text_id[has_text]):  # each distinct text checked once
        verdicts[text_id] = query.matches(messages.texts[text_id])
    where = np.flatnonzero(has_text & verdicts[np.maximum(messages.text_id, 0)])
    if snippets:
        made = {int(t): _snippet(messages.texts[t], query) for t in np.unique(messages.text_id[where])}
        snippet = pa.array([made[int(t)] for t in messages.text_id[where]], pa.string())
    else:
        snippet = pa.nulls(len(where), pa.string())
    return pa.table({
        "trajectory_id": messages.ids.take(pa.array(messages.local[where])),
        "position": pa.array(messages.position[where], pa.int32()),
        "role": messages.role.take(pa.array(where)),
        "snippet": snippet,
        "_row": pa.array(messages.row[where], pa.int64()),
        "_text": pa.array(messages.text_id[where], pa.int64()),
    }, schema=_PART_HITS)


def _part_hits(part: Path, query: Query, use_index: bool, snippets: bool) -> pa.Table:
    if use_index:
        try:
            opened = _open(part)
            if opened is not None:
                return _indexed_hits(part, opened, query)
        except FileNotFoundError:
            if not part.exists():
                raise  # compacted away: the caller lists the parts again
            _warn_unusable(part, "its files went missing")
        except (OSError, ValueError) as exc:  # damaged (pyarrow's and tantivy's errors are ValueErrors)
            _warn_unusable(part, f"{type(exc).__name__}: {exc}")
    return _scanned_hits(part, query, snippets)


def _warn_unusable(part: Path, why: str) -> None:
    warnings.warn(f"search index {index_path(part)} unusable ({why}); scanning its part",
                  SearchIndexWarning, stacklevel=4)


def _snippet(text: str, query: Query) -> str:
    """About SNIPPET_CHARS characters of `text` around the first phrase or word, whitespace collapsed."""
    if query.phrases or query.words:
        first = query.phrases[0] if query.phrases else (query.words[0],)  # a phrase is the rarer sight
        look = r"\W+".join(map(re.escape, first))
    else:
        look = _pattern_regex(query.patterns[0]).pattern
    found = re.search(r"(?<!\w)" + look + r"(?!\w)", text, re.IGNORECASE)
    at = found.start() if found else 0  # lower-casing can move offsets (rare scripts): then the start
    start = max(0, at - SNIPPET_CHARS // 3)
    piece = " ".join(text[start:start + SNIPPET_CHARS].split())
    return ("…" if start > 0 else "") + piece + ("…" if start + SNIPPET_CHARS < len(text) else "")


def _add_snippets(hits: pa.Table, parts: list[Path], part_of_hit: np.ndarray, query: Query) -> pa.Array:
    """The snippet column of `hits`: those the scan made, and for indexed parts' hits the text read now
    (each distinct text of a part once, from the row groups holding it)."""
    snippets = hits.column("snippet").to_pylist()
    missing = np.flatnonzero(hits.column("snippet").is_null().to_numpy(zero_copy_only=False))
    rows, texts = hits.column("_row").to_numpy(), hits.column("_text").to_numpy()
    positions = hits.column("position").to_numpy()
    for p in np.unique(part_of_hit[missing]).tolist():
        chosen = missing[part_of_hit[missing] == p]
        distinct, first = np.unique(texts[chosen], return_index=True)
        read = message_texts(parts[p], rows[chosen][first], positions[chosen][first])
        made = dict(zip(distinct.tolist(), (_snippet(text or "", query) for text in read), strict=True))
        for i in chosen.tolist():
            snippets[i] = made[int(texts[i])]
    return pa.array(snippets, pa.string())


def _refuse_remote(store: Store) -> None:
    """Text search reads parts and indexes from local disk: refused on an S3 store."""
    if not store.storage.local:
        raise UsageError(f"{store.path}: text search is not supported on S3 stores yet (no index is built "
                         "there); use SQL, e.g. `WHERE content ILIKE '%word%'` on the messages view")


def _check_limit(limit: int | None) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise UsageError(f"the search limit must be a whole number >= 0, not {limit!r}")


def search(store: Store, query: str, limit: int | None = None, *, use_index: bool = True,
           snippets: bool = True) -> pa.Table:
    """The messages of the store matching `query` (see the module docstring for the rules), as a table of
    trajectory_id, position, role and (with `snippets`) snippet, ordered by trajectory_id and position;
    at most `limit` rows.

    `snippets=False` reads no message text from an indexed part. `use_index=False` scans every part (the
    reference the index is tested against).
    """
    _refuse_remote(store)
    _check_limit(limit)
    parsed = parse_query(query)

    def work(parts: list[Path]) -> pa.Table:
        pieces = [_part_hits(part, parsed, use_index, snippets) for part in parts]
        part_of_hit = np.repeat(np.arange(len(pieces)), [piece.num_rows for piece in pieces])
        hits = pa.concat_tables(pieces) if pieces else _PART_HITS.empty_table()
        hits = hits.append_column("_part", pa.array(part_of_hit, pa.int64()))
        hits = hits.sort_by([("trajectory_id", "ascending"), ("position", "ascending")])
        if limit is not None:
            hits = hits.slice(0, limit)
        if not snippets:
            return hits.select(_HITS_SCHEMA.names)
        column = _add_snippets(hits, parts, hits.column("_part").to_numpy(), parsed)
        return hits.select(_HITS_SCHEMA.names).append_column("snippet", column)

    return retry_vanished(lambda: work([local_path(part) for part in store.parts("trajectories")]))


def search_ids(store: Store, query: str, *, use_index: bool = True) -> pa.Array:
    """The ids of the trajectories with at least one message matching `query`, sorted; no message text
    is read from an indexed part. `len()` of it counts them."""
    hits = search(store, query, use_index=use_index, snippets=False)
    return pc.unique(hits.column("trajectory_id").combine_chunks())


@contextlib.contextmanager
def hits_view(store: Store, query: str, name: str = "search_hits", *, snippets: bool = True) -> Iterator:
    """A confined connection (omrl.store.query.connect) with the hits of `query` as the view `name` (the columns
    of `search`, snippet only with `snippets`); closed after."""
    from omrl.store.query import close, connect

    hits = search(store, query, snippets=snippets)
    con = connect(store)
    try:
        con.register(name, hits)  # an in-memory Arrow table: allowed after the configuration is locked
        yield con
    finally:
        close(con)


class _TextIndex(PartIndex):
    """This index as the store's commits see it (PART_INDEXES): none on S3 (tantivy needs a local folder)."""

    def compacted(self, store: StoreWriter, part: StorePath) -> None:
        """Build the part's index. The part is committed already: a failure is a warning, and searches scan
        the part instead."""
        if not store.storage.local:
            return
        try:
            build_index(local_path(part))
        except FileNotFoundError:
            return  # compacted away meanwhile: the merged part gets its own index
        except Exception as exc:  # any failure of the index library: the committed part must stand
            warnings.warn(f"no search index for {part} (searches scan it instead): {type(exc).__name__}: {exc}",
                          SearchIndexWarning, stacklevel=4)

    def complete(self, store: StoreWriter) -> None:
        for part in missing_indexes(store):  # none on S3
            self.compacted(store, part)

    def removed(self, store: StoreWriter, part: StorePath) -> None:
        if store.storage.local:
            remove_index(local_path(part))


PART_INDEXES.append(_TextIndex())
