"""Text search: omrl.store.search's exact index against the full scan, on store_bench's corpus (Zipf words,
repeated system prompt, tool outputs shared in a group).

For each n: the store is written in appends of --batch rows, each part's index built beside it (timed
against the part's write: index_build_vs_write), then the store is compacted and the merged part indexed
from its file (compact_index_vs_compact). Queries (the tagged word, a rare and a common word, two words, a
phrase, an absent word) run 3 times on the compacted store, the median counts; every indexed result is
asserted equal to the scan's. Per query: `speedup` (search with snippets vs the scan), `ids_speedup`
(search_ids, what the viewer and a count need, vs the scan's ids).

Two alternatives are measured on the merged part, for the record: an index with token positions
(phrases answered by the index alone, about three times the bytes: `positions_*`), and one tantivy document per message instead
of per distinct text (`per_message_*`: build time and bytes).

Prints one JSON line; the last n's figures are at the top level.

    python benchmarks/search_bench.py --n 2000
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from store_bench import SEARCH_WORD, make_corpus  # noqa: E402  (the one corpus generator of the benchmarks)

from omrl.schema.arrow import to_table  # noqa: E402
from omrl.store import Store  # noqa: E402
from omrl.store import search as S  # noqa: E402


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
    """The tagged word, a rare and a common word of the stored text, two words, a phrase taken from a
    message, an absent word."""
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


def time_queries(store: Store, queries: dict[str, str], ids: bool = True) -> dict:
    """Median times of the scan and the index per query, each indexed result asserted equal to the scan's."""
    out = {}
    for name, query in queries.items():
        scan_s, expected = median_time(lambda q=query: S.search(store, q, use_index=False))
        index_s, indexed = median_time(lambda q=query: S.search(store, q))
        assert indexed.equals(expected), (name, query, indexed.num_rows, expected.num_rows)
        out[name] = {"query": query, "hits": expected.num_rows, "scan_s": round(scan_s, 4),
                     "index_s": round(index_s, 4), "speedup": round(scan_s / index_s, 1)}
        if ids:
            scan_ids_s, expected_ids = median_time(lambda q=query: S.search_ids(store, q, use_index=False))
            ids_s, found = median_time(lambda q=query: S.search_ids(store, q))
            assert found.equals(expected_ids), (name, query, len(found), len(expected_ids))
            out[name].update(trajectories=len(found), ids_s=round(ids_s, 4),
                             ids_speedup=round(scan_ids_s / ids_s, 1))
    return out


def per_message_index(part: Path, folder: Path) -> float:
    """Build the alternative: one tantivy document per message (its row and position as fast fields); seconds."""
    import numpy as np
    import tantivy

    start = time.perf_counter()
    messages, _ = S.part_messages(part)
    terms = S.token_texts(messages.dictionary)
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("tokens", tokenizer_name="omrl_tokens", index_option="position")
    builder.add_unsigned_field("row", fast=True)
    builder.add_unsigned_field("position", fast=True)
    index = tantivy.Index(builder.build(), path=str(folder), reuse=False)
    index.register_tokenizer("omrl_tokens", S.analyzer())
    writer = index.writer(heap_size=S.TANTIVY_HEAP_BYTES, num_threads=1)
    for row, position, text_id in zip(messages.row.tolist(), messages.position.tolist(),
                                      np.maximum(messages.text_id, 0).tolist(), strict=True):
        doc = tantivy.Document()
        doc.add_text("tokens", terms[text_id])
        doc.add_unsigned("row", row)
        doc.add_unsigned("position", position)
        writer.add_document(doc)
    writer.commit()
    writer.wait_merging_threads()
    return time.perf_counter() - start


def alternatives(merged: Path, store: Store, picked: dict[str, str], workdir: Path) -> dict:
    """The index with positions (size, phrase speed; the default has none) and with a document per message
    (build, size)."""
    default_bytes = folder_bytes(S.index_path(merged))
    S.remove_index(merged)
    default_positions = S.POSITIONS
    S.POSITIONS = True
    try:
        start = time.perf_counter()
        S.build_index(merged)
        positions_build_s = time.perf_counter() - start
        positions_bytes = folder_bytes(S.index_path(merged))
        phrase = time_queries(store, {"phrase": picked["phrase"], "common_word": picked["common_word"]}, ids=False)
    finally:
        S.POSITIONS = default_positions
        S.remove_index(merged)
        S.build_index(merged)
    folder = workdir / "per-message-index"
    folder.mkdir()
    per_message_s = per_message_index(merged, folder)
    per_message_bytes = folder_bytes(folder)
    shutil.rmtree(folder)
    return {"positions_build_s": round(positions_build_s, 3), "positions_index_bytes": positions_bytes,
            "positions_index_size_ratio": round(positions_bytes / merged.stat().st_size, 4),
            "positions_phrase_speedup": phrase["phrase"]["speedup"],
            "positions_common_word_speedup": phrase["common_word"]["speedup"],
            "per_message_build_s": round(per_message_s, 3), "per_message_index_bytes": per_message_bytes,
            "per_message_vs_per_text_bytes": round(per_message_bytes / default_bytes, 3)}


def run(n: int, batch: int, seed: int, workdir: Path) -> dict:
    rows = list(make_corpus(n, seed))
    store = Store.create(workdir / f"store-{n}")
    _hands_off(store)
    write_s = index_s = 0.0
    for i in range(0, n, batch):
        table = to_table(rows[i:i + batch])
        start = time.perf_counter()
        part = store.append(table).part
        write_s += time.perf_counter() - start
        start = time.perf_counter()
        S.build_index(part)
        index_s += time.perf_counter() - start
    del rows
    start = time.perf_counter()
    merged = store.compact() or store.parts()[0]
    compact_s = time.perf_counter() - start
    S.remove_index(merged)  # built by the compaction when the store does that itself: timed here alone
    start = time.perf_counter()
    S.build_index(merged)
    compact_index_s = time.perf_counter() - start
    S.build_missing(store)  # removes the indexes of the parts the compaction replaced
    meta = json.loads((S.index_path(merged) / S.META_FILE).read_text())

    picked = pick_queries(store, random.Random(seed))
    queries = time_queries(store, picked)
    part_bytes = merged.stat().st_size
    index_bytes = folder_bytes(S.index_path(merged))
    return {
        "n": n, "part_bytes": part_bytes, "messages": meta["messages"], "distinct_texts": meta["texts"],
        "part_write_s": round(write_s, 3), "index_build_s": round(index_s, 3),
        "index_build_vs_write": round(index_s / write_s, 3),
        "compact_s": round(compact_s, 3), "compact_index_s": round(compact_index_s, 3),
        "compact_index_vs_compact": round(compact_index_s / compact_s, 3),
        "index_bytes": index_bytes, "index_size_ratio": round(index_bytes / part_bytes, 4),
        "search_speedup": min(q["speedup"] for q in queries.values()),
        "ids_speedup": min(q["ids_speedup"] for q in queries.values()),
        "queries": queries,
        **alternatives(merged, store, picked, workdir),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", default="2000", help="comma-separated corpus sizes (trajectories)")
    parser.add_argument("--batch", type=int, default=500, help="rows per append (one part and one index each)")
    parser.add_argument("--seed", type=int, default=0, help="corpus and query seed")
    parser.add_argument("--workdir", default=None, help="where to write (default: a temporary folder, removed)")
    args = parser.parse_args()
    sizes = [int(v) for v in args.n.split(",")]
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="omrl-search-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        runs = [run(n, args.batch, args.seed, workdir) for n in sizes]
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    last = runs[-1]
    top = {k: last[k] for k in ("n", "index_build_vs_write", "compact_index_vs_compact", "index_size_ratio",
                                "search_speedup", "ids_speedup", "positions_index_size_ratio",
                                "positions_phrase_speedup",
                                "per_message_vs_per_text_bytes")}
    top |= {f"{name}_speedup": last["queries"][name]["speedup"] for name in ("common_word", "rare_word", "phrase",
                                                                          "absent_word")}
    print(json.dumps({**top, "runs": runs}))


if __name__ == "__main__":
    main()
