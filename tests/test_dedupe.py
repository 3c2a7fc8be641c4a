"""Near-deduplication on datasketch: the kept set equals an exact all-pairs Jaccard pass, on a fixed seed."""

from __future__ import annotations

import random

import pytest

from omrl.curate.minhash import NearDuplicateIndex, jaccard, shingles


def _corpus(seed: int, clusters: int = 60) -> list[tuple[str, str]]:
    """Base texts and variants at edit rates around the threshold (Jaccard about 0.95 down to 0.4)."""
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(3000)]
    rows = []
    for c in range(clusters):
        base = [rng.choice(vocab) for _ in range(rng.randint(60, 200))]
        rows.append((f"c{c}-base", " ".join(base)))
        for v, rate in enumerate((0.0, 0.01, 0.03, 0.05, 0.07, 0.1, 0.25)):
            words = [rng.choice(vocab) if rng.random() < rate else w for w in base]
            rows.append((f"c{c}-v{v}", " ".join(words)))
    rng.shuffle(rows)
    return rows


def _exact_kept(rows, threshold):
    kept: list[tuple[str, set[str]]] = []
    for key, text in rows:
        items = shingles(text)
        if all(jaccard(items, other) < threshold for _, other in kept):
            kept.append((key, items))
    return {key for key, _ in kept}


@pytest.mark.parametrize("threshold", [0.7, 0.8, 0.9])
def test_kept_set_equals_exact_jaccard(threshold):
    rows = _corpus(seed=7)
    index = NearDuplicateIndex(threshold)
    kept = {key for key, text in rows if index.check_and_add(key, text) is None}
    exact = _exact_kept(rows, threshold)
    assert kept == exact
    assert 60 < len(kept) < len(rows)  # the corpus does hold near duplicates on both sides of the threshold


def test_reported_duplicate_is_the_earliest_kept_and_verified():
    base = " ".join(f"w{i}" for i in range(100))
    index = NearDuplicateIndex(0.8)
    assert index.check_and_add("first", base) is None
    assert index.check_and_add("other", " ".join(f"x{i}" for i in range(100))) is None
    other, sim = index.check_and_add("copy", base.replace("w50", "CHANGED"))
    assert other == "first" and sim == pytest.approx(95 / 101) and sim >= 0.8
    # A short text (one shingle) and an empty one are handled, not special-cased into a crash.
    assert index.check_and_add("short", "hi") is None
    assert index.check_and_add("short-again", "hi") == ("short", 1.0)
    assert index.check_and_add("empty", "") is None
    with pytest.raises(ValueError, match="threshold"):
        NearDuplicateIndex(0)


def test_same_seed_same_signatures():
    items = shingles("the quick brown fox jumps over the lazy dog again and again")
    a, b = NearDuplicateIndex(seed=3), NearDuplicateIndex(seed=3)
    assert (a.signature(items).hashvalues == b.signature(items).hashvalues).all()
    assert not (a.signature(items).hashvalues == NearDuplicateIndex(seed=4).signature(items).hashvalues).all()
