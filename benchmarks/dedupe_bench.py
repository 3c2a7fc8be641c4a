"""Near-deduplication: the former pure-Python MinHash + LSH against datasketch's MinHash + MinHashLSH.

Both index the same texts in the same order with the same banding (32 bands x 4 rows, 128 values),
the same word-3-shingles and the same threshold, and both check every LSH candidate with exact Jaccard;
they differ in the signatures (pure Python: blake2b-64 then (a*x + b) mod 2^61-1 in Python integers,
128 per shingle; datasketch: sha1-32 then numpy affine32 permutations). The corpus: N rows of
trajectory-like text (150-600 words from a Zipf vocabulary), made of base texts and variants at
several edit rates, so many pairs lie near the threshold. An exact greedy pass (all pairs, exact
Jaccard) over a sample of whole clusters says whether either index missed a near duplicate.

Prints one JSON line: seconds for each, their ratio, kept counts, whether the kept sets are identical,
and the sample check.

    python benchmarks/dedupe_bench.py --n 10000
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import struct
import time
from collections import defaultdict

from omrl.curate.minhash import NearDuplicateIndex, jaccard, shingles

_PRIME = (1 << 61) - 1
_MAX = (1 << 32) - 1


class PurePythonIndex:
    """omrl.curate.minhash before datasketch (kept here as the baseline): same contract as NearDuplicateIndex."""

    def __init__(self, threshold: float = 0.8, shingle_size: int = 3, bands: int = 32, rows: int = 4, seed: int = 1):
        rng = random.Random(seed)
        self.params = [(rng.randrange(1, _PRIME), rng.randrange(0, _PRIME)) for _ in range(bands * rows)]
        self.threshold, self.shingle_size, self.bands, self.rows = threshold, shingle_size, bands, rows
        self.buckets: dict[tuple[int, bytes], list[str]] = defaultdict(list)
        self.sets: dict[str, set[str]] = {}

    def signature(self, items: set[str]) -> list[int]:
        hashes = [struct.unpack("<Q", hashlib.blake2b(s.encode(), digest_size=8).digest())[0] for s in items]
        if not hashes:
            return [_MAX] * len(self.params)
        return [min(((a * h + b) % _PRIME) & _MAX for h in hashes) for a, b in self.params]

    def _keys(self, sig: list[int]) -> list[tuple[int, bytes]]:
        return [(b, hashlib.blake2b(str(sig[b * self.rows:(b + 1) * self.rows]).encode(), digest_size=8).digest())
                for b in range(self.bands)]

    def check_and_add(self, key: str, text: str) -> tuple[str, float] | None:
        items = shingles(text, self.shingle_size)
        bucket_keys = self._keys(self.signature(items))
        seen: set[str] = set()
        for bk in bucket_keys:
            for other in self.buckets.get(bk, ()):
                if other in seen:
                    continue
                seen.add(other)
                sim = jaccard(items, self.sets[other])
                if sim >= self.threshold:
                    return other, sim
        self.sets[key] = items
        for bk in bucket_keys:
            self.buckets[bk].append(key)
        return None


def corpus(n: int, seed: int) -> list[tuple[str, str, int]]:
    """(key, text, cluster) rows: base texts and variants (copies, light, near-threshold and heavy edits)."""
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(5000)]
    weights = [1 / (i + 1) for i in range(len(vocab))]
    rates = [0.0, 0.01, 0.03, 0.05, 0.07, 0.1, 0.25]  # per-word edit rate of a variant
    rows: list[tuple[str, str, int]] = []
    cluster = 0
    while len(rows) < n:
        base = rng.choices(vocab, weights, k=rng.randint(150, 600))
        rows.append((f"r{len(rows)}", " ".join(base), cluster))
        for _ in range(rng.randint(0, 3)):
            if len(rows) >= n:
                break
            rate = rng.choice(rates)
            words = [rng.choice(vocab) if rng.random() < rate else w for w in base]
            rows.append((f"r{len(rows)}", " ".join(words), cluster))
        cluster += 1
    rng.shuffle(rows)
    return rows


def run(index, rows: list[tuple[str, str, int]]) -> tuple[float, set[str]]:
    start = time.perf_counter()
    kept = {key for key, text, _ in rows if index.check_and_add(key, text) is None}
    return time.perf_counter() - start, kept


def exact_kept(rows: list[tuple[str, str, int]], threshold: float) -> set[str]:
    """The greedy pass with exact Jaccard against every kept row (no LSH)."""
    kept: list[tuple[str, set[str]]] = []
    for key, text, _ in rows:
        items = shingles(text)
        if all(jaccard(items, other) < threshold for _, other in kept):
            kept.append((key, items))
    return {key for key, _ in kept}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--threshold", type=float, default=0.8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sample-clusters", type=int, default=300, help="clusters checked against exact Jaccard")
    args = parser.parse_args()
    rows = corpus(args.n, args.seed)
    pure_s, pure_kept = run(PurePythonIndex(args.threshold), rows)
    sketch_s, sketch_kept = run(NearDuplicateIndex(args.threshold), rows)
    sample = [r for r in rows if r[2] < args.sample_clusters]  # whole clusters, in the same order
    exact = exact_kept(sample, args.threshold)
    print(json.dumps({
        "rows": len(rows), "threshold": args.threshold, "seed": args.seed,
        "pure_python_s": round(pure_s, 3), "datasketch_s": round(sketch_s, 3),
        "speedup": round(pure_s / sketch_s, 2),
        "kept_pure_python": len(pure_kept), "kept_datasketch": len(sketch_kept),
        "kept_identical": pure_kept == sketch_kept,
        "sample_rows": len(sample), "sample_kept_exact": len(exact),
        # The sample is checked standalone (its rows' earlier duplicates outside it do not exist there).
        "sample_datasketch_equals_exact": run(NearDuplicateIndex(args.threshold), sample)[1] == exact,
        "sample_pure_python_equals_exact": run(PurePythonIndex(args.threshold), sample)[1] == exact,
    }))


if __name__ == "__main__":
    main()
