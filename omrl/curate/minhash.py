"""Near-duplicate detection over word shingles: datasketch's MinHash + MinHashLSH propose, exact Jaccard decides.

Near duplicates are pairs whose word-shingle sets have Jaccard similarity >= a threshold. LSH (32
bands of 4 rows of a 128-value signature, datasketch's default `affine32` permutations from `seed`)
proposes candidate pairs; every candidate is then checked with the exact Jaccard of its shingle sets,
so the threshold is exact for candidates and the kept set is the one an exact greedy pass over all
pairs would keep, except for pairs LSH misses: at Jaccard 0.8 that chance is (1 - 0.8**4)**32, about
5e-8 (0.9: 2e-23). The signatures differ from the pure-Python MinHash this replaced (other hash and
permutation family), so only that miss chance can tell the two kept sets apart;
benchmarks/dedupe_bench.py measured them identical on 10,000 rows, and tests/test_dedupe.py checks the
kept set against exact all-pairs Jaccard.
"""

from __future__ import annotations

from datasketch import MinHash, MinHashLSH

from omrl.errors import UsageError


def shingles(text: str, size: int = 3) -> set[str]:
    """Word n-grams of a text (the whole text as one shingle when it has fewer than `size` words)."""
    words = text.split()
    if len(words) < size:
        return {" ".join(words)} if words else set()
    return {" ".join(words[i:i + size]) for i in range(len(words) - size + 1)}


def jaccard(a: set[str], b: set[str]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


class NearDuplicateIndex:
    """Adds texts one by one; `check_and_add(...)` says whether an earlier kept text is a near duplicate."""

    def __init__(self, threshold: float = 0.8, shingle_size: int = 3, bands: int = 32, rows: int = 4, seed: int = 1):
        if not 0 < threshold <= 1:
            raise UsageError("near-duplicate threshold must be in (0, 1]")
        self.threshold, self.shingle_size = threshold, shingle_size
        self.num_perm, self.seed = bands * rows, seed
        self.lsh = MinHashLSH(num_perm=self.num_perm, params=(bands, rows))
        # Permutations are drawn once and shared by every signature (datasketch draws them per MinHash).
        self._permutations = MinHash(num_perm=self.num_perm, seed=seed).permutations
        self.sets: dict[str, set[str]] = {}
        self.order: dict[str, int] = {}

    def signature(self, items: set[str]) -> MinHash:
        m = MinHash(num_perm=self.num_perm, seed=self.seed, permutations=self._permutations, scheme="affine32")
        if items:
            m.update_batch([s.encode() for s in items])
        return m

    def check_and_add(self, key: str, text: str) -> tuple[str, float] | None:
        """The (key, Jaccard) of the earliest kept near duplicate of `text`, or None after adding `text` as kept."""
        items = shingles(text, self.shingle_size)
        m = self.signature(items)
        for other in sorted(self.lsh.query(m), key=self.order.__getitem__):  # earliest first: deterministic
            sim = jaccard(items, self.sets[other])
            if sim >= self.threshold:
                return other, sim
        self.sets[key] = items
        self.order[key] = len(self.order)
        self.lsh.insert(key, m)
        return None
