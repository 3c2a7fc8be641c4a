"""MinHash signatures and LSH banding over word shingles (standard library only).

Near duplicates are pairs whose word-shingle sets have Jaccard similarity >= a threshold. LSH (32
bands of 4 rows of a 128-value signature) proposes candidate pairs; every candidate is then checked
with the exact Jaccard of its shingle sets, so the threshold is exact for candidates. The chance that
LSH misses a pair at Jaccard 0.8 is (1 - 0.8**4)**32, about 5e-8.
"""

from __future__ import annotations

import hashlib
import random
import struct
from collections import defaultdict

_PRIME = (1 << 61) - 1  # Mersenne prime: a fast, well-spread modulus for the universal hashes
_MAX = (1 << 32) - 1


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


class MinHasher:
    """Signatures of `num_perm` values from random affine hashes (a*x + b) mod p of each shingle's hash."""

    def __init__(self, num_perm: int = 128, seed: int = 1):
        rng = random.Random(seed)
        self.params = [(rng.randrange(1, _PRIME), rng.randrange(0, _PRIME)) for _ in range(num_perm)]

    def signature(self, items: set[str]) -> list[int]:
        hashes = [struct.unpack("<Q", hashlib.blake2b(s.encode(), digest_size=8).digest())[0] for s in items]
        if not hashes:
            return [_MAX] * len(self.params)
        return [min(((a * h + b) % _PRIME) & _MAX for h in hashes) for a, b in self.params]


class NearDuplicateIndex:
    """Adds texts one by one; `find(...)` says whether an earlier kept text is a near duplicate."""

    def __init__(self, threshold: float = 0.8, shingle_size: int = 3, bands: int = 32, rows: int = 4, seed: int = 1):
        if not 0 < threshold <= 1:
            raise ValueError("near-duplicate threshold must be in (0, 1]")
        self.threshold, self.shingle_size, self.bands, self.rows = threshold, shingle_size, bands, rows
        self.hasher = MinHasher(bands * rows, seed)
        self.buckets: dict[tuple[int, bytes], list[str]] = defaultdict(list)
        self.sets: dict[str, set[str]] = {}

    def _keys(self, sig: list[int]) -> list[tuple[int, bytes]]:
        return [(b, hashlib.blake2b(str(sig[b * self.rows:(b + 1) * self.rows]).encode(), digest_size=8).digest())
                for b in range(self.bands)]

    def check_and_add(self, key: str, text: str) -> tuple[str, float] | None:
        """The (key, Jaccard) of a kept near duplicate of `text`, or None after adding `text` as kept."""
        items = shingles(text, self.shingle_size)
        bucket_keys = self._keys(self.hasher.signature(items))
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
