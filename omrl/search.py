"""Text search over a store's messages: a per-part index that narrows, a check that makes it exact.

Semantics (the one definition; the index and the full scan both follow it):

- The searched text of a message is its `content` (reasoning and tool-call arguments are not searched;
  SQL reaches those). A message without content matches nothing.
- Tokens: the text lower-cased (`str.lower`), then each maximal run of Unicode word characters (Python's
  `\\w`: letters, digits, underscore, in any script) is one token. The query is tokenised the same way.
- A query is whitespace-separated terms and "quoted phrases". A term that is one token is a word; a
  phrase, or a term that splits into several tokens (`os.path`, `don't`), must occur as consecutive tokens.
  A message is a hit when every word and every phrase occurs in it: matches never span two messages.
- A hit is one message: (trajectory_id, position, role, snippet), ordered by trajectory_id then position,
  `limit` taken after ordering. Rows of every live trajectories part are searched.

Index: one per trajectories part, in a hidden folder beside it (`.part-X.parquet.search/`, written in a
temporary folder and renamed in whole, never matching the `part-*.parquet` names the store and its dataset
card list). It is a tantivy index whose documents are blocks of consecutive rows (about BLOCK_MESSAGES
messages each) holding the tokens of the block's distinct message texts, without positions. A search asks
tantivy for the blocks holding every query token, reads only the row groups of those rows and checks
each of their messages with the rules above, so the result equals the full scan by construction. A part
without a usable index (an old store, a crash between the part and its index, a part rewritten since) is
scanned with the same check instead.

Why tantivy (maintained, Rust, wheels for every platform): benchmarks/search_bench.py compares it with a
plain inverted index of the same blocks in Parquet (token -> block, read with row-group pruning). At 2,000
trajectories both are 8% of the part's bytes and cost about the part's write to build; tantivy looks a
token up in 1.5 ms where the Parquet file takes 15 ms, and it leaves positions, prefixes and ranking
within reach. DuckDB's fts extension cannot be installed offline, and its index lives in a database file
rather than beside immutable parts.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from omrl.durable import fsync_path, is_stale  # is_stale: the one rule for dead writers' leftovers
from omrl.errors import UsageError

if TYPE_CHECKING:  # a type only: the store imports this module to index its parts
    from omrl.store import Store

TOKEN = re.compile(r"\w+")
INDEX_SUFFIX = ".search"
INDEX_VERSION = 2
META_FILE = "omrl-search.json"
# Rows per index document: enough messages that the index stays small, few enough that a rare word's
# candidate blocks are a small share of the part.
BLOCK_MESSAGES = 128
# Longer tokens (hex blobs, minified code) stay out of the index, which keeps it small; a query token this
# long narrows nothing there and is checked on the candidates like every other token.
MAX_INDEXED_TOKEN_BYTES = 64
SNIPPET_CHARS = 160
TANTIVY_HEAP_BYTES = 50_000_000  # one writer thread: the index is built beside an append, on shared cores
RELIST_ATTEMPTS = 5
_ANALYZER = "omrl_tokens"  # whitespace-separated tokens made by `tokenize`: tantivy splits nothing itself
RESULT_SCHEMA = pa.schema([
    pa.field("trajectory_id", pa.string()),
    pa.field("position", pa.int32()),
    pa.field("role", pa.string()),
    pa.field("snippet", pa.string()),
])
_BUILDING = re.compile(r"\.search\.(?:building|removing)-(\d+)-[0-9a-f]+$")


class SearchIndexWarning(UserWarning):
    """An index that could not be used; its part was scanned instead (same results, slower)."""


def tokenize(text: str) -> list[str]:
    """The tokens of `text`: lower-cased, maximal runs of Unicode word characters, in order."""
    return TOKEN.findall(text.lower())


# ------------------------------------------------------------------------------------------ queries


@dataclass(frozen=True)
class Query:
    """A parsed query: tokens that must all occur in a message, and token runs that must occur in order."""

    words: tuple[str, ...]  # every token of the query, phrases' included (a phrase's tokens occur too)
    phrases: tuple[tuple[str, ...], ...]

    def matches(self, text: str | None) -> bool:
        """Whether one message's text is a hit."""
        if not text:
            return False
        lowered = text.lower()
        if any(word not in lowered for word in self.words):  # substring test: cheap, never drops a hit
            return False
        tokens = TOKEN.findall(lowered)
        if not set(self.words) <= set(tokens):
            return False
        return all(_has_run(tokens, phrase) for phrase in self.phrases)


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
    for match in re.finditer(r'"([^"]*)"|([^\s"]+)', text):
        tokens = tokenize(match.group(1) if match.group(1) is not None else match.group(2))
        words.update(dict.fromkeys(tokens))
        if len(tokens) > 1:
            phrases[tuple(tokens)] = None
    if not words:
        raise UsageError(f"the search {text!r} has no words (letters or digits) to look for")
    return Query(tuple(words), tuple(phrases))


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


def _flatten(table: pa.Table, rows: np.ndarray) -> _Messages:
    """`table` (id, messages with role and content) as messages; `rows` are its rows' numbers in the part."""
    messages = table.column("messages").combine_chunks()
    parents = pc.list_parent_indices(messages).to_numpy(zero_copy_only=False)
    offsets = messages.offsets.to_numpy()
    flat = pc.list_flatten(messages)
    position = np.arange(len(flat), dtype=np.int64) + offsets[0] - offsets[:-1][parents]
    encoded = pc.dictionary_encode(flat.field("content"))
    text_id = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    return _Messages(row=rows[parents], local=parents, position=position.astype(np.int32), role=flat.field("role"),
                     text_id=text_id, dictionary=encoded.dictionary, ids=table.column("id").combine_chunks())


def _read_rows(part: Path, rows: np.ndarray | None = None) -> tuple[pa.Table, np.ndarray]:
    """The id, role and content of a part's `rows` (sorted row numbers; None: all), reading only the row
    groups that hold them; returns the rows' table and their numbers."""
    file = pq.ParquetFile(part)
    if rows is None:
        table = file.read(columns=_COLUMNS)
        return table, np.arange(table.num_rows, dtype=np.int64)
    sizes = [file.metadata.row_group(i).num_rows for i in range(file.metadata.num_row_groups)]
    starts = np.concatenate([[0], np.cumsum(sizes)])
    groups = np.unique(np.searchsorted(starts, rows, side="right") - 1)
    table = file.read_row_groups(groups.tolist(), columns=_COLUMNS)
    group_rows = np.concatenate([np.arange(starts[g], starts[g + 1]) for g in groups])
    local = np.searchsorted(group_rows, rows)
    return table.take(pa.array(local)), rows


# ------------------------------------------------------------------------------------------ the index


def index_path(part: Path) -> Path:
    """Where the index of a trajectories part lives (a hidden folder beside it)."""
    part = Path(part)
    return part.with_name(f".{part.name}{INDEX_SUFFIX}")


def _schema():
    import tantivy

    builder = tantivy.SchemaBuilder()
    builder.add_text_field("tokens", tokenizer_name=_ANALYZER, index_option="basic")
    builder.add_unsigned_field("first", fast=True)  # the block's first row
    builder.add_unsigned_field("rows", fast=True)  # and its number of rows
    return builder.build()


def _register(index) -> None:
    import tantivy

    analyzer = (tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.whitespace())
                .filter(tantivy.Filter.remove_long(MAX_INDEXED_TOKEN_BYTES + 1)).build())
    index.register_tokenizer(_ANALYZER, analyzer)


# ASCII bytes: letters lower-cased, digits and underscore kept, every other byte a space
_ASCII_TOKENS = bytes(c + 32 if 65 <= c <= 90 else c if (48 <= c <= 57 or 97 <= c <= 122 or c == 95) else 32
                      for c in range(256))


def token_texts(texts: list[str | None]) -> list[str]:
    """Each text's tokens (`tokenize`) separated by whitespace. ASCII text is mapped byte by byte: there
    `\\w` is exactly [A-Za-z0-9_] and lower-casing is ASCII's, so the tokens are the same, many times faster."""
    out = []
    for text in texts:
        if text is None:
            out.append("")
        elif text.isascii():
            out.append(text.encode("ascii").translate(_ASCII_TOKENS).decode("ascii"))
        else:
            out.append(" ".join(tokenize(text)))
    return out


def blocks(messages: _Messages, num_rows: int) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Consecutive rows grouped into blocks of about BLOCK_MESSAGES messages: (first row, row count, the
    distinct text ids) of each block. A block is one index document: few, fat documents keep the index
    small, and the check of a candidate block is cheap next to reading its row group."""
    if num_rows == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), []
    per_row = np.bincount(messages.local, minlength=num_rows)
    before = np.cumsum(per_row) - per_row  # messages in the rows before each row
    _, block_of_row = np.unique(before // BLOCK_MESSAGES, return_inverse=True)
    firsts = np.flatnonzero(np.concatenate([[True], block_of_row[1:] != block_of_row[:-1]]))
    counts = np.diff(np.concatenate([firsts, [num_rows]]))
    has_text = messages.text_id >= 0
    block_of_message = block_of_row[messages.local[has_text]]
    pairs = np.unique(block_of_message.astype(np.int64) * (len(messages.dictionary) + 1) + messages.text_id[has_text])
    pair_block = pairs // (len(messages.dictionary) + 1)
    cuts = np.searchsorted(pair_block, np.arange(len(firsts)))
    texts = np.split(pairs % (len(messages.dictionary) + 1), cuts[1:])
    return firsts, counts, texts


def part_messages(part: Path, table: pa.Table | None = None) -> tuple[_Messages, int]:
    """A whole part's messages (from `table`, its rows, when given) and its number of rows."""
    if table is None:
        table, rows = _read_rows(part)
    else:
        table, rows = table.select(["id", "messages"]), np.arange(table.num_rows, dtype=np.int64)
    return _flatten(table, rows), table.num_rows


def build_index(part: Path, table: pa.Table | None = None) -> Path:
    """Build the index of one trajectories part beside it, atomically; returns its folder.

    `table`: the part's rows (at least id and messages) when the caller has them; otherwise the part is
    read. An index already there (another process built it) is kept.
    """
    import tantivy

    part = Path(part)
    final = index_path(part)
    messages, num_rows = part_messages(part, table)
    temp = part.with_name(f"{final.name}.building-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    temp.mkdir()
    try:
        index = tantivy.Index(_schema(), path=str(temp), reuse=False)
        _register(index)
        writer = index.writer(heap_size=TANTIVY_HEAP_BYTES, num_threads=1)
        token_text = token_texts(messages.texts)
        firsts, counts, texts = blocks(messages, num_rows)
        for first, count, text_ids in zip(firsts, counts, texts, strict=True):
            doc = tantivy.Document()
            doc.add_text("tokens", " ".join(token_text[t] for t in text_ids))  # tantivy keeps a token once
            doc.add_unsigned("first", int(first))  # a plain int would be an i64, refused by the u64 column
            doc.add_unsigned("rows", int(count))
            writer.add_document(doc)
        writer.commit()
        writer.wait_merging_threads()
        meta = {"version": INDEX_VERSION, "tantivy": tantivy.__version__, "part": part.name,
                "part_bytes": part.stat().st_size,
                "rows": int(num_rows), "blocks": len(firsts), "max_token_bytes": MAX_INDEXED_TOKEN_BYTES}
        (temp / META_FILE).write_text(json.dumps(meta) + "\n")
        fsync_path(temp / META_FILE)  # tantivy's commit has synced its own files and folder already
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


def _usable(part: Path) -> bool:
    """Whether the part has an index that was built from it as it is now, by this version of tantivy (its
    file format changes between versions: an index of another is rebuilt by `build_missing`)."""
    import tantivy

    try:
        meta = json.loads((index_path(part) / META_FILE).read_text())
        return (meta.get("version") == INDEX_VERSION and meta.get("tantivy") == tantivy.__version__
                and meta.get("part") == part.name
                and meta.get("part_bytes") == part.stat().st_size
                and meta.get("max_token_bytes") == MAX_INDEXED_TOKEN_BYTES)
    except (OSError, ValueError):
        return False


def missing_indexes(store: Store) -> list[Path]:
    """The live trajectories parts without a usable index (for `store check --repair` and compaction)."""
    return [part for part in store.parts("trajectories", warn=False) if not _usable(part)]


def _leftovers(store: Store) -> list[Path]:
    """Index folders whose part is gone, stale ones of rewritten parts, and temporary folders of dead builders."""
    folder = store.table_dir("trajectories")
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
    """Remove leftover index folders, build every missing index; returns the number built."""
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


def _candidate_rows(part: Path, query: Query) -> np.ndarray | None:
    """The sorted row numbers of the blocks holding every indexable query token, or None when the index
    cannot narrow (no usable index, or every query token too long to be indexed)."""
    import tantivy

    if not _usable(part):
        return None
    tokens = [t for t in query.words if len(t.encode()) <= MAX_INDEXED_TOKEN_BYTES]
    if not tokens:
        return None
    folder = index_path(part)
    try:
        index = tantivy.Index.open(str(folder))
        _register(index)
        searcher = index.searcher()
        total = searcher.num_docs
        if total == 0:
            return np.zeros(0, dtype=np.int64)
        clauses = [(tantivy.Occur.Must, tantivy.Query.term_query(index.schema, "tokens", t, index_option="basic"))
                   for t in tokens]
        hits = searcher.search(tantivy.Query.boolean_query(clauses), limit=total, count=False).hits
        addresses = [address for _, address in hits]
        firsts = searcher.fast_field_values("first", addresses) if addresses else []
        counts = searcher.fast_field_values("rows", addresses) if addresses else []
    except (OSError, ValueError) as exc:  # removed or damaged under us: the scan gives the same rows
        warnings.warn(f"search index {folder} unusable ({type(exc).__name__}: {exc}); scanning its part",
                      SearchIndexWarning, stacklevel=3)
        return None
    if not firsts:
        return np.zeros(0, dtype=np.int64)
    return np.unique(np.concatenate([np.arange(f, f + c, dtype=np.int64) for f, c in zip(firsts, counts, strict=True)]))


def _snippet(text: str, query: Query) -> str:
    """About SNIPPET_CHARS characters of `text` around the first phrase or word, whitespace collapsed."""
    first = query.phrases[0] if query.phrases else (query.words[0],)  # a phrase is the rarer sight
    found = re.search(r"(?<!\w)" + r"\W+".join(map(re.escape, first)) + r"(?!\w)", text, re.IGNORECASE)
    at = found.start() if found else 0  # lower-casing can move offsets (rare scripts): then the start
    start = max(0, at - SNIPPET_CHARS // 3)
    piece = " ".join(text[start:start + SNIPPET_CHARS].split())
    return ("…" if start > 0 else "") + piece + ("…" if start + SNIPPET_CHARS < len(text) else "")


def _hits(messages: _Messages, query: Query, candidates: np.ndarray | None = None) -> pa.Table:
    """The hits among `messages`: every message with text is checked, or only the `candidates` (a mask)."""
    has_text = messages.text_id >= 0
    candidates = has_text if candidates is None else candidates & has_text
    verdicts = np.zeros(len(messages.texts), dtype=bool)
    for text_id in np.unique(messages.text_id[candidates]):  # each distinct text checked once
        verdicts[text_id] = query.matches(messages.texts[text_id])
    where = np.flatnonzero(candidates & verdicts[np.maximum(messages.text_id, 0)])
    snippets = {int(t): _snippet(messages.texts[t], query) for t in np.unique(messages.text_id[where])}
    return pa.table({
        "trajectory_id": messages.ids.take(pa.array(messages.local[where])),
        "position": pa.array(messages.position[where], pa.int32()),
        "role": messages.role.take(pa.array(where)),
        "snippet": pa.array([snippets[int(t)] for t in messages.text_id[where]], pa.string()),
    }, schema=RESULT_SCHEMA)


def _search_part(part: Path, query: Query, use_index: bool) -> pa.Table:
    rows = _candidate_rows(part, query) if use_index else None
    return hits_in_rows(part, query, rows)


def hits_in_rows(part: Path, query: Query, rows: np.ndarray | None) -> pa.Table:
    """The hits among a part's `rows` (sorted row numbers; None: every row), each message checked."""
    if rows is not None and len(rows) == 0:
        return RESULT_SCHEMA.empty_table()
    table, rows = _read_rows(part, rows)
    return _hits(_flatten(table, rows), query)


def _each_part(store: Store, work) -> list[pa.Table]:
    """`work(part)` for every live trajectories part, listed again if a compaction removed one meanwhile."""
    for attempt in range(RELIST_ATTEMPTS):
        try:
            return [work(part) for part in store.parts("trajectories")]
        except FileNotFoundError:
            if attempt == RELIST_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def search(store: Store, query: str, limit: int | None = None, *, use_index: bool = True) -> pa.Table:
    """The messages of the store matching `query` (see the module docstring for the rules), as a table of
    trajectory_id, position, role, snippet ordered by trajectory_id and position; at most `limit` rows.

    `use_index=False` scans every part (the reference the index is tested against).
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise UsageError(f"the search limit must be a whole number >= 0, not {limit!r}")
    parsed = parse_query(query)
    pieces = [t for t in _each_part(store, lambda p: _search_part(p, parsed, use_index)) if t.num_rows]
    result = pa.concat_tables(pieces) if pieces else RESULT_SCHEMA.empty_table()
    result = result.sort_by([("trajectory_id", "ascending"), ("position", "ascending")])
    return result.slice(0, limit) if limit is not None else result


@contextlib.contextmanager
def hits_view(store: Store, query: str, name: str = "search_hits") -> Iterator:
    """A confined connection (omrl.query.connect) with the hits of `query` as the view `name`; closed after."""
    from omrl.query import close, connect

    hits = search(store, query)
    con = connect(store)
    try:
        con.register(name, hits)  # an in-memory Arrow table: allowed after the configuration is locked
        yield con
    finally:
        close(con)
