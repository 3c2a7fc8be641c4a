"""Text search: the tantivy index (omrl.search) against a plain inverted index in Parquet, and both against
the full scan, on store_bench's corpus (Zipf words, repeated system prompt, tool outputs shared in a group).

For each n: the store is written in appends of --batch rows; each part's index is built beside it (timed
against the part's write), then the store is compacted and the merged part indexed. Queries (rare and
common words, a phrase, two words, an absent word) run 3 times on the compacted store; the median is
reported and every result is asserted equal to the full scan's.

Prints one JSON line; the last n's figures are at the top level: index_build_vs_write (index build time /
part write time over the appends), index_size_ratio (index bytes / part bytes), search_speedup (smallest
full-scan time / indexed time over the queries), and the same for the Parquet inverted index (parquet_*).

    python benchmarks/search_bench.py --n 1000,4000
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from store_bench import SEARCH_WORD, make_corpus  # noqa: E402  (the one corpus generator of the benchmarks)

from omrl import search as S  # noqa: E402
from omrl.schema import to_table  # noqa: E402
from omrl.store import Store  # noqa: E402

POSTINGS_FILE = "postings.parquet"
BLOCKS_FILE = "blocks.parquet"
POSTING_ROW_GROUP = 32_768  # small row groups: a token lookup reads only the groups whose min/max hold it


# ------------------------------------------------------------- the alternative: an inverted index in Parquet


def parquet_index_path(part: Path) -> Path:
    return part.with_name(f".{part.name}.postings")


def build_parquet_index(part: Path, table: pa.Table | None = None) -> Path:
    """The same blocks and tokens as omrl.search, as token -> block postings (sorted by token) and a block table."""
    messages, num_rows = S.part_messages(part, table)
    firsts, counts, texts = S.blocks(messages, num_rows)
    per_text = pc.utf8_split_whitespace(pa.array(S.token_texts(messages.texts), pa.string()))
    text_of_pair = np.concatenate(texts) if texts else np.zeros(0, dtype=np.int64)
    block_of_pair = np.repeat(np.arange(len(texts)), [len(t) for t in texts])
    taken = per_text.take(pa.array(text_of_pair))  # each (block, distinct text) pair's tokens
    postings = pa.table({"token": pc.list_flatten(taken),
                         "block": pa.array(block_of_pair, pa.uint32()).take(pc.list_parent_indices(taken))})
    length = pc.binary_length(postings.column("token"))  # splitting leaves empty strings at runs' ends
    postings = postings.filter(pc.and_(pc.greater(length, 0), pc.less_equal(length, S.MAX_INDEXED_TOKEN_BYTES)))
    postings = postings.group_by(["token", "block"]).aggregate([])  # one posting per token and block
    postings = postings.sort_by([("token", "ascending"), ("block", "ascending")])
    folder = parquet_index_path(part)
    folder.mkdir()
    pq.write_table(postings, folder / POSTINGS_FILE, compression="zstd", row_group_size=POSTING_ROW_GROUP,
                   use_dictionary=["token"], column_encoding={"block": "DELTA_BINARY_PACKED"})
    pq.write_table(pa.table({"first": pa.array(firsts, pa.uint32()), "rows": pa.array(counts, pa.uint32())}),
                   folder / BLOCKS_FILE, compression="zstd")
    return folder


def parquet_search(store: Store, query: str) -> pa.Table:
    """omrl.search.search with the Parquet postings narrowing the candidates instead of tantivy."""
    parsed = S.parse_query(query)
    tokens = [t for t in parsed.words if len(t.encode()) <= S.MAX_INDEXED_TOKEN_BYTES]
    pieces = []
    for part in store.parts():
        folder = parquet_index_path(part)
        postings = pq.read_table(folder / POSTINGS_FILE, filters=[("token", "in", tokens)])
        found = None
        for token in tokens:
            ids = postings.filter(pc.equal(postings.column("token"), token)).column("block").to_numpy()
            found = ids if found is None else np.intersect1d(found, ids, assume_unique=True)
        chosen = pq.read_table(folder / BLOCKS_FILE).take(pa.array(found))
        rows = [np.arange(f, f + c) for f, c in zip(chosen.column("first").to_pylist(),
                                                    chosen.column("rows").to_pylist(), strict=True)]
        rows = np.unique(np.concatenate(rows)) if rows else np.zeros(0, dtype=np.int64)
        pieces.append(S.hits_in_rows(part, parsed, rows))
    result = pa.concat_tables(pieces)
    return result.sort_by([("trajectory_id", "ascending"), ("position", "ascending")])


# --------------------------------------------------------------------------------------------- measuring


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def median_time(fn, repeats: int = 3):
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def pick_queries(store: Store, rng: random.Random) -> dict[str, str]:
    """A rare and a common word of the stored text, two words, a phrase taken from a message, an absent word."""
    sample = store.read(columns=["messages"]).slice(0, 50).column("messages").to_pylist()
    texts = [m["content"] for messages in sample for m in messages if m["content"]]
    counts: dict[str, int] = {}
    for text in texts:
        for token in set(S.tokenize(text)):
            counts[token] = counts.get(token, 0) + 1
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    words = S.tokenize(rng.choice([t for t in texts if len(S.tokenize(t)) > 4]))
    at = rng.randrange(len(words) - 2)
    return {"tagged_word": SEARCH_WORD, "rare_word": ranked[-1], "common_word": ranked[len(ranked) // 50],
            "two_words": f"{ranked[-2]} {ranked[len(ranked) // 10]}", "phrase": '"' + " ".join(words[at:at + 3]) + '"',
            "absent_word": "zzqxv"}


def _hands_off(store: Store) -> None:
    """Stop the store from indexing or compacting by itself, so this benchmark times each step alone."""
    if hasattr(store, "_index"):
        store._index = lambda part, data=None: None
    if hasattr(store, "_auto_compact"):
        store._auto_compact = lambda table, policy: None


def time_queries(store: Store, queries: dict[str, str], parquet: bool) -> dict:
    """Median times of the full scan, the tantivy index and (with `parquet`) the Parquet postings, each
    result asserted equal to the scan's."""
    out = {}
    for name, query in queries.items():
        scan_s, expected = median_time(lambda q=query: S.search(store, q, use_index=False))
        index_s, indexed = median_time(lambda q=query: S.search(store, q))
        assert indexed.equals(expected), (name, query, indexed.num_rows, expected.num_rows)
        out[name] = {"query": query, "hits": expected.num_rows, "scan_s": round(scan_s, 4),
                     "tantivy_s": round(index_s, 4), "speedup": round(scan_s / index_s, 1)}
        if parquet:
            pq_s, pq_result = median_time(lambda q=query: parquet_search(store, q))
            assert pq_result.equals(expected), (name, query, pq_result.num_rows, expected.num_rows)
            out[name].update(parquet_s=round(pq_s, 4), parquet_speedup=round(scan_s / pq_s, 1))
    return out


def small_row_groups(merged: Path, rows_per_group: int, workdir: Path, queries: dict[str, str]) -> dict:
    """What smaller row groups would give: the merged part rewritten with `rows_per_group`, indexed, searched."""
    store = Store.create(workdir)
    _hands_off(store)
    part = store.table_dir("trajectories") / merged.name
    pq.write_table(pq.read_table(merged), part, compression="zstd", row_group_size=rows_per_group)
    S.build_index(part)
    timed = time_queries(store, queries, parquet=False)
    return {"rows_per_group": rows_per_group, "part_bytes": part.stat().st_size,
            "search_speedup": min(q["speedup"] for q in timed.values()), "queries": timed}


def run(n: int, batch: int, seed: int, workdir: Path) -> dict:
    rows = list(make_corpus(n, seed))
    store = Store.create(workdir / f"store-{n}")
    _hands_off(store)
    write_s = tantivy_s = parquet_s = 0.0
    for i in range(0, n, batch):
        table = to_table(rows[i:i + batch])
        start = time.perf_counter()
        part = store.append(table).part
        write_s += time.perf_counter() - start
        start = time.perf_counter()
        S.build_index(part, table)
        tantivy_s += time.perf_counter() - start
        start = time.perf_counter()
        build_parquet_index(part, table)
        parquet_s += time.perf_counter() - start
    del rows
    start = time.perf_counter()
    merged = store.compact() or store.parts()[0]
    compact_s = time.perf_counter() - start
    start = time.perf_counter()
    S.build_index(merged)
    compact_index_s = time.perf_counter() - start
    start = time.perf_counter()
    build_parquet_index(merged)
    compact_parquet_s = time.perf_counter() - start
    for leftover in store.table_dir("trajectories").glob(".part-*"):
        if leftover.is_dir() and not (store.table_dir("trajectories") / leftover.name[1:].rsplit(".", 1)[0]).exists():
            shutil.rmtree(leftover)  # indexes of the parts the compaction replaced

    picked = pick_queries(store, random.Random(seed))
    queries = time_queries(store, picked, parquet=True)
    part_bytes = merged.stat().st_size
    return {
        "n": n, "part_bytes": part_bytes, "part_write_s": round(write_s, 3),
        "index_build_s": round(tantivy_s, 3), "parquet_build_s": round(parquet_s, 3),
        "index_build_vs_write": round(tantivy_s / write_s, 3),
        "parquet_build_vs_write": round(parquet_s / write_s, 3),
        "compact_s": round(compact_s, 3), "compact_index_s": round(compact_index_s, 3),
        "compact_parquet_index_s": round(compact_parquet_s, 3),
        "index_bytes": folder_bytes(S.index_path(merged)),
        "parquet_index_bytes": folder_bytes(parquet_index_path(merged)),
        "index_size_ratio": round(folder_bytes(S.index_path(merged)) / part_bytes, 4),
        "parquet_index_size_ratio": round(folder_bytes(parquet_index_path(merged)) / part_bytes, 4),
        "search_speedup": min(q["speedup"] for q in queries.values()),
        "parquet_search_speedup": min(q["parquet_speedup"] for q in queries.values()),
        "queries": queries,
        "small_row_groups": small_row_groups(merged, 64, workdir / f"store-{n}-rg", picked),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", default="1000,4000", help="comma-separated corpus sizes (trajectories)")
    parser.add_argument("--batch", type=int, default=500, help="rows per append (one part and one index each)")
    parser.add_argument("--seed", type=int, default=0, help="corpus and query seed")
    parser.add_argument("--block-messages", type=int, default=S.BLOCK_MESSAGES,
                        help="messages per index block (smaller: more exact candidates, a bigger index)")
    parser.add_argument("--workdir", default=None, help="where to write (default: a temporary folder, removed)")
    args = parser.parse_args()
    sizes = [int(v) for v in args.n.split(",")]
    S.BLOCK_MESSAGES = args.block_messages
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="omrl-search-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        runs = [run(n, args.batch, args.seed, workdir) for n in sizes]
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    last = runs[-1]
    top = {"block_messages": S.BLOCK_MESSAGES}
    top |= {k: last[k] for k in ("n", "index_build_vs_write", "index_size_ratio", "search_speedup",
                                "parquet_build_vs_write", "parquet_index_size_ratio", "parquet_search_speedup")}
    print(json.dumps({**top, "runs": runs}))


if __name__ == "__main__":
    main()
