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
card list). It is a tantivy index with one document per distinct message text (repeated system prompts and
tool outputs are indexed once) holding that text's tokens, plus `keys.parquet` mapping each text to its
(row, position) messages. A search asks tantivy for the texts holding every query token, then reads only the
row groups holding those messages and checks each candidate text with the rules above, so the result
equals the full scan by construction. A part without a usable index (an old store, a crash between the
part and its index, a part rewritten since) is scanned with the same check instead.
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

from omrl.errors import UsageError

if TYPE_CHECKING:  # a type only: the store imports this module to index its parts
    from omrl.store import Store

TOKEN = re.compile(r"\w+")
INDEX_SUFFIX = ".search"
INDEX_VERSION = 1
META_FILE = "omrl-search.json"
KEYS_FILE = "keys.parquet"
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


@dataclass(frozen=True)
class _Messages:
    """A part's messages, flattened: row in the part, position in its conversation, role, text id; and
    the distinct texts the ids point at (a text repeated across messages is held once)."""

    row: np.ndarray  # row number in the part
    local: np.ndarray  # row in `ids`
    position: np.ndarray
    role: pa.Array
    text_id: np.ndarray  # -1: no content
    texts: list[str]
    ids: pa.Array  # trajectory id of each row


_COLUMNS = ["id", "messages.list.element.role", "messages.list.element.content"]


def _flatten(table: pa.Table, rows: np.ndarray) -> _Messages:
    """`table` (id, messages with role and content) as messages; `rows` are its rows' numbers in the part."""
    messages = table.column("messages").combine_chunks()
    parents = pc.list_parent_indices(messages).to_numpy(zero_copy_only=False)
    offsets = messages.offsets.to_numpy()
    base = offsets[0]
    flat = pc.list_flatten(messages)
    position = np.arange(len(flat), dtype=np.int64) + base - offsets[:-1][parents]
    content = flat.field("content")
    encoded = pc.dictionary_encode(content).combine_chunks() if isinstance(content, pa.ChunkedArray) \
        else pc.dictionary_encode(content)
    text_id = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    return _Messages(row=rows[parents], local=parents, position=position.astype(np.int32), role=flat.field("role"),
                     text_id=text_id, texts=encoded.dictionary.to_pylist(), ids=table.column("id").combine_chunks())


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
    builder.add_unsigned_field("text", fast=True)
    return builder.build()


def _register(index) -> None:
    import tantivy

    analyzer = (tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.whitespace())
                .filter(tantivy.Filter.remove_long(MAX_INDEXED_TOKEN_BYTES + 1)).build())
    index.register_tokenizer(_ANALYZER, analyzer)


def _fsync_tree(folder: Path) -> None:
    for path in folder.iterdir():
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def build_index(part: Path, table: pa.Table | None = None) -> Path:
    """Build the index of one trajectories part beside it, atomically; returns its folder.

    `table`: the part's rows (at least id and messages) when the caller has them; otherwise the part is
    read. An index already there (another process built it) is kept.
    """
    import tantivy

    part = Path(part)
    final = index_path(part)
    if table is None:
        table, rows = _read_rows(part)
    else:
        table, rows = table.select(["id", "messages"]), np.arange(table.num_rows, dtype=np.int64)
    messages = _flatten(table, rows)
    temp = part.with_name(f"{final.name}.building-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    temp.mkdir()
    try:
        index = tantivy.Index(_schema(), path=str(temp), reuse=False)
        _register(index)
        indexed = np.zeros(len(messages.texts), dtype=bool)
        writer = index.writer(heap_size=TANTIVY_HEAP_BYTES, num_threads=1)
        for text_id, text in enumerate(messages.texts):
            tokens = set(tokenize(text))
            if tokens:  # a text without a token can match no query
                indexed[text_id] = True
                doc = tantivy.Document()
                doc.add_text("tokens", " ".join(tokens))
                doc.add_unsigned("text", text_id)  # a plain int would be an i64, refused by the u64 column
                writer.add_document(doc)
        writer.commit()
        writer.wait_merging_threads()
        keep = (messages.text_id >= 0) & indexed[np.maximum(messages.text_id, 0)]
        order = np.argsort(messages.text_id[keep], kind="stable")
        keys = pa.table({
            "text": pa.array(messages.text_id[keep][order].astype(np.uint32)),
            "row": pa.array(messages.row[keep][order].astype(np.uint32)),
            "position": pa.array(messages.position[keep][order].astype(np.uint32)),
        })
        pq.write_table(keys, temp / KEYS_FILE, compression="zstd", use_dictionary=False,
                       column_encoding={"text": "DELTA_BINARY_PACKED", "row": "DELTA_BINARY_PACKED",
                                        "position": "DELTA_BINARY_PACKED"})
        meta = {"version": INDEX_VERSION, "part": part.name, "part_bytes": part.stat().st_size,
                "rows": int(table.num_rows), "texts": len(messages.texts),
                "max_token_bytes": MAX_INDEXED_TOKEN_BYTES}
        (temp / META_FILE).write_text(json.dumps(meta) + "\n")
        _fsync_tree(temp)
        try:
            os.rename(temp, final)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            shutil.rmtree(temp, ignore_errors=True)  # built by someone else meanwhile: theirs is as good
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
    """Whether the part has an index that was built from it as it is now."""
    try:
        meta = json.loads((index_path(part) / META_FILE).read_text())
        return (meta.get("version") == INDEX_VERSION and meta.get("part") == part.name
                and meta.get("part_bytes") == part.stat().st_size
                and meta.get("max_token_bytes") == MAX_INDEXED_TOKEN_BYTES)
    except (OSError, ValueError):
        return False


def missing_indexes(store: Store) -> list[Path]:
    """The live trajectories parts without a usable index (for `store check --repair` and compaction)."""
    return [part for part in store.parts("trajectories", warn=False) if not _usable(part)]


def _leftovers(store: Store) -> list[Path]:
    """Index folders whose part is gone, stale ones of rewritten parts, and temporary folders of dead builders."""
    from omrl.store import _is_stale  # the store's one rule for a dead writer's temporary files

    folder = store.table_dir("trajectories")
    out = []
    for path in folder.glob(f".part-*{INDEX_SUFFIX}*"):
        if _BUILDING.search(path.name):
            if _is_stale(path, _BUILDING):
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


def _candidate_texts(part: Path, query: Query) -> tuple[np.ndarray, pa.Table] | None:
    """(text ids holding every indexable query token, the keys of their messages), or None when the
    index cannot narrow (no usable index, or every query token too long to be indexed)."""
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
            return np.zeros(0, dtype=np.int64), pa.table({"text": pa.array([], pa.uint32())})
        schema = index.schema
        clauses = [(tantivy.Occur.Must, tantivy.Query.term_query(schema, "tokens", t, index_option="basic"))
                   for t in tokens]
        hits = searcher.search(tantivy.Query.boolean_query(clauses), limit=total, count=False).hits
        text_ids = np.array(searcher.fast_field_values("text", [address for _, address in hits]),
                            dtype=np.int64) if hits else np.zeros(0, dtype=np.int64)
        keys = pq.read_table(folder / KEYS_FILE)
    except (OSError, ValueError) as exc:  # removed or damaged under us: the scan gives the same rows
        warnings.warn(f"search index {folder} unusable ({type(exc).__name__}: {exc}); scanning its part",
                      SearchIndexWarning, stacklevel=3)
        return None
    return np.sort(text_ids), keys


def _snippet(text: str, query: Query) -> str:
    """About SNIPPET_CHARS characters of `text` around the first query word, whitespace collapsed."""
    found = re.search(r"(?<!\w)" + re.escape(query.words[0]) + r"(?!\w)", text, re.IGNORECASE)
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
    found = _candidate_texts(part, query) if use_index else None
    if found is None:  # no index: every message is a candidate
        table, rows = _read_rows(part)
        return _hits(_flatten(table, rows), query)
    text_ids, keys = found
    if len(text_ids) == 0:
        return RESULT_SCHEMA.empty_table()
    chosen = keys.filter(pc.is_in(keys.column("text"), pa.array(text_ids.astype(np.uint32))))
    rows = np.unique(chosen.column("row").to_numpy())
    table, rows = _read_rows(part, rows)
    messages = _flatten(table, rows)
    # Only the candidate messages: the index says the others of these rows lack a query token.
    wanted = _key(chosen.column("row").to_numpy(), chosen.column("position").to_numpy())
    return _hits(messages, query, np.isin(_key(messages.row, messages.position), wanted))


def _key(row: np.ndarray, position: np.ndarray) -> np.ndarray:
    return (row.astype(np.int64) << 32) | position.astype(np.int64)


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
